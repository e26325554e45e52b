//! Multi-step arithmetic word problems with a worked line per step (the long suite's GSM8K
//! stand-in).
//!
//! ```text
//! prompt:   Tom has 2 apples. In January he buys 1 more. In February he doubles them.
//!           In March he gives away 5. ... How many apples does Tom have at the end?
//! response: January: 2+1=3
//!           February: 3*2=6
//!           March: 6-5=1
//!           ...
//!           Answer: 1
//! ```
//!
//! A problem has [`MIN_STEPS`]..=[`MAX_STEPS`] monthly events, each adding or removing one to
//! eight items or doubling / tripling them; every line reuses the previous line's result, so
//! the worked answer is a dependency chain and one wrong line makes every later line (and the
//! answer) wrong. Values stay single digits ([`MIN_VALUE`]..=[`MAX_VALUE`]): an operation is
//! drawn among those whose result stays in range. One step is then a small lookup (the
//! previous result, the month's operation, a one-digit table), learnable by a ~1M-parameter
//! model in a couple of CPU hours; the difficulty is the chain: per-step accuracy `p` over `n`
//! chained steps gives roughly `p^n` final-answer accuracy, unsaturated by design. (A first
//! design with two-digit values and carries was not learned at all in ~1200 training steps of
//! the shipped model's size: the model wrote the format with wrong numbers.)
//!
//! Each line starts with its month, the key that finds the month's sentence in the prompt
//! (content lookup instead of counting sentences). Arithmetic is written the way GSM8K's
//! calculator annotations write it (`3+4=7`): no spaces, one token per digit. Eight to twelve
//! steps keep the worked answer 64 tokens or longer.

use super::super::words::PEOPLE;
use super::super::{Example, TaskKind};
use super::Scale;
use crate::rng::Rng;

/// Fewest steps in a problem.
pub const MIN_STEPS: usize = 8;
/// Most steps in a problem.
pub const MAX_STEPS: usize = 12;
/// Steps of a [`Scale::Small`] (training-only) problem.
pub const SMALL_STEPS: (usize, usize) = (1, 4);

/// Month names, the step markers (step `i` happens in `MONTHS[i]`).
pub const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Countable things (plural).
pub const ITEMS: [&str; 8] = [
    "apples", "coins", "cards", "shells", "stamps", "marbles", "eggs", "stickers",
];

/// Verbs that add `b` (written "VERB b more").
pub const ADD_VERBS: [&str; 3] = ["buys", "finds", "wins"];

/// Verbs that remove `b` (written "VERB b").
pub const SUB_VERBS: [&str; 3] = ["gives away", "loses", "sells"];

/// Smallest value any line may produce.
pub const MIN_VALUE: u32 = 0;
/// Largest value any line may produce (one digit everywhere keeps every line the same length).
pub const MAX_VALUE: u32 = 9;

/// One operation of a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `a + b`.
    Add(u32),
    /// `a - b`.
    Sub(u32),
    /// `a * k` (k = 2 or 3).
    Mul(u32),
}

impl Op {
    /// The result of applying the operation to `a`.
    pub fn apply(self, a: u32) -> u32 {
        match self {
            Op::Add(b) => a + b,
            Op::Sub(b) => a - b,
            Op::Mul(k) => a * k,
        }
    }

    /// The worked line's arithmetic, e.g. `23+7=30`.
    pub fn line(self, a: u32) -> String {
        let (sym, b) = match self {
            Op::Add(b) => ('+', b),
            Op::Sub(b) => ('-', b),
            Op::Mul(k) => ('*', k),
        };
        format!("{a}{sym}{b}={}", self.apply(a))
    }
}

fn draw_op(rng: &mut Rng, a: u32) -> Op {
    loop {
        // Add and subtract 35% each, multiply 30% (doubling twice as often as tripling).
        let r = rng.below(20);
        let op = if r < 7 {
            Op::Add(1 + rng.below(8) as u32)
        } else if r < 14 {
            Op::Sub(1 + rng.below(8) as u32)
        } else if r < 18 {
            Op::Mul(2)
        } else {
            Op::Mul(3)
        };
        let ok = match op {
            Op::Add(b) => a + b <= MAX_VALUE,
            Op::Sub(b) => a >= MIN_VALUE + b,
            Op::Mul(k) => a * k <= MAX_VALUE,
        };
        if ok {
            return op;
        }
    }
}

/// Draws one problem.
pub fn generate(rng: &mut Rng) -> Example {
    generate_scaled(rng, Scale::Full)
}

/// Draws one problem of `scale`.
pub fn generate_scaled(rng: &mut Rng, scale: Scale) -> Example {
    let (lo, hi) = match scale {
        Scale::Full => (MIN_STEPS, MAX_STEPS),
        Scale::Small => SMALL_STEPS,
    };
    let person = PEOPLE[rng.index(PEOPLE.len())];
    let items = ITEMS[rng.index(ITEMS.len())];
    let steps = lo + rng.index(hi - lo + 1);
    let start = 1 + rng.below(9) as u32;
    let (name, pron) = (person.name, person.subject_lc);
    let mut prompt = format!("{name} has {start} {items}.");
    let mut lines = Vec::with_capacity(steps + 1);
    let mut a = start;
    for month in MONTHS.iter().take(steps) {
        let op = draw_op(rng, a);
        let event = match op {
            Op::Add(b) => format!("{} {b} more", ADD_VERBS[rng.index(ADD_VERBS.len())]),
            Op::Sub(b) => format!("{} {b}", SUB_VERBS[rng.index(SUB_VERBS.len())]),
            Op::Mul(2) => "doubles them".to_string(),
            Op::Mul(_) => "triples them".to_string(),
        };
        prompt.push_str(&format!(" In {month} {pron} {event}."));
        lines.push(format!("{month}: {}", op.line(a)));
        a = op.apply(a);
    }
    prompt.push_str(&format!(" How many {items} does {name} have at the end?"));
    let answer = a.to_string();
    lines.push(format!("Answer: {answer}"));
    Example {
        kind: TaskKind::LongMath,
        prompt,
        response: lines.join("\n"),
        answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Re-derives every line from the prompt alone and checks the response against it.
    #[test]
    fn every_line_follows_from_the_prompt() {
        let mut rng = Rng::new(11);
        let (mut adds, mut subs, mut muls) = (0, 0, 0);
        for _ in 0..3_000 {
            let ex = generate(&mut rng);
            let sentences: Vec<&str> = ex.prompt.split(". ").collect();
            let mut a: u32 = sentences[0].split(' ').nth(2).unwrap().parse().unwrap();
            let events = &sentences[1..sentences.len() - 1];
            assert!((MIN_STEPS..=MAX_STEPS).contains(&events.len()), "{ex:?}");
            let lines: Vec<&str> = ex.response.lines().collect();
            assert_eq!(lines.len(), events.len() + 1);
            for (i, ev) in events.iter().enumerate() {
                let words: Vec<&str> = ev.split(' ').collect();
                assert_eq!(words[1], MONTHS[i]);
                let num = |w: &str| w.trim_end_matches('.').parse::<u32>().unwrap();
                let op = match words[3] {
                    "doubles" => Op::Mul(2),
                    "triples" => Op::Mul(3),
                    "gives" => Op::Sub(num(words[5])),
                    v if ADD_VERBS.contains(&v) => Op::Add(num(words[4])),
                    _ => Op::Sub(num(words[4])),
                };
                match op {
                    Op::Add(_) => adds += 1,
                    Op::Sub(_) => subs += 1,
                    Op::Mul(_) => muls += 1,
                }
                let r = op.apply(a);
                assert!((MIN_VALUE..=MAX_VALUE).contains(&r), "{ex:?}");
                assert_eq!(lines[i], format!("{}: {}", MONTHS[i], op.line(a)));
                a = r;
            }
            assert_eq!(ex.answer, a.to_string());
            assert_eq!(*lines.last().unwrap(), format!("Answer: {a}"));
        }
        // Every operation kind stays common despite the single-digit range.
        let total = (adds + subs + muls) as f64;
        for (name, n) in [("add", adds), ("sub", subs), ("mul", muls)] {
            assert!(n as f64 / total > 0.1, "{name}: {n} of {total}");
        }
    }
}
