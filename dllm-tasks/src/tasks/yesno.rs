//! Yes/no questions over a short passage (the suite's BoolQ stand-in).
//!
//! ```text
//! prompt:   The cat is big. The dog is slow. The fox is wet. Is the dog fast?
//! response: The dog is slow. Answer: no
//! ```
//!
//! The passage states two or three facts "The ANIMAL is ADJECTIVE." about distinct animals,
//! each adjective drawn from a different antonym pair (big/small, fast/slow, ...). The
//! question asks about one animal with one word of its fact's pair: the word the passage
//! used (`yes`) or its antonym (`no`), half and half. Without reading the passage the
//! answer is a coin flip: every pair word is equally likely in facts and questions.
//!
//! # Learnability
//! The rationale restates the relevant fact, and the answer compares the restated adjective
//! with the asked one. Both steps are single lookups for a transformer:
//! - finding the fact is one content-based attention hop: the asked adjective's antonym
//!   pair occurs in exactly one fact, so the model attends from the question's adjective to
//!   the passage adjective of the same pair and copies it (the animal confirms it);
//! - the answer is whether two words of one pair agree, an XOR of two learnt "which side
//!   of the pair" features. Equivalently, `yes` exactly when the asked word occurs verbatim
//!   in the passage, which a duplicate-token head (among the first heads small transformers
//!   form) detects.
//!
//! Earlier designs stated the polarity in a separate token ("The dog cannot fly. ... Can the
//! dog fly?"), so finding it needs the two-layer induction pattern "the token after the
//! asked animal", and let a model that never reads the right fact score ~71% by copying the
//! polarity of any fact. With LLaDA's own trainer (1.1M parameters, 12k steps of 64) that
//! design stayed at 56-68% while the three other tasks reached 100%: the retrieval never
//! formed, and the score was the guessing baseline. Here guessing gives 50%, and the
//! retrieval is one hop.
//!
//! Measured so far: a 0.9M-parameter RoPE probe trained 22 minutes on one core stayed at
//! 49% on this task (math and completion 100%), so this is the task that needs the most
//! training; it is the one to watch.

use super::{Example, TaskKind};
use crate::rng::Rng;

/// The animals that facts are about.
pub const ANIMALS: [&str; 16] = [
    "cat", "dog", "fox", "bird", "cow", "pig", "duck", "frog", "goat", "horse", "sheep", "bear",
    "lion", "mouse", "owl", "wolf",
];

/// Antonym pairs; a passage uses each pair at most once.
pub const ANTONYMS: [(&str, &str); 8] = [
    ("big", "small"),
    ("fast", "slow"),
    ("hot", "cold"),
    ("old", "young"),
    ("loud", "quiet"),
    ("happy", "sad"),
    ("wet", "dry"),
    ("tall", "short"),
];

/// Draws one passage and question.
pub fn generate(rng: &mut Rng) -> Example {
    let n_facts = 2 + rng.index(2);
    let animals = rng.sample_indices(ANIMALS.len(), n_facts);
    let pairs = rng.sample_indices(ANTONYMS.len(), n_facts);
    let adjectives: Vec<&str> = pairs
        .iter()
        .map(|&p| {
            if rng.below(2) == 0 {
                ANTONYMS[p].0
            } else {
                ANTONYMS[p].1
            }
        })
        .collect();
    let target = rng.index(n_facts);
    let yes = rng.below(2) == 0;
    let stated = adjectives[target];
    let (a, b) = ANTONYMS[pairs[target]];
    let asked = match (yes, stated == a) {
        (true, _) => stated,
        (false, true) => b,
        (false, false) => a,
    };
    let mut prompt = String::new();
    for (&animal, adjective) in animals.iter().zip(&adjectives) {
        prompt.push_str(&format!("The {} is {adjective}. ", ANIMALS[animal]));
    }
    let animal = ANIMALS[animals[target]];
    prompt.push_str(&format!("Is the {animal} {asked}?"));
    let answer = if yes { "yes" } else { "no" }.to_string();
    let response = format!("The {animal} is {stated}. Answer: {answer}");
    Example {
        kind: TaskKind::YesNo,
        prompt,
        response,
        answer,
    }
}

/// The antonym of `word`, if it belongs to a pair.
pub fn antonym(word: &str) -> Option<&'static str> {
    ANTONYMS.iter().find_map(|&(a, b)| {
        if a == word {
            Some(b)
        } else if b == word {
            Some(a)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers the question by actually reading the passage: (restated fact, answer).
    fn solve(prompt: &str) -> (String, &'static str) {
        let (passage, question) = prompt.rsplit_once("Is the ").unwrap();
        let (animal, asked) = question.trim_end_matches('?').split_once(' ').unwrap();
        let facts: Vec<&str> = passage
            .split(". ")
            .map(|f| f.trim().trim_end_matches('.'))
            .filter(|f| f.starts_with(&format!("The {animal} is ")))
            .collect();
        assert_eq!(
            facts.len(),
            1,
            "the asked animal has exactly one fact: {prompt}"
        );
        let stated = facts[0].rsplit(' ').next().unwrap();
        assert!(
            stated == asked || antonym(stated) == Some(asked),
            "unrelated question: {prompt}"
        );
        (
            format!("{}.", facts[0]),
            if stated == asked { "yes" } else { "no" },
        )
    }

    #[test]
    fn answers_follow_from_the_passage() {
        let mut rng = Rng::new(2);
        let mut yes = 0;
        for _ in 0..4_000 {
            let ex = generate(&mut rng);
            let (fact, ans) = solve(&ex.prompt);
            assert_eq!(ex.answer, ans, "{ex:?}");
            assert_eq!(ex.response, format!("{fact} Answer: {ans}"));
            yes += (ans == "yes") as usize;
            // Each antonym pair at most once per passage: the asked pair finds one fact.
            let passage = ex.prompt.rsplit_once("Is the ").unwrap().0;
            for (a, b) in ANTONYMS {
                let n = passage.matches(&format!(" {a}.")).count()
                    + passage.matches(&format!(" {b}.")).count();
                assert!(n <= 1, "{ex:?}");
            }
        }
        assert!((1_850..2_150).contains(&yes), "yes {yes}");
    }

    #[test]
    fn pair_words_carry_no_answer_by_themselves() {
        // Without the passage, the asked word says nothing: each word is asked about as often
        // with "yes" as with "no".
        let mut rng = Rng::new(5);
        let mut by_word = std::collections::HashMap::<String, (u32, u32)>::new();
        for _ in 0..16_000 {
            let ex = generate(&mut rng);
            let asked = ex
                .prompt
                .rsplit(' ')
                .next()
                .unwrap()
                .trim_end_matches('?')
                .to_string();
            let e = by_word.entry(asked).or_default();
            if ex.answer == "yes" {
                e.0 += 1
            } else {
                e.1 += 1
            }
        }
        assert_eq!(by_word.len(), 16);
        for (w, (y, n)) in by_word {
            let share = y as f64 / (y + n) as f64;
            assert!((share - 0.5).abs() < 0.08, "{w}: {y} yes / {n} no");
        }
    }
}
