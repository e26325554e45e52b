//! Where a wrong answer first goes wrong, read against the decoder's step log (`eval
//! --first-errors`): the first generated position whose token differs from the reference, how the
//! forward that decided it saw the positions before it, and what verification did with it.
//!
//! On long-math the token before the first wrong one tells its kind: after "=" it is a line's
//! result. A result whose operands the deciding forward still saw masked (decided in that same
//! forward, or later) was predicted on incomplete context; one whose left context was complete
//! is the model's own mistake there. Positions are read by their last decision (a remasked and
//! re-decided position counts where it was decided the last time).

use serde::Serialize;

use crate::eval::{Answered, StepLog};
use crate::Result;

/// How far before the first wrong token the positions its deciding forward saw masked are
/// counted (a long-math line's result sits 2 and 4 positions after its operands).
pub const LEFT_SPAN: usize = 8;

/// A look at or above this probability confirms a token (the `a look ≥ 0.99` column).
const CONFIRMING_LOOK: f64 = 0.99;

/// A wrong answer's first wrong token ([`first_wrong`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FirstWrong {
    /// Its generated position (0 = the first generated position).
    pub position: usize,
    /// The reference's token before it, as text (the answer's token there is the same): `=`
    /// before a long-math line's result.
    pub after: String,
    /// The step that decided it (`None`: no step did, EOS filled in after an early stop).
    pub step: Option<usize>,
    /// The confidence it was decided at.
    pub confidence: Option<f64>,
    /// Distances (1 to [`LEFT_SPAN`]) of the positions before it that the forward deciding it
    /// saw masked: undecided before that step (decided in it, or later), the guess that forward
    /// showed excepted.
    pub masked_before: Vec<usize>,
    /// It was the only decision of its step.
    pub alone: bool,
    /// The probability each look at it (a verification shadow row) gave its token, in order.
    pub looks: Vec<f64>,
    /// How often verification sent it back to the mask.
    pub remasked: usize,
}

/// The first wrong token of an answer (`None` when every position equals the reference), from
/// [`Answered`]'s per-position records and step log; `after(position)` is the reference's token
/// text at a position (its error is returned).
pub fn first_wrong(
    token_right: &[bool],
    commit_step: &[Option<usize>],
    commit_confidence: &[Option<f64>],
    log: &[StepLog],
    after: impl FnOnce(usize) -> Result<String>,
) -> Result<Option<FirstWrong>> {
    let Some(k) = token_right.iter().position(|&r| !r) else {
        return Ok(None);
    };
    let step = commit_step.get(k).copied().flatten();
    let entry = step.and_then(|s| log.iter().find(|l| l.step == s));
    let guess = entry.and_then(|l| l.guess).map(|g| g.0);
    let masked_before = match step {
        Some(s) => (1..=LEFT_SPAN.min(k))
            .filter(|&d| {
                let q = k - d;
                Some(q) != guess && commit_step.get(q).copied().flatten().is_none_or(|t| t >= s)
            })
            .collect(),
        None => Vec::new(),
    };
    Ok(Some(FirstWrong {
        position: k,
        after: if k == 0 { String::new() } else { after(k - 1)? },
        step,
        confidence: commit_confidence.get(k).copied().flatten(),
        masked_before,
        alone: entry.is_some_and(|l| l.decided.len() == 1),
        looks: (log.iter())
            .flat_map(|l| l.verified.iter().filter(|v| v.0 == k).map(|v| v.1))
            .collect(),
        remasked: log.iter().filter(|l| l.remasked.contains(&k)).count(),
    }))
}

/// One row of [`first_errors`]: wrong answers whose first wrong token falls in one class.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ErrorRow {
    /// The class: left context masked or complete when decided, and the confidence.
    pub class: &'static str,
    /// Wrong answers in it.
    pub answers: usize,
    /// Of them, first wrong tokens after "=" (long-math: a line's result).
    pub after_equals: usize,
    /// The only decision of their step.
    pub alone: usize,
    /// Looked at by verification at least once.
    pub looked: usize,
    /// Given at least 0.99 by some look.
    pub confirmed: usize,
    /// Sent back to the mask at least once.
    pub remasked: usize,
}

/// The classes of [`first_errors`], in order.
pub const CLASSES: [&str; 5] = [
    "left context masked, decided at 0.9 or above",
    "left context masked, decided below 0.9",
    "left context complete, decided at 0.9 or above",
    "left context complete, decided below 0.9",
    "never decided by a step",
];

/// The wrong answers of `answers`, by where their first wrong token came from.
pub fn first_errors(answers: &[Answered]) -> Vec<ErrorRow> {
    let mut rows: Vec<ErrorRow> = (CLASSES.iter())
        .map(|&class| ErrorRow {
            class,
            answers: 0,
            after_equals: 0,
            alone: 0,
            looked: 0,
            confirmed: 0,
            remasked: 0,
        })
        .collect();
    for f in answers.iter().filter(|a| !a.final_answer) {
        let Some(f) = &f.first_wrong else { continue };
        let i = match (f.confidence, f.masked_before.is_empty()) {
            (None, _) => 4,
            (Some(c), false) => usize::from(c < 0.9),
            (Some(c), true) => 2 + usize::from(c < 0.9),
        };
        let r = &mut rows[i];
        r.answers += 1;
        r.after_equals += usize::from(f.after.trim() == "=");
        r.alone += usize::from(f.alone);
        r.looked += usize::from(!f.looks.is_empty());
        r.confirmed += usize::from(f.looks.iter().any(|&p| p >= CONFIRMING_LOOK));
        r.remasked += usize::from(f.remasked > 0);
    }
    rows
}

/// A markdown table of [`first_errors`] rows.
pub fn first_errors_table(rows: &[ErrorRow]) -> String {
    let mut s = format!(
        "| first wrong token (left context: the {LEFT_SPAN} positions before it, as the forward \
         deciding it saw them) | wrong answers | after \"=\" | alone in its step | looked at | a \
         look ≥ 0.99 | sent back |\n|---|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.class, r.answers, r.after_equals, r.alone, r.looked, r.confirmed, r.remasked
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(step: usize, decided: &[usize], guess: Option<usize>) -> StepLog {
        StepLog {
            step,
            window: (0, 16),
            decided: decided.iter().map(|&p| (p, 0.99)).collect(),
            verified: Vec::new(),
            remasked: Vec::new(),
            guess: guess.map(|g| (g, true)),
        }
    }

    #[test]
    fn the_first_wrong_token_counts_what_its_forward_saw_masked() {
        // Positions 0-9; 6 is the first wrong one, decided in step 1 with 3 and 4 (masked
        // in that forward); 5 was that forward's shown guess; 0-2 were decided in step 0; 7-9
        // came later.
        let steps = [0, 0, 0, 1, 1, 2, 1, 2, 2, 2].map(Some);
        let mut conf = [Some(0.99); 10];
        conf[6] = Some(0.97);
        let mut right = [true; 10];
        right[6] = false;
        right[8] = false;
        let mut logs = vec![log(0, &[0, 1, 2], None), log(1, &[3, 4, 6], Some(5))];
        logs.push(StepLog {
            verified: vec![(6, 0.4), (6, 0.995)],
            remasked: vec![],
            ..log(2, &[5, 7, 8, 9], None)
        });
        let f = first_wrong(&right, &steps, &conf, &logs, |p| Ok(format!("t{p}")))
            .unwrap()
            .unwrap();
        assert_eq!(f.position, 6);
        assert_eq!(f.after, "t5");
        assert_eq!(f.step, Some(1));
        assert_eq!(f.confidence, Some(0.97));
        // 5 was the guess (seen), 3 and 4 decided in the same step (masked), 0-2 before it.
        assert_eq!(f.masked_before, vec![2, 3]);
        assert!(!f.alone);
        assert_eq!(f.looks, vec![0.4, 0.995]);
        assert_eq!(f.remasked, 0);
        // Without the guess, 5 (decided later) was masked too.
        logs[1].guess = None;
        let f = first_wrong(&right, &steps, &conf, &logs, |p| Ok(format!("t{p}")))
            .unwrap()
            .unwrap();
        assert_eq!(f.masked_before, vec![1, 2, 3]);
        // A right answer has none.
        assert!(
            first_wrong(&[true; 10], &steps, &conf, &logs, |_| Ok(String::new()))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_lone_decision_with_its_left_context_complete_is_its_own_class() {
        let steps = [0, 0, 0, 1].map(Some);
        let conf = [Some(1.0), Some(1.0), Some(1.0), Some(0.6)];
        let right = [true, true, true, false];
        let logs = vec![log(0, &[0, 1, 2], None), log(1, &[3], None)];
        let f = first_wrong(&right, &steps, &conf, &logs, |_| Ok("=".into()))
            .unwrap()
            .unwrap();
        assert!(f.masked_before.is_empty());
        assert!(f.alone);
        let rows = first_errors(&[crate::eval::tests::answered_with(Some(f))]);
        let row = rows.iter().find(|r| r.answers == 1).unwrap();
        assert_eq!(row.class, CLASSES[3]);
        assert_eq!((row.after_equals, row.alone, row.looked), (1, 1, 0));
        assert!(first_errors_table(&rows)
            .contains("| left context complete, decided below 0.9 | 1 | 1 | 1 | 0 | 0 | 0 |"));
    }
}
