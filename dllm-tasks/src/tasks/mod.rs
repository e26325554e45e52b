//! The task generators of both suites, the train streams, the held-out test sets and answer
//! checking.
//!
//! The short suite ([`Suite::Short`], answers of at most 16 tokens):
//!
//! | [`TaskKind`] | name         | stands in for | answer                |
//! |--------------|--------------|---------------|-----------------------|
//! | `Math`       | `math`       | GSM8K         | a two-digit number    |
//! | `YesNo`      | `yesno`      | BoolQ         | `yes` / `no`          |
//! | `Choice`     | `choice`     | ARC-C         | `A` / `B` / `C` / `D` |
//! | `Completion` | `completion` | HellaSwag     | one to three words    |
//!
//! The long suite ([`Suite::Long`], worked answers of 64-128 tokens, one step per line) is
//! described in [`long`]: `long-math`, `long-yesno`, `long-choice`, `long-story`.
//!
//! Every response is a rationale followed by `Answer: X`, and [`Example::answer`] is `X`.
//! The test set is [`TEST_SET_SIZE`] unique prompts per task drawn from fixed seeds of its
//! own; no train stream ever yields a prompt of any test set.

pub mod choice;
pub mod completion;
pub mod long;
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

/// The tasks of both suites.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskKind {
    /// Math word problems, like GSM8K.
    #[serde(rename = "math")]
    Math,
    /// Yes/no questions over a short passage, like BoolQ.
    #[serde(rename = "yesno")]
    YesNo,
    /// Four-option multiple choice, like ARC-Challenge.
    #[serde(rename = "choice")]
    Choice,
    /// Sentence completion, like HellaSwag.
    #[serde(rename = "completion")]
    Completion,
    /// Multi-step arithmetic with a worked line per step, like GSM8K ([`long::math`]).
    #[serde(rename = "long-math")]
    LongMath,
    /// Yes/no over a chain of comparisons, the chain restated, like BoolQ ([`long::yesno`]).
    #[serde(rename = "long-yesno")]
    LongYesNo,
    /// Six-option multiple choice with a rationale line per option, like ARC-C
    /// ([`long::choice`]).
    #[serde(rename = "long-choice")]
    LongChoice,
    /// A story continuation that tracks named people and things, like HellaSwag
    /// ([`long::story`]).
    #[serde(rename = "long-story")]
    LongStory,
}

impl TaskKind {
    /// The short suite's tasks, in the order tables and mixes use (`Suite::Short.tasks()`).
    pub const ALL: [TaskKind; 4] = [
        TaskKind::Math,
        TaskKind::YesNo,
        TaskKind::Choice,
        TaskKind::Completion,
    ];

    /// The long suite's tasks, in the order tables and mixes use (`Suite::Long.tasks()`).
    pub const LONG: [TaskKind; 4] = [
        TaskKind::LongMath,
        TaskKind::LongYesNo,
        TaskKind::LongChoice,
        TaskKind::LongStory,
    ];

    /// Every task of both suites.
    pub const EVERY: [TaskKind; 8] = [
        TaskKind::Math,
        TaskKind::YesNo,
        TaskKind::Choice,
        TaskKind::Completion,
        TaskKind::LongMath,
        TaskKind::LongYesNo,
        TaskKind::LongChoice,
        TaskKind::LongStory,
    ];

    /// The short name: `math`, `yesno`, `choice`, `completion`, `long-math`, `long-yesno`,
    /// `long-choice`, `long-story` (what `FromStr` accepts).
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Math => "math",
            TaskKind::YesNo => "yesno",
            TaskKind::Choice => "choice",
            TaskKind::Completion => "completion",
            TaskKind::LongMath => "long-math",
            TaskKind::LongYesNo => "long-yesno",
            TaskKind::LongChoice => "long-choice",
            TaskKind::LongStory => "long-story",
        }
    }

    /// The evaluation set of the LLaDA paper this task stands in for.
    pub fn paper_dataset(self) -> &'static str {
        match self {
            TaskKind::Math | TaskKind::LongMath => "GSM8K",
            TaskKind::YesNo | TaskKind::LongYesNo => "BoolQ",
            TaskKind::Choice | TaskKind::LongChoice => "ARC-C",
            TaskKind::Completion | TaskKind::LongStory => "HellaSwag",
        }
    }

    /// The suite the task belongs to.
    pub fn suite(self) -> Suite {
        if TaskKind::ALL.contains(&self) {
            Suite::Short
        } else {
            Suite::Long
        }
    }

    /// Whether the answers are worked, one step per line (scored by [`long::check_steps`]).
    pub fn is_worked(self) -> bool {
        self.suite() == Suite::Long
    }

    /// Position in [`TaskKind::EVERY`] (for the short tasks also in [`TaskKind::ALL`]).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Position within its suite's [`Suite::tasks`].
    pub fn index_in_suite(self) -> usize {
        self.index() % 4
    }
}

/// A task suite: the tasks a model is trained and evaluated on together, with their own
/// tokenizer and sequence limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Suite {
    /// The four short tasks (answers of at most 16 tokens) of the shipped `tiny-*` models.
    Short,
    /// The four long tasks (worked answers of 64-128 tokens) of [`long`].
    Long,
}

impl Suite {
    /// Both suites.
    pub const ALL: [Suite; 2] = [Suite::Short, Suite::Long];

    /// Its tasks, in table and mix order.
    pub fn tasks(self) -> [TaskKind; 4] {
        match self {
            Suite::Short => TaskKind::ALL,
            Suite::Long => TaskKind::LONG,
        }
    }

    /// `short` or `long` (what `FromStr` accepts).
    pub fn name(self) -> &'static str {
        match self {
            Suite::Short => "short",
            Suite::Long => "long",
        }
    }
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Suite {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "short" => Ok(Suite::Short),
            "long" => Ok(Suite::Long),
            _ => Err(Error::InvalidArgument(format!(
                "unknown suite {s:?} (expected short or long)"
            ))),
        }
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
    /// (`gsm8k`, `boolq`, `arc-c`/`arc`, `hellaswag`) as aliases of the short tasks
    /// (`long-gsm8k`, ... of the long ones).
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "math" | "gsm8k" => Ok(TaskKind::Math),
            "yesno" | "boolq" => Ok(TaskKind::YesNo),
            "choice" | "arc-c" | "arc" => Ok(TaskKind::Choice),
            "completion" | "hellaswag" => Ok(TaskKind::Completion),
            "long-math" | "long-gsm8k" => Ok(TaskKind::LongMath),
            "long-yesno" | "long-boolq" => Ok(TaskKind::LongYesNo),
            "long-choice" | "long-arc-c" | "long-arc" => Ok(TaskKind::LongChoice),
            "long-story" | "long-hellaswag" => Ok(TaskKind::LongStory),
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
        TaskKind::LongMath => long::math::generate(rng),
        TaskKind::LongYesNo => long::yesno::generate(rng),
        TaskKind::LongChoice => long::choice::generate(rng),
        TaskKind::LongStory => long::story::generate(rng),
    }
}

/// Examples per task in the held-out test set.
pub const TEST_SET_SIZE: usize = 200;

/// The seed of each task's test-set stream. Training never draws from these streams (it
/// uses [`train_rng`]), and the prompts are filtered out of training anyway.
const TEST_SEEDS: [u64; 8] = [
    0x7E57_5EED_0000_0001,
    0x7E57_5EED_0000_0002,
    0x7E57_5EED_0000_0003,
    0x7E57_5EED_0000_0004,
    0x7E57_5EED_0000_0011,
    0x7E57_5EED_0000_0012,
    0x7E57_5EED_0000_0013,
    0x7E57_5EED_0000_0014,
];

/// Stream id separating training draws from any other use of the same seed.
const TRAIN_STREAM: u64 = 0x7EA1_0000;

/// The generator behind [`train_stream`]`(seed)`.
pub fn train_rng(seed: u64) -> Rng {
    Rng::with_stream(seed, TRAIN_STREAM)
}

fn build_test_set(kind: TaskKind) -> Vec<Example> {
    held_out_stream(kind, TEST_SET_SIZE)
}

/// The first `n` unique examples of `kind`'s held-out stream: the test set is its first
/// [`TEST_SET_SIZE`]; past them the stream goes on with the same generator and seed (prompts
/// beyond the test set are not excluded from training, but a long-math prompt is one of about
/// 10^12: see `eval::QuestionSet`).
pub fn held_out_stream(kind: TaskKind, n: usize) -> Vec<Example> {
    let mut rng = Rng::new(TEST_SEEDS[kind.index()]);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let ex = generate(kind, &mut rng);
        if seen.insert(ex.prompt.clone()) {
            out.push(ex);
        }
    }
    out
}

fn test_sets() -> &'static [Vec<Example>; 8] {
    static SETS: OnceLock<[Vec<Example>; 8]> = OnceLock::new();
    SETS.get_or_init(|| TaskKind::EVERY.map(build_test_set))
}

/// The held-out test set of `kind`: [`TEST_SET_SIZE`] examples with unique prompts, always
/// the same ones in the same order.
pub fn test_set(kind: TaskKind) -> Vec<Example> {
    test_sets()[kind.index()].clone()
}

/// The whole held-out short suite, task by task in [`TaskKind::ALL`] order.
pub fn test_suite() -> Vec<Example> {
    TaskKind::ALL.into_iter().flat_map(test_set).collect()
}

/// Every prompt of the test sets (all tasks of both suites), built once.
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

/// An endless stream of short-suite training examples: each draws a task uniformly at
/// random, then an example of it, redrawing (same task) while the prompt is held out, so the
/// task mix stays uniform and no test prompt is ever seen. Deterministic in `seed`.
pub fn train_stream(seed: u64) -> TrainStream {
    suite_train_stream(Suite::Short, seed)
}

/// [`train_stream`] over the tasks of `suite`. `suite_train_stream(Suite::Short, seed)` is
/// `train_stream(seed)`.
pub fn suite_train_stream(suite: Suite, seed: u64) -> TrainStream {
    TrainStream {
        rng: train_rng(seed),
        weights: [1; 4],
        suite,
        small: 0.0,
    }
}

/// The iterator returned by [`train_stream`] and [`suite_train_stream`]. Never ends.
#[derive(Clone, Debug)]
pub struct TrainStream {
    rng: Rng,
    /// Relative frequency of each task, in [`Suite::tasks`] order.
    weights: [u32; 4],
    suite: Suite,
    /// Probability that a worked task is drawn at [`long::Scale::Small`].
    small: f64,
}

impl TrainStream {
    /// The generator state, to checkpoint the stream's position.
    pub fn rng_state(&self) -> [u64; 4] {
        self.rng.state()
    }

    /// Resumes a short-suite stream at a position saved with [`TrainStream::rng_state`] (with
    /// uniform task weights; re-apply [`TrainStream::with_weights`] if the run used others).
    pub fn from_rng_state(state: [u64; 4]) -> Self {
        Self::from_suite_rng_state(Suite::Short, state)
    }

    /// Resumes a stream of `suite` at a position saved with [`TrainStream::rng_state`].
    pub fn from_suite_rng_state(suite: Suite, state: [u64; 4]) -> Self {
        TrainStream {
            rng: Rng::from_state(state),
            weights: [1; 4],
            suite,
            small: 0.0,
        }
    }

    /// Draw each worked (long-suite) example at [`long::Scale::Small`] with probability
    /// `fraction` — a training aid: small instances teach the same formats and lookups on short
    /// prompts and canvases. `0` (the default) draws exactly the stream without it. An error
    /// outside `[0, 1]` or for the short suite (its tasks have no scales).
    pub fn with_small_fraction(mut self, fraction: f64) -> crate::Result<Self> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(crate::Error::InvalidArgument(format!(
                "small-instance fraction {fraction} is not in [0, 1]"
            )));
        }
        if fraction > 0.0 && self.suite == Suite::Short {
            return Err(crate::Error::InvalidArgument(
                "small instances exist only for the long suite".into(),
            ));
        }
        self.small = fraction;
        Ok(self)
    }

    /// The suite whose tasks it draws.
    pub fn suite(&self) -> Suite {
        self.suite
    }

    /// Draw tasks with relative frequencies `weights` (in [`Suite::tasks`] order) instead of
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
        let tasks = self.suite.tasks();
        if self.weights == [1; 4] {
            return tasks[self.rng.index(4)];
        }
        let total: u32 = self.weights.iter().sum();
        let mut x = self.rng.below(total as u64) as u32;
        for (k, &w) in tasks.iter().zip(&self.weights) {
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
        let scale = if self.small > 0.0 && kind.is_worked() && self.rng.f64() < self.small {
            long::Scale::Small
        } else {
            long::Scale::Full
        };
        loop {
            let ex = long::generate_scaled(kind, &mut self.rng, scale);
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
pub(crate) fn cut_at_eos(response: &str) -> &str {
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
