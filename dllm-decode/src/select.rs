//! Which masked positions to unmask this step: LLaDA's per-block token-count schedule, top-n
//! selection, Fast-dLLM's confidence threshold, and Dream's timestep schedule.
//!
//! Selection is deterministic: candidates are ranked by confidence (descending), ties broken by the
//! lower position (`torch.topk` leaves tie order unspecified). NaN confidences rank last.

use crate::rng::Rng;

/// LLaDA's `get_num_transfer_tokens`: `masked` tokens over `steps` steps, the remainder going to the
/// first steps: `n[i] = masked / steps + (i < masked % steps)`.
pub fn transfer_counts(masked: usize, steps: usize) -> Vec<usize> {
    let (base, rem) = (masked / steps, masked % steps);
    (0..steps).map(|i| base + usize::from(i < rem)).collect()
}

/// Dream's timesteps `linspace(1, eps, steps + 1)`.
pub fn dream_timesteps(steps: usize, eps: f64) -> Vec<f64> {
    (0..=steps)
        .map(|i| 1.0 + (eps - 1.0) * i as f64 / steps as f64)
        .collect()
}

/// Dream's per-step count: `floor(masked * (1 - s / t))`, everything at the last step.
pub fn dream_count(masked: usize, step: usize, steps: usize, ts: &[f64]) -> usize {
    if step + 1 >= steps {
        masked
    } else {
        ((masked as f64) * (1.0 - ts[step + 1] / ts[step])).floor() as usize
    }
}

fn ranked(cands: &[(usize, f64)]) -> Vec<(usize, f64)> {
    let mut v = cands.to_vec();
    let key = |c: f64| if c.is_nan() { f64::NEG_INFINITY } else { c };
    v.sort_by(|a, b| key(b.1).total_cmp(&key(a.1)).then(a.0.cmp(&b.0)));
    v
}

/// The `n` most confident `(position, confidence)` candidates' positions.
pub fn top_n(cands: &[(usize, f64)], n: usize) -> Vec<usize> {
    ranked(cands).into_iter().take(n).map(|c| c.0).collect()
}

/// Fast-dLLM threshold rule: the most confident candidate, plus every other with confidence
/// `>= threshold`.
pub fn above_threshold(cands: &[(usize, f64)], threshold: f64) -> Vec<usize> {
    ranked(cands)
        .into_iter()
        .enumerate()
        .filter(|(i, c)| *i == 0 || c.1 >= threshold)
        .map(|(_, c)| c.0)
        .collect()
}

/// `n` positions sampled without replacement with probabilities `softmax(conf / temp)` (Dream's
/// `alg_temp > 0` branch, `torch.multinomial(..., replacement=False)`).
pub fn sample_without_replacement(
    cands: &[(usize, f64)],
    n: usize,
    temp: f64,
    rng: &mut Rng,
) -> Vec<usize> {
    let mut pool: Vec<(usize, f64)> = cands.to_vec();
    let m = pool
        .iter()
        .map(|c| c.1 / temp)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut w: Vec<f64> = pool.iter().map(|c| (c.1 / temp - m).exp()).collect();
    let mut out = Vec::with_capacity(n);
    while out.len() < n && !pool.is_empty() {
        let total: f64 = w.iter().sum();
        let mut u = rng.f64() * total;
        let mut pick = pool.len() - 1;
        for (i, &wi) in w.iter().enumerate() {
            if u < wi {
                pick = i;
                break;
            }
            u -= wi;
        }
        out.push(pool.swap_remove(pick).0);
        w.swap_remove(pick);
    }
    out
}

/// LLaDA's schedule: step `i` of a block unmasks the `n[i]` most confident candidates
/// ([`transfer_counts`] over the block's masked positions and `steps_per_block`).
///
/// Under multi-block decoding, the drafts offered when a block becomes current are that block's
/// first step: the `n[0]` most confident are accepted (with [`ScheduleSelector::with_block_length`];
/// without it, none), and the block continues with the rest of its schedule.
#[derive(Debug, Clone)]
pub struct ScheduleSelector {
    steps_per_block: usize,
    block_length: Option<usize>,
    counts: Vec<usize>,
    /// Drafts accepted as the current block's first step.
    accepted: usize,
}

impl ScheduleSelector {
    /// A schedule of `steps_per_block` steps per block.
    pub fn new(steps_per_block: usize) -> Self {
        Self {
            steps_per_block: steps_per_block.max(1),
            block_length: None,
            counts: Vec::new(),
            accepted: 0,
        }
    }

    /// Blocks are `block_length` positions: drafts can then be accepted as a block's first step.
    pub fn with_block_length(mut self, block_length: usize) -> Self {
        self.block_length = Some(block_length);
        self
    }
}

impl crate::roles::Selector for ScheduleSelector {
    fn begin_block(&mut self, masked: usize) {
        let accepted = std::mem::take(&mut self.accepted);
        self.counts = transfer_counts(masked + accepted, self.steps_per_block);
        if accepted > 0 {
            // The accepted drafts were the block's first step.
            self.counts.remove(0);
        }
    }

    fn select(&mut self, candidates: &[(usize, f64)], step: usize) -> Vec<usize> {
        // Past the schedule (or with an empty one) every remaining candidate goes, so a block
        // always completes.
        let n = self.counts.get(step).copied().unwrap_or(candidates.len());
        top_n(candidates, n)
    }

    fn accept_drafts(&mut self, drafts: &[(usize, f64)]) -> Vec<usize> {
        let Some(b) = self.block_length else {
            return Vec::new();
        };
        let first = transfer_counts(b, self.steps_per_block)
            .first()
            .copied()
            .unwrap_or(0);
        let chosen = top_n(drafts, first);
        self.accepted = chosen.len();
        chosen
    }
}

/// Fast-dLLM's threshold rule ([`above_threshold`]); drafts are accepted when their confidence
/// reaches the threshold.
#[derive(Debug, Clone, Copy)]
pub struct ThresholdSelector {
    /// Confidence needed.
    pub threshold: f64,
}

impl crate::roles::Selector for ThresholdSelector {
    fn select(&mut self, candidates: &[(usize, f64)], _step: usize) -> Vec<usize> {
        above_threshold(candidates, self.threshold)
    }

    fn accept_drafts(&mut self, drafts: &[(usize, f64)]) -> Vec<usize> {
        ranked(drafts)
            .into_iter()
            .filter(|c| c.1 >= self.threshold)
            .map(|c| c.0)
            .collect()
    }
}

/// Staged decisions' rule (paper §3.3): every candidate at `theta_visible` or above becomes
/// Visible (Stable at `theta_stable`), and if none does, the most confident one becomes Visible;
/// drafts are accepted at `theta_visible`. With `no_adjacent`, a candidate below `theta_stable`
/// is not decided beside a position decided in the same step (two neighbours decided together
/// each predicted the other as a mask: the "1+5=5" error of a result digit decided with its
/// operand). With `wait_left` = n > 0, a candidate below `theta_stable` *waits* while another
/// candidate (an undecided position of the block) lies at most n positions before it: it was
/// predicted without its left context (a result digit before its operand, an operand copied
/// before the line it comes from), and is decided once that context is. The near wait
/// (`near_wait`) does the same at any threshold, closer: below its confidence a candidate waits
/// while another lies at most its `within` positions before it. A confirmed shown guess
/// ([`crate::roles::Selector::guess_confirmed`]) is decided context: nothing waits for it. The
/// step's fallback decision is then the most confident candidate that does not wait (the first
/// undecided position never does, so every step decides something).
#[derive(Debug, Clone, Copy)]
pub struct StsSelector {
    /// The two thresholds.
    pub thresholds: crate::states::Thresholds,
    /// Never decide two adjacent positions in one step below the stable threshold.
    pub no_adjacent: bool,
    /// Below the stable threshold, wait while an undecided position lies at most this many
    /// positions before (0: never wait).
    pub wait_left: usize,
    /// The near wait (`None`: off).
    pub near_wait: Option<crate::decide::NearWait>,
    /// This step's confirmed shown guess (set by `guess_confirmed`; start with `None`).
    pub guess: Option<usize>,
}

impl StsSelector {
    /// Whether another candidate than the confirmed guess lies at most `within` positions before
    /// `pos` (`candidates` sorted by position or not).
    fn left_open(&self, candidates: &[(usize, f64)], pos: usize, within: usize) -> bool {
        within > 0
            && candidates
                .iter()
                .any(|&(q, _)| q < pos && q + within >= pos && Some(q) != self.guess)
    }

    /// Whether the candidate at `pos`, `c` confident, waits for its left context.
    fn waits(&self, candidates: &[(usize, f64)], pos: usize, c: f64) -> bool {
        // A NaN confidence reaches no threshold: it waits wherever a wait applies.
        let below = |th: f64| c.is_nan() || c < th;
        (below(self.thresholds.stable) && self.left_open(candidates, pos, self.wait_left))
            || self.near_wait.is_some_and(|n| {
                below(f64::from(n.below)) && self.left_open(candidates, pos, n.within)
            })
    }
}

impl crate::roles::Selector for StsSelector {
    fn guess_confirmed(&mut self, pos: Option<usize>) {
        self.guess = pos;
    }

    fn select(&mut self, candidates: &[(usize, f64)], _step: usize) -> Vec<usize> {
        let t = self.thresholds;
        if !self.no_adjacent && self.wait_left == 0 && self.near_wait.is_none() {
            return above_threshold(candidates, t.visible);
        }
        // A NaN confidence reaches no threshold.
        let reaches = |c: f64, th: f64| c >= th;
        let mut chosen: Vec<usize> = Vec::new();
        let ranked = ranked(candidates);
        for &(pos, c) in &ranked {
            if !reaches(c, t.visible) {
                break;
            }
            let beside = self.no_adjacent && chosen.iter().any(|&q| q + 1 == pos || pos + 1 == q);
            if (beside && !reaches(c, t.stable)) || self.waits(candidates, pos, c) {
                continue;
            }
            chosen.push(pos);
        }
        if chosen.is_empty() {
            // Nothing reached the visible threshold (or everything that did waits): the most
            // confident candidate that does not wait.
            chosen.extend(
                ranked
                    .iter()
                    .find(|&&(p, c)| !self.waits(candidates, p, c))
                    .map(|c| c.0),
            );
        }
        chosen
    }

    fn accept_drafts(&mut self, drafts: &[(usize, f64)]) -> Vec<usize> {
        ranked(drafts)
            .into_iter()
            .filter(|c| c.1 >= self.thresholds.visible)
            .map(|c| c.0)
            .collect()
    }

    fn thresholds(&self) -> Option<crate::states::Thresholds> {
        Some(self.thresholds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llada_schedule_table() {
        // (masked, steps) -> counts, from get_num_transfer_tokens.
        let table: &[(usize, usize, &[usize])] = &[
            (32, 32, &[1; 32]),
            (32, 8, &[4; 8]),
            (10, 4, &[3, 3, 2, 2]),
            (3, 5, &[1, 1, 1, 0, 0]),
            (7, 1, &[7]),
        ];
        for &(m, s, want) in table {
            let got = transfer_counts(m, s);
            assert_eq!(got, want, "masked {m} steps {s}");
            assert_eq!(got.iter().sum::<usize>(), m);
        }
    }

    #[test]
    fn dream_schedule_reveals_everything() {
        for (masked, steps) in [(32usize, 32usize), (64, 16), (5, 8), (100, 3)] {
            let ts = dream_timesteps(steps, 1e-3);
            assert_eq!(ts.len(), steps + 1);
            assert!((ts[0] - 1.0).abs() < 1e-12 && (ts[steps] - 1e-3).abs() < 1e-12);
            let mut left = masked;
            for i in 0..steps {
                let k = dream_count(left, i, steps, &ts).min(left);
                left -= k;
            }
            assert_eq!(left, 0);
        }
        // First step of 32 over 32 steps: 32 * (1 - ts[1]/ts[0]) = 32 * 0.0312... -> 0 or 1.
        let ts = dream_timesteps(4, 1e-3);
        assert_eq!(
            dream_count(8, 0, 4, &ts),
            (8.0 * (1.0 - ts[1])).floor() as usize
        );
    }

    #[test]
    fn a_schedule_accepts_drafts_as_the_first_step_of_the_block() {
        use crate::roles::Selector;
        // 8 positions over 4 steps: 2 per step; the two best drafts are the first step.
        let mut s = ScheduleSelector::new(4).with_block_length(8);
        let acc = s.accept_drafts(&[(10, 0.2), (11, 0.9), (12, 0.5)]);
        assert_eq!(acc, vec![11, 12]);
        s.begin_block(6);
        assert_eq!(s.counts, vec![2, 2, 2], "the rest of the schedule");
        // Without drafts the block runs its whole schedule; without a block length none are
        // accepted.
        s.begin_block(8);
        assert_eq!(s.counts, vec![2, 2, 2, 2]);
        let mut plain = ScheduleSelector::new(4);
        assert!(plain.accept_drafts(&[(10, 0.99)]).is_empty());
    }

    #[test]
    fn staged_selection_keeps_unstable_decisions_apart() {
        use crate::roles::Selector;
        let thresholds = crate::states::Thresholds {
            visible: 0.7,
            stable: 0.9,
        };
        let c = [
            (10, 0.95),
            (11, 0.8),
            (12, 0.75),
            (13, 0.92),
            (15, 0.71),
            (16, 0.5),
        ];
        let mut plain = StsSelector {
            thresholds,
            no_adjacent: false,
            wait_left: 0,
            near_wait: None,
            guess: None,
        };
        assert_eq!(plain.select(&c, 0), vec![10, 13, 11, 12, 15]);
        let mut apart = StsSelector {
            thresholds,
            no_adjacent: true,
            wait_left: 0,
            near_wait: None,
            guess: None,
        };
        // 11 sits beside 10, 12 beside 13 (both decided first); 15 has no decided neighbour.
        assert_eq!(apart.select(&c, 0), vec![10, 13, 15]);
        // Stable decisions may sit side by side; the most confident candidate always goes.
        assert_eq!(
            apart.select(&[(3, 0.96), (4, 0.95), (5, 0.3)], 0),
            vec![3, 4]
        );
        assert_eq!(apart.select(&[(3, 0.2), (4, 0.3)], 0), vec![4]);
    }

    #[test]
    fn below_stable_a_candidate_waits_for_its_left_context() {
        use crate::roles::Selector;
        let thresholds = crate::states::Thresholds {
            visible: 0.9,
            stable: 0.95,
        };
        let mut wait = StsSelector {
            thresholds,
            no_adjacent: true,
            wait_left: 8,
            near_wait: None,
            guess: None,
        };
        // 20 is undecided: 24 (0.93, visible) waits for it, 26 (stable) does not, 40 is too far
        // to wait; 20 itself (0.5) is not visible.
        let c = [(20, 0.5), (24, 0.93), (26, 0.99), (40, 0.92)];
        assert_eq!(wait.select(&c, 0), vec![26, 40]);
        // Nothing visible: the fallback is the most confident candidate that does not wait, not
        // the most confident one (a result digit before its operand).
        assert_eq!(wait.select(&[(30, 0.3), (33, 0.8)], 0), vec![30]);
        assert_eq!(wait.select(&[(30, 0.3), (39, 0.8)], 0), vec![39]);
        // A visible candidate that waits does not stop the fallback.
        assert_eq!(wait.select(&[(30, 0.3), (31, 0.93)], 0), vec![30]);
        // Off, the same candidates are decided as before.
        wait.wait_left = 0;
        assert_eq!(wait.select(&c, 0), vec![26, 24, 40]);
        assert_eq!(wait.select(&[(30, 0.3), (33, 0.8)], 0), vec![33]);
    }

    #[test]
    fn the_near_wait_holds_a_sure_candidate_beside_an_undecided_one() {
        use crate::roles::Selector;
        let mut near = StsSelector {
            thresholds: crate::states::Thresholds {
                visible: 0.9,
                stable: 0.9,
            },
            no_adjacent: true,
            wait_left: 8,
            near_wait: Some(crate::decide::NearWait {
                within: 2,
                below: 0.975,
            }),
            guess: None,
        };
        // 12 and 13 are final-threshold candidates; 13 has 12 (undecided now) one position before
        // it and waits below 0.975; 20 is three positions from 17, beyond the near wait.
        let c = [(10, 0.99), (12, 0.93), (13, 0.96), (17, 0.99), (20, 0.95)];
        assert_eq!(near.select(&c, 0), vec![10, 17, 20]);
        // At 0.975 it no longer waits.
        let sure = [(10, 0.99), (12, 0.93), (13, 0.98)];
        assert_eq!(near.select(&sure, 0), vec![10, 13]);
        // A confirmed shown guess at 12 is decided context: 13 does not wait for it (12 waits
        // for 10, which this forward saw masked).
        near.guess_confirmed(Some(12));
        assert_eq!(near.select(&c, 0), vec![10, 17, 13, 20]);
        // A rejected guess (none confirmed) counts again.
        near.guess_confirmed(None);
        assert_eq!(near.select(&c, 0), vec![10, 17, 20]);
        // Everything waits but the first candidate: the fallback is the first.
        assert_eq!(near.select(&[(5, 0.5), (6, 0.97)], 0), vec![5]);
        // Off: 12 and 13 are decided (0.93 and 0.96 reach the final threshold).
        near.near_wait = None;
        assert_eq!(near.select(&c, 0), vec![10, 17, 13, 20, 12]);
    }

    #[test]
    fn selection_rules() {
        let c = [
            (10, 0.5),
            (11, 0.95),
            (12, 0.95),
            (13, f64::NAN),
            (14, 0.91),
        ];
        assert_eq!(top_n(&c, 2), vec![11, 12]);
        assert_eq!(top_n(&c, 5).last(), Some(&13));
        assert_eq!(above_threshold(&c, 0.9), vec![11, 12, 14]);
        assert_eq!(above_threshold(&[(3, 0.1), (4, 0.2)], 0.9), vec![4]);
        let mut rng = Rng::new(1);
        let s = sample_without_replacement(&c[..3], 3, 1.0, &mut rng);
        let mut sorted = s.clone();
        sorted.sort();
        assert_eq!(sorted, vec![10, 11, 12]);
    }
}
