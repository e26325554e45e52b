//! Building blocks shared by LLaDA and Dream: linear layers over dense or GGUF-quantized weights,
//! embeddings, RMSNorm, NeoX ("rotate half") RoPE and bidirectional attention.
//!
//! Every op has two forms selected by [`OpMode`]: the fused CPU kernels candle ships for inference
//! (`rms_norm`, `rope_thd`, CPU flash attention), and differentiable compositions for training
//! (candle's fused ops have no backward pass).
//!
//! With [`Backend::Hexagon`] the fused forms run on the Hexagon NPU through `candle-hexagon`:
//! linear layers own weights packed into NPU memory at load time ([`Linear::Hex`]), and RMSNorm,
//! RoPE, attention and SwiGLU call the device's custom ops, which route each call (and fall back
//! to the same CPU kernels when the device does not take it). Tensors stay on `Device::Cpu`.

use std::sync::{Arc, RwLock};

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};
use candle_hexagon::{HexLinear, HexagonDevice, Placed};

use crate::Result;

/// Where the fused inference ops run.
#[derive(Debug, Clone, Default)]
pub enum Backend {
    /// candle's CPU kernels.
    #[default]
    Cpu,
    /// The Hexagon NPU (emulated DSP or FastRPC), with CPU fallback per op.
    Hexagon(HexagonDevice),
}

impl Backend {
    /// The Hexagon device, when that is the backend.
    pub fn hexagon(&self) -> Option<&HexagonDevice> {
        match self {
            Backend::Cpu => None,
            Backend::Hexagon(d) => Some(d),
        }
    }
}

/// Which implementation of the fused ops a model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpMode {
    /// candle's fused CPU kernels (no backward pass): inference.
    #[default]
    Fused,
    /// Differentiable compositions of primitive ops: training.
    Differentiable,
}

/// A weight as it comes out of a checkpoint.
#[derive(Debug, Clone)]
pub enum Param {
    /// A dense tensor already in the compute dtype.
    Dense(Tensor),
    /// A GGUF-quantized tensor (row-major `(rows, cols)`).
    Quant(Arc<QTensor>),
}

/// `y = x W^T (+ b)` over dense or quantized weights.
#[derive(Debug, Clone)]
pub enum Linear {
    /// Dense weight in the compute dtype.
    Dense {
        /// Weight `(out, in)` as in the checkpoint, or `(in, out)` contiguous when `transposed`.
        weight: Tensor,
        /// Stored as `(in, out)`: candle's gemm runs 1.2-2x faster on a contiguous right-hand
        /// side than on a transposed view, so inference models store weights this way (training
        /// keeps the checkpoint layout: its weights are variables being updated).
        transposed: bool,
        /// Optional bias `(out)`.
        bias: Option<Tensor>,
    },
    /// Weights packed in Hexagon NPU memory (fp16 HMX tiles or Q4_0 tiles), bias included.
    Hex(HexLinear),
    /// Quantized weight; activations are converted to f32 for the quantized matmul.
    Quant {
        /// The quantized matmul (quantizes activations to Q8_0 for Q4_0/Q8_0 weights).
        weight: QMatMul,
        /// Optional bias `(out)`.
        bias: Option<Tensor>,
        /// Output features.
        out_dim: usize,
        /// Input features.
        in_dim: usize,
    },
}

impl Linear {
    /// Build from a checkpoint parameter.
    pub fn new(weight: Param, bias: Option<Tensor>) -> Result<Self> {
        Ok(match weight {
            Param::Dense(weight) => Linear::Dense {
                weight,
                transposed: false,
                bias,
            },
            Param::Quant(q) => {
                let (out_dim, in_dim) = q.shape().dims2()?;
                Linear::Quant {
                    weight: QMatMul::from_arc(q)?,
                    bias,
                    out_dim,
                    in_dim,
                }
            }
        })
    }

    /// Build from a checkpoint parameter on `backend`: on the Hexagon NPU when the device takes
    /// the weights (dense -> fp16 tiles, Q4_0 -> Q4_0 tiles), otherwise exactly [`Linear::new`]
    /// (the device counts the decision and its reason).
    pub fn on_backend(weight: Param, bias: Option<Tensor>, backend: &Backend) -> Result<Self> {
        let Some(dev) = backend.hexagon() else {
            return Linear::new(weight, bias);
        };
        let placed = match &weight {
            Param::Dense(t) => HexLinear::from_dense(dev, t, bias.as_ref())?,
            Param::Quant(q) => HexLinear::from_qtensor(dev, q, bias.as_ref())?,
        };
        match placed {
            Placed::Npu(h) => Ok(Linear::Hex(h)),
            Placed::Cpu(_) => Linear::new(weight, bias),
        }
    }

    /// Store a dense weight as `(in, out)` contiguous for inference (no-op for other kinds).
    pub fn for_inference(self) -> Result<Self> {
        Ok(match self {
            Linear::Dense {
                weight,
                transposed: false,
                bias,
            } => Linear::Dense {
                weight: weight.t()?.contiguous()?,
                transposed: true,
                bias,
            },
            other => other,
        })
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Linear::Dense {
                weight, transposed, ..
            } => {
                let d = weight.dims();
                if *transposed {
                    (d[1], d[0])
                } else {
                    (d[0], d[1])
                }
            }
            Linear::Hex(h) => h.dims(),
            Linear::Quant {
                out_dim, in_dim, ..
            } => (*out_dim, *in_dim),
        }
    }

    /// Apply to `x` of shape `(..., in)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match self {
            Linear::Dense {
                weight, transposed, ..
            } => {
                let dims = x.dims().to_vec();
                let k = dims[dims.len() - 1];
                let rows: usize = dims[..dims.len() - 1].iter().product();
                let x2 = x.reshape((rows, k))?;
                let y = if *transposed {
                    x2.matmul(weight)?
                } else {
                    x2.matmul(&weight.t()?)?
                };
                let mut out = dims.clone();
                *out.last_mut().expect("rank >= 1") = self.dims().0;
                y.reshape(out)?
            }
            Linear::Quant { weight, .. } => {
                let dt = x.dtype();
                weight.forward(&x.to_dtype(DType::F32)?)?.to_dtype(dt)?
            }
            // The bias is applied on the NPU in the same batch.
            Linear::Hex(h) => return Ok(h.forward_hex(x)?),
        };
        match self.bias() {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        }
    }

    fn bias(&self) -> Option<&Tensor> {
        match self {
            Linear::Dense { bias, .. } | Linear::Quant { bias, .. } => bias.as_ref(),
            Linear::Hex(_) => None,
        }
    }
}

/// Token embedding over a dense or quantized table; quantized tables are gathered row by row and
/// never dequantized whole.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Param,
    dtype: DType,
}

impl Embedding {
    /// Wrap a `(vocab, hidden)` table; outputs are produced in `dtype`.
    pub fn new(table: Param, dtype: DType) -> Self {
        Self { table, dtype }
    }

    /// Rows of the table.
    pub fn rows(&self) -> Result<usize> {
        Ok(match &self.table {
            Param::Dense(t) => t.dim(0)?,
            Param::Quant(q) => q.shape().dims2()?.0,
        })
    }

    /// `(b, n)` ids to `(b, n, hidden)`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, n) = ids.dims2()?;
        match &self.table {
            Param::Dense(t) => {
                let flat = ids.flatten_all()?;
                Ok(t.index_select(&flat, 0)?.reshape((b, n, ()))?)
            }
            Param::Quant(q) => Ok(q.embedding(ids)?.to_dtype(self.dtype)?),
        }
    }
}

/// RMSNorm `x * rsqrt(mean(x^2) + eps) * w`, normalised in f32.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
    backend: Backend,
}

impl RmsNorm {
    /// Wrap a `(hidden)` weight.
    pub fn new(weight: Tensor, eps: f32) -> Self {
        Self::on_backend(weight, eps, &Backend::Cpu)
    }

    /// Wrap a `(hidden)` weight; the fused form runs on `backend`.
    pub fn on_backend(weight: Tensor, eps: f32, backend: &Backend) -> Self {
        Self {
            weight,
            eps,
            backend: backend.clone(),
        }
    }

    /// Normalise the last dimension.
    pub fn forward(&self, x: &Tensor, mode: OpMode) -> Result<Tensor> {
        Ok(match (mode, &self.backend) {
            (OpMode::Fused, Backend::Cpu) => {
                candle_hexagon::ops::norm::rms_norm_cpu(x, &self.weight, self.eps)?
            }
            (OpMode::Fused, Backend::Hexagon(d)) => {
                candle_hexagon::ops::rms_norm(d, x, &self.weight, self.eps)?
            }
            (OpMode::Differentiable, _) => {
                candle_nn::ops::rms_norm_slow(x, &self.weight, self.eps)?
            }
        })
    }
}

/// `silu(gate) * up`, on `backend` in the fused form.
pub fn swiglu(gate: &Tensor, up: &Tensor, mode: OpMode, backend: &Backend) -> Result<Tensor> {
    match (mode, backend) {
        (OpMode::Fused, Backend::Hexagon(d)) => Ok(candle_hexagon::ops::swiglu(d, gate, up)?),
        _ => Ok((candle_nn::ops::silu(gate)? * up)?),
    }
}

/// NeoX / HF `rotate_half` rotary embedding tables, grown on demand.
#[derive(Debug)]
pub struct Rope {
    theta: f64,
    head_dim: usize,
    dtype: DType,
    device: Device,
    tables: RwLock<(Tensor, Tensor)>,
}

impl Rope {
    /// Tables for `head_dim` (even) with base `theta`, pre-built for `initial` positions.
    pub fn new(
        theta: f64,
        head_dim: usize,
        initial: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let tables = Self::build(theta, head_dim, initial.max(1), dtype, device)?;
        Ok(Self {
            theta,
            head_dim,
            dtype,
            device: device.clone(),
            tables: RwLock::new(tables),
        })
    }

    fn build(
        theta: f64,
        head_dim: usize,
        n: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in 0..n {
            for i in 0..half {
                let inv_freq = theta.powf(-(2.0 * i as f64) / head_dim as f64);
                let a = p as f64 * inv_freq;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let cos = Tensor::from_vec(cos, (n, half), device)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (n, half), device)?.to_dtype(dtype)?;
        Ok((cos, sin))
    }

    fn ensure(&self, n: usize) -> Result<()> {
        let have = self.tables.read().expect("rope lock").0.dim(0)?;
        if have < n {
            let grown = Self::build(
                self.theta,
                self.head_dim,
                n.next_power_of_two(),
                self.dtype,
                &self.device,
            )?;
            *self.tables.write().expect("rope lock") = grown;
        }
        Ok(())
    }

    /// `(cos, sin)` of shape `(n, head_dim / 2)` for positions `start..start + n`.
    pub fn range(&self, start: usize, n: usize) -> Result<(Tensor, Tensor)> {
        self.ensure(start + n)?;
        let t = self.tables.read().expect("rope lock");
        Ok((t.0.narrow(0, start, n)?, t.1.narrow(0, start, n)?))
    }

    /// `(cos, sin)` for arbitrary positions.
    pub fn gather(&self, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let max = positions.iter().copied().max().unwrap_or(0);
        self.ensure(max + 1)?;
        let idx: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let idx = Tensor::new(idx, &self.device)?;
        let t = self.tables.read().expect("rope lock");
        Ok((t.0.index_select(&idx, 0)?, t.1.index_select(&idx, 0)?))
    }

    /// Rotate `x` of shape `(b, n, heads, head_dim)` with per-row tables `(n, head_dim / 2)`.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor, mode: OpMode) -> Result<Tensor> {
        Self::apply_on(x, cos, sin, mode, &Backend::Cpu)
    }

    /// [`Rope::apply`] with the fused form on `backend`.
    pub fn apply_on(
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mode: OpMode,
        backend: &Backend,
    ) -> Result<Tensor> {
        match (mode, backend) {
            (OpMode::Fused, Backend::Hexagon(d)) => Ok(candle_hexagon::ops::rope(d, x, cos, sin)?),
            (OpMode::Fused, Backend::Cpu) => {
                Ok(candle_hexagon::ops::elementwise::rope_cpu(x, cos, sin)?)
            }
            (OpMode::Differentiable, _) => {
                let (_, n, _, d) = x.dims4()?;
                let cos = Tensor::cat(&[cos, cos], D::Minus1)?.reshape((1, n, 1, d))?;
                let sin = Tensor::cat(&[sin, sin], D::Minus1)?.reshape((1, n, 1, d))?;
                let x1 = x.narrow(D::Minus1, 0, d / 2)?;
                let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
                let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
                Ok((x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?)
            }
        }
    }
}

/// Bidirectional multi-head attention. `q`: `(b, nq, heads, d)`, `k`/`v`: `(b, nk, kv_heads, d)`;
/// returns `(b, nq, heads * d)`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, mode: OpMode) -> Result<Tensor> {
    attention_on(q, k, v, scale, mode, &Backend::Cpu)
}

/// [`attention`] with the fused form on `backend`.
pub fn attention_on(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    mode: OpMode,
    backend: &Backend,
) -> Result<Tensor> {
    let (b, nq, h, d) = q.dims4()?;
    let out = match (mode, backend) {
        (OpMode::Fused, Backend::Hexagon(dev)) => {
            // (b, nq, h, d): the NPU kernel returns bshd directly (candle-nn's CPU kernel returns bhsd).
            candle_hexagon::ops::flash_attn(dev, q, k, v, scale)?
        }
        (mode, _) => attention_cpu(q, k, v, scale, mode)?,
    };
    Ok(out.reshape((b, nq, h * d))?)
}

fn attention_cpu(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, mode: OpMode) -> Result<Tensor> {
    let h = q.dim(2)?;
    let out = match mode {
        // The same CPU path the Hexagon backend falls back to (candle-nn's flash attention).
        OpMode::Fused => candle_hexagon::ops::attention::flash_attn_cpu(q, k, v, scale)?,
        OpMode::Differentiable => {
            let hkv = k.dim(2)?;
            let rep = h / hkv;
            let qt = q.transpose(1, 2)?.contiguous()?;
            let expand = |t: &Tensor| -> Result<Tensor> {
                let (b, n, _, d) = t.dims4()?;
                let t = t.transpose(1, 2)?;
                Ok(if rep == 1 {
                    t.contiguous()?
                } else {
                    t.unsqueeze(2)?
                        .expand((b, hkv, rep, n, d))?
                        .reshape((b, h, n, d))?
                })
            };
            let kt = expand(k)?;
            let vt = expand(v)?;
            let scores = (qt.matmul(&kt.t()?)? * scale as f64)?;
            let p = candle_nn::ops::softmax(&scores, D::Minus1)?;
            p.matmul(&vt)?.transpose(1, 2)?
        }
    };
    Ok(out)
}
