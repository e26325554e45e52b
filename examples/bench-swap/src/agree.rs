//! Do two generations agree? Both runs are recorded forward by forward (requested rows, batch-0
//! logits) and step by step (the canvas). Identical logits mean identical runs. Otherwise, at the
//! first step whose canvases differ, the forward before it had identical inputs in both runs; with
//! `e` the largest |logit difference| of that forward, a different token at a position needs the
//! reference's top-2 logit gap <= 2e, and a different choice of positions needs the reference's
//! confidences within a factor exp(4e) — else the divergence is not explained by the numerics.

use anyhow::Result;
use dllm_decode::{generate, Control, DecodeParams, StepEvent};
use dllm_models::DiffusionLm;

/// A recorded generation.
pub struct Run {
    calls: Vec<(Vec<usize>, Vec<Vec<f32>>)>,
    steps: Vec<(usize, Vec<u32>)>,
    initial: Vec<u32>,
    /// The generated tokens.
    pub generated: Vec<u32>,
    /// Tokens the decoder unmasked.
    pub decoded: usize,
    /// Forwards.
    pub forwards: usize,
}

/// Generate and record.
pub fn record(
    model: &mut dyn DiffusionLm,
    prompt: &[u32],
    p: &DecodeParams,
) -> std::result::Result<Run, dllm_decode::DecodeError> {
    let mut rec = dllm_models::recorder::LogitsRecorder::new(model);
    let mut steps = vec![];
    let mut obs = |e: &StepEvent<'_>| {
        steps.push((e.forwards, e.canvas.to_vec()));
        Control::Continue
    };
    let g = generate(&mut rec, prompt, p, &mut obs)?;
    let mut initial = prompt.to_vec();
    initial.resize(prompt.len() + p.gen_length, rec.info().special.mask);
    Ok(Run {
        calls: rec.calls,
        steps,
        initial,
        generated: g.generated().to_vec(),
        decoded: g.tokens_decoded,
        forwards: g.forwards,
    })
}

fn top2(row: &[f32]) -> (f64, f64) {
    let (mut a, mut b) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for &x in row {
        let x = x as f64;
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    (a, b)
}

fn confidence(row: &[f32]) -> f64 {
    let (top, _) = top2(row);
    1.0 / row.iter().map(|&x| (x as f64 - top).exp()).sum::<f64>()
}

/// How `other` compares with `reference`, in a few words for a table cell.
pub fn verdict(reference: &Run, other: &Run, mask: u32) -> Result<String> {
    if reference.calls == other.calls && reference.generated == other.generated {
        return Ok("identical (bit-identical logits)".into());
    }
    let mut max_err = 0f64;
    for s in 0..reference.steps.len().min(other.steps.len()) {
        let ((fr, cr), (fo, co)) = (&reference.steps[s], &other.steps[s]);
        if fr != fo || fr == &0 {
            return Ok(format!("NO: step {s} took {fr} vs {fo} forwards"));
        }
        let ((pos, lr), (pos_o, lo)) = (&reference.calls[fr - 1], &other.calls[fo - 1]);
        if pos != pos_o {
            return Ok(format!("NO: step {s} scored different rows"));
        }
        let e = lr
            .iter()
            .flatten()
            .zip(lo.iter().flatten())
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .fold(0.0, f64::max);
        max_err = max_err.max(e);
        if cr == co {
            continue;
        }
        let prev = if s == 0 {
            &reference.initial
        } else {
            &reference.steps[s - 1].1
        };
        let (mut only_r, mut only_o, mut notes) = (vec![], vec![], vec![]);
        for p in (0..cr.len()).filter(|&p| cr[p] != co[p]) {
            let Some(row) = pos.iter().position(|&q| q == p) else {
                return Ok(format!(
                    "NO: step {s}: position {p} changed without being scored"
                ));
            };
            if prev[p] != mask {
                return Ok(format!("NO: step {s}: position {p} was already decided"));
            }
            if cr[p] != mask && co[p] != mask {
                let (a, b) = top2(&lr[row]);
                if a - b > 2.0 * e + 1e-9 {
                    return Ok(format!(
                        "NO: step {s}: position {p}: top-2 gap {:.1e} > 2e",
                        a - b
                    ));
                }
                notes.push(format!("top-2 gap {:.1e} <= 2e", a - b));
            } else if cr[p] != mask {
                only_r.push(row);
            } else {
                only_o.push(row);
            }
        }
        if only_r.len() != only_o.len() {
            return Ok(format!(
                "NO: step {s}: different numbers of tokens unmasked"
            ));
        }
        for &a in &only_r {
            for &b in &only_o {
                let ratio = confidence(&lr[a]) / confidence(&lr[b]);
                if ratio > (4.0 * e).exp() + 1e-12 {
                    return Ok(format!(
                        "NO: step {s}: confidence ratio {ratio:.4} > exp(4e)"
                    ));
                }
                notes.push(format!("confidence ratio {ratio:.6} <= exp(4e)"));
            }
        }
        return Ok(format!(
            "near-tie at step {s} of {} (e = {e:.1e}: {}); {} of {} tokens equal",
            reference.steps.len(),
            notes.join(", "),
            reference
                .generated
                .iter()
                .zip(&other.generated)
                .filter(|(a, b)| a == b)
                .count(),
            reference.generated.len()
        ));
    }
    if reference.generated == other.generated {
        Ok(format!("identical tokens (max logit error {max_err:.1e})"))
    } else {
        Ok("NO: tokens differ without a divergent step".into())
    }
}
