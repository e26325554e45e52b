//! The result of a generation.

/// Why decoding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Every position was decoded.
    Completed,
    /// A completed block ended in EOS/EoT; the positions after it were filled with EOS.
    EndOfSequence,
    /// The step observer asked to stop; undecoded positions are still `[MASK]`.
    Observer,
}

/// One model forward of a generation, as the decoder asked for it (the input of latency
/// projections and of the paper's activity plots).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardTrace {
    /// Step index (0-based) the forward belongs to.
    pub step: usize,
    /// First canvas position forwarded.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Logits rows requested.
    pub rows: usize,
    /// Positions in the KV cache the window attended to (0 for a forward from an empty cache).
    pub cached: usize,
    /// Undecided generated positions in the window (its useful work).
    pub active: usize,
    /// Positions whose K/V were recomputed beside this forward (dual path), 0 if none.
    pub refreshed: usize,
    /// Positions re-scored (each masked alone) beside this forward (dual path), 0 if none.
    pub rescored: usize,
    /// Positions this forward computes beyond the current block because the adaptive lookahead
    /// extended the window (their predictions are drafts).
    pub lookahead: usize,
}

/// A finished (or stopped) generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The whole canvas: prompt then `gen_length` positions.
    pub canvas: Vec<u32>,
    /// Prompt length.
    pub prompt_len: usize,
    /// Model forward calls (a classifier-free-guidance pair counts as one batched call).
    pub forwards: usize,
    /// Denoising steps run.
    pub steps: usize,
    /// Positions unmasked by the decoder (excludes EOS filled in after an early stop).
    pub tokens_decoded: usize,
    /// Sum over forwards of the undecided generated positions in the forward's window (the useful
    /// work of each forward); see [`Generation::mean_active_per_forward`].
    pub active_positions: usize,
    /// Draft predictions made (undecided positions beyond the current block that a forward scored).
    pub draft_predictions: usize,
    /// Positions that held a draft when their block became current (accepted + rejected).
    pub drafts: usize,
    /// Drafts accepted (decided without a forward of their own block) when their block became current.
    pub drafts_accepted: usize,
    /// Drafts that did not meet the commit criterion when their block became current.
    pub drafts_rejected: usize,
    /// Visible tokens whose identity a refresh changed.
    pub revised: usize,
    /// Positions whose K/V the second path recomputed, summed over steps.
    pub refreshes: usize,
    /// Visible positions the second path re-scored (each masked alone), summed over steps.
    pub rescored: usize,
    /// Positions the adaptive lookahead added to windows beyond the current block (drafts),
    /// summed over forwards.
    pub lookahead_positions: usize,
    /// Wall time of the refreshes, ms (on their own thread).
    pub refresh_ms: f64,
    /// Time the main path waited for a refresh after its own forward was done, ms.
    pub merge_wait_ms: f64,
    /// Window rows whose logits were not computed because no decision needed them.
    pub logits_rows_skipped: usize,
    /// Positions still Visible (below the stable threshold) when their block completed.
    pub unstable_at_block_end: usize,
    /// Every forward, in order.
    pub trace: Vec<ForwardTrace>,
    /// Why decoding ended.
    pub stop: StopReason,
}

impl Generation {
    /// An empty generation for a prompt of `prompt_len` tokens (the canvas is filled in at the end).
    pub(crate) fn start(prompt_len: usize) -> Self {
        Self {
            canvas: Vec::new(),
            prompt_len,
            forwards: 0,
            steps: 0,
            tokens_decoded: 0,
            active_positions: 0,
            draft_predictions: 0,
            drafts: 0,
            drafts_accepted: 0,
            drafts_rejected: 0,
            revised: 0,
            refreshes: 0,
            rescored: 0,
            lookahead_positions: 0,
            refresh_ms: 0.0,
            merge_wait_ms: 0.0,
            logits_rows_skipped: 0,
            unstable_at_block_end: 0,
            trace: Vec::new(),
            stop: StopReason::Completed,
        }
    }

    /// The generated positions, as produced (EOS included).
    pub fn generated(&self) -> &[u32] {
        &self.canvas[self.prompt_len..]
    }

    /// The generated ids up to (excluding) the first of `stop_ids`.
    pub fn answer(&self, stop_ids: &[u32]) -> &[u32] {
        let g = self.generated();
        let end = g
            .iter()
            .position(|t| stop_ids.contains(t))
            .unwrap_or(g.len());
        &g[..end]
    }

    /// Mean undecided generated positions per forward window.
    pub fn mean_active_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.active_positions as f64 / self.forwards as f64
        }
    }

    /// Decoded tokens per forward call.
    pub fn tokens_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.tokens_decoded as f64 / self.forwards as f64
        }
    }
}
