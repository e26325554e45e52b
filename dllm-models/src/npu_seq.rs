//! One sequence on the NPU's block-level module: the forward submits one DSP batch per block
//! against a KV cache resident in device memory ([`DeviceKv`], fp16), and a sparse refresh runs on
//! the CPU while those batches run — reading the cached rows the NPU only appends after (the
//! device's leases allow exactly that) — and is returned for a merge at the step boundary.

use std::ops::Range;
use std::time::Instant;

use candle_core::{DType, Tensor};
use candle_hexagon::{
    BlockWeights, DeviceKv, ForwardOutput, HexTransformer, HexTransformerConfig, HexagonDevice,
    PackedFormat, PackedWeight, Placed, WeightRef,
};
use half::f16;

use crate::block::{GateUp, Qkv};
use crate::config::{MatrixDims, TransformerConfig};
use crate::kv_cache::CachedRows;
use crate::layers::{CpuLinear, Linear, Param};
use crate::linear::TileFormat;
use crate::lm::{DualPathTiming, Refresh, RefreshRequest, Rows, SequenceToken};
use crate::weights::{Role, WeightSource};
use crate::weights_model::{dense, TransformerWeights};
use crate::{Error, Result};

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
        return Err(Error::InvalidArgument(format!(
            "canvas batch {batch} does not match the cached batch {}",
            k.batch()
        )));
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
    let requested = w.requested(rows, window.clone())?;
    let ws = if w.cfg.shift_logits {
        window.start.saturating_sub(1)
    } else {
        window.start
    };
    let n = window.end - ws;
    let hidden_rows: Vec<usize> = requested.iter().map(|&p| w.source_row(p) - ws).collect();
    let identity = hidden_rows.len() == n && hidden_rows.iter().enumerate().all(|(i, &r)| i == r);
    let x = w.embed(&canvas.narrow(1, ws, n)?)?.to_dtype(DType::F32)?;
    let t0 = Instant::now();
    let handle = hex.submit(kv, &x, ws, (!identity).then_some(&hidden_rows[..]))?;
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
        ForwardOutput::Logits => out,
        ForwardOutput::Hidden => w.head_only(&out)?,
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
    let bufs = if positions.is_empty() && logits.is_none_or(<[usize]>::is_empty) {
        Vec::new() // nothing to recompute: `refresh` returns an empty refresh without reading
    } else {
        host_rows(kv, positions)?
    };
    let cached: Vec<CachedRows<'_, f16>> = bufs.iter().map(|(k, v)| CachedRows { k, v }).collect();
    w.refresh::<f16>(&cached, kv.len(), token, canvas, positions, logits)
}

/// [`crate::DiffusionLm::rescore`] on the CPU against the device cache's rows `[0, len)`.
pub(crate) fn rescore_on_cpu(
    w: &TransformerWeights,
    kv: &DeviceKv,
    canvas: &Tensor,
    positions: &[usize],
) -> Result<Tensor> {
    let bufs = host_rows(kv, positions)?;
    let cached: Vec<CachedRows<'_, f16>> = bufs.iter().map(|(k, v)| CachedRows { k, v }).collect();
    w.rescore::<f16>(&cached, kv.len(), canvas, positions)
}

/// Position-major host copies of every layer's cached rows (the CPU path's working set).
fn host_rows(kv: &DeviceKv, positions: &[usize]) -> Result<Vec<(Vec<f16>, Vec<f16>)>> {
    let len = kv.len();
    if len == 0 {
        return Err(Error::InvalidArgument(format!(
            "refresh position {} is not cached (the cache is empty)",
            positions.first().copied().unwrap_or(0)
        )));
    }
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

/// Pack the whole stack into the NPU's block-level module when the device takes it (`None` keeps
/// the per-op path; the decision and its reason are counted by the device).
pub(crate) fn place_blocks(
    dev: &HexagonDevice,
    cfg: &TransformerConfig,
    w: &dyn WeightSource,
) -> Result<Option<HexTransformer>> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim());
    let MatrixDims {
        nq,
        nkv,
        ff,
        vocab: v,
    } = cfg.matrix_dims();
    struct Owned {
        attn_norm: Tensor,
        ffn_norm: Tensor,
        mats: [Param; 7],
        bias: [Option<Tensor>; 3],
    }
    let norm = |role: Role| -> Result<Tensor> { dense(w.get(role, &[h])?, role) };
    let mut owned = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let bias = |role: Role, n: usize| -> Result<Option<Tensor>> {
            if cfg.qkv_bias {
                Ok(Some(dense(w.get(role, &[n])?, role)?))
            } else {
                Ok(None)
            }
        };
        owned.push(Owned {
            attn_norm: norm(Role::AttnNorm(i))?,
            ffn_norm: norm(Role::FfnNorm(i))?,
            mats: [
                w.get(Role::Q(i), &[nq, h])?,
                w.get(Role::K(i), &[nkv, h])?,
                w.get(Role::V(i), &[nkv, h])?,
                w.get(Role::O(i), &[h, nq])?,
                w.get(Role::Gate(i), &[ff, h])?,
                w.get(Role::Up(i), &[ff, h])?,
                w.get(Role::Down(i), &[h, ff])?,
            ],
            bias: [
                bias(Role::QBias(i), nq)?,
                bias(Role::KBias(i), nkv)?,
                bias(Role::VBias(i), nkv)?,
            ],
        });
    }
    let final_norm = norm(Role::FinalNorm)?;
    let head = if cfg.tie_word_embeddings {
        w.get(Role::Embed, &[v, h])?
    } else {
        w.get(Role::Head, &[v, h])?
    };
    fn r(p: &Param) -> WeightRef<'_> {
        match p {
            Param::Dense(t) => WeightRef::Dense(t),
            Param::Quant(q) => WeightRef::Quant(q),
        }
    }
    let blocks = owned
        .iter()
        .map(|o| BlockWeights {
            attn_norm: &o.attn_norm,
            q: r(&o.mats[0]),
            k: r(&o.mats[1]),
            v: r(&o.mats[2]),
            q_bias: o.bias[0].as_ref(),
            k_bias: o.bias[1].as_ref(),
            v_bias: o.bias[2].as_ref(),
            o: r(&o.mats[3]),
            ffn_norm: &o.ffn_norm,
            gate: r(&o.mats[4]),
            up: r(&o.mats[5]),
            down: r(&o.mats[6]),
        })
        .collect();
    let hcfg = HexTransformerConfig {
        hidden: h,
        heads: cfg.num_heads,
        kv_heads: cfg.num_kv_heads,
        head_dim: hd,
        ffn: ff,
        vocab: v,
        rope_theta: cfg.rope_theta,
        rms_eps: cfg.rms_norm_eps as f32,
        max_positions: cfg.max_seq_len,
    };
    let weights = candle_hexagon::TransformerWeights {
        blocks,
        final_norm: &final_norm,
        lm_head: Some(r(&head)),
    };
    Ok(match HexTransformer::new(dev, &hcfg, &weights)? {
        Placed::Npu(t) => Some(t),
        Placed::Cpu(_) => None,
    })
}

/// A CPU layer over the NPU module's packed bytes (read in place by kernels-cpu).
fn shared(p: PackedWeight, bias: Option<&Tensor>) -> Result<Linear> {
    let format = match p.format {
        PackedFormat::F16Tiles => TileFormat::F16Hmx,
        PackedFormat::Q4_0Tiles => TileFormat::Q4_0,
    };
    Ok(Linear::Cpu(CpuLinear::from_shared_tiles(
        format, p.n, p.k, p.bytes, bias,
    )?))
}

/// Block `i`'s CPU layers for the paths that run beside the NPU (the sparse refresh), reading
/// the NPU module's packed weights: fused q/k/v (with the fused `qkv_bias`), o, fused gate/up,
/// down. Returns `(qkv, o, gate_up, down)`.
pub(crate) fn shared_block(
    hex: &HexTransformer,
    i: usize,
    cfg: &TransformerConfig,
    qkv_bias: Option<&Tensor>,
) -> Result<(Qkv, Linear, GateUp, Linear)> {
    let p = hex.packed_block(i).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "the NPU module has {} blocks, block {i} was asked for",
            hex.num_blocks()
        ))
    })?;
    let MatrixDims {
        nq, nkv, ff: ffn, ..
    } = cfg.matrix_dims();
    if p.qkv.n != nq + 2 * nkv || p.gate_up.n != 2 * ffn {
        return Err(Error::InvalidArgument(format!(
            "block {i}: the NPU's fused q/k/v has {} outputs and gate/up {} (the config implies \
             {} and {})",
            p.qkv.n,
            p.gate_up.n,
            nq + 2 * nkv,
            2 * ffn
        )));
    }
    Ok((
        Qkv::Fused {
            qkv: shared(p.qkv, qkv_bias)?,
            nq,
            nkv,
        },
        shared(p.o, None)?,
        GateUp::Fused {
            gate_up: shared(p.gate_up, None)?,
            ffn,
        },
        shared(p.down, None)?,
    ))
}

/// The LM head over the NPU module's packed head, when the head is on the NPU.
pub(crate) fn shared_head(hex: &HexTransformer) -> Result<Option<Linear>> {
    hex.packed_head().map(|p| shared(p, None)).transpose()
}
