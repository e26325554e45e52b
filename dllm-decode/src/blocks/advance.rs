//! Between steps: closing a finished block (its unstable count, the early stop), making the next
//! block current, and the drafts it accepts then.

use super::Blocks;
use crate::error::{DecodeError, Result};
use crate::generation::StopReason;
use crate::states::{transition, TokenEvent, TokenState};

impl Blocks<'_> {
    /// Tentative tokens still waiting for their first fresh look.
    fn waiting(&self) -> usize {
        self.verifier
            .as_ref()
            .map_or(0, |v| v.waiting(&self.states))
    }

    /// After a step: close every block with nothing left to decide and open the next, until one
    /// has work, the generation ends, or it waits for a verification forward (the last block, or
    /// an early stop, with tentative tokens no later forward has looked at yet).
    pub(super) fn advance(&mut self) -> Result<()> {
        loop {
            if !self.candidates().is_empty() {
                return Ok(());
            }
            let block = self.block_range(self.block);
            let last = self.block + 1 >= self.p.num_blocks();
            let stop_ids = self.info.special.stop_ids();
            let early =
                self.p.early_stop && !last && stop_ids.contains(&self.canvas[block.end - 1]);
            if (last || early) && self.waiting() > 0 {
                return Ok(());
            }
            self.out.unstable_at_block_end += block
                .clone()
                .filter(|&k| self.states[k] == TokenState::Visible)
                .count();
            if early {
                let eos = self.info.special.eos;
                self.canvas[block.end..].iter_mut().for_each(|t| *t = eos);
                self.out.stop = StopReason::EndOfSequence;
                self.done = true;
                return Ok(());
            }
            if last {
                self.done = true;
                return Ok(());
            }
            self.block += 1;
            self.open_block()?;
        }
    }

    /// The current block becomes current: the drafts of the forward that made it current (the
    /// last one) are offered to the selector with that forward's confidence; older drafts are
    /// dropped. Accepted drafts are Visible under staged decisions (never final at once), final
    /// otherwise; they are reported with the step that made the block current.
    pub(super) fn open_block(&mut self) -> Result<()> {
        let block = self.block_range(self.block);
        let mask = self.mask();
        let latest = self.out.forwards.checked_sub(1);
        let pending: Vec<(usize, f64)> = block
            .clone()
            .filter(|&i| self.canvas[i] == mask)
            .filter_map(|i| match self.drafts[i] {
                Some((d, f)) if Some(f) == latest => Some((i, d.confidence)),
                _ => None,
            })
            .collect();
        if !pending.is_empty() {
            let mut accepted = self.selector.accept_drafts(&pending);
            accepted.sort_unstable();
            if accepted.windows(2).any(|w| w[0] == w[1]) {
                return Err(DecodeError::Policy {
                    policy: "selector".into(),
                    reason: format!("accept_drafts returned a position twice: {accepted:?}"),
                });
            }
            for &pos in &accepted {
                self.take_draft(pos, &pending)?;
            }
            self.out.drafts += pending.len();
            self.out.drafts_accepted += accepted.len();
            self.out.drafts_rejected += pending.len() - accepted.len();
            self.out.tokens_decoded += accepted.len();
        }
        block.clone().for_each(|i| self.drafts[i] = None);
        let masked = block.filter(|&i| self.canvas[i] == mask).count();
        self.selector.begin_block(masked);
        self.step_in_block = 0;
        Ok(())
    }

    fn take_draft(&mut self, pos: usize, pending: &[(usize, f64)]) -> Result<()> {
        let Some((d, _)) = self.drafts[pos].filter(|_| pending.iter().any(|c| c.0 == pos)) else {
            return Err(DecodeError::Policy {
                policy: "selector".into(),
                reason: format!(
                    "accept_drafts returned position {pos}, which is not among the offered drafts"
                ),
            });
        };
        self.canvas[pos] = d.token;
        self.states[pos] = match self.thresholds {
            Some(t) => transition(TokenState::Invisible, TokenEvent::Drafted, t)?,
            None => TokenState::Stable,
        };
        let forward = self.out.forwards;
        if let Some(v) = self.verifier.as_mut() {
            v.counted(pos, forward);
            v.decided(pos, d.token, d.confidence);
        }
        self.out.drafts_taken.push((pos, d.token));
        self.report.unmasked.push(pos);
        self.report.confidences.push(d.confidence);
        Ok(())
    }
}
