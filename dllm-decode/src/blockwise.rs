//! The block loop: semi-autoregressive decoding over blocks, with the window policy and the selector
//! as plug-in roles ([`crate::roles`]). LLaDA's reference `generate` (vanilla), Fast-dLLM's prefix
//! and dual cache and multi-block speculative decoding are all this loop with different policies.
//!
//! Per block, the candidates of a step are the still-undecided positions of the current block only
//! (LLaDA sets the confidence of later positions to -inf and of decided ones to -inf), so only their
//! logits are requested — plus, when the policy asks for them, the undecided positions of the window
//! beyond the block, whose predictions are kept as drafts.

use candle_core::Tensor;
use dllm_models::{DiffusionLm, RefreshRequest, Rows};

use crate::confidence::{LladaScorer, Scored};
use crate::error::{DecodeError, Result};
use crate::generation::{ForwardTrace, Generation, StopReason};
use crate::observer::{final_prefix, Control, StepEvent, StepObserver};
use crate::params::{DecodeParams, Strategy};
use crate::revision::{RefreshPlan, Reviser};
use crate::rng::Rng;
use crate::roles::{DecodeView, Selector, WindowPlan, WindowPolicy};
use crate::states::{transition, TokenEvent, TokenState};

/// Logits rows as `Vec<f32>` per requested position (batch item 0).
pub(crate) fn rows_of(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    logits.dims3()?;
    Ok(logits.get(0)?.to_vec2()?)
}

pub(crate) fn canvas_tensor(ids: &[u32], model: &dyn DiffusionLm) -> Result<Tensor> {
    Ok(Tensor::from_slice(ids, (1, ids.len()), model.device())?)
}

/// The forward of one step: logits of `rows` (classifier-free guidance batches the unconditional
/// canvas, prompt masked, with the conditional one).
fn forward(
    model: &mut dyn DiffusionLm,
    p: &DecodeParams,
    canvas: &[u32],
    prompt_len: usize,
    plan: &WindowPlan,
    rows: &[usize],
) -> Result<Tensor> {
    let t = canvas_tensor(canvas, model)?;
    if plan.fresh_cache {
        model.clear_cache()?;
    }
    let window = plan.start..plan.end;
    if p.cfg_scale > 0.0 {
        let mask = model.info().special.mask;
        let mut uncond = canvas.to_vec();
        uncond[..prompt_len].iter_mut().for_each(|x| *x = mask);
        let both = Tensor::cat(&[&t, &canvas_tensor(&uncond, model)?], 0)?;
        let l = model.forward(&both, window, Rows::Positions(rows))?;
        let (c, u) = (l.narrow(0, 0, 1)?, l.narrow(0, 1, 1)?);
        return Ok((&u + ((c - &u)? * (p.cfg_scale as f64 + 1.0))?)?);
    }
    Ok(model.forward(&t, window, Rows::Positions(rows))?)
}

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

/// The state a decision puts a position in: through the state machine under staged stabilization,
/// final at once otherwise.
fn decided_state(selector: &dyn Selector, confidence: f64) -> Result<TokenState> {
    let Some(t) = selector.thresholds() else {
        return Ok(TokenState::Stable);
    };
    let event = if confidence >= t.visible {
        TokenEvent::Predicted(confidence)
    } else {
        TokenEvent::Promoted
    };
    Ok(transition(TokenState::Invisible, event, t)?)
}

/// What the revision part of the loop runs with (built by the decoder for `mbsd` with staged
/// stabilization and sparse cache refresh, or an oracle).
pub(crate) struct RevisionSetup {
    pub npu: std::sync::Arc<crate::latency::LatencyTable>,
    pub cpu: std::sync::Arc<crate::latency::LatencyTable>,
    /// Reference ids of the generated positions (the oracle), if any.
    pub oracle: Option<Vec<u32>>,
}

/// Run block decoding from a prepared canvas (`prompt ++ [MASK] * gen_length`) with the given roles.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    model: &mut dyn DiffusionLm,
    mut canvas: Vec<u32>,
    prompt_len: usize,
    p: &DecodeParams,
    policy: &mut dyn WindowPolicy,
    selector: &mut dyn Selector,
    revision: Option<RevisionSetup>,
    observer: &mut dyn StepObserver,
) -> Result<Generation> {
    let info = model.info().clone();
    let special = info.special.clone();
    let (mask, stop_ids) = (special.mask, special.stop_ids());
    let scorer = LladaScorer {
        remasking: p.remasking,
        temperature: p.temperature,
        logits_eos_inf: p.logits_eos_inf,
        confidence_eos_eot_inf: p.confidence_eos_eot_inf,
        eos: special.eos,
        eot: special.eot,
        mask,
    };
    let mut rng = Rng::new(p.seed);
    let num_blocks = p.num_blocks();
    let len = canvas.len();
    let mut gen = Generation::start(prompt_len);
    // Drafts: predictions for undecided positions beyond the current block, with the index of
    // the forward that made them.
    let mut drafts: Vec<Option<(Scored, usize)>> = vec![None; len];
    let mut states: Vec<TokenState> = (0..len)
        .map(|k| {
            if k < prompt_len || canvas[k] != mask {
                TokenState::Stable
            } else {
                TokenState::Invisible
            }
        })
        .collect();
    // The input each position's cached K/V were computed from (`None`: not cached).
    let mut kv_input: Vec<Option<u32>> = vec![None; len];
    let draft_context = policy.draft_context();
    let thresholds = selector.thresholds();
    let revising = p.strategy == Strategy::Mbsd && thresholds.is_some();
    let mut reviser = match (revision, thresholds) {
        (Some(r), Some(t)) if revising && (p.revision.scr || r.oracle.is_some()) => {
            let oracle = r.oracle.map(|ids| {
                (0..len)
                    .map(|k| k.checked_sub(prompt_len).and_then(|i| ids.get(i).copied()))
                    .collect()
            });
            Some(Reviser {
                thresholds: t,
                margin: p.revision.margin as f64,
                budget: p.revision.refresh_budget,
                cpu_ms_per_position: r.cpu.per_position_ms(),
                npu: r.npu,
                oracle,
                conf: vec![1.0; len],
                pending_kv: Default::default(),
            })
        }
        _ => None,
    };
    let sls = p.revision.sls;
    model.clear_cache()?;
    for b in 0..num_blocks {
        let block = prompt_len + b * p.block_length..prompt_len + (b + 1) * p.block_length;
        let masked_in =
            |c: &[u32]| -> Vec<usize> { block.clone().filter(|&i| c[i] == mask).collect() };
        // The block becomes current: the drafts of the forward that made it current (the last
        // one) are offered with that forward's confidence; older drafts are dropped.
        let latest = gen.forwards.checked_sub(1);
        let pending: Vec<(usize, f64)> = block
            .clone()
            .filter(|&i| canvas[i] == mask)
            .filter_map(|i| match drafts[i] {
                Some((d, f)) if Some(f) == latest => Some((i, d.confidence)),
                _ => None,
            })
            .collect();
        let mut accepted = Vec::new();
        let mut accepted_conf = Vec::new();
        if !pending.is_empty() {
            accepted = selector.accept_drafts(&pending);
            accepted.sort_unstable();
            if accepted.windows(2).any(|w| w[0] == w[1]) {
                return Err(DecodeError::Policy {
                    policy: "selector".into(),
                    reason: format!("accept_drafts returned a position twice: {accepted:?}"),
                });
            }
            for &pos in &accepted {
                let Some((d, _)) = drafts[pos].filter(|_| pending.iter().any(|c| c.0 == pos))
                else {
                    return Err(DecodeError::Policy {
                        policy: "selector".into(),
                        reason: format!(
                            "accept_drafts returned position {pos}, which is not among the offered drafts"
                        ),
                    });
                };
                canvas[pos] = d.token;
                states[pos] = decided_state(selector, d.confidence)?;
                accepted_conf.push(d.confidence);
                if let Some(r) = reviser.as_mut() {
                    r.conf[pos] = d.confidence;
                }
            }
            gen.drafts += pending.len();
            gen.drafts_accepted += accepted.len();
            gen.drafts_rejected += pending.len() - accepted.len();
            gen.tokens_decoded += accepted.len();
        }
        block.clone().for_each(|i| drafts[i] = None);
        if !accepted.is_empty() && masked_in(&canvas).is_empty() {
            // Every undecided position of the block came from its drafts: report them now (no
            // forward ran for this event).
            let event = StepEvent {
                step: gen.steps,
                block: b,
                num_blocks,
                forwards: gen.forwards,
                canvas: &canvas,
                prompt_len,
                unmasked: &accepted,
                confidences: &accepted_conf,
                revised: &[],
                window: block.start..block.start,
                masked_left: canvas[prompt_len..].iter().filter(|&&t| t == mask).count(),
                mask_id: mask,
                states: &states,
                final_len: final_prefix(&states, prompt_len),
                tentative: &[],
            };
            if observer.on_step(&event) == Control::Stop {
                gen.stop = StopReason::Observer;
                gen.canvas = canvas;
                return Ok(gen);
            }
            accepted.clear();
            accepted_conf.clear();
        }
        selector.begin_block(masked_in(&canvas).len());
        let step_bound = p.steps_per_block().max(p.block_length) + 1;
        let mut i = 0;
        loop {
            let cands = masked_in(&canvas);
            if cands.is_empty() {
                break;
            }
            // What the model sees: decided tokens, plus confident drafts when the policy shows them.
            let seen: Vec<u32> = match draft_context {
                None => canvas.clone(),
                Some(t) => (0..len)
                    .map(|k| match drafts[k] {
                        Some((d, _)) if canvas[k] == mask && d.confidence >= t => d.token,
                        _ => canvas[k],
                    })
                    .collect(),
            };
            // Decided positions whose cached K/V came from another input: the window recomputes
            // them (the next forward reads the cache, so a CPU recompute merged after it would
            // come one forward late), except the ones the refresh revised, which are its own.
            let mut stale: Vec<usize> = (prompt_len..len)
                .filter(|&k| {
                    canvas[k] != mask && kv_input[k].is_some() && kv_input[k] != Some(canvas[k])
                })
                .collect();
            if let Some(r) = reviser.as_ref() {
                stale.retain(|k| !r.pending_kv.contains(k));
            }
            let view = DecodeView {
                canvas: &canvas,
                mask,
                prompt_len,
                block: &block,
                block_index: b,
                num_blocks,
                step_in_block: i,
                cache_len: model.cache_len(),
                stale: &stale,
                info: &info,
            };
            let plan = policy.plan(&view)?;
            check_plan(policy, &plan, len, view.cache_len, &cands)?;
            // Undecided positions a window leaves out (cut to a latency bucket) wait for a later
            // forward.
            let cands: Vec<usize> = cands
                .into_iter()
                .filter(|&k| (plan.start..plan.end).contains(&k))
                .collect();
            let draft_rows: Vec<usize> = if plan.drafts {
                (plan.start..plan.end)
                    .filter(|&k| !block.contains(&k) && canvas[k] == mask)
                    .collect()
            } else {
                Vec::new()
            };
            let wanted: Vec<usize> = cands.iter().chain(&draft_rows).copied().collect();
            let rows: Vec<usize> = if sls {
                wanted.clone()
            } else {
                (plan.start..plan.end).collect()
            };
            gen.logits_rows_skipped += plan.end - plan.start - rows.len();
            let cached = if plan.fresh_cache { 0 } else { view.cache_len };
            let refresh = match reviser.as_ref() {
                Some(r) if !plan.fresh_cache => r.plan(
                    &states,
                    prompt_len,
                    plan.end - plan.start,
                    rows.len(),
                    cached,
                ),
                _ => RefreshPlan::default(),
            };
            let (logits, refreshed) = if refresh.is_empty() {
                (forward(model, p, &seen, prompt_len, &plan, &rows)?, None)
            } else {
                if p.cfg_scale > 0.0 {
                    return Err(DecodeError::Policy {
                        policy: policy.name().to_string(),
                        reason: "a sparse refresh cannot run with classifier-free guidance".into(),
                    });
                }
                let (l, r) = model.forward_with_refresh(
                    &canvas_tensor(&seen, model)?,
                    plan.start..plan.end,
                    Rows::Positions(&rows),
                    RefreshRequest {
                        positions: &refresh.kv,
                        logits: Some(&refresh.rescore),
                        score_masked: true,
                    },
                )?;
                (l, Some(r))
            };
            gen.forwards += 1;
            let active = (plan.start..plan.end)
                .filter(|&k| k >= prompt_len && canvas[k] == mask)
                .count();
            gen.active_positions += active;
            // Positions beyond the current block the window computes as drafts.
            let lookahead = if plan.drafts && !plan.fresh_cache {
                plan.end.saturating_sub(block.end.max(plan.start))
            } else {
                0
            };
            gen.lookahead_positions += lookahead;
            gen.trace.push(ForwardTrace {
                step: gen.steps,
                start: plan.start,
                end: plan.end,
                rows: rows.len(),
                cached,
                active,
                refreshed: refresh.kv.len(),
                rescored: refresh.rescore.len(),
                lookahead,
            });
            if plan.fresh_cache {
                kv_input.iter_mut().for_each(|k| *k = None);
            }
            // Step boundary: merge the refreshed K/V first (they were computed against the cache
            // this forward read), then let the policy commit the window's fresh rows.
            if let Some(r) = &refreshed {
                model.apply_refresh(r)?;
                gen.refreshes += r.positions.len();
                gen.rescored += r.scored.len();
                for &k in &r.positions {
                    kv_input[k] = Some(seen[k]);
                }
                if let Some(rv) = reviser.as_mut() {
                    rv.merged(&r.positions);
                }
                if let Some(t) = &r.timing {
                    gen.refresh_ms += 1e3 * t.refresh_secs();
                    gen.merge_wait_ms += 1e3 * t.wait_secs();
                }
            }
            let view = DecodeView {
                cache_len: model.cache_len(),
                ..view
            };
            if let Some((a, e)) = policy.commit(&view, &plan) {
                // Drafts shown as context never enter the cache: stop before the first of them.
                let e = (a..e).find(|&k| seen[k] != canvas[k]).unwrap_or(e);
                if e > a {
                    model.commit(a..e)?;
                    for k in a..e {
                        kv_input[k] = Some(seen[k]);
                    }
                }
            }
            let mut all_rows = rows_of(&logits)?;
            let index: std::collections::HashMap<usize, usize> =
                rows.iter().enumerate().map(|(k, &pos)| (pos, k)).collect();
            let mut scored: Vec<Scored> = Vec::with_capacity(wanted.len());
            for pos in &wanted {
                let row = &mut all_rows[index[pos]];
                scored.push(scorer.score(row, &mut rng));
            }
            let draft_scores = scored.split_off(cands.len());
            for (&pos, s) in draft_rows.iter().zip(&draft_scores) {
                drafts[pos] = Some((*s, gen.forwards - 1));
            }
            gen.draft_predictions += draft_rows.len();
            // Revisions: the re-scores of the CPU path, or the oracle.
            let mut revised = Vec::new();
            if let Some(rv) = reviser.as_mut() {
                if let Some(r) = refreshed.as_ref().filter(|r| !r.scored.is_empty()) {
                    let rl = r
                        .logits
                        .as_ref()
                        .map(rows_of)
                        .transpose()?
                        .unwrap_or_default();
                    revised = rv.apply(&r.scored, &rl, &mut canvas, &mut states)?;
                }
                revised.extend(rv.oracle_step(prompt_len, &mut canvas, &states));
                gen.revised += revised.len();
            }
            let conf: Vec<(usize, f64)> = cands
                .iter()
                .zip(&scored)
                .map(|(&pos, s)| (pos, s.confidence))
                .collect();
            let chosen = selector.select(&conf, i);
            // A step may decide nothing (LLaDA's schedule with more steps than positions runs such
            // forwards), but a block cannot take more steps than this: every step after the
            // schedule decides something, so only a broken selector gets here.
            if chosen.is_empty() && i >= step_bound {
                return Err(DecodeError::Policy {
                    policy: "selector".into(),
                    reason: format!(
                        "block {b} made no progress in {} steps ({} positions undecided)",
                        i + 1,
                        cands.len()
                    ),
                });
            }
            let mut unmasked = std::mem::take(&mut accepted);
            let mut unmasked_conf = std::mem::take(&mut accepted_conf);
            for &pos in &chosen {
                let k = cands.binary_search(&pos).map_err(|_| DecodeError::Policy {
                    policy: "selector".into(),
                    reason: format!("chose position {pos}, which is not a candidate"),
                })?;
                canvas[pos] = scored[k].token;
                states[pos] = decided_state(selector, scored[k].confidence)?;
                if let Some(r) = reviser.as_mut() {
                    r.conf[pos] = scored[k].confidence;
                }
                unmasked.push(pos);
                unmasked_conf.push(scored[k].confidence);
            }
            gen.tokens_decoded += chosen.len();
            gen.steps += 1;
            i += 1;
            // The predictions this step left undecided, for observers that show them.
            let tentative: Vec<(usize, u32)> = cands
                .iter()
                .zip(&scored)
                .chain(draft_rows.iter().zip(&draft_scores))
                .filter(|(&pos, _)| canvas[pos] == mask)
                .map(|(&pos, s)| (pos, s.token))
                .collect();
            let event = StepEvent {
                step: gen.steps - 1,
                block: b,
                num_blocks,
                forwards: gen.forwards,
                canvas: &canvas,
                prompt_len,
                unmasked: &unmasked,
                confidences: &unmasked_conf,
                revised: &revised,
                window: plan.start..plan.end,
                masked_left: canvas[prompt_len..].iter().filter(|&&t| t == mask).count(),
                mask_id: mask,
                states: &states,
                final_len: final_prefix(&states, prompt_len),
                tentative: &tentative,
            };
            if observer.on_step(&event) == Control::Stop {
                gen.stop = StopReason::Observer;
                gen.canvas = canvas;
                return Ok(gen);
            }
        }
        gen.unstable_at_block_end += block
            .clone()
            .filter(|&k| states[k] == TokenState::Visible)
            .count();
        if p.early_stop && b + 1 < num_blocks && stop_ids.contains(&canvas[block.end - 1]) {
            canvas[block.end..]
                .iter_mut()
                .for_each(|t| *t = special.eos);
            gen.stop = StopReason::EndOfSequence;
            break;
        }
    }
    gen.canvas = canvas;
    Ok(gen)
}
