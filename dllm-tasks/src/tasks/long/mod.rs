//! The long suite: four task families whose worked answers are 64-128 tokens, one step per
//! line, each line depending on earlier ones (the workload of 128-token, 4 x 32-block
//! decoding).
//!
//! | [`TaskKind`] | name | stands in for | worked answer |
//! |---|---|---|---|
//! | `LongMath` | `long-math` | GSM8K | 8-12 lines `Month: a+b=c` (single digits), each reusing the last result |
//! | `LongYesNo` | `long-yesno` | BoolQ | the chain of comparisons restated from X down, then the verdict |
//! | `LongChoice` | `long-choice` | ARC-C | one line classifying each of six options |
//! | `LongStory` | `long-story` | HellaSwag | three rounds of a story that must track who holds what |
//!
//! Every response ends with an `Answer: X` line; every other line is a *step*, and
//! [`check_steps`] scores them position by position against the reference (the per-step
//! accuracy of a worked answer). Lines are separated by `\n`.
//!
//! [`TaskKind`]: super::TaskKind

pub mod choice;
pub mod confirm;
pub mod math;
pub mod story;
pub mod yesno;

use serde::{Deserialize, Serialize};

use super::{cut_at_eos, normalize_whitespace, Example, ANSWER_MARKER};

/// The size of a generated instance. Held-out sets and the documented lengths are
/// [`Scale::Full`]; [`Scale::Small`] instances (fewer steps, facts, options or people; answers
/// under 64 tokens) exist for training only: they teach the same formats and lookups on short
/// prompts and short canvases, which a small model learns from far sooner and trains on far
/// cheaper (see `TrainStream::with_small_fraction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scale {
    /// The suite's instances (64-128-token answers).
    Full,
    /// Training-only small instances (answers of at most [`SMALL_MAX_RESPONSE_TOKENS`] tokens).
    Small,
}

/// Most tokens of a [`Scale::Small`] response (without EOS; tested), so a 64-position response
/// region holds it and its EOS.
pub const SMALL_MAX_RESPONSE_TOKENS: usize = 63;

/// Draws one instance of a long task at `scale`.
pub fn generate_scaled(kind: super::TaskKind, rng: &mut crate::rng::Rng, scale: Scale) -> Example {
    use super::TaskKind as K;
    match kind {
        K::LongMath => math::generate_scaled(rng, scale),
        K::LongYesNo => yesno::generate_scaled(rng, scale),
        K::LongChoice => choice::generate_scaled(rng, scale),
        K::LongStory => story::generate_scaled(rng, scale),
        short => super::generate(short, rng),
    }
}

/// The separator between the steps of a worked answer.
pub const STEP_SEPARATOR: char = '\n';

/// How many steps of a worked answer are right.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepScore {
    /// Reference steps reproduced at the same line, up to whitespace.
    pub right: usize,
    /// Steps in the reference.
    pub total: usize,
}

/// The steps of a worked response: its lines before the `Answer:` line, whitespace-normalised,
/// empty lines dropped.
pub fn steps(response: &str) -> Vec<String> {
    cut_at_eos(response)
        .split(STEP_SEPARATOR)
        .map(normalize_whitespace)
        .filter(|l| !l.is_empty() && !l.starts_with(ANSWER_MARKER))
        .collect()
}

/// Scores the steps of `model_response` against `example`'s reference, line by line (line
/// `i` must equal reference line `i`). `None` for tasks whose answers are not worked (the
/// short suite).
pub fn check_steps(example: &Example, model_response: &str) -> Option<StepScore> {
    if !example.kind.is_worked() {
        return None;
    }
    let want = steps(&example.response);
    let got = steps(model_response);
    let right = want.iter().zip(&got).filter(|(w, g)| w == g).count();
    Some(StepScore {
        right,
        total: want.len(),
    })
}
