//! The logit shift, defined once. A model with shifted logits (Dream) predicts position `p` from
//! the hidden state at `p - 1` (position 0 keeps its own); every place that plans rows — a
//! window's first row, the room its K/V need, the rows that score a position, which positions
//! can be scored — asks this type, so the rule is written in one place.

/// Whether (and how) a model's logits are shifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shift(bool);

impl Shift {
    /// The shift of a model whose raw logits are (`true`) or are not shifted.
    pub(crate) fn new(shifted: bool) -> Self {
        Shift(shifted)
    }

    /// Whether logits are shifted.
    pub(crate) fn on(self) -> bool {
        self.0
    }

    /// The raw-output row whose hidden state gives the logits of position `p`.
    pub(crate) fn source(self, p: usize) -> usize {
        if self.0 {
            p.saturating_sub(1)
        } else {
            p
        }
    }

    /// The first row a window starting at `start` computes (one earlier when shifted).
    pub(crate) fn window_start(self, start: usize) -> usize {
        self.source(start)
    }

    /// Rows a window of `positions` positions may compute (one more when shifted): the room its
    /// K/V need after the cache.
    pub(crate) fn window_rows(self, positions: usize) -> usize {
        positions + usize::from(self.0)
    }

    /// Whether position `p` can be scored by a group of its own (not position 0 when shifted:
    /// nothing comes before it).
    pub(crate) fn scorable(self, p: usize) -> bool {
        !(self.0 && p == 0)
    }

    /// The rows of the group that scores `p` with `p` masked: `(position, input is the mask)`,
    /// the logits read from the first row.
    pub(crate) fn group(self, p: usize) -> Vec<(usize, bool)> {
        if self.0 {
            vec![(p - 1, false), (p, true)]
        } else {
            vec![(p, true)]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_row_plan() {
        let (on, off) = (Shift::new(true), Shift::new(false));
        assert_eq!((on.source(5), off.source(5), on.source(0)), (4, 5, 0));
        assert_eq!((on.window_start(3), off.window_start(3)), (2, 3));
        assert_eq!((on.window_rows(8), off.window_rows(8)), (9, 8));
        assert!(!on.scorable(0) && on.scorable(1) && off.scorable(0));
        assert_eq!(on.group(4), vec![(3, false), (4, true)]);
        assert_eq!(off.group(4), vec![(4, true)]);
    }
}
