//! The built-in window policies: LLaDA's vanilla (whole canvas, no cache), Fast-dLLM's prefix and
//! dual cache, and multi-block speculative decoding (paper §3.2): a decoding window decoupled from
//! the block that follows the commit frontier and, late in a block, looks ahead into future
//! blocks while a latency table says the extra positions are nearly free.
//!
//! ## Multi-block speculative decoding ([`MbsdWindow`])
//!
//! The block stays the unit of left-to-right commitment; the window is the range of one forward.
//! Only the first forward of a generation is a whole-canvas forward (it caches the prompt and the
//! masked answer: without the masked suffix in the cache the long-answer model's accuracy on
//! long-math fell from 75% to 17% in a measurement); after it the cache stays, every window forward attends to it, and **every
//! window's K/V are written back** into it, so the cache always holds the latest K/V of every
//! position (a new block's K/V come from its own window forwards).
//!
//! * **Continuous sliding** (`sliding`; by default on for LLaDA, off for Dream). The window
//!   starts at the commit frontier: the first undecided position of the block, or an earlier
//!   decided one whose cached K/V are stale (decided after the
//!   last forward that computed it, [`DecodeView::stale`]). Positions decided and recomputed leave
//!   it on the left, so as the block fills the window shrinks to the undecided region.
//! * **Bucket fit.** On a latency table in tile buckets, a window a few positions wider than a
//!   bucket edge is cut back to the edge (while it still holds an undecided position of the
//!   block): the block's last undecided positions wait for the next forward instead of the
//!   forward paying for a whole extra bucket. This is what lets the stale positions at a block
//!   start be recomputed by the window itself (the block start's window is those few positions
//!   plus a block). On by default for LLaDA, off for Dream ([`MbsdParams::fits_bucket`]). The
//!   forward it fits counts the window, the row before it (shifted logits) and the verification
//!   rows, and the shown guess's shadow with `fit_guess` (on for LLaDA with a span, its
//!   default, [`MbsdParams::fits_guess`]: a window of at most 16 positions gives up positions it
//!   would rarely decide; in blocks of 32 without the span it is off, where cutting a position
//!   out of the window for the guess's row cost about 0.9 forwards per answer).
//! * **Left trim** (`trim_left`, on). A window that keeps the block (Dream's: no sliding) and
//!   whose forward would pass a bucket edge — counting every row the model computes: the
//!   window, the row before it for a model with shifted logits, the verification rows and the
//!   shown guess's shadow — leaves out decided positions at its left, before the frontier, whose
//!   cached K/V are current (computed from the token they hold), when that fits the edge. No
//!   decision waits for it; the positions left out keep K/V one forward old instead of
//!   recomputed ones (on tiny-dream-long, tuning and confirmation: the same answers and
//!   forwards, 0.90x the projected time of the defaults without it). Never at a block start's
//!   refresh.
//! * **Adaptive lookahead.** When the current block has at most `trigger` undecided positions, the
//!   window is extended past the block end, position by position, while the latency table says the
//!   forward's extra cost stays within `allowance` of the window's own cost and the extra K/V and
//!   activations fit `budget`. On a table in tile buckets (the NPU's) this fills the bucket the
//!   shrunken window left free. The added positions' predictions are *drafts*.
//! * **Drafts** never change the commit order. When their block becomes current, the drafts of
//!   the forward that made it current (the last forward of the previous block) are offered to the
//!   selector with that forward's confidence, and accepted only if they meet the commit criterion;
//!   older drafts are dropped. With `draft_context`, drafts at least that confident are shown to
//!   later forwards instead of the mask (still not decided).
//!
//! * **Block-start refresh** (`refresh`; by default on for models with shifted logits, Dream, in
//!   place of sliding, off for LLaDA: [`MbsdParams::resolved`]). A block's first window starts at
//!   the canvas's start: the K/V of the prompt and of every generated position before the block
//!   are recomputed with everything decided since they were cached (Fast-dLLM's dual cache
//!   recomputes the whole canvas at each block start; this leaves the masked suffix as cached).
//!
//! With sliding and lookahead off, the window is the current block against the cache: the dual
//! cache without its per-block whole-canvas forward.

use std::sync::Arc;

use crate::error::Result;
use crate::latency::LatencyTable;
use crate::params::MbsdParams;
use crate::roles::{DecodeView, WindowPlan, WindowPolicy};

/// LLaDA's reference algorithm: every step forwards the whole canvas; nothing is cached.
#[derive(Debug, Clone, Copy, Default)]
pub struct VanillaWindow;

impl WindowPolicy for VanillaWindow {
    fn plan(&mut self, v: &DecodeView<'_>) -> Result<WindowPlan> {
        Ok(WindowPlan {
            start: 0,
            end: v.canvas.len(),
            fresh_cache: true,
            drafts: false,
        })
    }
    fn commit(&mut self, _: &DecodeView<'_>, _: &WindowPlan) -> Option<(usize, usize)> {
        None
    }
    fn name(&self) -> &str {
        "vanilla"
    }
}

fn full(v: &DecodeView<'_>) -> WindowPlan {
    WindowPlan {
        start: 0,
        end: v.canvas.len(),
        fresh_cache: true,
        drafts: false,
    }
}

/// Fast-dLLM prefix cache: a full forward at each block start caches the prompt and finished blocks;
/// later steps forward the current block and everything after it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefixCacheWindow;

impl WindowPolicy for PrefixCacheWindow {
    fn plan(&mut self, v: &DecodeView<'_>) -> Result<WindowPlan> {
        Ok(if v.step_in_block == 0 {
            full(v)
        } else {
            WindowPlan {
                start: v.block.start,
                end: v.canvas.len(),
                fresh_cache: false,
                drafts: false,
            }
        })
    }
    fn commit(&mut self, v: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
        plan.fresh_cache.then_some((0, v.block.start))
    }
    fn name(&self) -> &str {
        "prefix-cache"
    }
}

/// Fast-dLLM dual cache: the full forward at block start caches prefix and suffix; later steps
/// forward only the current block.
#[derive(Debug, Clone, Copy, Default)]
pub struct DualCacheWindow;

impl WindowPolicy for DualCacheWindow {
    fn plan(&mut self, v: &DecodeView<'_>) -> Result<WindowPlan> {
        Ok(if v.step_in_block == 0 {
            full(v)
        } else {
            WindowPlan {
                start: v.block.start,
                end: v.block.end,
                fresh_cache: false,
                drafts: false,
            }
        })
    }
    fn commit(&mut self, v: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
        plan.fresh_cache.then_some((0, v.canvas.len()))
    }
    fn name(&self) -> &str {
        "dual-cache"
    }
}

/// Multi-block speculative decoding (see the module docs).
#[derive(Debug, Clone)]
pub struct MbsdWindow {
    params: MbsdParams,
    table: Arc<LatencyTable>,
}

/// Bytes one extra window position costs: its K/V in every layer plus its activations (the
/// hidden state, q/k/v, the MLP intermediates) and a logits row, in the compute dtype (f32 logits).
pub fn position_bytes(info: &dllm_models::ModelInfo) -> u64 {
    let e = info.dtype.size_in_bytes() as u64;
    let kv = 2 * info.num_layers as u64 * (info.num_kv_heads * info.head_dim) as u64 * e;
    let act = (4 * info.hidden_size + 3 * info.intermediate_size) as u64 * e;
    kv + act + 4 * info.vocab_size as u64
}

impl MbsdWindow {
    /// The policy with its parameters and the latency table that prices lookahead.
    pub fn new(params: MbsdParams, table: Arc<LatencyTable>) -> Self {
        Self { params, table }
    }

    /// Extend `[start, end)` into future positions while the table says it is nearly free.
    fn lookahead(&self, v: &DecodeView<'_>, start: usize, mut end: usize) -> usize {
        let len = v.canvas.len();
        let masked = |a: usize, b: usize| (a..b).filter(|&p| v.is_masked(p)).count();
        // Cached positions the window attends to (the cache minus the window's own rows).
        let cached = v
            .cache_len
            .saturating_sub(end.min(v.cache_len) - start.min(v.cache_len));
        // Verification rows come first: the lookahead prices its extension on top of them.
        let vr = v.verify_rows + shift_row(v, start);
        let base_w = end - start;
        let base_rows = masked(start, end);
        let base = self.table.cost_ms(base_w + vr, base_rows + vr, cached);
        let allowed = base * self.params.allowance;
        let per_pos = position_bytes(v.info) as f64;
        let budget = self.params.budget_mib * (1u64 << 20) as f64;
        let mut rows = base_rows;
        while end < len {
            let extra = end + 1 - start - base_w;
            if extra as f64 * per_pos > budget {
                break;
            }
            let r = rows + usize::from(v.is_masked(end));
            let cost = self.table.cost_ms(end + 1 - start + vr, r + vr, cached) - base;
            if cost > allowed {
                break;
            }
            rows = r;
            end += 1;
        }
        end
    }

    /// Cut `[start, end)` back so that it and the forward's verification rows fit the bucket edge
    /// below them, when the cut window still holds an undecided position of the block and costs
    /// less (on a bucketed table a few positions past an edge cost a whole bucket: at a block start
    /// the stale positions of the previous block's last forward plus a full block are one bucket
    /// and a few positions; and the tokens waiting for their first look get their shadow rows in
    /// this forward instead of one later).
    fn fit_bucket(&self, v: &DecodeView<'_>, start: usize, end: usize) -> usize {
        let fit_guess = self
            .params
            .fit_guess
            .unwrap_or(self.params.guess_fit_by_family(v.info.shift_logits));
        let guess = if fit_guess { v.guess_rows } else { 0 };
        let vr = v.verify_rows + shift_row(v, start) + guess;
        let Some(edge) = self.table.bucket_edge_below(end - start + vr) else {
            return end;
        };
        if edge <= vr {
            return end;
        }
        let cut = start + edge - vr;
        let cached = v
            .cache_len
            .saturating_sub(end.min(v.cache_len) - start.min(v.cache_len));
        let rows = |e: usize| (start..e).filter(|&p| v.is_masked(p)).count() + vr;
        let holds_work = (start..cut).any(|p| v.block.contains(&p) && v.is_masked(p));
        let cheaper = self.table.cost_ms(edge, rows(cut), cached)
            < self.table.cost_ms(end - start + vr, rows(end), cached);
        if holds_work && cheaper {
            cut
        } else {
            end
        }
    }
}

/// The row a window starting at `start` computes before it: a model with shifted logits
/// predicts a position from the row before it (none before position 0).
fn shift_row(v: &DecodeView<'_>, start: usize) -> usize {
    usize::from(v.info.shift_logits && start > 0)
}

impl MbsdWindow {
    /// Leave decided positions out of the window's left so that the forward — the window, the
    /// row before it (shifted logits), the verification rows and the shown guess's shadow — fits
    /// the bucket edge below it: positions decided before the frontier whose cached K/V are
    /// current (computed from the token they hold; `DecodeView::stale` are not), which the
    /// window would only recompute. All or nothing: on a bucketed table a partial trim costs the
    /// same bucket. The window (`start`) is unchanged when they are too few.
    fn trim_left(&self, v: &DecodeView<'_>, start: usize, end: usize) -> usize {
        let total = end - start + shift_row(v, start) + v.verify_rows + v.guess_rows;
        let Some(edge) = self.table.bucket_edge_below(total) else {
            return start;
        };
        let want = start + (total - edge);
        let limit = v.frontier().min(v.cache_len);
        let current = |p: usize| !v.is_masked(p) && v.stale.binary_search(&p).is_err();
        if want <= limit && (start..want).all(current) {
            want
        } else {
            start
        }
    }
}

impl WindowPolicy for MbsdWindow {
    fn plan(&mut self, v: &DecodeView<'_>) -> Result<WindowPlan> {
        if v.cache_len == 0 {
            // The generation's first forward: nothing is cached yet.
            return Ok(full(v));
        }
        let (sliding, refresh) = self.params.resolved(v.info.shift_logits);
        let anchor = if sliding {
            v.frontier()
        } else {
            // The block's start, or earlier when verification sent a token of a past block back
            // to the mask (the block has moved on; that position is undecided again).
            v.block.start.min(v.frontier())
        };
        let mut start = v.stale.first().map_or(anchor, |&s| s.min(anchor));
        if v.step_in_block == 0 && refresh {
            // The block starts on fresh K/V of everything before it (a model with shifted logits
            // has no row before position 0).
            start = usize::from(v.info.shift_logits);
        }
        // At most `span` positions from the frontier, lookahead included; a refresh or stale
        // positions before it are recomputed on top.
        let cap = self
            .params
            .span
            .map_or(usize::MAX, |s| start.max(v.frontier()) + s);
        let mut end = v.block.end.min(cap);
        if self.params.trim_left && !(v.step_in_block == 0 && refresh) {
            start = self.trim_left(v, start, end);
        }
        let fitted = if self.params.fits_bucket(v.info.shift_logits) {
            self.fit_bucket(v, start, end)
        } else {
            end
        };
        if fitted < end {
            end = fitted;
        } else if self.params.lookahead && v.masked_in_block() <= self.params.trigger {
            end = self.lookahead(v, start, end).min(cap);
        }
        Ok(WindowPlan {
            start,
            end,
            fresh_cache: false,
            drafts: end > v.block.end,
        })
    }

    fn commit(&mut self, _: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
        // Every window row: the cache keeps the latest K/V of every position.
        Some((plan.start, plan.end))
    }

    fn draft_context(&self) -> Option<f64> {
        self.params.draft_context.map(f64::from)
    }

    fn name(&self) -> &str {
        "mbsd"
    }
}
