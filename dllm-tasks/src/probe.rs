//! A teacher-forced skill probe for `long-math`: which part of a worked line a model has learnt.
//!
//! A worked line `January: 4+2=6` needs three skills: **copy** the first operand from the previous
//! line's result (or the prompt's start), **look up** the month's operation and operand in the
//! prompt, and **compute** the single-digit result. Decoding mixes them (and the order tokens are
//! committed in); this probe separates them. The canvas holds the prompt and the *reference*
//! answer; for each line a few tokens are masked and one forward predicts them:
//!
//! - copy: the line's first operand (lines after the first), everything else visible;
//! - lookup: the operator and the operand (both must be right);
//! - arithmetic: the result, together with every other place that repeats it (the next line's
//!   first operand, or the `Answer:` value after the last line), so it must be computed.
//!
//! Final-answer accuracy of a chain of `n` lines is roughly the product of its lines' accuracies,
//! so a skill at 35% explains a near-guessing final answer even when the other two are perfect.

use dllm_models::{DiffusionLm, Rows};
use serde::Serialize;
use tokenizers::Tokenizer;

use crate::tasks::{Example, TaskKind};
use crate::tokenizer::{encode_prompt, encode_response};
use crate::{Error, Result, EOS_ID, MASK_ID};

/// One skill's score.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SkillScore {
    /// Probes answered right.
    pub right: usize,
    /// Probes run.
    pub total: usize,
}

impl SkillScore {
    /// Accuracy in [0, 1] (0 without probes).
    pub fn accuracy(&self) -> f64 {
        self.right as f64 / self.total.max(1) as f64
    }
    fn add(&mut self, ok: bool) {
        self.right += usize::from(ok);
        self.total += 1;
    }
}

/// The three skills of a worked long-math line.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct MathSkills {
    /// Copying the previous result as the next line's first operand.
    pub copy: SkillScore,
    /// Finding the month's operator and operand in the prompt.
    pub lookup: SkillScore,
    /// Computing the line's result from its visible operands.
    pub arithmetic: SkillScore,
}

fn id(tok: &Tokenizer, token: &str) -> Result<u32> {
    tok.token_to_id(token).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "the tokenizer has no {token:?} token (not the long suite's tokenizer)"
        ))
    })
}

/// Probe `model` on `examples` (long-math only; others are an error) with answers of `gen_len`
/// positions (the reference padded with EOS, as in training).
pub fn probe_long_math(
    model: &mut dyn DiffusionLm,
    tok: &Tokenizer,
    examples: &[Example],
    gen_len: usize,
) -> Result<MathSkills> {
    let (eq, answer) = (id(tok, "=")?, id(tok, "ĠAnswer")?);
    let mut s = MathSkills::default();
    for ex in examples {
        if ex.kind != TaskKind::LongMath {
            return Err(Error::InvalidArgument(format!(
                "the skill probe runs on long-math examples, not {}",
                ex.kind
            )));
        }
        let prompt = encode_prompt(tok, &ex.prompt)?;
        let mut resp = encode_response(tok, &ex.response)?;
        if resp.len() > gen_len {
            return Err(Error::InvalidArgument(format!(
                "a reference answer of {} tokens does not fit gen_len {gen_len}",
                resp.len()
            )));
        }
        resp.resize(gen_len, EOS_ID);
        let eqs: Vec<usize> = (0..resp.len()).filter(|&j| resp[j] == eq).collect();
        // The answer's value: the token after `Answer`, `:` and the space.
        let answer_at = resp.iter().position(|&t| t == answer).map(|j| j + 3);
        let mut probe = |masked: &[usize], scored: &[usize]| -> Result<bool> {
            let mut canvas: Vec<u32> = prompt.iter().chain(&resp).copied().collect();
            let at: Vec<usize> = scored.iter().map(|&j| prompt.len() + j).collect();
            for &j in masked {
                canvas[prompt.len() + j] = MASK_ID;
            }
            let n = canvas.len();
            let x = candle_core::Tensor::from_vec(canvas, (1, n), &candle_core::Device::Cpu)?;
            model.clear_cache()?;
            let logits = model.forward_full(&x, Rows::Positions(&at))?;
            let pred: Vec<u32> = logits
                .squeeze(0)?
                .argmax(candle_core::D::Minus1)?
                .to_vec1()?;
            Ok(pred.iter().zip(scored).all(|(&p, &j)| p == resp[j]))
        };
        for (li, &e) in eqs.iter().enumerate() {
            if e < 3 || e + 1 >= resp.len() {
                continue;
            }
            let (a, op, b, res) = (e - 3, e - 2, e - 1, e + 1);
            if li > 0 {
                s.copy.add(probe(&[a], &[a])?);
            }
            s.lookup.add(probe(&[op, b], &[op, b])?);
            let repeat = match eqs.get(li + 1) {
                Some(&next) if next >= 3 => Some(next - 3),
                _ => answer_at,
            };
            let mut masked = vec![res];
            masked.extend(repeat.filter(|&j| j < resp.len()));
            s.arithmetic.add(probe(&masked, &[res])?);
        }
    }
    Ok(s)
}
