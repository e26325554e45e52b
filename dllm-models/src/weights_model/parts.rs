//! Rows of one or many sequences through the stack together, each part attending to its own cache.
//!
//! A [`Part`] is one sequence's share of a call: its cached rows, a **main** set of rows and
//! **groups** of rows. Main rows are either a window (their K/V are written into the cache's free
//! rows, where a commit finds them) or a sparse refresh of cached positions (their K/V are
//! returned); they attend to the cache — without their own positions' stale rows — and to each
//! other. A group is a verification shadow or a re-score: its rows attend to the cache and to the
//! main rows **except** the group's own positions, and to the group's own fresh rows; nothing
//! attends to a group, and its K/V go nowhere.
//!
//! Rows of every part go through each block's matrices together (ragged: a part brings as many
//! rows as it has); only the attention is per part. Row results of the CPU kernels do not depend
//! on the other rows of a call, so every part's output is bit for bit what it would be alone.
//!
//! A group is the position alone (LLaDA), or for a model with shifted logits (Dream, whose
//! logits at `p` come from the hidden state at `p - 1`) the pair `p - 1` (its current token) and
//! `p` (masked), its logits read from the first row. (Scoring several positions in one group,
//! all masked, would predict each without its neighbours: each is its own group.)

use candle_core::{Device, Tensor};
use kernels_cpu::attention::Skip;

use super::cpu_ops::AttentionSource;
use super::segment::{materialize, segment_attention, segment_attention_fresh, KvGeom};
use super::TransformerWeights;
use crate::kv_cache::{scatter_rows, CachedRows, FreeRows, KvElem};
use crate::layers::{attention_on, Backend};
use crate::{Error, OpMode, Result};

/// Where a part's main rows are and where their K/V go.
pub(crate) enum Main<'a, T> {
    /// Canvas positions `[ws, ws + n)`, written into the free rows after the cache.
    Window {
        ws: usize,
        n: usize,
        free: Vec<FreeRows<'a, T>>,
    },
    /// Cached positions (sorted, unique) whose K/V are recomputed and returned per layer.
    Refresh {
        pos: Vec<usize>,
        keys: Vec<Tensor>,
        values: Vec<Tensor>,
    },
}

/// One group's rows: `(position, input is the mask)`, logits from its first row.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) rows: Vec<(usize, bool)>,
}

impl Group {
    /// The group that verifies or re-scores `p` (see the module docs).
    pub(crate) fn of(p: usize, shift: crate::shift::Shift) -> Self {
        Group {
            rows: shift.group(p),
        }
    }

    /// The group that verifies `p` with the positions `hidden` masked too: one more row each
    /// (input MASK, in place of the position's cached and window rows).
    pub(crate) fn hiding(p: usize, shift: crate::shift::Shift, hidden: &[usize]) -> Self {
        let mut g = Self::of(p, shift);
        g.rows.extend(hidden.iter().map(|&q| (q, true)));
        g
    }
}

/// One sequence's share of a call.
pub(crate) struct Part<'a, T> {
    /// Batch items (the cache's batch).
    pub(crate) b: usize,
    /// Cached rows `[0, len)` of every layer.
    pub(crate) len: usize,
    pub(crate) cached: Vec<CachedRows<'a, T>>,
    pub(crate) main: Main<'a, T>,
    pub(crate) groups: Vec<Group>,
    /// Main rows (of `0..n`) whose hidden state the logits come from, in request order.
    pub(crate) main_out: Vec<usize>,
    /// The part's token ids, one row per batch item, indexed by canvas position.
    pub(crate) canvas: Vec<Vec<u32>>,
}

/// Input row counts and query offsets of a part.
#[derive(Debug, Clone, Copy)]
struct Span {
    /// First input row of the part in the call.
    input: usize,
    /// First query row of the part in the last block.
    last_q: usize,
}

impl<T: KvElem> Part<'_, T> {
    fn main_positions(&self) -> Vec<usize> {
        match &self.main {
            Main::Window { ws, n, .. } => (*ws..ws + n).collect(),
            Main::Refresh { pos, .. } => pos.clone(),
        }
    }

    fn main_rows(&self) -> usize {
        match &self.main {
            Main::Window { n, .. } => *n,
            Main::Refresh { pos, .. } => pos.len(),
        }
    }

    fn group_rows(&self) -> usize {
        self.groups.iter().map(|g| g.rows.len()).sum()
    }

    /// Input rows per batch item.
    fn per_item(&self) -> usize {
        self.main_rows() + self.group_rows()
    }

    /// Query rows per batch item in the last block.
    fn last_per_item(&self) -> usize {
        self.main_out.len() + self.groups.len()
    }

    /// Positions of one batch item's rows (main, then groups).
    fn positions(&self) -> Vec<usize> {
        let mut p = self.main_positions();
        p.extend(self.groups.iter().flat_map(|g| g.rows.iter().map(|r| r.0)));
        p
    }

    /// Token ids of batch item `bi`'s rows.
    fn ids(&self, bi: usize, mask: u32) -> Vec<u32> {
        let row = &self.canvas[bi];
        let mut ids: Vec<u32> = self.main_positions().iter().map(|&p| row[p]).collect();
        ids.extend(
            self.groups
                .iter()
                .flat_map(|g| g.rows.iter().map(|&(p, m)| if m { mask } else { row[p] })),
        );
        ids
    }

    /// The cache skip of the main rows: their own positions' stale rows.
    fn main_skip(&self) -> Skip<'_> {
        match &self.main {
            Main::Window { ws, n, .. } => Skip::Range {
                start: (*ws).min(self.len),
                end: (ws + n).min(self.len),
            },
            Main::Refresh { pos, .. } => Skip::Sorted(pos),
        }
    }
}

/// The attention source over parts: see the module docs.
pub(crate) struct Parts<'w, 'p, 'a, T> {
    pub(crate) w: &'w TransformerWeights,
    pub(crate) parts: &'p mut [Part<'a, T>],
    spans: Vec<Span>,
    /// The current block's fresh K/V of every input row.
    kv: Option<(Tensor, Tensor)>,
}

/// What a call over parts returns per part: `(b, main_out, vocab)` and `(b, groups, vocab)`
/// logits.
pub(crate) type PartLogits = (Tensor, Tensor);

impl<'w, 'p, 'a, T: KvElem> Parts<'w, 'p, 'a, T> {
    /// Run every part through the stack; per part its main and group logits.
    pub(crate) fn run(
        w: &'w TransformerWeights,
        parts: &'p mut [Part<'a, T>],
    ) -> Result<Vec<PartLogits>> {
        let mask = w.info.special.mask;
        let mut spans = Vec::with_capacity(parts.len());
        let (mut ids, mut positions, mut last) = (Vec::new(), Vec::new(), Vec::new());
        let mut q = 0;
        for part in parts.iter() {
            let span = Span {
                input: ids.len(),
                last_q: q,
            };
            let (pos, per) = (part.positions(), part.per_item());
            for bi in 0..part.b {
                let base = (span.input + bi * per) as u32;
                ids.extend(part.ids(bi, mask));
                positions.extend_from_slice(&pos);
                last.extend(part.main_out.iter().map(|&r| base + r as u32));
                let mut at = part.main_rows();
                for g in &part.groups {
                    last.push(base + at as u32);
                    at += g.rows.len();
                }
            }
            q += part.b * part.last_per_item();
            spans.push(span);
        }
        let n = ids.len();
        let x = w.embed(&Tensor::from_vec(ids, (1, n), &w.device)?)?;
        let (cos, sin) = w.rope.gather(&positions)?;
        let last = Tensor::from_vec(last, q, &w.device)?;
        let mut src = Parts {
            w,
            parts,
            spans,
            kv: None,
        };
        let x = w.stack(x, (&cos, &sin), Some(&last), &mut src)?;
        let logits = w.logits(&x)?;
        let vocab = w.cfg.vocab_size;
        src.parts
            .iter()
            .zip(&src.spans)
            .map(|(part, span)| {
                let per = part.last_per_item();
                let l = logits
                    .narrow(1, span.last_q, part.b * per)?
                    .reshape((part.b, per, vocab))?;
                let m = part.main_out.len();
                Ok((l.narrow(1, 0, m)?, l.narrow(1, m, part.groups.len())?))
            })
            .collect()
    }

    /// One part's rows of a `(1, rows, ..)` tensor as `(b, per_item, ..)`.
    fn slice(t: &Tensor, at: usize, b: usize, per: usize) -> Result<Tensor> {
        let mut dims = t.dims().to_vec();
        let rest = dims.split_off(2);
        let mut shape = vec![b, per];
        shape.extend(rest);
        Ok(t.narrow(1, at, b * per)?.reshape(shape)?)
    }

    /// Whether attention runs on kernels-cpu over the cache in place (else over one materialised
    /// key tensor: the per-op NPU path and the differentiable mode).
    fn in_place(&self) -> bool {
        matches!(
            (&self.w.ops_backend, self.w.mode),
            (Backend::Cpu, OpMode::Fused)
        )
    }

    /// Attention over cache segments plus fresh rows `k`/`v` `(b, rows, kv_heads, head_dim)`, on
    /// a materialised key tensor.
    fn attend_materialized(
        &self,
        q: &Tensor,
        segs: &[(CachedRows<'_, T>, usize, Skip<'_>)],
        k: &Tensor,
        v: &Tensor,
        kv: KvGeom,
    ) -> Result<Tensor> {
        let w = self.w;
        let (kk, vv) = materialize(segs, k, v, kv, &w.device)?;
        attention_on(q, &kk, &vv, w.scale(), w.mode, &w.ops_backend)
    }
}

/// The rows of `t` `(b, rows, ..)` not listed in `skip` (sorted).
fn without_rows(t: &Tensor, skip: &[usize], device: &Device) -> Result<Tensor> {
    let keep: Vec<u32> = (0..t.dim(1)?)
        .filter(|r| skip.binary_search(r).is_err())
        .map(|r| r as u32)
        .collect();
    Ok(t.index_select(&Tensor::new(keep, device)?, 1)?)
}

impl<T: KvElem> AttentionSource for Parts<'_, '_, '_, T> {
    fn cache_kv(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<()> {
        let (heads, hd) = (self.w.cfg.num_kv_heads, self.w.cfg.head_dim());
        for (part, span) in self.parts.iter_mut().zip(&self.spans) {
            let (b, per, nm) = (part.b, part.per_item(), part.main_rows());
            let pk = Self::slice(&k, span.input, b, per)?.narrow(1, 0, nm)?;
            let pv = Self::slice(&v, span.input, b, per)?.narrow(1, 0, nm)?;
            match &mut part.main {
                Main::Window { n, free, .. } => {
                    let f = free.get_mut(layer).ok_or(Error::Internal {
                        what: "a window part without free rows for every layer",
                    })?;
                    scatter_rows(&pk, f.k, 0..*n, b, heads, hd)?;
                    scatter_rows(&pv, f.v, 0..*n, b, heads, hd)?;
                }
                Main::Refresh { keys, values, .. } => {
                    keys.push(pk.contiguous()?);
                    values.push(pv.contiguous()?);
                }
            }
        }
        self.kv = Some((k, v));
        Ok(())
    }

    fn attend(&mut self, layer: usize, q: &Tensor) -> Result<Tensor> {
        let (k, v) = self.kv.clone().ok_or(Error::Internal {
            what: "attention before the block's K/V were cached",
        })?;
        let last = layer + 1 == self.w.blocks.len();
        let mut outs = Vec::with_capacity(self.parts.len());
        for (pi, span) in self.spans.iter().enumerate() {
            let part = &self.parts[pi];
            outs.push(self.attend_part(part, *span, layer, q, (&k, &v), last)?);
        }
        Ok(Tensor::cat(&outs, 1)?)
    }
}

/// One part's rows of one block, as `(b, rows, ..)` tensors.
struct PartRows<'c, T> {
    /// Queries `(b, main queries + group queries, heads, head_dim)`.
    q: Tensor,
    /// Keys and values of every input row `(b, main + group rows, kv_heads, head_dim)`.
    k: Tensor,
    v: Tensor,
    /// The cache's rows of this block.
    cached: (CachedRows<'c, T>, usize),
    /// The window's pending rows (read in place), when the main rows are a window.
    pending: Option<(CachedRows<'c, T>, usize)>,
    kv: KvGeom,
}

impl<T: KvElem> Parts<'_, '_, '_, T> {
    /// One part's attention: its main queries over the cache and the main rows, each group's
    /// queries over the cache and the main rows without the group's positions, plus its own rows.
    fn attend_part(
        &self,
        part: &Part<'_, T>,
        span: Span,
        layer: usize,
        q: &Tensor,
        (k, v): (&Tensor, &Tensor),
        last: bool,
    ) -> Result<Tensor> {
        let (b, per, nm) = (part.b, part.per_item(), part.main_rows());
        let (q_at, q_per, q_main) = if last {
            (span.last_q, part.last_per_item(), part.main_out.len())
        } else {
            (span.input, per, nm)
        };
        let rows = PartRows {
            q: Self::slice(q, q_at, b, q_per)?,
            k: Self::slice(k, span.input, b, per)?,
            v: Self::slice(v, span.input, b, per)?,
            cached: (part.cached[layer], part.len),
            pending: match &part.main {
                Main::Window { free, n, .. } => Some((
                    CachedRows {
                        k: &*free[layer].k,
                        v: &*free[layer].v,
                    },
                    *n,
                )),
                Main::Refresh { .. } => None,
            },
            kv: KvGeom::of(self.w, b),
        };
        let mut outs = Vec::with_capacity(1 + part.groups.len());
        if q_main > 0 {
            outs.push(self.attend_main(part, &rows, q_main)?);
        }
        let (mut g_in, mut g_q) = (nm, q_main);
        for g in &part.groups {
            let nq = if last { 1 } else { g.rows.len() };
            outs.push(self.attend_group(part, &rows, g, (g_in, g_q, nq))?);
            g_in += g.rows.len();
            g_q += nq;
        }
        let out = if outs.is_empty() {
            Tensor::zeros((b, 0, q.dim(2)? * q.dim(3)?), q.dtype(), q.device())?
        } else {
            Tensor::cat(&outs, 1)?
        };
        Ok(out.reshape((1, b * q_per, ()))?)
    }

    /// The main queries over the cache (without the main rows' own positions) and the main rows.
    fn attend_main(&self, part: &Part<'_, T>, r: &PartRows<'_, T>, nq: usize) -> Result<Tensor> {
        let nm = part.main_rows();
        let qm = r.q.narrow(1, 0, nq)?;
        let (km, vm) = (r.k.narrow(1, 0, nm)?, r.v.narrow(1, 0, nm)?);
        let seg = (r.cached.0, r.cached.1, part.main_skip());
        let scale = self.w.scale();
        match r.pending {
            Some((p, n)) if self.in_place() => {
                segment_attention(&qm, &[seg, (p, n, Skip::None)], r.kv, scale)
            }
            None if self.in_place() => segment_attention_fresh(&qm, &[seg], &km, &vm, r.kv, scale),
            _ => self.attend_materialized(&qm, &[seg], &km, &vm, r.kv),
        }
    }

    /// A group's queries (`at` = (first input row, first query row, queries)) over the cache and
    /// the main rows without the group's positions, plus the group's own rows.
    fn attend_group(
        &self,
        part: &Part<'_, T>,
        r: &PartRows<'_, T>,
        g: &Group,
        (g_in, g_q, nq): (usize, usize, usize),
    ) -> Result<Tensor> {
        let nm = part.main_rows();
        let rows = g.rows.len();
        let qg = r.q.narrow(1, g_q, nq)?;
        let (kg, vg) = (r.k.narrow(1, g_in, rows)?, r.v.narrow(1, g_in, rows)?);
        let main_pos = part.main_positions();
        let own: Vec<usize> = g.rows.iter().map(|r| r.0).collect();
        // The cache without the main rows' and the group's positions.
        let mut cache_skip: Vec<usize> = own
            .iter()
            .copied()
            .chain(main_pos.iter().copied())
            .filter(|&p| p < part.len)
            .collect();
        cache_skip.sort_unstable();
        cache_skip.dedup();
        // The main rows without the group's positions (rows relative to the main set).
        let mut main_skip: Vec<usize> = own
            .iter()
            .filter_map(|p| main_pos.binary_search(p).ok())
            .collect();
        main_skip.sort_unstable();
        let cache_seg = (r.cached.0, r.cached.1, Skip::Sorted(&cache_skip));
        let (kv, scale, in_place) = (r.kv, self.w.scale(), self.in_place());
        match r.pending {
            Some((p, n)) if in_place => segment_attention_fresh(
                &qg,
                &[cache_seg, (p, n, Skip::Sorted(&main_skip))],
                &kg,
                &vg,
                kv,
                scale,
            ),
            None if nm == 0 && in_place => {
                segment_attention_fresh(&qg, &[cache_seg], &kg, &vg, kv, scale)
            }
            Some(_) => {
                // The main rows' fresh K/V without the group's, then the group's own.
                let device = &self.w.device;
                let (km, vm) = (r.k.narrow(1, 0, nm)?, r.v.narrow(1, 0, nm)?);
                let k = Tensor::cat(&[&without_rows(&km, &main_skip, device)?, &kg], 1)?;
                let v = Tensor::cat(&[&without_rows(&vm, &main_skip, device)?, &vg], 1)?;
                self.attend_materialized(&qg, &[cache_seg], &k, &v, kv)
            }
            None if nm == 0 => self.attend_materialized(&qg, &[cache_seg], &kg, &vg, kv),
            None => Err(Error::Internal {
                what: "groups beside a refresh's main rows",
            }),
        }
    }
}
