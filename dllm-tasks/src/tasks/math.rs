//! Math word problems (the suite's GSM8K stand-in).
//!
//! ```text
//! prompt:   Tom has 23 apples. He buys 5 more. How many apples does Tom have now?
//! response: 23 + 5 = 28. Answer: 28
//! ```
//!
//! One operation per problem: the second sentence's verb decides between adding
//! ("gets", "buys", "finds", "wins" ... "more") and subtracting ("gives away", "loses",
//! "sells", "uses"). The starting amount `a` has two digits (10..=99), the change `b` one
//! digit (1..=9), and the result two digits.
//!
//! # Why no carry or borrow
//! The units of `a` and `b` never carry (`a % 10 + b <= 9`) or borrow (`a % 10 >= b`), so the
//! result's tens digit is a copy of `a`'s and its units digit is one entry of a 90-entry
//! single-digit table. The GSM8K-like part that remains is reading the problem: which
//! number is which, and which operation the verb means. The rationale restates the operands
//! (copying, which tiny transformers learn fastest), then the result, then the answer.
//!
//! Carries are what a ~1-5M parameter model trained for an hour on a CPU would get wrong:
//! the tens digit would depend on a comparison of two other digits, an extra composed
//! lookup, and half of uniformly drawn problems carry. A model that never learnt the carry
//! would sit near 50%, and the target is 70%. Without carries every digit is a copy or one
//! lookup, and the answer is still multi-token with an order that matters: `Answer: 28`
//! must agree with the `= 28` of the rationale, which in turn comes from the copied
//! operands.

use super::words::PEOPLE;
use super::{Example, TaskKind};
use crate::rng::Rng;

/// Countable things the people own (plural forms).
pub const ITEMS: [&str; 12] = [
    "apples", "pens", "books", "coins", "cards", "shells", "stamps", "marbles", "eggs", "cookies",
    "flowers", "stickers",
];

/// Verbs meaning "the amount goes up by b" (followed by "b more").
pub const ADD_VERBS: [&str; 4] = ["gets", "buys", "finds", "wins"];

/// Verbs meaning "the amount goes down by b".
pub const SUB_VERBS: [&str; 4] = ["gives away", "loses", "sells", "uses"];

/// Draws one problem.
pub fn generate(rng: &mut Rng) -> Example {
    let person = PEOPLE[rng.index(PEOPLE.len())];
    let items = ITEMS[rng.index(ITEMS.len())];
    let add = rng.below(2) == 0;
    let tens = 1 + rng.below(9);
    // Rejection keeps (units, b) uniform over the 45 carry-free (or borrow-free) pairs.
    let (units, b) = loop {
        let units = rng.below(10);
        let b = 1 + rng.below(9);
        let ok = if add { units + b <= 9 } else { b <= units };
        if ok {
            break (units, b);
        }
    };
    let a = tens * 10 + units;
    let (verb, more, sign, result) = if add {
        (ADD_VERBS[rng.index(ADD_VERBS.len())], " more", '+', a + b)
    } else {
        (SUB_VERBS[rng.index(SUB_VERBS.len())], "", '-', a - b)
    };
    let name = person.name;
    let prompt = format!(
        "{name} has {a} {items}. {} {verb} {b}{more}. How many {items} does {name} have now?",
        person.subject
    );
    let answer = result.to_string();
    let response = format!("{a} {sign} {b} = {result}. Answer: {answer}");
    Example {
        kind: TaskKind::Math,
        prompt,
        response,
        answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `a op b = r` back out of the rationale.
    fn parse(resp: &str) -> (u64, char, u64, u64) {
        let mut it = resp.split_whitespace();
        let a = it.next().unwrap().parse().unwrap();
        let op = it.next().unwrap().chars().next().unwrap();
        let b = it.next().unwrap().parse().unwrap();
        assert_eq!(it.next(), Some("="));
        let r = it.next().unwrap().trim_end_matches('.').parse().unwrap();
        (a, op, b, r)
    }

    #[test]
    fn arithmetic_is_correct_and_carry_free() {
        let mut rng = Rng::new(1);
        let (mut adds, mut subs) = (0, 0);
        for _ in 0..5_000 {
            let ex = generate(&mut rng);
            let (a, op, b, r) = parse(&ex.response);
            assert!((10..=99).contains(&a) && (1..=9).contains(&b), "{ex:?}");
            assert!((10..=99).contains(&r), "{ex:?}");
            match op {
                '+' => {
                    adds += 1;
                    assert_eq!(r, a + b);
                    assert!(a % 10 + b <= 9, "carry in {ex:?}");
                    assert!(ex.prompt.contains(" more."), "{ex:?}");
                }
                '-' => {
                    subs += 1;
                    assert_eq!(r, a - b);
                    assert!(a % 10 >= b, "borrow in {ex:?}");
                    assert!(!ex.prompt.contains(" more."), "{ex:?}");
                }
                _ => panic!("bad op in {ex:?}"),
            }
            assert_eq!(ex.answer, r.to_string());
            assert!(ex.prompt.starts_with(&format!(
                "{} has {a} ",
                ex.prompt.split(' ').next().unwrap()
            )));
        }
        assert!((2_300..2_700).contains(&adds) && (2_300..2_700).contains(&subs));
    }
}
