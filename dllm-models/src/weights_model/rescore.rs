//! Re-scoring decided positions one at a time against the KV cache (the scoring half of a sparse
//! refresh, paper §3.3).
//!
//! A masked-diffusion model scores a token by predicting it from a masked input. To ask "is the
//! token at `p` still the model's choice, given everything else as it now stands?", `p` is masked
//! and every other position keeps its current token. Scoring several positions in one pass with
//! all of them masked at once would predict each without its neighbours (a wrong answer where
//! neighbours depend on each other, e.g. the digits of one worked line). So each scored position
//! is its own **group** of rows that attends to the cache (with the group's positions left out)
//! plus its own fresh rows, never to another group's: one pass computes every group's projections
//! and MLP together, and only the attention is per group (a block-diagonal mask over the fresh rows).
//!
//! A group is the scored position alone (LLaDA), or for a model with shifted logits (Dream, whose
//! logits at `p` come from the hidden state at `p - 1`) the pair `p - 1` (its current token) and
//! `p` (masked), the logits read from the first row.

use candle_core::Tensor;
use kernels_cpu::attention::Skip;

use super::segment::{materialize, segment_attention_fresh, KvGeom};
use super::TransformerWeights;
use crate::kv_cache::{CachedRows, KvElem};
use crate::layers::{attention_on, Backend};
use crate::{OpMode, PositionDefect, Result};

/// One scored position's rows: canvas positions, whether each row's input is the mask, and the
/// row whose hidden state gives the logits.
struct Group {
    rows: Vec<(usize, bool)>,
    logit_row: usize,
    /// The group's positions, sorted (left out of the cache for its rows).
    sorted: Vec<usize>,
}

impl TransformerWeights {
    /// Logits `(batch, positions, vocab)` of each of `positions` (cached, unique) predicted with
    /// that position alone masked and every other position as `canvas` holds it (see the module
    /// docs), attending to the cached rows `[0, len)`.
    pub(crate) fn rescore<T: KvElem>(
        &self,
        cached: &[CachedRows<'_, T>],
        len: usize,
        canvas: &Tensor,
        positions: &[usize],
    ) -> Result<Tensor> {
        let (b, l) = canvas.dims2()?;
        let mut seen = positions.to_vec();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(PositionDefect::Repeated {
                what: "re-score",
                positions: positions.to_vec(),
                position: w[0],
            }
            .into());
        }
        let shift = self.cfg.shift_logits;
        if let Some(&bad) = positions
            .iter()
            .find(|&&p| p >= len || p >= l || (shift && p == 0))
        {
            return Err(PositionDefect::NotRescorable {
                position: bad,
                cache_len: len,
                canvas_len: l,
            }
            .into());
        }
        if positions.is_empty() {
            return Ok(Tensor::zeros(
                (b, 0, self.cfg.vocab_size),
                candle_core::DType::F32,
                &self.device,
            )?);
        }
        let groups: Vec<Group> = positions
            .iter()
            .map(|&p| {
                let rows = if shift {
                    vec![(p - 1, false), (p, true)]
                } else {
                    vec![(p, true)]
                };
                let mut sorted: Vec<usize> = rows.iter().map(|r| r.0).collect();
                sorted.sort_unstable();
                Group {
                    rows,
                    logit_row: 0,
                    sorted,
                }
            })
            .collect();
        let mask = self.info.special.mask;
        let ids: Vec<Vec<u32>> = canvas.to_vec2::<u32>()?;
        let flat: Vec<u32> = ids
            .iter()
            .flat_map(|row| {
                groups
                    .iter()
                    .flat_map(|g| g.rows.iter().map(|&(p, m)| if m { mask } else { row[p] }))
            })
            .collect();
        let row_pos: Vec<usize> = groups
            .iter()
            .flat_map(|g| g.rows.iter().map(|r| r.0))
            .collect();
        let n = row_pos.len();
        // Offsets of each group's rows, and the logits rows (one per group, in group order).
        let mut starts = Vec::with_capacity(groups.len());
        let mut at = 0;
        for g in &groups {
            starts.push(at);
            at += g.rows.len();
        }
        let logit_rows: Vec<usize> = groups
            .iter()
            .zip(&starts)
            .map(|(g, &s)| s + g.logit_row)
            .collect();
        let ids = Tensor::from_vec(flat, (b, n), &self.device)?;
        let mut x = self.embed.forward(&ids)?;
        let (cos, sin) = self.rope.gather(&row_pos)?;
        let last_rows = self.idx(logit_rows.iter().copied())?;
        let kv = KvGeom::of(self, b);
        let last = self.blocks.len() - 1;
        for (li, blk) in self.blocks.iter().enumerate() {
            let q_rows = (li == last).then_some(&last_rows);
            let c = cached[li];
            let mut attend = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
                let nq = q.dim(1)?;
                if nq == 0 {
                    return Ok(q.clone());
                }
                // Queries are every row (earlier layers) or one logits row per group (the last).
                let per_group_q = nq != n;
                let mut outs = Vec::with_capacity(groups.len());
                for (gi, g) in groups.iter().enumerate() {
                    let (s, gl) = (starts[gi], g.rows.len());
                    let qg = if per_group_q {
                        q.narrow(1, gi, 1)?
                    } else {
                        q.narrow(1, s, gl)?
                    };
                    let (kg, vg) = (k.narrow(1, s, gl)?, v.narrow(1, s, gl)?);
                    let skip = Skip::Sorted(&g.sorted);
                    let out = match (&self.ops_backend, self.mode) {
                        (Backend::Cpu, OpMode::Fused) => segment_attention_fresh(
                            &qg,
                            &[(c, len, skip)],
                            &kg,
                            &vg,
                            kv,
                            self.scale(),
                        )?,
                        _ => {
                            let (kk, vv) =
                                materialize(&[(c, len, skip)], &kg, &vg, kv, &self.device)?;
                            attention_on(&qg, &kk, &vv, self.scale(), self.mode, &self.ops_backend)?
                        }
                    };
                    outs.push(out);
                }
                Ok(Tensor::cat(&outs, 1)?)
            };
            x = self.block(blk, &x, (&cos, &sin), q_rows, &mut attend)?.0;
        }
        self.logits(&x)
    }
}
