//! Templated sentence completion (the suite's HellaSwag stand-in).
//!
//! ```text
//! prompt:   After school, it started to rain, so Anna opened her
//! response: umbrella. Answer: umbrella
//! ```
//!
//! Each scenario is a cause ("it started to rain") and an unfinished consequence
//! ("so NAME opened her") whose ending is fixed by the cause. Several scenarios share the
//! words right before the gap ("put on her" -> warm coat / sunglasses / glasses; "went to
//! the" -> doctor / pool / post office; "gave it some" -> water / food), so the ending must
//! come from the cue earlier in the sentence, as in HellaSwag, not from the last words.
//! Endings have one to three words, several of them split into multiple tokens.
//!
//! Variety comes from 24 people and 6 openings; the name and opening never change the
//! ending, so held-out prompts test that the model ignores them.
//!
//! # Learnability
//! 30 cue-to-ending associations is a small lookup; the rationale is the ending itself and
//! the answer a copy of it. A probe with ~1M parameters reached ~95% on a task of this kind
//! in half an hour.

use super::words::{Person, PEOPLE};
use super::{Example, TaskKind};
use crate::rng::Rng;

/// Sentence openings (the empty one capitalises the scenario's first letter instead).
pub const OPENINGS: [&str; 6] = [
    "",
    "One day, ",
    "In the morning, ",
    "After school, ",
    "On Sunday, ",
    "Later that day, ",
];

/// The scenarios: a template (`{N}` name, `{s}` she/he, `{p}` her/his) and its ending.
pub const SCENARIOS: [(&str, &str); 30] = [
    ("it started to rain, so {N} opened {p}", "umbrella"),
    ("it was very cold, so {N} put on {p}", "warm coat"),
    ("the sun was very bright, so {N} put on {p}", "sunglasses"),
    ("{N} could not see the board, so {s} put on {p}", "glasses"),
    ("{N} was tired, so {s} went to", "bed"),
    ("{N} was sick, so {s} went to the", "doctor"),
    ("{N} wanted to swim, so {s} went to the", "pool"),
    (
        "{N} wanted to send a letter, so {s} went to the",
        "post office",
    ),
    ("the plant was dry, so {N} gave it some", "water"),
    ("the dog was hungry, so {N} gave it some", "food"),
    ("the room was dark, so {N} turned on the", "light"),
    ("the room was hot, so {N} opened the", "window"),
    ("someone knocked, so {N} opened the", "door"),
    ("the phone rang, so {N} picked up the", "phone"),
    ("{N} was thirsty, so {s} drank a glass of", "water"),
    ("{N} was hungry, so {s} made a", "sandwich"),
    ("{N} wanted to read, so {s} opened a", "book"),
    ("the floor was dirty, so {N} swept it with a", "broom"),
    ("it was {N}'s birthday, so {s} blew out the", "candles"),
    ("the door was locked, so {N} looked for {p}", "key"),
    ("{N} missed the bus, so {s} had to", "walk to school"),
    ("the soup was cold, so {N} heated it in the", "microwave"),
    ("{N} cut {p} finger, so {s} put on a", "bandage"),
    ("the cake was ready, so {N} took it out of the", "oven"),
    ("it was snowing, so {N} built a", "snowman"),
    ("the music was too loud, so {N} covered {p}", "ears"),
    (
        "{N} had dirty hands, so {s} washed them with",
        "soap and water",
    ),
    ("the car was out of gas, so {N} drove to the", "gas station"),
    ("the baby was crying, so {N} sang a", "soft song"),
    (
        "the grass was too long, so {N} cut it with the",
        "lawn mower",
    ),
];

fn fill(template: &str, person: &Person) -> String {
    template
        .replace("{N}", person.name)
        .replace("{s}", person.subject_lc)
        .replace("{p}", person.possessive)
}

/// Draws one unfinished sentence.
pub fn generate(rng: &mut Rng) -> Example {
    let (template, ending) = SCENARIOS[rng.index(SCENARIOS.len())];
    let person = PEOPLE[rng.index(PEOPLE.len())];
    let opening = OPENINGS[rng.index(OPENINGS.len())];
    let body = fill(template, &person);
    let prompt = if opening.is_empty() {
        let mut chars = body.chars();
        let first = chars.next().map(|c| c.to_ascii_uppercase());
        first.into_iter().chain(chars).collect()
    } else {
        format!("{opening}{body}")
    };
    let answer = ending.to_string();
    let response = format!("{ending}. Answer: {ending}");
    Example {
        kind: TaskKind::Completion,
        prompt,
        response,
        answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_sentences_and_endings_match_the_cue() {
        let mut rng = Rng::new(4);
        for _ in 0..3_000 {
            let ex = generate(&mut rng);
            assert!(
                ex.prompt.starts_with(|c: char| c.is_ascii_uppercase()),
                "{ex:?}"
            );
            assert!(!ex.prompt.contains('{'), "unfilled template: {ex:?}");
            // Exactly one (scenario, person) fills to the prompt's tail, and its ending is
            // the answer.
            let prompt = ex.prompt.to_lowercase();
            let mut endings: Vec<&str> = Vec::new();
            for (t, e) in SCENARIOS {
                if PEOPLE
                    .iter()
                    .any(|p| prompt.ends_with(&fill(t, p).to_lowercase()))
                {
                    endings.push(e);
                }
            }
            assert_eq!(endings, [ex.answer.as_str()], "{ex:?}");
            assert_eq!(ex.response, format!("{0}. Answer: {0}", ex.answer));
        }
    }

    #[test]
    fn shared_gap_words_need_the_cue() {
        // At least three groups of scenarios end with the same words before the gap but
        // have different endings: the property that makes this HellaSwag-like.
        let mut tails = std::collections::HashMap::<&str, Vec<&str>>::new();
        for (t, e) in SCENARIOS {
            let tail = t.split(", so ").nth(1).unwrap();
            let tail = tail.split_once(' ').unwrap().1; // drop the subject
            tails.entry(tail).or_default().push(e);
        }
        let ambiguous = tails.values().filter(|es| es.len() > 1).count();
        assert!(ambiguous >= 3, "{tails:?}");
    }
}
