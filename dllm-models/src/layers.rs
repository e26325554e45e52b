//! Building blocks shared by LLaDA and Dream: RMSNorm, NeoX ("rotate half") RoPE, SwiGLU and
//! bidirectional attention; the weight-owning layers ([`Linear`], [`Embedding`]) live in
//! [`crate::linear`] and are re-exported here, where the model code has always found them.
//!
//! Every op has two forms selected by [`OpMode`]: fused CPU kernels for inference
//! (kernels-cpu's attention, SwiGLU, residual add, RoPE and RMSNorm — the last two with the bits
//! of candle's `rope_thd` and `rms_norm`, which serve the other dtypes — split over the model's
//! pool), and differentiable compositions for training (fused ops have no backward pass).
//!
//! With [`Backend::Hexagon`] the fused forms run on the Hexagon NPU through `candle-hexagon`:
//! linear layers own weights packed into NPU memory at load time ([`Linear::Hex`]); on the CPU
//! they own weights packed for `kernels-cpu` ([`Linear::Cpu`]). RMSNorm,
//! RoPE, attention and SwiGLU call the device's custom ops, which route each call (and fall back
//! to the same CPU kernels when the device does not take it). Tensors stay on `Device::Cpu`.

use std::sync::RwLock;

use candle_core::{DType, Device, Tensor, D};

pub use crate::backend::HexagonDevice;

pub use crate::linear::{CpuLinear, CpuLinears, Embedding, Linear, Param};
use crate::Result;

pub use crate::backend::Backend;

/// Which implementation of the fused ops a model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpMode {
    /// candle's fused CPU kernels (no backward pass): inference.
    #[default]
    Fused,
    /// Differentiable compositions of primitive ops: training.
    Differentiable,
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
                let x = x.contiguous()?;
                match cpu_rms_norm(&x, &self.weight, self.eps)? {
                    Some(t) => t,
                    None => candle_nn::ops::rms_norm(&x, &self.weight, self.eps)?,
                }
            }
            #[cfg(feature = "hexagon")]
            (OpMode::Fused, Backend::Hexagon(d)) => {
                candle_hexagon::ops::rms_norm(d, x, &self.weight, self.eps)?
            }
            #[cfg(not(feature = "hexagon"))]
            (OpMode::Fused, Backend::Hexagon(d)) => match *d {},
            (OpMode::Differentiable, _) => {
                candle_nn::ops::rms_norm_slow(x, &self.weight, self.eps)?
            }
        })
    }
}

/// `silu(gate) * up`, on `backend` in the fused form.
pub fn swiglu(gate: &Tensor, up: &Tensor, mode: OpMode, backend: &Backend) -> Result<Tensor> {
    match (mode, backend) {
        #[cfg(feature = "hexagon")]
        (OpMode::Fused, Backend::Hexagon(d)) => Ok(candle_hexagon::ops::swiglu(d, gate, up)?),
        (OpMode::Fused, _) => match cpu_pointwise(gate, up, kernels_cpu::pointwise::swiglu)? {
            Some(t) => Ok(t),
            None => Ok((candle_nn::ops::silu(gate)? * up)?),
        },
        _ => Ok((candle_nn::ops::silu(gate)? * up)?),
    }
}

/// `a + b` in the fused form: kernels-cpu's parallel add for f32 CPU tensors of one shape,
/// candle's otherwise (and for training).
pub fn add(a: &Tensor, b: &Tensor, mode: OpMode) -> Result<Tensor> {
    if mode == OpMode::Fused {
        if let Some(t) = cpu_pointwise(a, b, kernels_cpu::pointwise::add)? {
            return Ok(t);
        }
    }
    Ok((a + b)?)
}

/// A kernels-cpu element-wise op of two inputs into an output of the same length.
type PointwiseOp = fn(&[f32], &[f32], &mut [f32]) -> kernels_cpu::Result<()>;

/// `f` over the f32 contents of `ts`, read in place (each tensor's storage locked for reading
/// while `f` runs); `None` when any of them is not a contiguous f32 CPU tensor (the callers then
/// use candle's op).
fn with_f32_slices<R>(ts: &[&Tensor], f: impl FnOnce(&[&[f32]]) -> Result<R>) -> Result<Option<R>> {
    use candle_core::{CpuStorage, Storage};
    if ts.iter().any(|t| t.dtype() != DType::F32) {
        return Ok(None);
    }
    let held: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let mut slices = Vec::with_capacity(ts.len());
    for (storage, layout) in &held {
        let (Storage::Cpu(CpuStorage::F32(v)), Some((o0, o1))) =
            (&**storage, layout.contiguous_offsets())
        else {
            return Ok(None);
        };
        slices.push(&v[o0..o1]);
    }
    f(&slices).map(Some)
}

/// `op` over two contiguous f32 CPU tensors of one shape, read in place, on the current rayon
/// pool; `None` for anything else (the caller uses candle's op).
fn cpu_pointwise(a: &Tensor, b: &Tensor, op: PointwiseOp) -> Result<Option<Tensor>> {
    if a.shape() != b.shape() {
        return Ok(None);
    }
    let out = with_f32_slices(&[a, b], |v| {
        let mut out = vec![0f32; v[0].len()];
        op(v[0], v[1], &mut out)?;
        Ok(out)
    })?;
    out.map(|o| Ok(Tensor::from_vec(o, a.shape(), a.device())?))
        .transpose()
}

/// kernels-cpu's RMSNorm of the last dimension of `x` by a `(hidden)` weight, for contiguous
/// f32 CPU tensors, read in place: candle's `rms_norm` bits with eight rows' sums of squares at
/// a time (candle's loop waits on each add of one row's sum). `None` for anything else.
fn cpu_rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Option<Tensor>> {
    if w.rank() != 1 || x.rank() == 0 || x.dims().last() != Some(&w.dim(0)?) {
        return Ok(None);
    }
    let out = with_f32_slices(&[x, w], |v| {
        let mut out = vec![0f32; v[0].len()];
        kernels_cpu::pointwise::rms_norm(v[0], v[1], eps, &mut out)?;
        Ok(out)
    })?;
    out.map(|o| Ok(Tensor::from_vec(o, x.shape(), x.device())?))
        .transpose()
}

/// kernels-cpu's rotary embedding of `x` `(b, t, heads, d)` with tables `(t, d / 2)` (or one per
/// batch, `(b, t, d / 2)`), for contiguous f32 CPU tensors, read in place: candle's `rope_thd`
/// bits, vectorised and on the current rayon pool. `None` for anything else (the caller uses
/// candle's op).
fn cpu_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Option<Tensor>> {
    let Ok((b, _, heads, d)) = x.dims4() else {
        return Ok(None);
    };
    if cos.shape() != sin.shape() {
        return Ok(None);
    }
    let per_batch = cos.rank() == 3;
    let out = with_f32_slices(&[x, cos, sin], |v| {
        let (xv, cv, sv) = (v[0], v[1], v[2]);
        let mut out = vec![0f32; xv.len()];
        let per_x = xv.len() / b.max(1);
        let per_cs = if per_batch {
            cv.len() / b.max(1)
        } else {
            cv.len()
        };
        for i in 0..b {
            let cs = if per_batch {
                i * per_cs..(i + 1) * per_cs
            } else {
                0..per_cs
            };
            kernels_cpu::pointwise::rope(
                &xv[i * per_x..(i + 1) * per_x],
                &cv[cs.clone()],
                &sv[cs],
                heads,
                d,
                &mut out[i * per_x..(i + 1) * per_x],
            )?;
        }
        Ok(out)
    })?;
    out.map(|o| Ok(Tensor::from_vec(o, x.shape(), x.device())?))
        .transpose()
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

    /// `(cos, sin)` tables `(n, head_dim / 2)` for positions `0..n`: `theta^(-2i/d)` and the
    /// angle in f64, rounded once to f32, then to `dtype`.
    pub(crate) fn build(
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
            #[cfg(feature = "hexagon")]
            (OpMode::Fused, Backend::Hexagon(d)) => Ok(candle_hexagon::ops::rope(d, x, cos, sin)?),
            #[cfg(not(feature = "hexagon"))]
            (OpMode::Fused, Backend::Hexagon(d)) => match *d {},
            (OpMode::Fused, Backend::Cpu) => match cpu_rope(x, cos, sin)? {
                Some(t) => Ok(t),
                None => Ok(candle_nn::rotary_emb::rope_thd(
                    &x.contiguous()?,
                    &cos.contiguous()?,
                    &sin.contiguous()?,
                )?),
            },
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
        #[cfg(feature = "hexagon")]
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
        OpMode::Fused => flash_attn_cpu(q, k, v, scale)?,
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

/// candle-nn's CPU flash attention per batch item (its lean B = 1 kernel), `(b, nq, h, d)` in and
/// out, cast back to `q`'s dtype. The Hexagon backend's CPU fallback is the same kernel
/// (`candle_hexagon::ops::attention::flash_attn_cpu`), so a model computes the same on either
/// backend when the device declines an op; this copy exists so the crate builds without it.
fn flash_attn_cpu(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    use candle_nn::attention::{flash_attn as cpu_flash, AttnMask};
    let mut outs = Vec::with_capacity(q.dim(0)?);
    for i in 0..q.dim(0)? {
        let (qi, ki, vi) = (q.narrow(0, i, 1)?, k.narrow(0, i, 1)?, v.narrow(0, i, 1)?);
        outs.push(match q.dtype() {
            DType::F32 => cpu_flash::<f32>(&qi, &ki, &vi, scale, AttnMask::None, None, None)?,
            DType::F16 => cpu_flash::<half::f16>(&qi, &ki, &vi, scale, AttnMask::None, None, None)?,
            DType::BF16 => {
                cpu_flash::<half::bf16>(&qi, &ki, &vi, scale, AttnMask::None, None, None)?
            }
            dt => {
                return Err(crate::Error::UnsupportedDtype {
                    what: "attention",
                    dtype: dt,
                })
            }
        });
    }
    let o = if outs.len() == 1 {
        outs.pop().expect("one batch item")
    } else {
        Tensor::cat(&outs, 0)?
    };
    // (b, h, s, d) -> (b, s, h, d); the cast back reads the transposed view (one copy).
    Ok(o.transpose(1, 2)?.to_dtype(q.dtype())?)
}
