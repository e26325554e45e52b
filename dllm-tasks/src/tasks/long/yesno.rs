//! Yes/no questions over a chain of comparisons, answered by restating the chain (the long
//! suite's BoolQ stand-in).
//!
//! ```text
//! prompt:   Dan is taller than Gina. Anna is taller than Ben. Gina is the shortest.
//!           Ben is taller than Dan. ... Is Ben taller than Gina?
//! response: Ben is taller than Dan.
//!           Dan is taller than Gina.
//!           So Ben is taller than Gina.
//!           Answer: yes
//! ```
//!
//! A passage orders [`MIN_PEOPLE`]..=[`MAX_PEOPLE`] people by one relation (taller, older,
//! faster): one fact per neighbouring pair, shuffled, plus who is last ("the shortest"). The
//! question asks whether X is above Y. The worked answer follows the chain down from X, one
//! restated fact per line, until it reaches Y (`yes`) or the last person (`no`, after
//! restating "... is the shortest."), then concludes.
//!
//! Every line's subject is the previous line's object and its object is found by looking up
//! the fact that starts with that subject (a content lookup in the passage): a pointer chase
//! of 7-11 hops, where one wrong hop derails every later line and usually the verdict. Yes and
//! no are equally likely and both need the chain, so guessing gives 50%.

use super::super::words::PEOPLE;
use super::super::{Example, TaskKind};
use super::Scale;
use crate::rng::Rng;

/// Fewest people in a passage.
pub const MIN_PEOPLE: usize = 10;
/// Most people in a passage.
pub const MAX_PEOPLE: usize = 13;
/// Fewest restated facts in a `yes` answer (the chain from X down to Y).
pub const MIN_YES_HOPS: usize = 8;
/// Fewest facts below X in a `no` question (the chain from X down to the last person).
pub const MIN_NO_HOPS: usize = 7;

/// People of a [`Scale::Small`] (training-only) passage; its chains need one hop or more.
pub const SMALL_PEOPLE: (usize, usize) = (3, 6);

/// Relations: the comparative and the superlative naming the last person of the order.
pub const RELATIONS: [(&str, &str); 3] = [
    ("taller", "shortest"),
    ("older", "youngest"),
    ("faster", "slowest"),
];

/// Draws one passage and question.
pub fn generate(rng: &mut Rng) -> Example {
    generate_scaled(rng, Scale::Full)
}

/// Draws one passage and question of `scale`.
pub fn generate_scaled(rng: &mut Rng, scale: Scale) -> Example {
    let ((lo, hi), min_yes, min_no) = match scale {
        Scale::Full => ((MIN_PEOPLE, MAX_PEOPLE), MIN_YES_HOPS, MIN_NO_HOPS),
        Scale::Small => (SMALL_PEOPLE, 1, 1),
    };
    let (rel, last) = RELATIONS[rng.index(RELATIONS.len())];
    let k = lo + rng.index(hi - lo + 1);
    let order: Vec<&str> = rng
        .sample_indices(PEOPLE.len(), k)
        .into_iter()
        .map(|i| PEOPLE[i].name)
        .collect();
    let yes = rng.below(2) == 0;
    // Positions in the order (0 = first): X at i, Y at j.
    let (i, j) = if yes {
        // j - i hops from X down to Y, at least `min_yes`.
        let hops = min_yes + rng.index(k - min_yes);
        let i = rng.index(k - hops);
        (i, i + hops)
    } else {
        // X has at least `min_no` people below it and at least one above it (Y).
        let i = 1 + rng.index(k - min_no - 1);
        (i, rng.index(i))
    };
    let (x, y) = (order[i], order[j]);
    let mut facts: Vec<String> = order
        .windows(2)
        .map(|w| format!("{} is {rel} than {}.", w[0], w[1]))
        .collect();
    facts.push(format!("{} is the {last}.", order[k - 1]));
    let mut shown = facts.clone();
    rng.shuffle(&mut shown);
    let prompt = format!("{} Is {x} {rel} than {y}?", shown.join(" "));
    let mut lines: Vec<String> = if yes {
        facts[i..j].to_vec()
    } else {
        facts[i..].to_vec()
    };
    let answer = if yes { "yes" } else { "no" };
    lines.push(if yes {
        format!("So {x} is {rel} than {y}.")
    } else {
        format!("So {x} is not {rel} than {y}.")
    });
    lines.push(format!("Answer: {answer}"));
    Example {
        kind: TaskKind::LongYesNo,
        prompt,
        response: lines.join("\n"),
        answer: answer.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Rebuilds the order from the shuffled facts and re-derives the response.
    #[test]
    fn the_chain_answers_the_question() {
        let mut rng = Rng::new(5);
        let mut yes = 0;
        for _ in 0..2_000 {
            let ex = generate(&mut rng);
            let (facts, question) = ex.prompt.rsplit_once(" Is ").unwrap();
            let q: Vec<&str> = question.trim_end_matches('?').split(' ').collect();
            let (x, rel, y) = (q[0], q[1], q[3]);
            let mut next: HashMap<&str, &str> = HashMap::new();
            let mut last = "";
            for f in facts.split(". ") {
                let w: Vec<&str> = f.trim_end_matches('.').split(' ').collect();
                if w[2] == "the" {
                    last = w[0];
                } else {
                    assert_eq!(w[2], rel);
                    assert!(next.insert(w[0], w[4]).is_none(), "two facts from {}", w[0]);
                }
            }
            let mut lines = Vec::new();
            let mut cur = x;
            let found = loop {
                if cur == y {
                    break true;
                }
                match next.get(cur) {
                    Some(n) => {
                        lines.push(format!("{cur} is {rel} than {n}."));
                        cur = n;
                    }
                    None => {
                        assert_eq!(cur, last);
                        let sup = RELATIONS.iter().find(|r| r.0 == rel).unwrap().1;
                        lines.push(format!("{cur} is the {sup}."));
                        break false;
                    }
                }
            };
            yes += usize::from(found);
            assert!(lines.len() >= MIN_NO_HOPS, "{ex:?}");
            let not = if found { "" } else { "not " };
            lines.push(format!("So {x} is {not}{rel} than {y}."));
            let answer = if found { "yes" } else { "no" };
            lines.push(format!("Answer: {answer}"));
            assert_eq!(ex.response, lines.join("\n"));
            assert_eq!(ex.answer, answer);
        }
        assert!((900..1_100).contains(&yes), "{yes} yes of 2000");
    }
}
