//! Four-option multiple choice over a small fixed knowledge base (the suite's ARC-C
//! stand-in).
//!
//! ```text
//! prompt:   Which of these is a metal? A. hammer B. gold C. Mars D. shirt
//! response: B. gold. Answer: B
//! ```
//!
//! The knowledge base is eight disjoint categories of six members (48 words). A question
//! asks for one category; the correct option is one of its members and the three
//! distractors come from three *different* other categories, so exactly one option is right.
//! Options are shuffled, so every letter is correct a quarter of the time.
//!
//! # Learnability
//! The facts to memorise are 48 word-to-category memberships, each seen as the right answer
//! hundreds of times in an hour of training (and as a distractor more often). The rationale
//! `B. gold.` restates the option exactly as the prompt wrote it, so after the model has
//! picked the member word it only copies the letter in front of it (previous-token copy), and
//! `Answer: B` copies that letter again. The byte-level tokenizer prepends a space to every
//! text, so the response's `B` is the same token as the prompt's ` B`.

use super::{Example, TaskKind};
use crate::rng::Rng;

/// One category of the knowledge base.
#[derive(Clone, Copy, Debug)]
pub struct Category {
    /// The question asked for this category.
    pub question: &'static str,
    /// Its members (no word belongs to two categories).
    pub members: [&'static str; 6],
}

/// The knowledge base. Words are disjoint across categories (tested).
pub const KNOWLEDGE: [Category; 8] = [
    Category {
        question: "Which of these is a fruit?",
        members: ["apple", "banana", "grape", "lemon", "mango", "peach"],
    },
    Category {
        question: "Which of these is a tool?",
        members: ["hammer", "saw", "drill", "wrench", "shovel", "rake"],
    },
    Category {
        question: "Which of these is a vehicle?",
        members: ["car", "bus", "train", "boat", "truck", "plane"],
    },
    Category {
        question: "Which of these is a metal?",
        members: ["iron", "gold", "copper", "silver", "tin", "zinc"],
    },
    Category {
        question: "Which of these is an instrument?",
        members: ["piano", "drum", "flute", "guitar", "violin", "harp"],
    },
    Category {
        question: "Which of these can you wear?",
        members: ["shirt", "hat", "coat", "sock", "scarf", "glove"],
    },
    Category {
        question: "Which of these is a planet?",
        members: ["Mars", "Venus", "Earth", "Jupiter", "Saturn", "Neptune"],
    },
    Category {
        question: "Which of these is a body part?",
        members: ["hand", "nose", "knee", "ear", "foot", "elbow"],
    },
];

/// The option letters, in order.
pub const LETTERS: [&str; 4] = ["A", "B", "C", "D"];

/// Draws one question.
pub fn generate(rng: &mut Rng) -> Example {
    let cat = rng.index(KNOWLEDGE.len());
    let right = KNOWLEDGE[cat].members[rng.index(6)];
    // Three distinct other categories, one member each.
    let others: Vec<usize> = (0..KNOWLEDGE.len()).filter(|&c| c != cat).collect();
    let picked = rng.sample_indices(others.len(), 3);
    let mut options = vec![right];
    for p in picked {
        options.push(KNOWLEDGE[others[p]].members[rng.index(6)]);
    }
    rng.shuffle(&mut options);
    let pos = options
        .iter()
        .position(|&o| o == right)
        .expect("right option is present");
    let mut prompt = KNOWLEDGE[cat].question.to_string();
    for (letter, option) in LETTERS.iter().zip(&options) {
        prompt.push_str(&format!(" {letter}. {option}"));
    }
    let answer = LETTERS[pos].to_string();
    let response = format!("{answer}. {right}. Answer: {answer}");
    Example {
        kind: TaskKind::Choice,
        prompt,
        response,
        answer,
    }
}

/// The category index of `word`, if it is in the knowledge base.
pub fn category_of(word: &str) -> Option<usize> {
    KNOWLEDGE.iter().position(|c| c.members.contains(&word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knowledge_base_is_disjoint() {
        let mut all: Vec<&str> = KNOWLEDGE.iter().flat_map(|c| c.members).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a word is in two categories");
    }

    #[test]
    fn exactly_one_option_answers_the_question() {
        let mut rng = Rng::new(3);
        let mut letters = [0u32; 4];
        for _ in 0..4_000 {
            let ex = generate(&mut rng);
            let cat = KNOWLEDGE
                .iter()
                .position(|c| ex.prompt.starts_with(c.question))
                .unwrap();
            let rest = &ex.prompt[KNOWLEDGE[cat].question.len()..];
            // " A. x B. y C. z D. w" -> [x, y, z, w]
            let words: Vec<&str> = rest.split_whitespace().skip(1).step_by(2).collect();
            assert_eq!(words.len(), 4, "{ex:?}");
            let right: Vec<usize> = (0..4)
                .filter(|&i| category_of(words[i]) == Some(cat))
                .collect();
            assert_eq!(right.len(), 1, "{ex:?}");
            let mut cats: Vec<usize> = words.iter().map(|w| category_of(w).unwrap()).collect();
            cats.sort();
            cats.dedup();
            assert_eq!(cats.len(), 4, "distractors share a category: {ex:?}");
            let i = right[0];
            assert_eq!(ex.answer, LETTERS[i]);
            assert_eq!(
                ex.response,
                format!("{}. {}. Answer: {}", LETTERS[i], words[i], LETTERS[i])
            );
            letters[i] += 1;
        }
        for c in letters {
            assert!((900..1_100).contains(&c), "letters {letters:?}");
        }
    }
}
