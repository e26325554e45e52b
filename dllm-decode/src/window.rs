//! The built-in window policies: LLaDA's vanilla (whole canvas, no cache), Fast-dLLM's prefix and
//! dual cache, and multi-block speculative decoding (paper §3.2): a decoding window decoupled from
//! the block that slides along the commit frontier and, late in a block, looks ahead into future
//! blocks while a latency table says the extra positions are nearly free.
//!
//! ## Multi-block speculative decoding ([`MbsdWindow`])
//!
//! The block stays the unit of left-to-right commitment; the window is the range of one forward.
//! Each block starts like the dual cache: one full forward re-caches every position. Then:
//!
//! * **Continuous sliding.** The window has the block's size and starts at the *fresh frontier*: the
//!   first position whose cached K/V were not computed with its decided token. After a forward, the
//!   window's leading decided positions (decided before that forward, so the forward saw their
//!   tokens) are committed into the cache and the frontier moves past them; the window then slides
//!   right, keeping its size, into the next block. Positions it covers beyond the current block get
//!   predictions: *drafts*.
//! * **Adaptive lookahead.** When the current block has at most `trigger` undecided positions, the
//!   window is extended position by position while the latency table says the forward's extra
//!   cost stays within `allowance` (a fraction of the window's own cost) and the extra K/V and
//!   activations fit `budget`.
//! * **Drafts** never enter the committed cache as decided tokens and never change the commit order:
//!   when their block becomes current, the selector accepts those that meet the commit criterion
//!   then (for threshold decoding: confidence at least the threshold); the rest are decided by the
//!   block's own forwards. With `draft_context`, drafts at least that confident are shown to later
//!   forwards instead of the mask (still not decided).
//!
//! With sliding and lookahead off, the policy is exactly the dual cache (a test holds it to that).

use std::sync::Arc;

use crate::error::{DecodeError, Result};
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
    /// Positions before this have cached K/V computed with their decided tokens.
    fresh: usize,
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
        Self {
            params,
            table,
            fresh: 0,
        }
    }

    /// Extend `[start, end)` into future positions while the table says it is nearly free.
    fn lookahead(&self, v: &DecodeView<'_>, start: usize, mut end: usize) -> usize {
        let len = v.canvas.len();
        let masked = |a: usize, b: usize| (a..b).filter(|&p| v.is_masked(p)).count();
        // Cached positions the window attends to (the cache minus the window's own rows).
        let cached = v
            .cache_len
            .saturating_sub(end.min(v.cache_len) - start.min(v.cache_len));
        let base_w = end - start;
        let base_rows = masked(start, end);
        let base = self.table.cost_ms(base_w, base_rows, cached);
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
            let cost = self.table.cost_ms(end + 1 - start, r, cached) - base;
            if cost > allowed {
                break;
            }
            rows = r;
            end += 1;
        }
        end
    }
}

impl WindowPolicy for MbsdWindow {
    fn plan(&mut self, v: &DecodeView<'_>) -> Result<WindowPlan> {
        if v.step_in_block == 0 {
            self.fresh = v.block.start;
            return Ok(full(v));
        }
        let len = v.canvas.len();
        let size = v.block.len();
        let (start, mut end) = if self.params.sliding {
            let start = self.fresh.min(v.frontier());
            (start, (start + size).min(len))
        } else {
            (v.block.start, v.block.end)
        };
        if end < v.block.end {
            return Err(DecodeError::param(
                "strategy",
                format!(
                    "mbsd window [{start}, {end}) does not reach the block end {}",
                    v.block.end
                ),
            ));
        }
        if self.params.lookahead && v.masked_in_block() <= self.params.trigger {
            end = self.lookahead(v, start, end);
        }
        Ok(WindowPlan {
            start,
            end,
            fresh_cache: false,
            drafts: end > v.block.end,
        })
    }

    fn commit(&mut self, v: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
        if plan.fresh_cache {
            return Some((0, v.canvas.len()));
        }
        if !self.params.sliding {
            return None;
        }
        // The window's leading positions that were decided when the forward ran: their fresh K/V
        // (computed from their decided tokens) replace the block-start ones in the cache.
        let from = plan.start.max(self.fresh);
        let upto = (from..plan.end)
            .find(|&p| v.is_masked(p))
            .unwrap_or(plan.end)
            .min(v.block.end);
        if upto > from {
            self.fresh = upto;
            Some((from, upto))
        } else {
            None
        }
    }

    fn draft_context(&self) -> Option<f64> {
        self.params.draft_context.map(f64::from)
    }

    fn name(&self) -> &str {
        "mbsd"
    }
}
