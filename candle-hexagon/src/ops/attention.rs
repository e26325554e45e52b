//! Bidirectional FlashAttention on the NPU (`KDSP_OP_FLASH_ATTN`: online softmax, f16 K/V, GQA),
//! its CPU fallback and its slow reference.
//!
//! Layout convention is candle-nn's "bshd": `q (b, q_len, heads, d)`, `k, v (b, kv_len, kv_heads,
//! d)`, output `(b, q_len, heads, d)` — exactly the kernel's `{D, H, T}` row-major view, so no
//! transposes are needed on either side. Any key set works (a cached prefix plus the current
//! window, windows in the middle of the canvas, ...): attention is order-free without a mask.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};
use kernels_dsp::*;

use super::{dtype_of, rows, stage_in, stage_out, to_f32_vec, StagePlan, Wire};
use crate::device::HexagonDevice;
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use crate::routing::OpDesc;
use crate::transport::Batch;

/// `softmax(scale * q k^T) v` per head without a mask; on the NPU when routed (else
/// [`flash_attn_cpu`]). Output `(b, q_len, heads, d)` in `q`'s dtype.
pub fn flash_attn(
    dev: &HexagonDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
) -> Result<Tensor> {
    let (b, nq, h, d) = q.dims4()?;
    let (kb, nk, hkv, kd) = k.dims4()?;
    if v.dims() != k.dims() || kb != b || kd != d || k.dtype() != v.dtype() {
        return Err(Error::InvalidInput {
            op: "flash_attn",
            detail: format!(
                "q {:?}, k {:?}, v {:?} are not (b, s, h, d) with matching b, d and k/v shapes",
                q.dims(),
                k.dims(),
                v.dims()
            ),
        });
    }
    if !scale.is_finite() {
        return Err(Error::InvalidInput {
            op: "flash_attn",
            detail: format!("scale {scale} is not finite"),
        });
    }
    let qw = Wire::for_dtype(q.dtype());
    let mut plan = StagePlan::default();
    let q_off = plan.push(q.elem_count() * qw.size());
    let k_off = plan.push(k.elem_count() * 2);
    let v_off = plan.push(v.elem_count() * 2);
    let o_off = plan.push(q.elem_count() * qw.size());
    let desc = OpDesc::FlashAttn {
        batch: b,
        q_len: nq,
        kv_len: nk,
        q_heads: h,
        kv_heads: hkv,
        head_dim: d,
        dtype: q.dtype(),
    };
    dev.dispatch(
        &desc,
        plan.total(),
        |buf| {
            let call = FlashAttnCall {
                dev,
                buf,
                offs: [q_off, k_off, v_off, o_off],
                wire: qw,
                dims: (b, nq, nk, h, hkv, d),
                scale,
            };
            Ok(q.contiguous()?
                .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &call)?)
        },
        || flash_attn_cpu(q, k, v, scale),
    )
}

/// The CPU path a model runs without the NPU: candle-nn's CPU flash attention per batch item
/// (its lean B = 1 kernel), cast back to `q`'s dtype.
pub fn flash_attn_cpu(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    use candle_nn::attention::{flash_attn as cpu_flash, AttnMask};
    let b = q.dim(0)?;
    let mut outs = Vec::with_capacity(b);
    for i in 0..b {
        let (qi, ki, vi) = (q.narrow(0, i, 1)?, k.narrow(0, i, 1)?, v.narrow(0, i, 1)?);
        let o = match q.dtype() {
            DType::F32 => cpu_flash::<f32>(&qi, &ki, &vi, scale, AttnMask::None, None, None)?,
            DType::F16 => cpu_flash::<half::f16>(&qi, &ki, &vi, scale, AttnMask::None, None, None)?,
            DType::BF16 => {
                cpu_flash::<half::bf16>(&qi, &ki, &vi, scale, AttnMask::None, None, None)?
            }
            dt => {
                return Err(Error::InvalidInput {
                    op: "flash_attn",
                    detail: format!("{dt:?} (use f32, f16 or bf16)"),
                })
            }
        };
        outs.push(o);
    }
    let o = if b == 1 {
        outs.pop().expect("one batch item")
    } else {
        Tensor::cat(&outs, 0)?
    };
    // (b, h, s, d) -> (b, s, h, d). candle-nn accumulates and returns f32 whatever the input
    // dtype: the cast back reads the transposed view, so it is also the one re-layout copy.
    Ok(o.transpose(1, 2)?.to_dtype(q.dtype())?)
}

/// Slow reference in f64: the textbook `softmax(scale q k^T) v` with GQA (query head `i` reads
/// key/value head `i / (heads / kv_heads)`), returned as f32 `(b, q_len, heads, d)`.
pub fn attention_slow(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    let (b, nq, h, d) = q.dims4()?;
    let (_, nk, hkv, _) = k.dims4()?;
    let (qs, ks, vs) = (to_f32_vec(q)?, to_f32_vec(k)?, to_f32_vec(v)?);
    let g = h / hkv;
    let mut out = vec![0f32; qs.len()];
    let mut p = vec![0f64; nk];
    for bi in 0..b {
        for t in 0..nq {
            for hi in 0..h {
                let qrow = &qs[((bi * nq + t) * h + hi) * d..][..d];
                let kh = hi / g;
                let mut max = f64::NEG_INFINITY;
                for (j, pj) in p.iter_mut().enumerate() {
                    let krow = &ks[((bi * nk + j) * hkv + kh) * d..][..d];
                    let s: f64 = qrow
                        .iter()
                        .zip(krow)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    *pj = s * scale as f64;
                    max = max.max(*pj);
                }
                let mut z = 0.0;
                for pj in p.iter_mut() {
                    *pj = (*pj - max).exp();
                    z += *pj;
                }
                let o = &mut out[((bi * nq + t) * h + hi) * d..][..d];
                for (i, oi) in o.iter_mut().enumerate() {
                    let acc: f64 = (0..nk)
                        .map(|j| p[j] * vs[((bi * nk + j) * hkv + kh) * d + i] as f64)
                        .sum();
                    *oi = (acc / z) as f32;
                }
            }
        }
    }
    Ok(Tensor::from_vec(out, q.shape(), &candle_core::Device::Cpu)?)
}

struct FlashAttnCall<'a> {
    dev: &'a HexagonDevice,
    buf: &'a DeviceBuffer,
    offs: [usize; 4],
    wire: Wire,
    dims: (usize, usize, usize, usize, usize, usize),
    scale: f32,
}

impl CustomOp3 for FlashAttnCall<'_> {
    fn name(&self) -> &'static str {
        "hexagon-flash-attn"
    }

    fn cpu_fwd(
        &self,
        sq: &CpuStorage,
        lq: &Layout,
        sk: &CpuStorage,
        lk: &Layout,
        sv: &CpuStorage,
        lv: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let run = || -> Result<(CpuStorage, Shape)> {
            let (b, nq, nk, h, hkv, d) = self.dims;
            let [q_off, k_off, v_off, o_off] = self.offs;
            // K/V travel as f16: the kernel's K/V format (and half the bytes of a KV cache).
            let bytes_in = stage_in(self.buf, q_off, sq, lq, self.wire, "flash_attn q")?
                + stage_in(self.buf, k_off, sk, lk, Wire::F16, "flash_attn k")?
                + stage_in(self.buf, v_off, sv, lv, Wire::F16, "flash_attn v")?;
            let id = self.buf.id();
            let (q_item, kv_item) = (nq * h * d, nk * hkv * d);
            let mut batch = Batch::new();
            for i in 0..b {
                let qt = rows(
                    id,
                    q_off + i * q_item * self.wire.size(),
                    self.wire,
                    &[d, h, nq],
                );
                let ot = rows(
                    id,
                    o_off + i * q_item * self.wire.size(),
                    self.wire,
                    &[d, h, nq],
                );
                let kt = rows(id, k_off + i * kv_item * 2, Wire::F16, &[d, hkv, nk]);
                let vt = rows(id, v_off + i * kv_item * 2, Wire::F16, &[d, hkv, nk]);
                let mut o = kdsp_op::new(KDSP_OP_FLASH_ATTN, ot, &[qt, kt, vt]);
                o.params.attn.scale = self.scale;
                batch.push("flash_attn", o);
            }
            self.dev.execute(&batch)?;
            let n = b * q_item;
            let out = stage_out(self.buf, o_off, n, self.wire, dtype_of(sq))?;
            self.dev.mem().count_staged(bytes_in, n * self.wire.size());
            Ok((out, lq.shape().clone()))
        };
        Ok(run()?)
    }
}
