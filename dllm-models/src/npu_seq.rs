//! One sequence on the NPU's block-level module: the forward submits one DSP batch per block
//! against a KV cache resident in device memory ([`DeviceKv`], fp16), and a sparse refresh runs on
//! the CPU while those batches run — reading the cached rows the NPU only appends after (the
//! device's leases allow exactly that) — and is returned for a merge at the step boundary.

use std::ops::Range;
use std::time::Instant;

use candle_core::{DType, Tensor};
use candle_hexagon::{DeviceKv, ForwardOutput, HexTransformer};
use half::f16;

use crate::kv_cache::{CachedRows, KvRows};
use crate::lm::{DualPathTiming, Refresh, RefreshRequest, Rows, SequenceToken};
use crate::weights_model::TransformerWeights;
use crate::{CanvasDefect, PositionDefect, Result};

/// The device rows the window protocol of [`crate::kv_cache`] runs over.
impl KvRows for DeviceKv {
    fn len(&self) -> usize {
        DeviceKv::len(self)
    }

    fn capacity(&self) -> usize {
        DeviceKv::capacity(self)
    }

    fn batch(&self) -> usize {
        DeviceKv::batch(self)
    }

    fn move_rows(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        Ok(DeviceKv::move_rows(self, src, dst, n)?)
    }

    fn set_len(&mut self, len: usize) -> Result<()> {
        Ok(DeviceKv::set_len(self, len)?)
    }
}

/// Rows the device cache is created with beyond the first need (it grows geometrically after).
const INITIAL_SLACK: usize = 64;

/// The device cache of a sequence, created at the first forward (when the batch is known).
pub(crate) fn ensure_kv<'a>(
    hex: &HexTransformer,
    kv: &'a mut Option<DeviceKv>,
    batch: usize,
    rows: usize,
) -> Result<&'a mut DeviceKv> {
    let stale = match kv {
        Some(k) => k.batch() != batch && k.is_empty(),
        None => true,
    };
    if stale {
        *kv = Some(hex.new_kv(batch, rows + INITIAL_SLACK)?);
    }
    let k = kv.as_mut().expect("created above");
    if k.batch() != batch {
        return Err(CanvasDefect::BatchMismatch {
            batch,
            cached: k.batch(),
        }
        .into());
    }
    Ok(k)
}

/// The window forward of [`crate::DiffusionLm::forward`] on the NPU, with an optional refresh on
/// the CPU beside it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    w: &TransformerWeights,
    hex: &HexTransformer,
    kv: &mut DeviceKv,
    token: SequenceToken,
    canvas: &Tensor,
    window: Range<usize>,
    rows: Rows<'_>,
    refresh: Option<RefreshRequest<'_>>,
) -> Result<(Tensor, Option<Refresh>)> {
    let rows = w.window_rows(rows, window)?;
    let (ws, n) = (rows.ws, rows.n);
    let x = w.embed(&canvas.narrow(1, ws, n)?)?.to_dtype(DType::F32)?;
    let t0 = Instant::now();
    let handle = hex.submit(kv, &x, ws, rows.hidden_rows.as_deref())?;
    // The DSP runs the blocks; the CPU computes the refresh meanwhile.
    let refreshed = match refresh {
        None => None,
        Some(r) => {
            let t = Instant::now();
            let res = r.run_with(
                canvas,
                |c, p, l| refresh_on_cpu(w, kv, token, c, p, l),
                |c, p| rescore_on_cpu(w, kv, c, p),
            )?;
            Some((res, (t, Instant::now())))
        }
    };
    let out = handle.wait()?;
    let forward = (t0, Instant::now());
    let logits = match hex.output() {
        ForwardOutput::Complete => out,
        // The tail stopped before the head's matmul (its weights stay on the CPU).
        ForwardOutput::BeforeTailNode(_) => w.head_only(&out)?,
    };
    let refreshed = refreshed.map(|(mut r, refresh)| {
        r.timing = Some(DualPathTiming { forward, refresh });
        r
    });
    Ok((logits, refreshed))
}

/// A sparse refresh computed on the CPU against the device cache's rows `[0, len)` (read through the
/// leases: allowed while a forward appends after them).
pub(crate) fn refresh_on_cpu(
    w: &TransformerWeights,
    kv: &DeviceKv,
    token: SequenceToken,
    canvas: &Tensor,
    positions: &[usize],
    logits: Option<&[usize]>,
) -> Result<Refresh> {
    if positions.is_empty() && logits.is_none_or(<[usize]>::is_empty) {
        // Nothing to recompute: `refresh` returns an empty refresh without reading.
        return w.refresh::<f16>(&[], kv.len(), token, canvas, positions, logits);
    }
    with_cached(kv, positions, |cached| {
        w.refresh::<f16>(cached, kv.len(), token, canvas, positions, logits)
    })
}

/// [`crate::DiffusionLm::rescore`] on the CPU against the device cache's rows `[0, len)`.
pub(crate) fn rescore_on_cpu(
    w: &TransformerWeights,
    kv: &DeviceKv,
    canvas: &Tensor,
    positions: &[usize],
) -> Result<Tensor> {
    with_cached(kv, positions, |cached| {
        w.rescore::<f16>(cached, kv.len(), canvas, positions)
    })
}

/// Run `f` on every layer's cached rows `[0, len)`, position-major. One sequence (the decoders'
/// case): the device cache's own bytes, read in place — a refresh copies only the rows it
/// computes (its K/V out, merged later). Several sequences: their rows are not interleaved by
/// position in the device layout, so they are copied into that order first.
fn with_cached<R>(
    kv: &DeviceKv,
    positions: &[usize],
    f: impl FnOnce(&[CachedRows<'_, f16>]) -> Result<R>,
) -> Result<R> {
    if kv.is_empty() {
        return Err(PositionDefect::NotCached {
            what: "refresh",
            position: positions.first().copied().unwrap_or(0),
            cache_len: 0,
        }
        .into());
    }
    if kv.batch() == 1 {
        return kv.with_cached_rows(|layers| {
            let cached: Vec<CachedRows<'_, f16>> =
                layers.iter().map(|&(k, v)| CachedRows { k, v }).collect();
            f(&cached)
        })?;
    }
    let bufs = host_rows(kv)?;
    let cached: Vec<CachedRows<'_, f16>> = bufs.iter().map(|(k, v)| CachedRows { k, v }).collect();
    f(&cached)
}

/// Position-major host copies of every layer's cached rows (several sequences in one cache).
fn host_rows(kv: &DeviceKv) -> Result<Vec<(Vec<f16>, Vec<f16>)>> {
    let len = kv.len();
    let mut bufs: Vec<(Vec<f16>, Vec<f16>)> = Vec::with_capacity(kv.layers());
    for layer in 0..kv.layers() {
        let (k, v) = kv.read_rows(layer, 0..len)?;
        let pm = |t: Tensor| -> Result<Vec<f16>> {
            Ok(t.transpose(0, 1)?
                .contiguous()?
                .flatten_all()?
                .to_vec1::<f16>()?)
        };
        bufs.push((pm(k)?, pm(v)?));
    }
    Ok(bufs)
}

/// Merge a refresh into the device cache.
pub(crate) fn apply(kv: &mut DeviceKv, r: &Refresh) -> Result<()> {
    for (layer, (k, v)) in r.keys.iter().zip(&r.values).enumerate() {
        kv.write_positions(layer, &r.positions, k, v)?;
    }
    Ok(())
}
