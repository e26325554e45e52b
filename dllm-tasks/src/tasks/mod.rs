//! The four task generators, the train stream, the held-out test set and answer checking.
//!
//! | [`TaskKind`] | name         | stands in for | answer                |
//! |--------------|--------------|---------------|-----------------------|
//! | `Math`       | `math`       | GSM8K         | a two-digit number    |
//! | `YesNo`      | `yesno`      | BoolQ         | `yes` / `no`          |
//! | `Choice`     | `choice`     | ARC-C         | `A` / `B` / `C` / `D` |
//! | `Completion` | `completion` | HellaSwag     | one to three words    |
//!
//! Every response is a short rationale followed by `Answer: X`, and [`Example::answer`] is
//! `X`. The test set is [`TEST_SET_SIZE`] unique prompts per task drawn from fixed seeds of
//! its own; [`train_stream`] never yields a prompt of the test set.

pub mod choice;
pub mod completion;
pub mod math;
pub mod words;
pub mod yesno;

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::rng::Rng;

/// The four tasks of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// Math word problems, like GSM8K.
    Math,
    /// Yes/no questions over a short passage, like BoolQ.
    YesNo,
    /// Four-option multiple choice, like ARC-Challenge.
    Choice,
    /// Sentence completion, like HellaSwag.
    Completion,
}

impl TaskKind {
    /// All tasks, in the order tables and mixes use.
    pub const ALL: [TaskKind; 4] = [
        TaskKind::Math,
        TaskKind::YesNo,
        TaskKind::Choice,
        TaskKind::Completion,
    ];

    /// The short name: `math`, `yesno`, `choice`, `completion` (what `FromStr` accepts).
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Math => "math",
            TaskKind::YesNo => "yesno",
            TaskKind::Choice => "choice",
            TaskKind::Completion => "completion",
        }
    }

    /// The evaluation set of the LLaDA paper this task stands in for.
    pub fn paper_dataset(self) -> &'static str {
        match self {
            TaskKind::Math => "GSM8K",
            TaskKind::YesNo => "BoolQ",
            TaskKind::Choice => "ARC-C",
            TaskKind::Completion => "HellaSwag",
        }
    }

    /// Position in [`TaskKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TaskKind {
    type Err = Error;

    /// Accepts the short names, case-insensitively, and the paper's dataset names
    /// (`gsm8k`, `boolq`, `arc-c`/`arc`, `hellaswag`) as aliases.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "math" | "gsm8k" => Ok(TaskKind::Math),
            "yesno" | "boolq" => Ok(TaskKind::YesNo),
            "choice" | "arc-c" | "arc" => Ok(TaskKind::Choice),
            "completion" | "hellaswag" => Ok(TaskKind::Completion),
            _ => Err(Error::UnknownTask(s.to_string())),
        }
    }
}

/// One example: the prompt, the reference response (rationale + `Answer: X`) and `X`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Example {
    /// Which task generated it.
    pub kind: TaskKind,
    /// The question, without any special tokens.
    pub prompt: String,
    /// The reference response: a short rationale, then `Answer: X`.
    pub response: String,
    /// `X`, the final answer alone.
    pub answer: String,
}

/// Draws one example of `kind` from `rng`.
pub fn generate(kind: TaskKind, rng: &mut Rng) -> Example {
    match kind {
        TaskKind::Math => math::generate(rng),
        TaskKind::YesNo => yesno::generate(rng),
        TaskKind::Choice => choice::generate(rng),
        TaskKind::Completion => completion::generate(rng),
    }
}

/// Examples per task in the held-out test set.
pub const TEST_SET_SIZE: usize = 200;

/// The seed of each task's test-set stream. Training never draws from these streams (it
/// uses [`train_rng`]), and the prompts are filtered out of training anyway.
const TEST_SEEDS: [u64; 4] = [
    0x7E57_5EED_0000_0001,
    0x7E57_5EED_0000_0002,
    0x7E57_5EED_0000_0003,
    0x7E57_5EED_0000_0004,
];

/// Stream id separating training draws from any other use of the same seed.
const TRAIN_STREAM: u64 = 0x7EA1_0000;

/// The generator behind [`train_stream`]`(seed)`.
pub fn train_rng(seed: u64) -> Rng {
    Rng::with_stream(seed, TRAIN_STREAM)
}

fn build_test_set(kind: TaskKind) -> Vec<Example> {
    let mut rng = Rng::new(TEST_SEEDS[kind.index()]);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(TEST_SET_SIZE);
    while out.len() < TEST_SET_SIZE {
        let ex = generate(kind, &mut rng);
        if seen.insert(ex.prompt.clone()) {
            out.push(ex);
        }
    }
    out
}

fn test_sets() -> &'static [Vec<Example>; 4] {
    static SETS: OnceLock<[Vec<Example>; 4]> = OnceLock::new();
    SETS.get_or_init(|| TaskKind::ALL.map(build_test_set))
}

/// The held-out test set of `kind`: [`TEST_SET_SIZE`] examples with unique prompts, always
/// the same ones in the same order.
pub fn test_set(kind: TaskKind) -> Vec<Example> {
    test_sets()[kind.index()].clone()
}

/// The whole held-out suite, task by task in [`TaskKind::ALL`] order.
pub fn test_suite() -> Vec<Example> {
    test_sets().iter().flatten().cloned().collect()
}

/// Every prompt of the test set (all tasks), built once.
pub fn held_out_prompts() -> &'static HashSet<String> {
    static PROMPTS: OnceLock<HashSet<String>> = OnceLock::new();
    PROMPTS.get_or_init(|| {
        test_sets()
            .iter()
            .flatten()
            .map(|e| e.prompt.clone())
            .collect()
    })
}

/// Whether `prompt` belongs to the held-out test set.
pub fn is_held_out(prompt: &str) -> bool {
    held_out_prompts().contains(prompt)
}

/// An endless stream of training examples: each draws a task uniformly at random, then an
/// example of it, redrawing (same task) while the prompt is held out, so the task mix stays
/// uniform and no test prompt is ever seen. Deterministic in `seed`.
pub fn train_stream(seed: u64) -> TrainStream {
    TrainStream {
        rng: train_rng(seed),
        weights: [1; 4],
    }
}

/// The iterator returned by [`train_stream`]. Never ends.
#[derive(Clone, Debug)]
pub struct TrainStream {
    rng: Rng,
    /// Relative frequency of each task, in [`TaskKind::ALL`] order.
    weights: [u32; 4],
}

impl TrainStream {
    /// The generator state, to checkpoint the stream's position.
    pub fn rng_state(&self) -> [u64; 4] {
        self.rng.state()
    }

    /// Resumes a stream at a position saved with [`TrainStream::rng_state`] (with uniform task
    /// weights; re-apply [`TrainStream::with_weights`] if the run used others).
    pub fn from_rng_state(state: [u64; 4]) -> Self {
        TrainStream {
            rng: Rng::from_state(state),
            weights: [1; 4],
        }
    }

    /// Draw tasks with relative frequencies `weights` (in [`TaskKind::ALL`] order) instead of
    /// uniformly, e.g. to give the hardest task more examples. Uniform weights `[1; 4]` draw
    /// exactly the stream of [`train_stream`].
    pub fn with_weights(mut self, weights: [u32; 4]) -> crate::Result<Self> {
        if weights.iter().all(|&w| w == 0) {
            return Err(crate::Error::InvalidArgument(
                "task weights are all zero".into(),
            ));
        }
        self.weights = weights;
        Ok(self)
    }

    fn draw_kind(&mut self) -> TaskKind {
        if self.weights == [1; 4] {
            return TaskKind::ALL[self.rng.index(4)];
        }
        let total: u32 = self.weights.iter().sum();
        let mut x = self.rng.below(total as u64) as u32;
        for (k, &w) in TaskKind::ALL.iter().zip(&self.weights) {
            if x < w {
                return *k;
            }
            x -= w;
        }
        unreachable!("x < total")
    }
}

impl Iterator for TrainStream {
    type Item = Example;

    fn next(&mut self) -> Option<Example> {
        let kind = self.draw_kind();
        let held_out = held_out_prompts();
        loop {
            let ex = generate(kind, &mut self.rng);
            if !held_out.contains(&ex.prompt) {
                return Some(ex);
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

/// The marker before the final answer in every response.
pub const ANSWER_MARKER: &str = "Answer:";

/// The end-of-sequence token's text; anything from it on is not part of a response.
const EOS_TEXT: &str = "<eos>";

/// Cuts a decoded response at the first `<eos>` (if special tokens were kept in decoding).
fn cut_at_eos(response: &str) -> &str {
    response.find(EOS_TEXT).map_or(response, |i| &response[..i])
}

/// The final answer of a response: the text after the last `Answer:`, up to the end or the
/// first `<eos>`, trimmed. `None` if there is no marker or nothing after it.
pub fn extract_answer(response: &str) -> Option<&str> {
    let response = cut_at_eos(response);
    let start = response.rfind(ANSWER_MARKER)? + ANSWER_MARKER.len();
    let answer = response[start..].trim();
    (!answer.is_empty()).then_some(answer)
}

/// Collapses every run of whitespace to one space and trims the ends.
pub fn normalize_whitespace(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The outcome of checking one model response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The whole response (rationale and answer) equals the reference, up to whitespace.
    pub exact: bool,
    /// The final answer equals the reference answer, up to whitespace.
    pub final_answer: bool,
}

/// Checks `model_response` (decoded text, cut at or containing `<eos>`) against `example`.
pub fn check(example: &Example, model_response: &str) -> Verdict {
    let response = normalize_whitespace(cut_at_eos(model_response));
    let exact = response == normalize_whitespace(&example.response);
    let final_answer = extract_answer(&response)
        .is_some_and(|a| normalize_whitespace(a) == normalize_whitespace(&example.answer));
    Verdict {
        exact,
        final_answer,
    }
}
