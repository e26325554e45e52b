//! `HexLinear`: a linear layer whose weights live on the NPU, packed once at load time.
//!
//! Like candle's `QTensor` (which *is* the quantized matmul op), a [`HexLinear`] owns its packed,
//! NPU-mapped weights and is the op: dense checkpoint weights become fp16 HMX tiles
//! (`MATMUL_F16`), ggml Q4_0 weights become Q4_0 tiles (`MATMUL_Q4_0`, activations quantized to
//! Q8_0 on the DSP). A bias is added on the DSP in the same batch (`ADD`, broadcast over rows).
//! Rows are split into as many ops as the DSP scratch arena needs (`kdsp_op_check`).
//!
//! The packed copy is the only copy at load. The CPU fallback rebuilds the weights from it —
//! exactly: the packings are invertible — and keeps that unpacked copy once built, so a fallback computes what a CPU model with the same (fp16 or
//! Q4_0) weights computes.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Module, Shape, Tensor};
use half::f16;
use kernels_dsp::*;

use super::{dtype_of, rows, stage_in, stage_out, tiled, to_f32_vec, StagePlan, Wire};
use crate::device::{HexagonDevice, PlanKey};
use crate::error::{Error, InputProblem, Result};
use crate::layout;
use crate::memory::{DeviceBuffer, WeightSlot};
use crate::routing::{Decision, OpDesc, Reason, Support, WeightFormat};
use crate::transport::Batch;

/// The packed layout of a [`HexLinear`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedFormat {
    /// fp16 HMX weight tiles.
    F16Tiles,
    /// Q4_0 tiles.
    Q4_0Tiles,
}

/// Where a layer's weights ended up.
#[derive(Debug)]
pub enum Placed<T> {
    /// On the NPU.
    Npu(T),
    /// Kept on the CPU, for this reason (counted in the device's placement statistics).
    Cpu(Reason),
}

enum CpuWeights {
    Dense(Tensor),
    Quant(QMatMul),
}

struct Inner {
    dev: HexagonDevice,
    format: PackedFormat,
    n: usize,
    k: usize,
    weight: WeightSlot,
    bias: Option<WeightSlot>,
    cpu: OnceLock<(CpuWeights, Option<Tensor>)>,
}

/// A linear layer `y = x W^T (+ b)` with `W (n, k)` packed in NPU memory.
#[derive(Clone)]
pub struct HexLinear {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HexLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HexLinear({:?}, n {}, k {}, bias {}, {:?})",
            self.inner.format,
            self.inner.n,
            self.inner.k,
            self.inner.bias.is_some(),
            self.inner.weight
        )
    }
}

impl HexLinear {
    /// Pack a dense `(n, k)` weight (any float dtype) into fp16 tiles on `dev`, with an optional
    /// `(n)` bias. Returns [`Placed::Cpu`] when the device does not take it (deny-list, dtype,
    /// shape, address window); the decision is counted.
    pub fn from_dense(
        dev: &HexagonDevice,
        w: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Placed<Self>> {
        let (n, k) = w.dims2()?;
        let desc = OpDesc::Linear {
            weights: WeightFormat::Dense(w.dtype()),
            n,
            k,
            rows: 0,
            // Activations are not known at load time; the weight dtype is checked on its own.
            dtype: DType::F32,
        };
        Self::place(dev, &desc, PackedFormat::F16Tiles, n, k, bias, |dst| {
            let w16: Vec<f16> = w.to_dtype(DType::F16)?.flatten_all()?.to_vec1()?;
            layout::pack_f16_tiles_into(dst, &w16, n, k)
        })
    }

    /// Repack a ggml tensor of shape `(n, k)` into Q4_0 tiles on `dev` (Q4_0 only; other types are
    /// [`Placed::Cpu`] with a dtype reason).
    pub fn from_qtensor(
        dev: &HexagonDevice,
        q: &QTensor,
        bias: Option<&Tensor>,
    ) -> Result<Placed<Self>> {
        let (n, k) = q.shape().dims2()?;
        let weights = match q.dtype() {
            GgmlDType::Q4_0 => WeightFormat::Q4_0,
            other => WeightFormat::OtherQuant(format!("{other:?}").to_lowercase()),
        };
        let desc = OpDesc::Linear {
            weights,
            n,
            k,
            rows: 0,
            dtype: DType::F32,
        };
        Self::place(dev, &desc, PackedFormat::Q4_0Tiles, n, k, bias, |dst| {
            let data = q.data()?;
            layout::pack_q4_0_tiles_into(dst, &data, n, k)
        })
    }

    fn place(
        dev: &HexagonDevice,
        desc: &OpDesc,
        format: PackedFormat,
        n: usize,
        k: usize,
        bias: Option<&Tensor>,
        pack: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<Placed<Self>> {
        let kind = desc.kind();
        if let Some(b) = bias {
            if b.dims() != [n] {
                return Err(Error::input(
                    "HexLinear",
                    InputProblem::Shape {
                        what: "bias",
                        expected: vec![n],
                        found: b.dims().to_vec(),
                    },
                ));
            }
        }
        let reason = match dev.supports(desc) {
            Support::No(r) => r,
            Support::Yes(tier) => {
                let bytes = match format {
                    PackedFormat::F16Tiles => layout::f16_tiles_len(n, k),
                    PackedFormat::Q4_0Tiles => layout::q4_0_tiles_len(n, k),
                };
                let slots = dev.alloc_weights(bytes).and_then(|w| {
                    let b = match bias {
                        Some(_) => Some(dev.alloc_weights(n * 4)?),
                        None => None,
                    };
                    Ok((w, b))
                });
                match slots {
                    Ok((weight, bias_slot)) => {
                        weight.fill(pack)?;
                        if let (Some(slot), Some(b)) = (&bias_slot, bias) {
                            let v = to_f32_vec(b)?;
                            slot.fill(|dst| {
                                for (d, x) in dst.chunks_exact_mut(4).zip(&v) {
                                    d.copy_from_slice(&x.to_le_bytes());
                                }
                                Ok(())
                            })?;
                        }
                        dev.stats()
                            .record_placement(kind, Decision::Npu(tier), bytes as u64);
                        return Ok(Placed::Npu(HexLinear {
                            inner: Arc::new(Inner {
                                dev: dev.clone(),
                                format,
                                n,
                                k,
                                weight,
                                bias: bias_slot,
                                cpu: OnceLock::new(),
                            }),
                        }));
                    }
                    Err(e) => Reason::from_error(&e).ok_or(e)?,
                }
            }
        };
        dev.stats()
            .record_placement(kind, Decision::Cpu(reason.key()), 0);
        Ok(Placed::Cpu(reason))
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.inner.n, self.inner.k)
    }

    /// The packed layout.
    pub fn format(&self) -> PackedFormat {
        self.inner.format
    }

    /// True when a bias is applied.
    pub fn has_bias(&self) -> bool {
        self.inner.bias.is_some()
    }

    /// The packed weight bytes as the DSP sees them.
    pub fn packed(&self) -> Result<Vec<u8>> {
        self.inner.weight.bytes()
    }

    /// The weight unpacked from the NPU copy: `(n, k)` f16 for fp16 tiles; for Q4_0 tiles the
    /// dequantized values as f32 (bit-exact ggml blocks are in [`Self::q4_0_blocks`]).
    pub fn weight(&self) -> Result<Tensor> {
        let (n, k) = self.dims();
        let bytes = self.inner.weight.bytes()?;
        Ok(match self.inner.format {
            PackedFormat::F16Tiles => Tensor::from_vec(
                layout::unpack_f16_tiles(&bytes, n, k)?,
                (n, k),
                &Device::Cpu,
            )?,
            PackedFormat::Q4_0Tiles => self.qtensor()?.dequantize(&Device::Cpu)?,
        })
    }

    /// The ggml `block_q4_0` rows recovered from the Q4_0 tiles (Q4_0 layers only).
    pub fn q4_0_blocks(&self) -> Result<Vec<u8>> {
        if self.inner.format != PackedFormat::Q4_0Tiles {
            return Err(Error::input("HexLinear", InputProblem::NotQ4_0));
        }
        let (n, k) = self.dims();
        layout::unpack_q4_0_tiles(&self.inner.weight.bytes()?, n, k)
    }

    fn qtensor(&self) -> Result<QTensor> {
        let blocks = self.q4_0_blocks()?;
        let s = QStorage::from_data(Cow::Owned(blocks), &Device::Cpu, GgmlDType::Q4_0)?;
        Ok(QTensor::new(s, (self.inner.n, self.inner.k))?)
    }

    fn desc(&self, m: usize, dtype: DType) -> OpDesc {
        OpDesc::Linear {
            weights: match self.inner.format {
                PackedFormat::F16Tiles => WeightFormat::Dense(DType::F16),
                PackedFormat::Q4_0Tiles => WeightFormat::Q4_0,
            },
            n: self.inner.n,
            k: self.inner.k,
            rows: m,
            dtype,
        }
    }

    /// Apply to `x (..., k)`: on the NPU when routed, else [`Self::forward_cpu`].
    pub fn forward_hex(&self, x: &Tensor) -> Result<Tensor> {
        let (n, k) = self.dims();
        let dims = x.dims();
        if dims.last() != Some(&k) {
            return Err(Error::input(
                "HexLinear",
                InputProblem::Features {
                    found: dims.to_vec(),
                    features: k,
                },
            ));
        }
        let m = x.elem_count() / k;
        let (aw, ow) = self.wires(x.dtype());
        let mut plan = StagePlan::default();
        let a_off = plan.push(m * k * aw.size());
        let y_off = plan.push(m * n * ow.size());
        self.inner.dev.dispatch(
            &self.desc(m, x.dtype()),
            plan.total(),
            |buf| {
                let call = LinearCall {
                    lin: self,
                    buf,
                    a_off,
                    y_off,
                    aw,
                    ow,
                };
                Ok(x.contiguous()?.apply_op1_no_bwd(&call)?)
            },
            || self.forward_cpu(x),
        )
    }

    /// Activation and output wire types: Q4_0 takes f32 only; fp16 tiles keep f16 end to end.
    fn wires(&self, dt: DType) -> (Wire, Wire) {
        match (self.inner.format, dt) {
            (PackedFormat::F16Tiles, DType::F16) => (Wire::F16, Wire::F16),
            _ => (Wire::F32, Wire::F32),
        }
    }

    /// The CPU computation with the weights unpacked from the NPU copy (built once, on first use).
    pub fn forward_cpu(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = match self.inner.cpu.get() {
            Some(c) => c,
            None => {
                let w = match self.inner.format {
                    PackedFormat::F16Tiles => CpuWeights::Dense(self.weight()?),
                    PackedFormat::Q4_0Tiles => {
                        CpuWeights::Quant(QMatMul::from_qtensor(self.qtensor()?)?)
                    }
                };
                let b = match &self.inner.bias {
                    Some(slot) => {
                        let v: Vec<f32> = slot
                            .bytes()?
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect();
                        Some(Tensor::from_vec(v, self.inner.n, &Device::Cpu)?)
                    }
                    None => None,
                };
                let _ = self.inner.cpu.set((w, b));
                self.inner.cpu.get().expect("set above")
            }
        };
        let dt = x.dtype();
        let y = match w {
            CpuWeights::Dense(w) => {
                let k = self.inner.k;
                let m = x.elem_count() / k;
                let y = x.reshape((m, k))?.matmul(&w.to_dtype(dt)?.t()?)?;
                let mut out = x.dims().to_vec();
                *out.last_mut().expect("rank >= 1") = self.inner.n;
                y.reshape(out)?
            }
            CpuWeights::Quant(q) => q.forward(&x.to_dtype(DType::F32)?)?.to_dtype(dt)?,
        };
        Ok(match b {
            Some(b) => y.broadcast_add(&b.to_dtype(dt)?)?,
            None => y,
        })
    }
}

impl Module for HexLinear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Ok(self.forward_hex(x)?)
    }
}

/// Slow reference: `x W^T + b` in f64 from f32 values, returned as f32 `(m, n)` for `x (m, k)`.
pub fn linear_slow(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (n, k) = w.dims2()?;
    let xs = to_f32_vec(x)?;
    let ws = to_f32_vec(w)?;
    let bs = bias.map(to_f32_vec).transpose()?;
    let m = xs.len() / k;
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let acc: f64 = (0..k)
                .map(|t| xs[i * k + t] as f64 * ws[j * k + t] as f64)
                .sum();
            out[i * n + j] = (acc + bs.as_ref().map_or(0.0, |b| b[j] as f64)) as f32;
        }
    }
    Ok(Tensor::from_vec(out, (m, n), &Device::Cpu)?)
}

struct LinearCall<'a> {
    lin: &'a HexLinear,
    buf: &'a DeviceBuffer,
    a_off: usize,
    y_off: usize,
    aw: Wire,
    ow: Wire,
}

impl LinearCall<'_> {
    fn run(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let inner = &self.lin.inner;
        let (n, k) = (inner.n, inner.k);
        let m = l.shape().elem_count() / k;
        let bytes_in = stage_in(self.buf, self.a_off, s, l, self.aw, "HexLinear")?;
        let id = self.buf.id();
        let (opcode, wdtype, wlayout) = match inner.format {
            PackedFormat::F16Tiles => (
                KDSP_OP_MATMUL_F16,
                KDSP_DTYPE_F16,
                KDSP_LAYOUT_HMX_WEIGHT_TILES,
            ),
            PackedFormat::Q4_0Tiles => {
                (KDSP_OP_MATMUL_Q4_0, KDSP_DTYPE_Q4_0, KDSP_LAYOUT_Q4_0_TILES)
            }
        };
        let w = tiled(
            inner.weight.buf.id(),
            inner.weight.offset,
            wdtype,
            wlayout,
            k,
            n,
        );
        let matmul = |start: usize, r: usize| {
            let a = rows(
                id,
                self.a_off + start * k * self.aw.size(),
                self.aw,
                &[k, r],
            );
            let y = rows(
                id,
                self.y_off + start * n * self.ow.size(),
                self.ow,
                &[n, r],
            );
            (kdsp_op::new(opcode, y, &[w, a]), y)
        };
        let key = PlanKey {
            opcode,
            k: k as u32,
            n: n as u32,
            a_dtype: self.aw.kdsp(),
            d_dtype: self.ow.kdsp(),
        };
        let chunk = inner.dev.rows_per_op(key, m, |r| matmul(0, r).0)?;
        let mut batch = Batch::new();
        let mut start = 0;
        while start < m {
            let r = chunk.min(m - start);
            let (mm, y) = matmul(start, r);
            batch.push("linear matmul", mm);
            if let Some(b) = &inner.bias {
                let bt = rows(b.buf.id(), b.offset, Wire::F32, &[n, 1]);
                batch.push("linear bias", kdsp_op::new(KDSP_OP_ADD, y, &[y, bt]));
            }
            start += r;
        }
        inner.dev.execute(&batch)?;
        let out = stage_out(self.buf, self.y_off, m * n, self.ow, dtype_of(s))?;
        inner
            .dev
            .mem()
            .count_staged(bytes_in, m * n * self.ow.size());
        let mut dims = l.shape().dims().to_vec();
        *dims.last_mut().expect("rank >= 1") = n;
        Ok((out, Shape::from(dims)))
    }
}

impl CustomOp1 for LinearCall<'_> {
    fn name(&self) -> &'static str {
        "hexagon-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok(self.run(s, l)?)
    }
}
