//! FlashAttention on the NPU (`KDSP_OP_FLASH_ATTN`: online softmax, f16 K/V, GQA, an optional
//! additive mask), its CPU fallback and its slow reference.
//!
//! Layout convention is candle-nn's "bshd": `q (b, q_len, heads, d)`, `k, v (b, kv_len, kv_heads,
//! d)`, output `(b, q_len, heads, d)` — exactly the kernel's `{D, H, T}` row-major view, so no
//! transposes are needed on either side. Any key set works (a cached prefix plus the current
//! window, windows in the middle of the canvas, ...): attention is order-free without a mask.
//! Models that keep candle's usual `(b, heads, s, d)` layout use
//! [`crate::nn::flash_attn_bhsd`], which transposes in and out.
//!
//! Masking ([`AttnOptions`]):
//! - `mask` is additive (0 keeps a key, `-inf` drops it, finite values bias the score), shaped
//!   `(q_len, kv_len)` (shared by every batch item and head) or `(b or 1, heads or 1, q_len,
//!   kv_len)`, in f32, f16 or bf16;
//! - `causal` lets query `t` see the keys `0..=t + kv_len - q_len`: the queries are the *last*
//!   `q_len` of the `kv_len` positions (bottom-right aligned, a cached prefix followed by the
//!   current tokens; candle-nn's `AttnMask::causal_with_offset(kv_len - q_len)`; with
//!   `q_len == kv_len` the usual lower triangle). It needs `kv_len >= q_len`;
//! - both may be given: the causal mask is added to the explicit one;
//! - a query whose keys are all masked yields a zero row (kernel, CPU fallback and reference
//!   agree).
//!
//! Precision on the NPU path: K and V travel as fp16 (the kernel's K/V format); Q, the mask and
//! the output stay f32 unless they are f16; scores, softmax and accumulation are f32.

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Shape, Storage, Tensor};
use kernels_dsp::*;

use super::{dtype_of, rows, stage_in, stage_out, to_f32_vec, StagePlan, Wire};
use crate::device::HexagonDevice;
use crate::error::{Error, InputProblem, Result};
use crate::memory::DeviceBuffer;
use crate::routing::OpDesc;
use crate::transport::Batch;

/// Options of [`flash_attn_with`]: the score scale, an optional additive mask and a causal flag
/// (semantics in the [module docs](self)).
#[derive(Debug, Clone)]
pub struct AttnOptions {
    /// Score scale, usually `1 / sqrt(head_dim)`; must be finite.
    pub scale: f32,
    /// Additive mask `(q_len, kv_len)` or `(b or 1, heads or 1, q_len, kv_len)`.
    pub mask: Option<Tensor>,
    /// Query `t` sees keys `0..=t + kv_len - q_len` only.
    pub causal: bool,
}

impl AttnOptions {
    /// No mask, not causal.
    pub fn new(scale: f32) -> Self {
        AttnOptions {
            scale,
            mask: None,
            causal: false,
        }
    }

    /// The usual scale `1 / sqrt(head_dim)`, no mask, not causal.
    pub fn for_head_dim(head_dim: usize) -> Self {
        Self::new(1.0 / (head_dim.max(1) as f32).sqrt())
    }

    /// Set the causal flag.
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Set the additive mask.
    pub fn with_mask(mut self, mask: Tensor) -> Self {
        self.mask = Some(mask);
        self
    }
}

/// `softmax(scale * q k^T) v` per head without a mask: [`flash_attn_with`] with
/// [`AttnOptions::new`]`(scale)`.
pub fn flash_attn(
    dev: &HexagonDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
) -> Result<Tensor> {
    flash_attn_with(dev, q, k, v, &AttnOptions::new(scale))
}

/// `softmax(scale * q k^T + mask) v` per head (GQA: query head `i` reads key/value head
/// `i / (heads / kv_heads)`); on the NPU when routed (else [`flash_attn_cpu_with`]). Output
/// `(b, q_len, heads, d)` in `q`'s dtype.
pub fn flash_attn_with(
    dev: &HexagonDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOptions,
) -> Result<Tensor> {
    let dims = check_qkv(q, k, v, opts.scale)?;
    let plan_mask = effective_mask(opts, &dims)?;
    let qw = Wire::for_dtype(q.dtype());
    let mut plan = StagePlan::default();
    let q_off = plan.push(q.elem_count() * qw.size());
    let k_off = plan.push(k.elem_count() * 2);
    let v_off = plan.push(v.elem_count() * 2);
    let o_off = plan.push(q.elem_count() * qw.size());
    // The kernel takes one mask tensor: a causal-only call sends the triangle in f16 (0 and -inf
    // are exact there, at half the bytes of f32), built only when the call runs on the NPU.
    let m_at = match &plan_mask {
        MaskPlan::None => None,
        MaskPlan::Causal { .. } => Some((dims.nq * dims.nk, Wire::F16)),
        MaskPlan::Tensor(m) => Some((m.t.elem_count(), Wire::for_dtype(m.t.dtype()))),
    }
    .map(|(n, wire)| (plan.push(n * wire.size()), wire));
    let desc = OpDesc::FlashAttn {
        batch: dims.b,
        q_len: dims.nq,
        kv_len: dims.nk,
        q_heads: dims.h,
        kv_heads: dims.hkv,
        head_dim: dims.d,
        dtype: q.dtype(),
    };
    dev.dispatch(
        &desc,
        plan.total(),
        |buf| {
            let stage = |t: &Tensor, off, wire, mb, mh| -> Result<StagedMask> {
                let bytes = stage_tensor(buf, off, t, wire, "flash_attn mask")?;
                Ok(StagedMask {
                    off,
                    wire,
                    mb,
                    mh,
                    bytes,
                })
            };
            let mask = match (&plan_mask, m_at) {
                (MaskPlan::Causal { .. }, Some((off, wire))) => {
                    let t = causal_mask(dims.nq, dims.nk, DType::F16)?;
                    Some(stage(&t, off, wire, 1, 1)?)
                }
                (MaskPlan::Tensor(m), Some((off, wire))) => {
                    Some(stage(&m.t, off, wire, m.mb, m.mh)?)
                }
                _ => None,
            };
            let call = FlashAttnCall {
                dev,
                buf,
                offs: [q_off, k_off, v_off, o_off],
                wire: qw,
                dims,
                scale: opts.scale,
                mask,
            };
            Ok(q.contiguous()?
                .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &call)?)
        },
        || cpu_attn(q, k, v, opts.scale, &plan_mask, &dims),
    )
}

/// The CPU path a model runs without the NPU, without a mask: [`flash_attn_cpu_with`].
pub fn flash_attn_cpu(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    flash_attn_cpu_with(q, k, v, &AttnOptions::new(scale))
}

/// The CPU path a model runs without the NPU: candle-nn's CPU flash attention per batch item
/// (its lean B = 1 kernels: `AttnMask::Causal` for a causal-only call, `AttnMask::Mask` for a
/// mask shared by the heads, one call per head for a per-head mask), cast back to `q`'s dtype.
pub fn flash_attn_cpu_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOptions,
) -> Result<Tensor> {
    let dims = check_qkv(q, k, v, opts.scale)?;
    let plan = effective_mask(opts, &dims)?;
    cpu_attn(q, k, v, opts.scale, &plan, &dims)
}

/// The additive causal mask `(q_len, kv_len)` in `dtype`: 0 where key `j <= t + kv_len - q_len`,
/// `-inf` elsewhere. Needs `kv_len >= q_len` (the queries are the last `q_len` positions).
pub fn causal_mask(q_len: usize, kv_len: usize, dtype: DType) -> Result<Tensor> {
    if q_len > kv_len {
        return Err(Error::input(
            "causal_mask",
            InputProblem::CausalTooLong { q_len, kv_len },
        ));
    }
    let off = kv_len - q_len;
    let v: Vec<f32> = (0..q_len)
        .flat_map(|t| (0..kv_len).map(move |j| if j <= t + off { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Ok(Tensor::from_vec(v, (q_len, kv_len), &Device::Cpu)?.to_dtype(dtype)?)
}

/// Slow reference in f64 without a mask: [`attention_slow_with`].
pub fn attention_slow(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
    attention_slow_with(q, k, v, &AttnOptions::new(scale))
}

/// Slow reference in f64: the textbook `softmax(scale q k^T + mask) v` with GQA (query head `i`
/// reads key/value head `i / (heads / kv_heads)`), the causal rule applied by index, fully
/// masked rows zero; returned as f32 `(b, q_len, heads, d)`.
pub fn attention_slow_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttnOptions,
) -> Result<Tensor> {
    let Dims {
        b,
        nq,
        nk,
        h,
        hkv,
        d,
    } = check_qkv(q, k, v, opts.scale)?;
    if opts.causal && nq > nk {
        return Err(causal_too_long(nq, nk));
    }
    // The user's mask, indexed with broadcasting here rather than through `effective_mask`, so
    // the reference shares no mask code with the paths it checks.
    let mask = match &opts.mask {
        Some(m) => {
            let (mb, mh) = mask_extent(m, b, h, nq, nk)?;
            Some((to_f32_vec(m)?, mb, mh))
        }
        None => None,
    };
    let mask_at = |bi: usize, hi: usize, t: usize, j: usize| -> f64 {
        let causal = if opts.causal && j > t + (nk - nq) {
            f64::NEG_INFINITY
        } else {
            0.0
        };
        let add = mask.as_ref().map_or(0.0, |(m, mb, mh)| {
            let (bi, hi) = (if *mb == 1 { 0 } else { bi }, if *mh == 1 { 0 } else { hi });
            m[((bi * mh + hi) * nq + t) * nk + j] as f64
        });
        causal + add
    };
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
                    *pj = s * opts.scale as f64 + mask_at(bi, hi, t, j);
                    max = max.max(*pj);
                }
                if max == f64::NEG_INFINITY {
                    continue; // every key masked: the row stays zero
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
    Ok(Tensor::from_vec(out, q.shape(), &Device::Cpu)?)
}

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    nq: usize,
    nk: usize,
    h: usize,
    hkv: usize,
    d: usize,
}

fn invalid(problem: InputProblem) -> Error {
    Error::input("flash_attn", problem)
}

fn causal_too_long(nq: usize, nk: usize) -> Error {
    invalid(InputProblem::CausalTooLong {
        q_len: nq,
        kv_len: nk,
    })
}

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

fn check_qkv(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Dims> {
    let (b, nq, h, d) = q.dims4()?;
    let (kb, nk, hkv, kd) = k.dims4()?;
    if v.dims() != k.dims() || kb != b || kd != d || k.dtype() != v.dtype() {
        return Err(invalid(InputProblem::Qkv {
            q: q.dims().to_vec(),
            k: k.dims().to_vec(),
            v: v.dims().to_vec(),
        }));
    }
    if hkv == 0 || h % hkv != 0 {
        return Err(invalid(InputProblem::Heads {
            heads: h,
            kv_heads: hkv,
        }));
    }
    if !scale.is_finite() {
        return Err(invalid(InputProblem::Scale { value: scale }));
    }
    Ok(Dims {
        b,
        nq,
        nk,
        h,
        hkv,
        d,
    })
}

/// `(mb, mh)` of a mask of an allowed dtype and shape for these sizes.
fn mask_extent(m: &Tensor, b: usize, h: usize, nq: usize, nk: usize) -> Result<(usize, usize)> {
    if !matches!(m.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(invalid(InputProblem::DType {
            what: "mask",
            expected: FLOATS,
            found: m.dtype(),
        }));
    }
    match *m.dims() {
        [a, c] if a == nq && c == nk => Ok((1, 1)),
        [mb, mh, a, c] if (mb == 1 || mb == b) && (mh == 1 || mh == h) && a == nq && c == nk => {
            Ok((mb, mh))
        }
        _ => Err(invalid(InputProblem::Mask {
            found: m.dims().to_vec(),
            q_len: nq,
            kv_len: nk,
            batch: b,
            heads: h,
        })),
    }
}

/// A mask as applied: `(mb, mh, q_len, kv_len)`, contiguous, f16 or f32.
#[derive(Debug, Clone)]
struct Mask {
    t: Tensor,
    mb: usize,
    mh: usize,
}

/// What a call masks: nothing, the causal rule alone (which candle-nn's CPU kernel applies by
/// index) or a materialised additive mask (explicit, plus the causal rule when both are set).
#[derive(Debug, Clone)]
enum MaskPlan {
    None,
    Causal { kv_offset: usize },
    Tensor(Mask),
}

fn effective_mask(o: &AttnOptions, dims: &Dims) -> Result<MaskPlan> {
    let Dims { b, nq, nk, h, .. } = *dims;
    if o.causal && nq > nk {
        return Err(causal_too_long(nq, nk));
    }
    let Some(m) = &o.mask else {
        return Ok(if o.causal {
            MaskPlan::Causal { kv_offset: nk - nq }
        } else {
            MaskPlan::None
        });
    };
    let (mb, mh) = mask_extent(m, b, h, nq, nk)?;
    // f16 masks travel as f16; f32 and bf16 (which the kernel does not take) as f32.
    let dt = if m.dtype() == DType::F16 {
        DType::F16
    } else {
        DType::F32
    };
    let mut t = m.reshape((mb, mh, nq, nk))?.to_dtype(dt)?;
    if o.causal {
        t = t.broadcast_add(&causal_mask(nq, nk, dt)?)?;
    }
    Ok(MaskPlan::Tensor(Mask {
        t: t.contiguous()?,
        mb,
        mh,
    }))
}

/// One candle-nn CPU flash attention call on a B = 1 slice; returns `(1, heads, q_len, d)` f32.
fn cpu_one(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    mask: candle_nn::attention::AttnMask,
) -> Result<Tensor> {
    use candle_nn::attention::flash_attn as cpu_flash;
    Ok(match q.dtype() {
        DType::F32 => cpu_flash::<f32>(q, k, v, scale, mask, None, None)?,
        DType::F16 => cpu_flash::<half::f16>(q, k, v, scale, mask, None, None)?,
        DType::BF16 => cpu_flash::<half::bf16>(q, k, v, scale, mask, None, None)?,
        dt => {
            return Err(invalid(InputProblem::DType {
                what: "q",
                expected: FLOATS,
                found: dt,
            }))
        }
    })
}

fn cpu_attn(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    plan: &MaskPlan,
    dims: &Dims,
) -> Result<Tensor> {
    use candle_nn::attention::AttnMask;
    let mut outs = Vec::with_capacity(dims.b);
    for i in 0..dims.b {
        let (qi, ki, vi) = (q.narrow(0, i, 1)?, k.narrow(0, i, 1)?, v.narrow(0, i, 1)?);
        let o = match plan {
            MaskPlan::None => cpu_one(&qi, &ki, &vi, scale, AttnMask::None)?,
            MaskPlan::Causal { kv_offset } => cpu_one(
                &qi,
                &ki,
                &vi,
                scale,
                AttnMask::causal_with_offset(*kv_offset),
            )?,
            MaskPlan::Tensor(m) => {
                // candle-nn reads the mask as a flat (q_len, kv_len) slice of q's dtype.
                let mi =
                    m.t.get(if m.mb == 1 { 0 } else { i })?
                        .to_dtype(q.dtype())?;
                if m.mh == 1 {
                    let mask = AttnMask::Mask(mi.get(0)?.contiguous()?);
                    cpu_one(&qi, &ki, &vi, scale, mask)?
                } else {
                    // candle-nn's mask is shared by the heads: one call per head.
                    let g = dims.h / dims.hkv;
                    let heads = (0..dims.h)
                        .map(|j| {
                            let kv = |t: &Tensor| t.narrow(2, j / g, 1)?.contiguous();
                            let mask = AttnMask::Mask(mi.get(j)?.contiguous()?);
                            let qj = qi.narrow(2, j, 1)?.contiguous()?;
                            cpu_one(&qj, &kv(&ki)?, &kv(&vi)?, scale, mask)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Tensor::cat(&heads, 1)?
                }
            }
        };
        outs.push(o);
    }
    let o = if dims.b == 1 {
        outs.pop().expect("one batch item")
    } else {
        Tensor::cat(&outs, 0)?
    };
    // (b, h, s, d) -> (b, s, h, d). candle-nn accumulates and returns f32 whatever the input
    // dtype: the cast back reads the transposed view, so it is also the one re-layout copy.
    Ok(o.transpose(1, 2)?.to_dtype(q.dtype())?)
}

/// Copy a (contiguous, CPU) tensor into shared memory; returns the bytes written.
fn stage_tensor(
    buf: &DeviceBuffer,
    off: usize,
    t: &Tensor,
    wire: Wire,
    what: &'static str,
) -> Result<usize> {
    let (s, l) = t.storage_and_layout();
    if let Storage::Cpu(c) = &*s {
        stage_in(buf, off, c, l, wire, what)
    } else {
        Err(Error::input(
            what,
            InputProblem::NotOnCpu {
                location: t.device().location(),
            },
        ))
    }
}

/// A mask already copied into the staging buffer.
#[derive(Debug, Clone, Copy)]
struct StagedMask {
    off: usize,
    wire: Wire,
    mb: usize,
    mh: usize,
    bytes: usize,
}

struct FlashAttnCall<'a> {
    dev: &'a HexagonDevice,
    buf: &'a DeviceBuffer,
    offs: [usize; 4],
    wire: Wire,
    dims: Dims,
    scale: f32,
    mask: Option<StagedMask>,
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
            let Dims {
                b,
                nq,
                nk,
                h,
                hkv,
                d,
            } = self.dims;
            let [q_off, k_off, v_off, o_off] = self.offs;
            // K/V travel as f16: the kernel's K/V format (and half the bytes of a KV cache).
            let bytes_in = stage_in(self.buf, q_off, sq, lq, self.wire, "flash_attn q")?
                + stage_in(self.buf, k_off, sk, lk, Wire::F16, "flash_attn k")?
                + stage_in(self.buf, v_off, sv, lv, Wire::F16, "flash_attn v")?
                + self.mask.map_or(0, |m| m.bytes);
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
                let mut o = match self.mask {
                    None => kdsp_op::new(KDSP_OP_FLASH_ATTN, ot, &[qt, kt, vt]),
                    Some(m) => {
                        // A mask broadcast over the batch is staged once and read by every item.
                        let item = if m.mb == 1 { 0 } else { i };
                        let at = m.off + item * m.mh * nq * nk * m.wire.size();
                        let mt = rows(id, at, m.wire, &[nk, nq, m.mh]);
                        kdsp_op::new(KDSP_OP_FLASH_ATTN, ot, &[qt, kt, vt, mt])
                    }
                };
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
