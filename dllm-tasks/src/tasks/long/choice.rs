//! Six-option multiple choice with a rationale line per option (the long suite's ARC-C
//! stand-in).
//!
//! ```text
//! prompt:   Which of these is a metal? A. hammer B. gold C. Mars D. circle E. drum F. bus
//! response: A. hammer is a tool, not a metal.
//!           B. gold is a metal.
//!           C. Mars is a planet, not a metal.
//!           ...
//!           Answer: B
//! ```
//!
//! The knowledge base is the short suite's (eight disjoint categories of six words, see
//! [`crate::tasks::choice`]). The six options come from six different categories, one of them
//! the asked one, shuffled; guessing gives 1/6. Every line classifies one option (a recalled
//! fact) and compares it with the asked category; the answer is the letter of the one line
//! that does not say "not".

use super::super::choice::KNOWLEDGE;
use super::super::{Example, TaskKind};
use super::Scale;
use crate::rng::Rng;

/// The option letters, in order.
pub const LETTERS: [&str; 6] = ["A", "B", "C", "D", "E", "F"];

/// Options of a [`Scale::Small`] (training-only) question.
pub const SMALL_OPTIONS: usize = 3;

/// Draws one question.
pub fn generate(rng: &mut Rng) -> Example {
    generate_scaled(rng, Scale::Full)
}

/// Draws one question of `scale`.
pub fn generate_scaled(rng: &mut Rng, scale: Scale) -> Example {
    let n = match scale {
        Scale::Full => LETTERS.len(),
        Scale::Small => SMALL_OPTIONS,
    };
    let cat = rng.index(KNOWLEDGE.len());
    let others: Vec<usize> = (0..KNOWLEDGE.len()).filter(|&c| c != cat).collect();
    let mut cats = vec![cat];
    cats.extend(
        rng.sample_indices(others.len(), n - 1)
            .into_iter()
            .map(|p| others[p]),
    );
    let mut options: Vec<(usize, &str)> = cats
        .into_iter()
        .map(|c| (c, KNOWLEDGE[c].members[rng.index(6)]))
        .collect();
    rng.shuffle(&mut options);
    let asked = &KNOWLEDGE[cat];
    let mut prompt = asked.question();
    let mut lines = Vec::with_capacity(n + 1);
    let mut answer = String::new();
    for (letter, &(c, word)) in LETTERS.iter().zip(&options) {
        prompt.push_str(&format!(" {letter}. {word}"));
        let k = &KNOWLEDGE[c];
        if c == cat {
            lines.push(format!("{letter}. {word} is {} {}.", k.article, k.label));
            answer = letter.to_string();
        } else {
            lines.push(format!(
                "{letter}. {word} is {} {}, not {} {}.",
                k.article, k.label, asked.article, asked.label
            ));
        }
    }
    lines.push(format!("Answer: {answer}"));
    Example {
        kind: TaskKind::LongChoice,
        prompt,
        response: lines.join("\n"),
        answer,
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::choice::category_of;
    use super::*;

    #[test]
    fn one_line_per_option_and_one_right_option() {
        let mut rng = Rng::new(9);
        let mut letters = [0u32; 6];
        for _ in 0..3_000 {
            let ex = generate(&mut rng);
            let cat = KNOWLEDGE
                .iter()
                .position(|c| ex.prompt.starts_with(&c.question()))
                .unwrap();
            let words: Vec<&str> = ex.prompt[KNOWLEDGE[cat].question().len()..]
                .split_whitespace()
                .skip(1)
                .step_by(2)
                .collect();
            assert_eq!(words.len(), 6, "{ex:?}");
            let lines: Vec<&str> = ex.response.lines().collect();
            assert_eq!(lines.len(), 7);
            let mut cats: Vec<usize> = words.iter().map(|w| category_of(w).unwrap()).collect();
            for (i, w) in words.iter().enumerate() {
                let c = cats[i];
                let right = c == cat;
                assert!(lines[i].starts_with(&format!("{}. {w} is ", LETTERS[i])));
                assert!(lines[i].contains(KNOWLEDGE[c].label));
                assert_eq!(lines[i].contains(", not "), !right, "{ex:?}");
                if right {
                    assert_eq!(ex.answer, LETTERS[i]);
                    letters[i] += 1;
                }
            }
            cats.sort();
            cats.dedup();
            assert_eq!(cats.len(), 6, "two options share a category: {ex:?}");
            assert_eq!(lines[6], format!("Answer: {}", ex.answer));
        }
        for c in letters {
            assert!((400..600).contains(&c), "letters {letters:?}");
        }
    }
}
