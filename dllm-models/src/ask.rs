//! What a decoder asks of a model for one step of one sequence ([`Ask`]), and what the model
//! answers ([`Answer`]).
//!
//! A decoder that holds a generation as a value says what its next forward must compute; whoever
//! holds the model runs it — alone ([`crate::DiffusionLm::answer`]) or batched with other sequences
//! ([`crate::DiffusionTransformer::forward_many`]) — and hands the answer back. An ask is executed in
//! a fixed order: empty the cache (when asked), run the window forward with its verification rows,
//! then commit the asked range of the window's K/V.
//!
//! ## Verification rows
//!
//! For each position `p` of [`Ask::verify`] the forward carries a *shadow row*: input MASK at
//! position id `p`, attending to the cache and to this forward's window rows **except** `p`'s own
//! (its cached row and its window row are left out; its own fresh shadow row takes their place).
//! No row attends to a shadow, and shadows write nothing to the cache. Its logits are therefore
//! those of a leave-one-out forward — `p` masked, everything else as this forward computes it —
//! on the cache after this forward's commit (when the commit covers the window). For a model with
//! shifted logits (Dream: the prediction for `p` comes from the hidden state at `p - 1`) a shadow
//! is the pair `p - 1` (its token) and `p` (MASK), the logits read from the first.
//!
//! A shadow may also leave other positions out ([`Ask::verify_hidden`]): each is one more row
//! of its group, input MASK at that position id, in place of the position's cached and window
//! rows, exactly as for `p` itself. The shadow then predicts `p` with those tokens masked too — a
//! leave-k-out forward — while the window's rows still see them. A decoder hides from a token's
//! look the tentative tokens that may rest on it (decided in the same step or after it), so two
//! unverified tokens cannot confirm each other.

use std::ops::Range;

use candle_core::{Device, Tensor};

use crate::{AskDefect, Result};

/// One sequence's next forward: what to compute, and what to keep in its cache afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The canvas the forward sees: one row of token ids per batch item (two for classifier-free
    /// guidance: the conditional canvas, then the unconditional one). Rows have equal lengths.
    pub canvas: Vec<Vec<u32>>,
    /// Empty the KV cache before the forward (the window must then start at 0).
    pub clear_cache: bool,
    /// Canvas positions the forward computes, `start <= cache_len` (see [`DiffusionLm::forward`]).
    pub window: Range<usize>,
    /// Positions inside the window whose logits are returned, in this order.
    pub rows: Vec<usize>,
    /// Positions verified by shadow rows (see the module docs); each is cached or in the window,
    /// no repeats, and for a model with shifted logits at least 1.
    pub verify: Vec<usize>,
    /// Per verification position (in the order of `verify`), other positions its shadow sees
    /// masked (see the module docs); empty when no shadow hides anything. Each is cached or in
    /// the window, not the shadow's own position (nor, with shifted logits, the position before
    /// it), and listed once.
    pub verify_hidden: Vec<Vec<usize>>,
    /// After the forward, copy the K/V of this range of the window into the cache
    /// ([`DiffusionLm::commit`]).
    pub commit: Option<Range<usize>>,
}

/// What the model computed for an [`Ask`].
#[derive(Debug, Clone)]
pub struct Answer {
    /// `(batch, rows, vocab)` f32 logits of [`Ask::rows`], in their order.
    pub logits: Tensor,
    /// `(batch, verify, vocab)` f32 logits of the shadow rows of [`Ask::verify`], in their order.
    pub verify_logits: Tensor,
}

impl Ask {
    /// The canvas as a `(batch, len)` tensor.
    pub fn canvas_tensor(&self, device: &Device) -> Result<Tensor> {
        let b = self.canvas.len();
        let l = self.canvas.first().map_or(0, Vec::len);
        let flat: Vec<u32> = self.canvas.iter().flatten().copied().collect();
        if flat.len() != b * l {
            return Err(AskDefect::RaggedCanvas {
                lengths: self.canvas.iter().map(Vec::len).collect(),
            }
            .into());
        }
        Ok(Tensor::from_vec(flat, (b, l), device)?)
    }

    /// Canvas length.
    pub fn len(&self) -> usize {
        self.canvas.first().map_or(0, Vec::len)
    }

    /// Whether the canvas is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows this ask puts through the model's matrix products: per batch item, the window's
    /// positions (one more to the left for a model with shifted logits — `shift_logits`, Dream —
    /// when the window does not start at 0) plus one row per verification position (two with
    /// shifted logits: the position before it and the masked position) and one per position a
    /// shadow hides. A serving loop budgets
    /// the asks it batches into one [`crate::DiffusionTransformer::forward_many`] with it.
    pub fn rows_count(&self, shift_logits: bool) -> usize {
        let shift = crate::shift::Shift::new(shift_logits);
        let window = self.window.end - shift.window_start(self.window.start);
        let shadows: usize = (self.verify.iter())
            .filter(|&&p| shift.scorable(p))
            .map(|&p| shift.group(p).len())
            .sum();
        let hidden: usize = self.verify_hidden.iter().map(Vec::len).sum();
        self.canvas.len() * (window + shadows + hidden)
    }

    /// Checks that need no model: the verification positions are unique and inside the canvas,
    /// and a forward from an empty cache starts at 0.
    pub(crate) fn check(&self, shift: crate::shift::Shift) -> Result<()> {
        let len = self.len();
        let mut seen = self.verify.clone();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(AskDefect::RepeatedVerify { position: w[0] }.into());
        }
        if let Some(&p) = self
            .verify
            .iter()
            .find(|&&p| p >= len || !shift.scorable(p))
        {
            return Err(AskDefect::VerifyOutside {
                position: p,
                canvas_len: len,
            }
            .into());
        }
        self.check_hidden(shift)?;
        if self.clear_cache && self.window.start != 0 {
            return Err(AskDefect::ClearedWindowStart {
                start: self.window.start,
            }
            .into());
        }
        Ok(())
    }

    /// [`Ask::verify_hidden`]: one list per shadow (or none), positions inside the canvas, each
    /// once, none of them a row the shadow already has.
    fn check_hidden(&self, shift: crate::shift::Shift) -> Result<()> {
        if self.verify_hidden.is_empty() {
            return Ok(());
        }
        if self.verify_hidden.len() != self.verify.len() {
            return Err(AskDefect::HiddenLists {
                lists: self.verify_hidden.len(),
                shadows: self.verify.len(),
            }
            .into());
        }
        for (&p, hidden) in self.verify.iter().zip(&self.verify_hidden) {
            let own = shift.group(p);
            let mut sorted = hidden.clone();
            sorted.sort_unstable();
            let repeated = sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
            let bad = hidden
                .iter()
                .copied()
                .find(|&q| q >= self.len() || own.iter().any(|r| r.0 == q));
            if let Some(position) = repeated.or(bad) {
                return Err(AskDefect::HiddenInvalid {
                    position,
                    shadow: p,
                }
                .into());
            }
        }
        Ok(())
    }

    /// The positions shadow `k` hides (none when the ask hides nothing).
    pub(crate) fn hidden_of(&self, k: usize) -> &[usize] {
        self.verify_hidden.get(k).map_or(&[], Vec::as_slice)
    }
}
#[cfg(test)]
mod tests {
    use super::Ask;

    fn ask(batch: usize, window: std::ops::Range<usize>, verify: Vec<usize>) -> Ask {
        Ask {
            canvas: vec![vec![0; 40]; batch],
            clear_cache: false,
            rows: vec![window.start],
            window,
            verify,
            verify_hidden: vec![],
            commit: None,
        }
    }

    #[test]
    fn rows_count_is_window_plus_shadows_times_batch() {
        // LLaDA: the window's rows plus one per shadow.
        assert_eq!(ask(1, 8..16, vec![]).rows_count(false), 8);
        assert_eq!(ask(1, 8..16, vec![3, 9]).rows_count(false), 10);
        // Classifier-free guidance: two batch items, each with every row.
        assert_eq!(ask(2, 8..16, vec![3, 9]).rows_count(false), 20);
        // Shifted logits: the window starts one row earlier (not before 0), a shadow is a pair.
        assert_eq!(ask(1, 8..16, vec![3, 9]).rows_count(true), 9 + 4);
        assert_eq!(ask(1, 0..16, vec![]).rows_count(true), 16);
        assert_eq!(ask(2, 0..16, vec![5]).rows_count(true), 2 * (16 + 2));
        // A shadow that hides two positions computes two more rows.
        let mut a = ask(1, 8..16, vec![3, 9]);
        a.verify_hidden = vec![vec![4, 10], vec![]];
        assert_eq!(a.rows_count(false), 12);
    }

    #[test]
    fn hidden_positions_are_checked() {
        let shift = crate::shift::Shift::new;
        let with = |hidden: Vec<Vec<usize>>| {
            let mut a = ask(1, 8..16, vec![3, 9]);
            a.verify_hidden = hidden;
            a
        };
        assert!(with(vec![]).check(shift(false)).is_ok());
        assert!(with(vec![vec![4, 10], vec![12]])
            .check(shift(false))
            .is_ok());
        let msg = |a: Ask, s| a.check(shift(s)).unwrap_err().to_string();
        assert!(msg(with(vec![vec![4]]), false).contains("1 lists of hidden positions for 2"));
        // Its own position, a repeat, outside the canvas, the row before it with shifted logits.
        assert!(msg(with(vec![vec![3], vec![]]), false).contains("position 3"));
        assert!(msg(with(vec![vec![4, 4], vec![]]), false).contains("position 4"));
        assert!(msg(with(vec![vec![40], vec![]]), false).contains("position 40"));
        assert!(msg(with(vec![vec![2], vec![]]), true).contains("position 2"));
        assert!(with(vec![vec![2], vec![]]).check(shift(false)).is_ok());
    }
}
