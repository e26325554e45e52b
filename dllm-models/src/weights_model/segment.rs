//! Attention over the sequence's position-major KV cache segments (plus a call's fresh rows) on
//! the CPU, and the copy of those segments into one key tensor for paths whose kernel needs it.

use candle_core::{DType, Device, Tensor};
use kernels_cpu::attention::{self as ka, AttnShape, KvSegment, Skip};

use super::TransformerWeights;
use crate::kv_cache::{with_cpu_slice, CachedRows, KvElem};
use crate::{Error, Result};

/// Head geometry of the cache for one call.
#[derive(Debug, Clone, Copy)]
pub(super) struct KvGeom {
    pub(super) batch: usize,
    pub(super) heads: usize,
    pub(super) hd: usize,
}

impl KvGeom {
    pub(super) fn of(w: &TransformerWeights, batch: usize) -> Self {
        KvGeom {
            batch,
            heads: w.cfg.num_kv_heads,
            hd: w.cfg.head_dim(),
        }
    }
    /// Elements of one position of one batch item.
    pub(super) fn row(&self) -> usize {
        self.heads * self.hd
    }
}

/// Fresh K/V rows in `(batch, rows, kv_heads, head_dim)` layout (not position-major).
struct FreshRows<'a, T> {
    k: &'a [T],
    v: &'a [T],
    rows: usize,
}

pub(super) fn segment_attention<T: KvElem>(
    q: &Tensor,
    segs: &[(CachedRows<'_, T>, usize, Skip<'_>)],
    kv: KvGeom,
    scale: f32,
) -> Result<Tensor> {
    segment_attention_with(q, segs, None, kv, scale)
}

/// [`segment_attention`] plus the fresh `k`/`v` `(b, rows, kv_heads, d)` of this call, taken in
/// the cache's element type (converted when they are not) and read in place.
pub(super) fn segment_attention_fresh<T: KvElem>(
    q: &Tensor,
    segs: &[(CachedRows<'_, T>, usize, Skip<'_>)],
    k: &Tensor,
    v: &Tensor,
    kv: KvGeom,
    scale: f32,
) -> Result<Tensor> {
    let rows = k.dim(1)?;
    let (k, v) = (k.to_dtype(T::DTYPE)?, v.to_dtype(T::DTYPE)?);
    with_cpu_slice::<T, _>(&k, |k| {
        with_cpu_slice::<T, _>(&v, |v| {
            segment_attention_with(q, segs, Some(FreshRows { k, v, rows }), kv, scale)
        })
    })
}

/// Attention of `q` `(b, nq, heads, d)` over position-major cache segments (each `(rows, rows
/// count, skip)`) plus optional fresh rows; returns `(b, nq, heads * d)` in `q`'s dtype.
fn segment_attention_with<T: KvElem>(
    q: &Tensor,
    segs: &[(CachedRows<'_, T>, usize, Skip<'_>)],
    fresh: Option<FreshRows<'_, T>>,
    kv: KvGeom,
    scale: f32,
) -> Result<Tensor> {
    match q.dtype() {
        DType::F32 => segment_attention_q::<f32, T>(q, segs, fresh, kv, scale),
        DType::F16 => segment_attention_q::<half::f16, T>(q, segs, fresh, kv, scale),
        DType::BF16 => segment_attention_q::<half::bf16, T>(q, segs, fresh, kv, scale),
        dtype => Err(Error::UnsupportedDtype {
            what: "attention",
            dtype,
        }),
    }
}

/// [`segment_attention_with`] with queries of element type `Q` (the compute dtype), read in
/// place, whatever the cache's element type: the output comes out in `Q`, with no conversion
/// of the queries or the output through the cache's type.
fn segment_attention_q<Q: ka::Element + candle_core::WithDType, T: KvElem>(
    q: &Tensor,
    segs: &[(CachedRows<'_, T>, usize, Skip<'_>)],
    fresh: Option<FreshRows<'_, T>>,
    kv: KvGeom,
    scale: f32,
) -> Result<Tensor> {
    let (b, nq, h, d) = q.dims4()?;
    let row = kv.row();
    let shape = AttnShape {
        q_rows: nq,
        heads: h,
        kv_heads: kv.heads,
        head_dim: d,
    };
    let per = nq * h * d;
    let mut out = vec![Q::ZERO; b * per];
    with_cpu_slice::<Q, _>(q, |qv| {
        for bi in 0..b {
            let mut list: Vec<KvSegment<'_, T>> = segs
                .iter()
                .map(|(c, rows, skip)| KvSegment {
                    k: c.k.get(bi * row..).unwrap_or(&[]),
                    v: c.v.get(bi * row..).unwrap_or(&[]),
                    rows: *rows,
                    row_stride: b * row,
                    skip: *skip,
                })
                .collect();
            if let Some(f) = &fresh {
                let off = bi * f.rows * row;
                list.push(KvSegment {
                    k: &f.k[off..],
                    v: &f.v[off..],
                    rows: f.rows,
                    row_stride: row,
                    skip: Skip::None,
                });
            }
            ka::attention(
                &qv[bi * per..(bi + 1) * per],
                &list,
                shape,
                scale,
                &mut out[bi * per..(bi + 1) * per],
            )?;
        }
        Ok(())
    })?;
    Ok(Tensor::from_vec(out, (b, nq, h * d), q.device())?)
}

/// The key/value set of `segs` plus the fresh `k`/`v` as `(b, rows, kv_heads, d)` tensors, for the
/// per-op NPU path whose kernel takes one key tensor (this copies the cache; the block-level path
/// does not).
pub(super) fn materialize<T: KvElem>(
    segs: &[(CachedRows<'_, T>, usize, Skip<'_>)],
    k: &Tensor,
    v: &Tensor,
    kv: KvGeom,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let mut ks = Vec::new();
    let mut vs = Vec::new();
    for (c, rows, skip) in segs {
        if *rows == 0 {
            continue;
        }
        let keep: Vec<u32> = (0..*rows)
            .filter(|r| match skip {
                Skip::None => true,
                Skip::Range { start, end } => !(*start..*end).contains(r),
                Skip::Sorted(s) => s.binary_search(r).is_err(),
            })
            .map(|r| r as u32)
            .collect();
        if keep.is_empty() {
            continue;
        }
        let shape = (*rows, kv.batch, kv.heads, kv.hd);
        let idx = Tensor::new(keep, device)?;
        let kt = Tensor::from_slice(&c.k[..rows * kv.batch * kv.row()], shape, device)?
            .index_select(&idx, 0)?
            .transpose(0, 1)?;
        let vt = Tensor::from_slice(&c.v[..rows * kv.batch * kv.row()], shape, device)?
            .index_select(&idx, 0)?
            .transpose(0, 1)?;
        ks.push(kt.to_dtype(k.dtype())?);
        vs.push(vt.to_dtype(v.dtype())?);
    }
    if ks.is_empty() {
        return Ok((k.clone(), v.clone()));
    }
    ks.push(k.clone());
    vs.push(v.clone());
    Ok((
        Tensor::cat(&ks, 1)?.contiguous()?,
        Tensor::cat(&vs, 1)?.contiguous()?,
    ))
}
