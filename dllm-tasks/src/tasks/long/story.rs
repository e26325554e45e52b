//! A story continued consistently with the people and things named in the prompt (the long
//! suite's HellaSwag stand-in).
//!
//! ```text
//! prompt:   Anna has a kite. Ben has a drum. Cara has a book. Dan has a ball. They play, then
//!           each one passes the thing to the next and the last to the first. What does Ben
//!           have at the end?
//! response: Anna flies her kite.
//!           Ben plays his drum.
//!           ...
//!           Anna gives the kite to Ben.
//!           ...
//!           Ben flies the kite.
//!           ...
//!           Answer: kite
//! ```
//!
//! [`MIN_PEOPLE`]..=[`MAX_PEOPLE`] people each own a different thing. The continuation has
//! three rounds, one line per person each, in the prompt's order: each person uses their
//! thing (the verb fits the thing, the pronoun the person), passes it on, and then uses the
//! thing they received. The last round depends on the first two (person `i` now holds
//! person `i-1`'s thing), and the answer is what the asked person holds at the end.

use super::super::words::PEOPLE;
use super::super::{Example, TaskKind};
use super::Scale;
use crate::rng::Rng;

/// Fewest people in a story.
pub const MIN_PEOPLE: usize = 4;
/// Most people in a story.
pub const MAX_PEOPLE: usize = 5;

/// People of a [`Scale::Small`] (training-only) story.
pub const SMALL_PEOPLE: (usize, usize) = (2, 3);

/// Things and what one does with them.
pub const THINGS: [(&str, &str); 8] = [
    ("kite", "flies"),
    ("drum", "plays"),
    ("book", "reads"),
    ("ball", "kicks"),
    ("bike", "rides"),
    ("cake", "eats"),
    ("hat", "wears"),
    ("boat", "sails"),
];

/// Draws one story.
pub fn generate(rng: &mut Rng) -> Example {
    generate_scaled(rng, Scale::Full)
}

/// Draws one story of `scale`.
pub fn generate_scaled(rng: &mut Rng, scale: Scale) -> Example {
    let (lo, hi) = match scale {
        Scale::Full => (MIN_PEOPLE, MAX_PEOPLE),
        Scale::Small => SMALL_PEOPLE,
    };
    let n = lo + rng.index(hi - lo + 1);
    let people: Vec<_> = rng
        .sample_indices(PEOPLE.len(), n)
        .into_iter()
        .map(|i| PEOPLE[i])
        .collect();
    let things: Vec<(&str, &str)> = rng
        .sample_indices(THINGS.len(), n)
        .into_iter()
        .map(|i| THINGS[i])
        .collect();
    let asked = rng.index(n);
    let mut prompt = String::new();
    for (p, (thing, _)) in people.iter().zip(&things) {
        prompt.push_str(&format!("{} has a {thing}. ", p.name));
    }
    prompt.push_str(&format!(
        "They play, then each one passes the thing to the next and the last to the first. What does {} have at the end?",
        people[asked].name
    ));
    let mut lines = Vec::with_capacity(3 * n + 1);
    for (p, (thing, verb)) in people.iter().zip(&things) {
        lines.push(format!("{} {verb} {} {thing}.", p.name, p.possessive));
    }
    for (i, (p, (thing, _))) in people.iter().zip(&things).enumerate() {
        lines.push(format!(
            "{} gives the {thing} to {}.",
            p.name,
            people[(i + 1) % n].name
        ));
    }
    for (i, p) in people.iter().enumerate() {
        let (thing, verb) = things[(i + n - 1) % n];
        lines.push(format!("{} {verb} the {thing}.", p.name));
    }
    let answer = things[(asked + n - 1) % n].0.to_string();
    lines.push(format!("Answer: {answer}"));
    Example {
        kind: TaskKind::LongStory,
        prompt,
        response: lines.join("\n"),
        answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_story_follows_the_things() {
        let mut rng = Rng::new(21);
        for _ in 0..2_000 {
            let ex = generate(&mut rng);
            let owners: Vec<(&str, &str)> = ex
                .prompt
                .split(". ")
                .take_while(|s| s.contains(" has a "))
                .map(|s| s.split_once(" has a ").unwrap())
                .collect();
            let n = owners.len();
            assert!((MIN_PEOPLE..=MAX_PEOPLE).contains(&n), "{ex:?}");
            let lines: Vec<&str> = ex.response.lines().collect();
            assert_eq!(lines.len(), 3 * n + 1);
            let verb = |t: &str| THINGS.iter().find(|x| x.0 == t).unwrap().1;
            for (i, (name, thing)) in owners.iter().enumerate() {
                let p = PEOPLE.iter().find(|p| p.name == *name).unwrap();
                assert_eq!(
                    lines[i],
                    format!("{name} {} {} {thing}.", verb(thing), p.possessive)
                );
                let next = owners[(i + 1) % n].0;
                assert_eq!(lines[n + i], format!("{name} gives the {thing} to {next}."));
                let got = owners[(i + n - 1) % n].1;
                assert_eq!(lines[2 * n + i], format!("{name} {} the {got}.", verb(got)));
            }
            let asked = ex.prompt.rsplit_once("What does ").unwrap().1;
            let asked = asked.split(' ').next().unwrap();
            let i = owners.iter().position(|o| o.0 == asked).unwrap();
            assert_eq!(ex.answer, owners[(i + n - 1) % n].1);
        }
    }
}
