//! Dual-path progressive revision, the decision half (paper §3.3): which Visible tokens the CPU
//! path re-scores beside a window forward, and what a re-score decides.
//!
//! * **Candidates** are the Visible positions (decided, not yet final), lowest recorded confidence
//!   first: the paper's unstable prefix tokens, and also those still inside the window, whose
//!   revision matters most before later tokens are decided on top of them. (Re-scoring only the
//!   positions before the window was measured: the oracle then recovers almost nothing, since by
//!   the time a token leaves the window its dependants are decided.)
//! * **Budget.** The CPU path runs beside the step's NPU forward and should not outlast it:
//!   positions are taken while their CPU cost (the CPU latency table's cost per position, see
//!   [`LatencyTable::per_position_ms`]) fits in `refresh_budget` times the forward's cost (the
//!   NPU latency table, the one lookahead uses). Positions whose K/V must be recomputed (revised
//!   at the previous step) come first.
//! * **Re-score.** Each candidate is predicted with itself alone masked and everything else as it
//!   stands ([`dllm_models::DiffusionLm::rescore`]) against the cache, which holds the latest
//!   K/V of every position the windows computed. If another token beats the current one by at
//!   least `margin` probability, the token is revised (its K/V are recomputed at the next step's
//!   refresh, the paper's delayed merge); if the current token is confirmed at `theta_stable`
//!   or above it becomes Stable.
//! * **Oracle** (an evaluation instrument, [`crate::Decoder::oracle_revision`]): every Visible
//!   token that differs from a reference answer is replaced by the reference token at each step
//!   boundary, with no re-score and no budget: the most any revision could recover.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::confidence::softmax;
use crate::latency::LatencyTable;
use crate::states::{transition, Thresholds, TokenEvent, TokenState};
use crate::Result;

/// What one step's CPU path does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RefreshPlan {
    /// Positions whose K/V are recomputed from their current tokens.
    pub kv: Vec<usize>,
    /// Positions re-scored (each masked alone).
    pub rescore: Vec<usize>,
}

impl RefreshPlan {
    pub fn is_empty(&self) -> bool {
        self.kv.is_empty() && self.rescore.is_empty()
    }
}

/// The revision state of one generation.
pub(crate) struct Reviser {
    pub thresholds: Thresholds,
    pub margin: f64,
    pub budget: f64,
    pub npu: Arc<LatencyTable>,
    pub cpu_ms_per_position: f64,
    /// Reference tokens per canvas position (`None` outside the answer): the oracle.
    pub oracle: Option<Vec<Option<u32>>>,
    /// Last known confidence of each position (the priority of a Visible one).
    pub conf: Vec<f64>,
    /// Revised positions whose cached K/V no longer match their token (the refresh recomputes them).
    pub pending_kv: BTreeSet<usize>,
}

impl Reviser {
    /// The CPU path beside a forward of `window` positions (`rows` logits rows, `cached` cache
    /// rows attended).
    pub fn plan(
        &self,
        states: &[TokenState],
        prompt_len: usize,
        window: usize,
        rows: usize,
        cached: usize,
    ) -> RefreshPlan {
        let kv: Vec<usize> = self.pending_kv.iter().copied().collect();
        if self.oracle.is_some() {
            return RefreshPlan {
                kv,
                rescore: Vec::new(),
            };
        }
        let forward_ms = self.npu.cost_ms(window, rows, cached);
        let room = if self.cpu_ms_per_position > 0.0 {
            (self.budget * forward_ms / self.cpu_ms_per_position).floor() as usize
        } else {
            usize::MAX
        };
        let mut cands: Vec<usize> = (prompt_len..states.len())
            .filter(|&p| states[p] == TokenState::Visible && !self.pending_kv.contains(&p))
            .collect();
        cands.sort_by(|&a, &b| self.conf[a].total_cmp(&self.conf[b]).then(a.cmp(&b)));
        cands.truncate(room.saturating_sub(kv.len()));
        cands.sort_unstable();
        RefreshPlan { kv, rescore: cands }
    }

    /// The K/V of `positions` were recomputed from their current tokens.
    pub fn merged(&mut self, positions: &[usize]) {
        for p in positions {
            self.pending_kv.remove(p);
        }
    }

    /// Decide on the re-scores: `rows[i]` are the logits of `scored[i]`. Returns the revised
    /// positions (their tokens changed in `canvas`).
    pub fn apply(
        &mut self,
        scored: &[usize],
        rows: &[Vec<f32>],
        canvas: &mut [u32],
        states: &mut [TokenState],
    ) -> Result<Vec<usize>> {
        let mut revised = Vec::new();
        for (&pos, row) in scored.iter().zip(rows) {
            let probs = softmax(row);
            let cur = canvas[pos] as usize;
            let (best, p_best) =
                probs
                    .iter()
                    .copied()
                    .enumerate()
                    .fold((0usize, f64::NEG_INFINITY), |a, (i, p)| {
                        if p > a.1 {
                            (i, p)
                        } else {
                            a
                        }
                    });
            let p_cur = probs.get(cur).copied().unwrap_or(0.0);
            if best != cur && p_best - p_cur >= self.margin && p_best > p_cur {
                canvas[pos] = best as u32;
                self.conf[pos] = p_best;
                self.pending_kv.insert(pos);
                if p_best >= self.thresholds.stable {
                    states[pos] = TokenState::Stable;
                }
                revised.push(pos);
            } else if best == cur {
                self.conf[pos] = p_cur;
                states[pos] =
                    transition(states[pos], TokenEvent::Rescored(p_cur), self.thresholds)?;
            } else {
                self.conf[pos] = p_cur;
            }
        }
        Ok(revised)
    }

    /// The oracle's revision at a step boundary: Visible tokens that differ from the reference
    /// become the reference.
    pub fn oracle_step(
        &mut self,
        prompt_len: usize,
        canvas: &mut [u32],
        states: &[TokenState],
    ) -> Vec<usize> {
        let Some(reference) = &self.oracle else {
            return Vec::new();
        };
        let mut revised = Vec::new();
        for p in prompt_len..canvas.len() {
            if states[p] != TokenState::Visible {
                continue;
            }
            if let Some(want) = reference.get(p).copied().flatten() {
                if canvas[p] != want {
                    canvas[p] = want;
                    self.pending_kv.insert(p);
                    revised.push(p);
                }
            }
        }
        revised
    }
}
