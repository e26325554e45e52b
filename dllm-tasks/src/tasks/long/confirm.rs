//! The confirmation set: long-math questions from a generator written apart from the training one
//! ([`super::math`]), to judge decoding defaults on questions that chose nothing.
//!
//! Same surface rules (the worked-answer format `Month: a+b=c`, single-digit values, 8-12 monthly
//! steps with doubling and tripling, `Answer: X`), so the shipped long models can answer them;
//! everything else is its own: the items are ones the training generator never uses (`books`,
//! `candles`, `cookies`, `flowers`, `pens`: words of other tasks, one token each in the suite
//! tokenizer), the verbs are a subset (`wins`, `finds`, `gives away`, `loses`; never `buys` or
//! `sells`), the operations are drawn with another mix (multiplication more often, so results
//! move further), the start value and every operand come from its own stream, and the
//! names are drawn in another order. The names are the suite's (its tokenizer holds no others as
//! one token), so a confirmation prompt can never equal a training or held-out prompt: the items
//! differ.
//!
//! [`confirmation_set`] is [`CONFIRMATION_SIZE`] unique questions, always the same ones.

use std::collections::HashSet;

use super::super::words::PEOPLE;
use super::super::{Example, TaskKind};
use super::math::MONTHS;
use crate::rng::Rng;

/// Questions in the confirmation set.
pub const CONFIRMATION_SIZE: usize = 300;

/// The confirmation set's seed (no other stream of the suite uses it).
const SEED: u64 = 0xC0F1_2A7E_0000_0040;

/// Items the training generator never draws.
pub const ITEMS: [&str; 5] = ["books", "candles", "cookies", "flowers", "pens"];

/// Verbs adding `b` ("VERB b more") and removing `b` ("VERB b").
const ADD: [&str; 2] = ["wins", "finds"];
const SUB: [&str; 2] = ["gives away", "loses"];

/// Every value a worked line may produce.
const MAX: u32 = 9;

/// One step: its sentence and its worked line's operator and operand.
fn step(rng: &mut Rng, a: u32) -> (String, char, u32) {
    loop {
        // Multiply 40% (double 25, triple 15), add 30%, subtract 30%.
        let roll = rng.below(100);
        let (sentence, op, b) = if roll < 25 {
            ("doubles them".to_string(), '*', 2)
        } else if roll < 40 {
            ("triples them".to_string(), '*', 3)
        } else if roll < 70 {
            let b = 1 + rng.below(8) as u32;
            let v = ADD[rng.index(ADD.len())];
            (format!("{v} {b} more"), '+', b)
        } else {
            let b = 1 + rng.below(8) as u32;
            let v = SUB[rng.index(SUB.len())];
            (format!("{v} {b}"), '-', b)
        };
        let r = match op {
            '*' => a * b,
            '+' => a + b,
            _ => a.wrapping_sub(b),
        };
        if r <= MAX {
            return (sentence, op, b);
        }
    }
}

/// One confirmation question.
pub fn generate(rng: &mut Rng) -> Example {
    // Names drawn from the end of the list first: another order than the training generator's.
    let person = PEOPLE[PEOPLE.len() - 1 - rng.index(PEOPLE.len())];
    let items = ITEMS[rng.index(ITEMS.len())];
    let months = 8 + rng.index(5);
    let mut a = 1 + rng.below(9) as u32;
    let mut prompt = format!("{} has {a} {items}.", person.name);
    let mut lines = Vec::with_capacity(months + 1);
    for month in MONTHS.iter().take(months) {
        let (sentence, op, b) = step(rng, a);
        let r = match op {
            '*' => a * b,
            '+' => a + b,
            _ => a - b,
        };
        prompt.push_str(&format!(" In {month} {} {sentence}.", person.subject_lc));
        lines.push(format!("{month}: {a}{op}{b}={r}"));
        a = r;
    }
    prompt.push_str(&format!(
        " How many {items} does {} have at the end?",
        person.name
    ));
    lines.push(format!("Answer: {a}"));
    Example {
        kind: TaskKind::LongMath,
        prompt,
        response: lines.join("\n"),
        answer: a.to_string(),
    }
}

/// The confirmation set: [`CONFIRMATION_SIZE`] questions with unique prompts, always the same.
pub fn confirmation_set() -> Vec<Example> {
    confirmation_stream(CONFIRMATION_SIZE)
}

/// The confirmation generator's first `n` unique questions, always the same in the same order
/// ([`confirmation_set`] is the first [`CONFIRMATION_SIZE`]; the fresh set takes the next ones).
pub fn confirmation_stream(n: usize) -> Vec<Example> {
    let mut rng = Rng::new(SEED);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let ex = generate(&mut rng);
        if seen.insert(ex.prompt.clone()) {
            out.push(ex);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::check;
    use crate::tasks::long::{check_steps, math};

    #[test]
    fn confirmation_questions_follow_the_surface_rules_and_never_meet_the_training_items() {
        let set = confirmation_set();
        assert_eq!(set.len(), CONFIRMATION_SIZE);
        let mut muls = 0;
        let mut lines = 0;
        for ex in &set {
            // Its own items, never the training generator's.
            assert!(ITEMS.iter().any(|i| ex.prompt.contains(&format!(" {i}."))));
            assert!(math::ITEMS.iter().all(|i| !ex.prompt.contains(i)), "{ex:?}");
            assert!(!ex.prompt.contains("buys") && !ex.prompt.contains("sells"));
            // The reference answer scores as right on its own question, line by line.
            let v = check(ex, &ex.response);
            assert!(v.final_answer && v.exact, "{ex:?}");
            let st = check_steps(ex, &ex.response).unwrap();
            assert_eq!(st.right, st.total);
            assert!((8..=12).contains(&st.total), "{ex:?}");
            // Every worked line re-derives from the one before: single digits throughout.
            let mut prev: Option<u32> = None;
            for line in ex.response.lines().filter(|l| !l.starts_with("Answer")) {
                let expr = line.split(": ").nth(1).unwrap();
                let (lhs, r) = expr.split_once('=').unwrap();
                let r: u32 = r.parse().unwrap();
                let a: u32 = lhs[..1].parse().unwrap();
                assert!(r <= MAX && prev.is_none_or(|p| p == a), "{ex:?}");
                muls += usize::from(lhs.contains('*'));
                lines += 1;
                prev = Some(r);
            }
            assert_eq!(ex.answer, prev.unwrap().to_string());
        }
        // Doubling and tripling are common (more than in training's 30% target).
        assert!(muls as f64 / lines as f64 > 0.25, "{muls} of {lines}");
    }
}
