//! Yes/no questions over a short passage (the suite's BoolQ stand-in).
//!
//! ```text
//! prompt:   The cat is red. The dog is blue. The fox is green. Is the dog green?
//! response: The dog is blue. Answer: no
//! ```
//!
//! The passage states two or three facts "The ANIMAL is COLOUR." about distinct animals with
//! distinct colours; the question asks about one of them. Answers are balanced yes/no.
//!
//! # Learnability
//! Restating the relevant fact turns the hard part into copying: the rationale copies the
//! question's animal, then the colour that follows that animal in the passage (a
//! match-then-copy pattern that two attention layers learn quickly). The final `yes`/`no`
//! then compares two nearby tokens, the question's colour and the restated one, so a
//! decoder that commits the rationale first (the confident, low-entropy tokens) reduces the
//! answer to an equality test.
//!
//! For "no" questions the asked colour is, half of the time, the colour of *another* animal
//! of the passage, so "does the colour appear in the passage at all?" is not enough (it
//! tops out at 75%); the other half it is a colour the passage does not mention.

use super::{Example, TaskKind};
use crate::rng::Rng;

/// The animals that facts are about.
pub const ANIMALS: [&str; 16] = [
    "cat", "dog", "fox", "bird", "cow", "pig", "duck", "frog", "goat", "horse", "sheep", "bear",
    "lion", "mouse", "owl", "wolf",
];

/// The colours the animals have.
pub const COLOURS: [&str; 8] = [
    "red", "blue", "green", "yellow", "black", "white", "brown", "pink",
];

/// Draws one passage and question.
pub fn generate(rng: &mut Rng) -> Example {
    let n_facts = 2 + rng.index(2);
    let animals = rng.sample_indices(ANIMALS.len(), n_facts);
    let colours = rng.sample_indices(COLOURS.len(), n_facts);
    let target = rng.index(n_facts);
    let yes = rng.below(2) == 0;
    let true_colour = colours[target];
    let asked_colour = if yes {
        true_colour
    } else if rng.below(2) == 0 {
        // Another animal's colour: answering needs the right fact, not just the passage.
        let mut other = rng.index(n_facts - 1);
        if other >= target {
            other += 1;
        }
        colours[other]
    } else {
        let absent: Vec<usize> = (0..COLOURS.len())
            .filter(|c| !colours.contains(c))
            .collect();
        absent[rng.index(absent.len())]
    };
    let mut prompt = String::new();
    for (&a, &c) in animals.iter().zip(&colours) {
        prompt.push_str(&format!("The {} is {}. ", ANIMALS[a], COLOURS[c]));
    }
    let animal = ANIMALS[animals[target]];
    prompt.push_str(&format!("Is the {animal} {}?", COLOURS[asked_colour]));
    let answer = if yes { "yes" } else { "no" }.to_string();
    let response = format!("The {animal} is {}. Answer: {answer}", COLOURS[true_colour]);
    Example {
        kind: TaskKind::YesNo,
        prompt,
        response,
        answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers the question by actually reading the passage.
    fn solve(prompt: &str) -> (String, &'static str) {
        let (passage, question) = prompt.rsplit_once("Is the ").unwrap();
        let question = question.trim_end_matches('?');
        let (animal, colour) = question.split_once(' ').unwrap();
        let fact = passage
            .split(". ")
            .map(|f| f.trim().trim_end_matches('.'))
            .find(|f| f.starts_with(&format!("The {animal} is ")))
            .expect("the asked animal is in the passage");
        let true_colour = fact.rsplit(' ').next().unwrap().to_string();
        let yes = true_colour == colour;
        (true_colour, if yes { "yes" } else { "no" })
    }

    #[test]
    fn answers_follow_from_the_passage() {
        let mut rng = Rng::new(2);
        let (mut yes, mut no_in_passage, mut no_absent) = (0, 0, 0);
        for _ in 0..4_000 {
            let ex = generate(&mut rng);
            let (true_colour, ans) = solve(&ex.prompt);
            assert_eq!(ex.answer, ans, "{ex:?}");
            let animal = ex
                .prompt
                .rsplit_once("Is the ")
                .unwrap()
                .1
                .split(' ')
                .next()
                .unwrap();
            assert_eq!(
                ex.response,
                format!("The {animal} is {true_colour}. Answer: {ans}")
            );
            let asked = ex.prompt.rsplit(' ').next().unwrap().trim_end_matches('?');
            let passage = ex.prompt.rsplit_once("Is the ").unwrap().0;
            match (ans, passage.contains(&format!(" {asked}."))) {
                ("yes", _) => yes += 1,
                ("no", true) => no_in_passage += 1,
                _ => no_absent += 1,
            }
        }
        assert!((1_850..2_150).contains(&yes), "yes {yes}");
        assert!(
            (850..1_150).contains(&no_in_passage),
            "no (in passage) {no_in_passage}"
        );
        assert!((850..1_150).contains(&no_absent), "no (absent) {no_absent}");
    }
}
