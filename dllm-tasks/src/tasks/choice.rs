//! Four-option multiple choice over a small fixed knowledge base (the suite's ARC-C
//! stand-in).
//!
//! ```text
//! prompt:   Which of these is a metal? A. hammer B. gold C. Mars D. circle
//! response: A: tool B: metal C: planet D: shape. Answer: B
//! ```
//!
//! The knowledge base is eight disjoint categories of six members (48 words). A question
//! asks for one category; the correct option is one of its members and the three
//! distractors come from three *different* other categories, so exactly one option is right.
//! Options are shuffled, so every letter is correct a quarter of the time.
//!
//! # Learnability
//! The rationale classifies every option, in order: `A: tool B: metal ...`. Each of those
//! slots is a direct lookup (the word at option k, mapped to its category), which gives the
//! 48 memberships a direct training signal. The answer is then the letter in front of the
//! one label identical to the question's (`metal`): finding an identical token among a few
//! candidates and copying its neighbour is the attention pattern tiny models learn fastest.
//!
//! An earlier design answered `B. gold. Answer: B`, where picking the member directly needs
//! the model to compare the question's category with every option's hidden category, with
//! no signal on the memberships except through that comparison. In a probe (0.9M
//! parameters, 25 minutes on one core, one token per decoding step) it sat at chance for
//! 12 minutes and ended at 98% final-answer but 73% exact accuracy; this design ended at
//! 99% exact.
//!
//! Category labels are single words used verbatim in the question ("Which of these is a
//! metal?"), so the label in the rationale is the same token as in the question.

use super::{Example, TaskKind};
use crate::rng::Rng;

/// One category of the knowledge base.
#[derive(Clone, Copy, Debug)]
pub struct Category {
    /// The category's label, one word, as the question and the rationale write it.
    pub label: &'static str,
    /// The article in front of the label in the question ("a"/"an").
    pub article: &'static str,
    /// Its members (no word belongs to two categories).
    pub members: [&'static str; 6],
}

impl Category {
    /// The question asked for this category: "Which of these is a LABEL?".
    pub fn question(&self) -> String {
        format!("Which of these is {} {}?", self.article, self.label)
    }
}

const fn cat(label: &'static str, members: [&'static str; 6]) -> Category {
    Category {
        label,
        article: "a",
        members,
    }
}

/// The knowledge base. Words are disjoint across categories and labels (tested).
pub const KNOWLEDGE: [Category; 8] = [
    cat(
        "fruit",
        ["apple", "banana", "grape", "lemon", "mango", "peach"],
    ),
    cat(
        "tool",
        ["hammer", "saw", "drill", "wrench", "shovel", "rake"],
    ),
    cat("vehicle", ["car", "bus", "train", "boat", "truck", "plane"]),
    cat("metal", ["iron", "gold", "copper", "silver", "tin", "zinc"]),
    Category {
        label: "instrument",
        article: "an",
        members: ["piano", "drum", "flute", "guitar", "violin", "harp"],
    },
    cat(
        "planet",
        ["Mars", "Venus", "Earth", "Jupiter", "Saturn", "Neptune"],
    ),
    cat(
        "colour",
        ["red", "blue", "green", "yellow", "purple", "brown"],
    ),
    cat(
        "shape",
        [
            "circle",
            "square",
            "triangle",
            "oval",
            "rectangle",
            "hexagon",
        ],
    ),
];

/// The option letters, in order.
pub const LETTERS: [&str; 4] = ["A", "B", "C", "D"];

/// Draws one question.
pub fn generate(rng: &mut Rng) -> Example {
    let cat = rng.index(KNOWLEDGE.len());
    // Three distinct other categories, one member each, plus the right one; shuffled.
    let others: Vec<usize> = (0..KNOWLEDGE.len()).filter(|&c| c != cat).collect();
    let mut cats = vec![cat];
    cats.extend(
        rng.sample_indices(others.len(), 3)
            .into_iter()
            .map(|p| others[p]),
    );
    let mut options: Vec<(usize, &str)> = cats
        .into_iter()
        .map(|c| (c, KNOWLEDGE[c].members[rng.index(6)]))
        .collect();
    rng.shuffle(&mut options);
    let pos = options
        .iter()
        .position(|&(c, _)| c == cat)
        .expect("right option is present");
    let mut prompt = KNOWLEDGE[cat].question();
    let mut rationale = Vec::with_capacity(4);
    for (letter, (c, word)) in LETTERS.iter().zip(&options) {
        prompt.push_str(&format!(" {letter}. {word}"));
        rationale.push(format!("{letter}: {}", KNOWLEDGE[*c].label));
    }
    let answer = LETTERS[pos].to_string();
    let response = format!("{}. Answer: {answer}", rationale.join(" "));
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
        all.extend(KNOWLEDGE.iter().map(|c| c.label));
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(
            all.len(),
            n,
            "a word is in two categories or is also a label"
        );
        for c in KNOWLEDGE {
            let vowel = c.label.starts_with(['a', 'e', 'i', 'o', 'u']);
            assert_eq!(c.article, if vowel { "an" } else { "a" }, "{}", c.label);
        }
    }

    #[test]
    fn exactly_one_option_answers_the_question() {
        let mut rng = Rng::new(3);
        let mut letters = [0u32; 4];
        for _ in 0..4_000 {
            let ex = generate(&mut rng);
            let cat = KNOWLEDGE
                .iter()
                .position(|c| ex.prompt.starts_with(&c.question()))
                .unwrap();
            let rest = &ex.prompt[KNOWLEDGE[cat].question().len()..];
            // " A. x B. y C. z D. w" -> [x, y, z, w]
            let words: Vec<&str> = rest.split_whitespace().skip(1).step_by(2).collect();
            assert_eq!(words.len(), 4, "{ex:?}");
            let cats: Vec<usize> = words.iter().map(|w| category_of(w).unwrap()).collect();
            let right: Vec<usize> = (0..4).filter(|&i| cats[i] == cat).collect();
            assert_eq!(right.len(), 1, "{ex:?}");
            let mut distinct = cats.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 4, "distractors share a category: {ex:?}");
            let i = right[0];
            assert_eq!(ex.answer, LETTERS[i]);
            let rationale: Vec<String> = (0..4)
                .map(|k| format!("{}: {}", LETTERS[k], KNOWLEDGE[cats[k]].label))
                .collect();
            assert_eq!(
                ex.response,
                format!("{}. Answer: {}", rationale.join(" "), LETTERS[i])
            );
            letters[i] += 1;
        }
        for c in letters {
            assert!((900..1_100).contains(&c), "letters {letters:?}");
        }
    }
}
