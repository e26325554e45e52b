//! Yes/no questions over a short passage (the suite's BoolQ stand-in).
//!
//! ```text
//! prompt:   The cat can swim. The dog cannot fly. The fox can climb. Can the dog fly?
//! response: The dog cannot fly. Answer: no
//! ```
//!
//! The passage states two or three facts "The ANIMAL can/cannot ABILITY." about distinct
//! animals and distinct abilities, each fact's polarity drawn independently; the question
//! asks whether one of the animals has its stated ability. Answers are balanced yes/no, and
//! the other facts' polarities carry no information, so only the asked animal's fact
//! decides the answer.
//!
//! # Learnability
//! Restating the relevant fact turns the task into retrieval plus copying: the rationale
//! copies the question's animal, then the `can`/`cannot` that follows that animal in the
//! passage (a match-then-copy pattern that two attention layers learn quickly), then the
//! ability. The final `yes`/`no` is a function of one token of the rationale.
//!
//! An earlier design asked "Is the dog green?" over colour facts, so that `no` needed an
//! equality test between the asked and the restated colour. A ~0.9M-parameter probe learnt
//! the retrieval (42% exact after 12 minutes on one core) but stayed at chance on the
//! answer: detecting that two tokens are equal takes a tiny model much longer to learn than
//! reading a polarity that is stated.

use super::{Example, TaskKind};
use crate::rng::Rng;

/// The animals that facts are about.
pub const ANIMALS: [&str; 16] = [
    "cat", "dog", "fox", "bird", "cow", "pig", "duck", "frog", "goat", "horse", "sheep", "bear",
    "lion", "mouse", "owl", "wolf",
];

/// The abilities facts state or deny.
pub const ABILITIES: [&str; 8] = ["swim", "fly", "run", "climb", "jump", "dig", "sing", "hide"];

/// Draws one passage and question.
pub fn generate(rng: &mut Rng) -> Example {
    let n_facts = 2 + rng.index(2);
    let animals = rng.sample_indices(ANIMALS.len(), n_facts);
    let abilities = rng.sample_indices(ABILITIES.len(), n_facts);
    let can: Vec<bool> = (0..n_facts).map(|_| rng.below(2) == 0).collect();
    let target = rng.index(n_facts);
    let modal = |c: bool| if c { "can" } else { "cannot" };
    let mut prompt = String::new();
    for i in 0..n_facts {
        prompt.push_str(&format!(
            "The {} {} {}. ",
            ANIMALS[animals[i]],
            modal(can[i]),
            ABILITIES[abilities[i]]
        ));
    }
    let animal = ANIMALS[animals[target]];
    let ability = ABILITIES[abilities[target]];
    prompt.push_str(&format!("Can the {animal} {ability}?"));
    let answer = if can[target] { "yes" } else { "no" }.to_string();
    let response = format!(
        "The {animal} {} {ability}. Answer: {answer}",
        modal(can[target])
    );
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

    /// Answers the question by actually reading the passage: (restated fact, answer).
    fn solve(prompt: &str) -> (String, &'static str) {
        let (passage, question) = prompt.rsplit_once("Can the ").unwrap();
        let (animal, ability) = question.trim_end_matches('?').split_once(' ').unwrap();
        let facts: Vec<&str> = passage
            .split(". ")
            .map(|f| f.trim().trim_end_matches('.'))
            .filter(|f| f.starts_with(&format!("The {animal} ")))
            .collect();
        assert_eq!(
            facts.len(),
            1,
            "the asked animal has exactly one fact: {prompt}"
        );
        let fact = facts[0];
        assert!(
            fact.ends_with(&format!(" {ability}")),
            "asked about another ability: {prompt}"
        );
        let yes = fact.split(' ').nth(2) == Some("can");
        (format!("{fact}."), if yes { "yes" } else { "no" })
    }

    #[test]
    fn answers_follow_from_the_passage() {
        let mut rng = Rng::new(2);
        let mut yes = 0;
        let mut agree_with_majority = 0;
        for _ in 0..4_000 {
            let ex = generate(&mut rng);
            let (fact, ans) = solve(&ex.prompt);
            assert_eq!(ex.answer, ans, "{ex:?}");
            assert_eq!(ex.response, format!("{fact} Answer: {ans}"));
            yes += (ans == "yes") as usize;
            // The other facts must not give the answer away.
            let cans = ex.prompt.matches(" can ").count();
            let cannots = ex.prompt.matches(" cannot ").count();
            let majority_yes = cans > cannots;
            agree_with_majority += (majority_yes == (ans == "yes")) as usize;
        }
        assert!((1_850..2_150).contains(&yes), "yes {yes}");
        // Majority polarity of the passage is an imperfect cue (the asked fact is part of
        // it) but far from the answer itself.
        assert!(
            agree_with_majority < 3_400,
            "majority cue {agree_with_majority}/4000"
        );
    }
}
