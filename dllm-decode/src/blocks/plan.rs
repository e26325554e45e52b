//! Planning: what the next forward computes — the window the policy chooses, the logits rows a
//! decision needs, the verification rows of tentative tokens, and what enters the cache.

use std::ops::Range;

use dllm_models::Ask;

use super::{Blocks, Planned};
use crate::error::{DecodeError, Result};
use crate::roles::{DecodeView, WindowPlan, WindowPolicy};
use crate::states::TokenState;

fn check_plan(
    policy: &dyn WindowPolicy,
    plan: &WindowPlan,
    len: usize,
    cache_len: usize,
    cands: &[usize],
) -> Result<()> {
    let bad = |why: String| {
        Err(DecodeError::Policy {
            policy: policy.name().to_string(),
            reason: why,
        })
    };
    if plan.start >= plan.end || plan.end > len {
        return bad(format!(
            "window [{}, {}) is empty or outside the canvas of {len}",
            plan.start, plan.end
        ));
    }
    if plan.fresh_cache && plan.start != 0 {
        return bad(format!(
            "a forward that empties the cache must start at 0, not {}",
            plan.start
        ));
    }
    if !plan.fresh_cache && plan.start > cache_len {
        return bad(format!(
            "window [{}, {}) starts after the cached [0, {cache_len})",
            plan.start, plan.end
        ));
    }
    if !cands.iter().any(|&p| p >= plan.start && p < plan.end) {
        return bad(format!(
            "window [{}, {}) holds none of the current block's undecided positions {:?}",
            plan.start,
            plan.end,
            &cands[..cands.len().min(8)]
        ));
    }
    Ok(())
}

impl Blocks<'_> {
    /// What the model sees: decided tokens, plus confident drafts when the policy shows them.
    fn seen(&self) -> Vec<u32> {
        let mask = self.mask();
        match self.policy.draft_context() {
            None => self.canvas.clone(),
            Some(t) => (0..self.canvas.len())
                .map(|k| match self.drafts[k] {
                    Some((d, _)) if self.canvas[k] == mask && d.confidence >= t => d.token,
                    _ => self.canvas[k],
                })
                .collect(),
        }
    }

    /// Decided positions whose cached K/V came from another input: the window recomputes them
    /// (the next forward reads the cache).
    fn stale(&self) -> Vec<usize> {
        let mask = self.mask();
        (self.prompt_len..self.canvas.len())
            .filter(|&k| {
                self.canvas[k] != mask
                    && self.kv_input[k].is_some()
                    && self.kv_input[k] != Some(self.canvas[k])
            })
            .collect()
    }

    /// The next forward.
    pub(super) fn plan_next(&mut self) -> Result<Option<Ask>> {
        let cands = self.candidates();
        if cands.is_empty() {
            return self.plan_verification();
        }
        let len = self.canvas.len();
        let block = self.block_range(self.block);
        let (mut seen, stale) = (self.seen(), self.stale());
        // Tokens waiting for their first look get shadow rows in this forward: the policy leaves
        // room for them first.
        let verify_rows = self
            .verifier
            .as_ref()
            .map_or(0, |v| v.waiting(&self.states) * v.group_rows);
        // The guess the window will show (below), priced before the policy plans it.
        let guess_rows = self
            .guess_in(&cands, &seen, 0..len)
            .map_or(0, |_| 1 + usize::from(self.info.shift_logits));
        let view = DecodeView {
            canvas: &self.canvas,
            mask: self.mask(),
            prompt_len: self.prompt_len,
            block: &block,
            block_index: self.block,
            num_blocks: self.p.num_blocks(),
            step_in_block: self.step_in_block,
            cache_len: self.cache_len,
            stale: &stale,
            verify_rows,
            guess_rows,
            info: &self.info,
        };
        let plan = self.policy.plan(&view)?;
        check_plan(self.policy.as_ref(), &plan, len, self.cache_len, &cands)?;
        let commit = self.policy.commit(&view, &plan).and_then(|(a, e)| {
            // Drafts shown as context never enter the cache: stop before the first of them.
            let e = (a..e).find(|&k| seen[k] != self.canvas[k]).unwrap_or(e);
            (e > a).then_some(a..e)
        });
        // The guess: the last forward's prediction for the window's first undecided position.
        // It enters the cache with the window (a rejected guess leaves its position stale, and
        // the next window, starting at the frontier, recomputes everything after it).
        let shown = self.guess_in(&cands, &seen, plan.start..plan.end);
        if let Some((k, t)) = shown {
            seen[k] = t;
        }
        // Undecided positions a window leaves out (cut to a latency bucket) wait for a later
        // forward.
        let window = plan.start..plan.end;
        let cands: Vec<usize> = cands.into_iter().filter(|k| window.contains(k)).collect();
        let (draft_rows, rows) = self.logits_rows(&plan, &block, &cands, shown);
        let cached = if plan.fresh_cache { 0 } else { self.cache_len };
        let mut shadows = match &self.verifier {
            Some(v) => {
                let hidden = |p: usize| self.partners_of(v, p, &window, cached).len();
                v.shadows(
                    &self.states,
                    (window.len(), rows.len(), cached),
                    false,
                    &hidden,
                )
            }
            None => Vec::new(),
        };
        shadows.extend(shown.map(|g| g.0));
        let lookahead = if plan.drafts && !plan.fresh_cache {
            plan.end.saturating_sub(block.end.max(plan.start))
        } else {
            0
        };
        Ok(Some(self.ask(Planned {
            plan,
            cands,
            draft_rows,
            rows,
            seen,
            shadows,
            commit,
            lookahead,
            unlooked_in_window: self.unlooked_in(window.clone()),
            shown,
            computed: 0,
        })))
    }

    /// The guess a window over `window` shows (`MbsdParams::show_guess`): the last forward's
    /// prediction for its first undecided position, `(position, token)`.
    fn guess_in(
        &self,
        cands: &[usize],
        seen: &[u32],
        window: Range<usize>,
    ) -> Option<(usize, u32)> {
        if !self.show_guess {
            return None;
        }
        let first =
            (cands.iter().copied()).find(|&k| window.contains(&k) && seen[k] == self.mask())?;
        self.guessed[first].map(|t| (first, t))
    }

    /// A planned window's draft positions (undecided, beyond the block) and its logits rows: the
    /// candidates and drafts (the shown guess's own row only repeats its input: its shadow scores
    /// it), or every window row without selective logits.
    fn logits_rows(
        &self,
        plan: &WindowPlan,
        block: &Range<usize>,
        cands: &[usize],
        shown: Option<(usize, u32)>,
    ) -> (Vec<usize>, Vec<usize>) {
        let window = plan.start..plan.end;
        let mask = self.mask();
        let draft_rows: Vec<usize> = if plan.drafts {
            (window.clone())
                .filter(|&k| !block.contains(&k) && self.canvas[k] == mask)
                .collect()
        } else {
            Vec::new()
        };
        let rows = if self.p.sls {
            let guess = shown.map(|g| g.0);
            (cands.iter().chain(&draft_rows).copied())
                .filter(|&k| Some(k) != guess)
                .collect()
        } else {
            window.collect()
        };
        (draft_rows, rows)
    }

    /// A forward that only verifies: every undecided position is decided, but tokens wait for
    /// their first fresh look before the generation (or an early stop) may end. The window
    /// recomputes the positions from the first tentative or stale one to the block's end (so the
    /// shadows see fresh K/V of every decided token) and is committed.
    fn plan_verification(&mut self) -> Result<Option<Ask>> {
        let Some(v) = &self.verifier else {
            return Err(DecodeError::Policy {
                policy: "block loop".into(),
                reason: "nothing to decide and nothing to verify, yet the generation goes on"
                    .into(),
            });
        };
        let end = self.block_range(self.block).end;
        let first_visible = (self.prompt_len..end).find(|&k| self.states[k] == TokenState::Visible);
        let start = self
            .stale()
            .first()
            .copied()
            .into_iter()
            .chain(first_visible)
            .min()
            .unwrap_or(end - 1)
            .min(self.cache_len)
            .max(usize::from(self.info.shift_logits));
        let cached = self.cache_len;
        let shadows = v.shadows(&self.states, (end - start, 0, cached), true, &|_| 0);
        let plan = WindowPlan {
            start,
            end,
            fresh_cache: false,
            drafts: false,
        };
        Ok(Some(self.ask(Planned {
            plan,
            cands: Vec::new(),
            draft_rows: Vec::new(),
            // No decision needs logits; without selective skipping every row goes to the head.
            rows: if self.p.sls {
                Vec::new()
            } else {
                (start..end).collect()
            },
            seen: self.seen(),
            shadows,
            commit: Some(start..end),
            lookahead: 0,
            unlooked_in_window: false,
            shown: None,
            computed: 0,
        })))
    }

    /// Whether `range` holds a tentative token no forward has looked at yet.
    fn unlooked_in(&self, range: std::ops::Range<usize>) -> bool {
        self.verifier
            .as_ref()
            .is_some_and(|v| range.into_iter().any(|p| v.is_unlooked(p, &self.states)))
    }

    /// What each shadow of a planned forward leaves out ([`crate::verify::Verifier::partners`]):
    /// positions cached or in the window; nothing for the shown guess's shadow. Empty when no
    /// shadow hides anything.
    fn partners(&self, planned: &Planned) -> Vec<Vec<usize>> {
        let Some(v) = &self.verifier else {
            return Vec::new();
        };
        let window = planned.plan.start..planned.plan.end;
        let cached = if planned.plan.fresh_cache || self.out.forwards == 0 {
            0
        } else {
            self.cache_len
        };
        let guess = planned.shown.map(|g| g.0);
        let lists: Vec<Vec<usize>> = (planned.shadows.iter())
            .map(|&p| match Some(p) == guess {
                true => Vec::new(),
                false => self.partners_of(v, p, &window, cached),
            })
            .collect();
        match lists.iter().all(Vec::is_empty) {
            true => Vec::new(),
            false => lists,
        }
    }

    /// The partners a forward over `window` after `cached` cache rows can hide from `p`'s look.
    fn partners_of(
        &self,
        v: &crate::verify::Verifier,
        p: usize,
        window: &Range<usize>,
        cached: usize,
    ) -> Vec<usize> {
        let visible = |q: usize| q < cached || window.contains(&q);
        v.partners(p, &self.states, visible)
    }

    /// The ask of a planned forward (kept until its answer arrives).
    fn ask(&mut self, planned: Planned) -> Ask {
        let verify_hidden = self.partners(&planned);
        let mut canvas = vec![planned.seen.clone()];
        if self.p.cfg_scale > 0.0 {
            let mut uncond = planned.seen.clone();
            let mask = self.mask();
            uncond[..self.prompt_len].iter_mut().for_each(|x| *x = mask);
            canvas.push(uncond);
        }
        let ask = Ask {
            canvas,
            // The generation's first forward starts from an empty cache, whatever the policy.
            clear_cache: planned.plan.fresh_cache || self.out.forwards == 0,
            window: planned.plan.start..planned.plan.end,
            rows: planned.rows.clone(),
            verify: planned.shadows.clone(),
            verify_hidden,
            commit: planned.commit.clone(),
        };
        let computed = ask.rows_count(self.info.shift_logits) / ask.canvas.len().max(1);
        self.planned = Some(Planned {
            computed,
            ..planned
        });
        ask
    }
}
