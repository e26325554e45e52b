//! The long-math question sets decoding is judged on ([`QuestionSet`]), re-exported by `eval`.

use serde::Serialize;

use crate::tasks::{test_set, Example, TaskKind};
use crate::{Error, Result};

/// The long-math question sets decoding is judged on (the long suite's GSM8K stand-in).
///
/// Defaults were first chosen on [`QuestionSet::Tuning`] alone and reported on
/// [`QuestionSet::Confirmation`]; that choice fell below threshold-0.9 decoding there, so the
/// defaults were chosen again on both, and [`QuestionSet::Fresh`], which chose nothing, reports
/// them. The joint check (verification, 2026-12-04) was chosen after the fresh set had judged
/// the default before it, so [`QuestionSet::Fresh2`], read by nothing until the defaults of that
/// day were fixed, judges the final choice. The left wait (staged decisions, 2026-12-04, the day's
/// fourth session) was chosen on all four, and [`QuestionSet::Fresh3`] judges it.
/// [`QuestionSet::Fresh4`] judges verification's step-boundary rules of 2026-12-06, found by
/// reading wrong answers of the earlier sets. [`QuestionSet::Fresh5`] (2026-12-06, the day's
/// second session) judges the partner rule's second version, chosen on the tuning and
/// confirmation sets. [`QuestionSet::Fresh6`] (the day's fourth session) judges the near wait
/// and θ_stable 0.9, chosen on the tuning and confirmation sets. [`QuestionSet::Fresh7`]
/// (2026-12-06, the day's sixth session) judges mbsd's window sliding across one block
/// (`--block-length 128 --span 16 --wait-near 8`), chosen on the tuning and confirmation sets.
/// [`QuestionSet::Fresh8`] (the day's seventh session) judges the bucket fit counting the shown
/// guess's rows (`--fit-guess`) beside that window, chosen on the tuning and confirmation sets.
/// [`QuestionSet::Fresh9`] (2026-12-07) judges Dream's guess agreement
/// (`MbsdParams::guess_agreement`), chosen on the ten sets before it, all of which had been read.
/// Held-out questions past the first 200 are not excluded
/// from training by construction,
/// but the generator's prompt space (24 people, 8 items, 8-12 months of about 16 event sentences
/// each, 9 start values) is so large that a repeat is practically impossible; the confirmation
/// generator's items never occur in training.
/// The sets are ordered as they were made (and used): `Tuning < Confirmation < Fresh < Fresh2 <
/// Fresh3 < Fresh4 < Fresh5 < Fresh6 < Fresh7 < Fresh8 < Fresh9`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QuestionSet {
    /// Held-out long-math questions 1-100 (the set every earlier default was chosen on).
    Tuning,
    /// The confirmation generator's 300 questions ([`crate::tasks::long::confirm`]) and held-out
    /// long-math questions 101-400.
    Confirmation,
    /// The confirmation generator's questions 301-600 and held-out long-math questions 401-700.
    Fresh,
    /// The confirmation generator's questions 601-900 and held-out long-math questions 701-1000.
    Fresh2,
    /// The confirmation generator's questions 901-1200 and held-out long-math questions 1001-1300.
    Fresh3,
    /// The confirmation generator's questions 1201-1500 and held-out long-math questions 1301-1600.
    Fresh4,
    /// The confirmation generator's questions 1501-1800 and held-out long-math questions 1601-1900.
    Fresh5,
    /// The confirmation generator's questions 1801-2100 and held-out long-math questions 1901-2200.
    Fresh6,
    /// The confirmation generator's questions 2101-2400 and held-out long-math questions 2201-2500.
    Fresh7,
    /// The confirmation generator's questions 2401-2700 and held-out long-math questions 2501-2800.
    Fresh8,
    /// The confirmation generator's questions 2701-3000 and held-out long-math questions 2801-3100.
    Fresh9,
}

impl QuestionSet {
    /// Questions of the tuning set.
    pub const TUNING_SIZE: usize = 100;
    /// Every set, in order.
    pub const ALL: [QuestionSet; 11] = [
        QuestionSet::Tuning,
        QuestionSet::Confirmation,
        QuestionSet::Fresh,
        QuestionSet::Fresh2,
        QuestionSet::Fresh3,
        QuestionSet::Fresh4,
        QuestionSet::Fresh5,
        QuestionSet::Fresh6,
        QuestionSet::Fresh7,
        QuestionSet::Fresh8,
        QuestionSet::Fresh9,
    ];
    /// The sets the speed/quality picture (`bench --pareto`) runs by default: all but `Fresh4` to
    /// `Fresh9`, which judged the rules of 2026-12-06 and 2026-12-07 (`--sets` adds them).
    pub const PICTURE: [QuestionSet; 5] = [
        QuestionSet::Tuning,
        QuestionSet::Confirmation,
        QuestionSet::Fresh,
        QuestionSet::Fresh2,
        QuestionSet::Fresh3,
    ];

    /// Its questions, always the same, in order: the tuning set is held-out long-math 1-100; the
    /// k-th set after it (k = 1, ..., 9) is the confirmation generator's k-th 300 questions, then
    /// the k-th 300 held-out long-math questions after the first 100.
    pub fn questions(self) -> Vec<Example> {
        use crate::tasks::long::confirm::{confirmation_stream, CONFIRMATION_SIZE};
        let Some((generator, held_out)) = self.ranges() else {
            let mut v = test_set(TaskKind::LongMath);
            v.truncate(Self::TUNING_SIZE);
            return v;
        };
        debug_assert_eq!(generator.len(), CONFIRMATION_SIZE);
        let mut v: Vec<Example> = confirmation_stream(generator.end)
            .into_iter()
            .skip(generator.start)
            .collect();
        v.extend(
            crate::tasks::held_out_stream(TaskKind::LongMath, held_out.end)
                .into_iter()
                .skip(held_out.start),
        );
        v
    }

    /// The confirmation generator's and the held-out questions of a set after the tuning set
    /// (0-based ranges); `None` for the tuning set.
    fn ranges(self) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        use crate::tasks::long::confirm::CONFIRMATION_SIZE as N;
        let k = match self {
            QuestionSet::Tuning => return None,
            QuestionSet::Confirmation => 0,
            QuestionSet::Fresh => 1,
            QuestionSet::Fresh2 => 2,
            QuestionSet::Fresh3 => 3,
            QuestionSet::Fresh4 => 4,
            QuestionSet::Fresh5 => 5,
            QuestionSet::Fresh6 => 6,
            QuestionSet::Fresh7 => 7,
            QuestionSet::Fresh8 => 8,
            QuestionSet::Fresh9 => 9,
        };
        let held = Self::TUNING_SIZE + k * N;
        Some((k * N..(k + 1) * N, held..held + N))
    }

    /// What the set is, in words (1-based question numbers).
    pub fn describe(self) -> String {
        match self.ranges() {
            None => format!("held-out long-math questions 1-{}", Self::TUNING_SIZE),
            Some((g, h)) if g.start == 0 => format!(
                "the confirmation generator's {} questions, then held-out long-math questions {}-{}",
                g.len(),
                h.start + 1,
                h.end
            ),
            Some((g, h)) => format!(
                "the confirmation generator's questions {}-{}, then held-out long-math questions \
                 {}-{}",
                g.start + 1,
                g.end,
                h.start + 1,
                h.end
            ),
        }
    }

    /// `tuning`, `confirmation`, `fresh`, `fresh2`, `fresh3`, `fresh4`, `fresh5`, `fresh6`, `fresh7`, `fresh8` or `fresh9`.
    pub fn name(self) -> &'static str {
        match self {
            QuestionSet::Tuning => "tuning",
            QuestionSet::Confirmation => "confirmation",
            QuestionSet::Fresh => "fresh",
            QuestionSet::Fresh2 => "fresh2",
            QuestionSet::Fresh3 => "fresh3",
            QuestionSet::Fresh4 => "fresh4",
            QuestionSet::Fresh5 => "fresh5",
            QuestionSet::Fresh6 => "fresh6",
            QuestionSet::Fresh7 => "fresh7",
            QuestionSet::Fresh8 => "fresh8",
            QuestionSet::Fresh9 => "fresh9",
        }
    }
}

impl std::str::FromStr for QuestionSet {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        QuestionSet::ALL
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = QuestionSet::ALL.iter().map(|q| q.name()).collect();
                Error::InvalidArgument(format!(
                    "unknown question set {s:?} (expected one of: {})",
                    names.join(", ")
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_question_sets_are_disjoint_and_the_fresh_set_is_new() {
        let sets: Vec<Vec<Example>> = QuestionSet::ALL.iter().map(|s| s.questions()).collect();
        assert_eq!(sets[0].len(), 100);
        assert_eq!(sets[1].len(), 600);
        assert_eq!(sets[2].len(), 600);
        assert_eq!(sets[3].len(), 600);
        assert_eq!(sets[4].len(), 600);
        assert_eq!(sets[5].len(), 600);
        assert_eq!(sets[6].len(), 600);
        assert_eq!(sets[7].len(), 600);
        assert_eq!(sets[8].len(), 600);
        assert_eq!(sets[9].len(), 600);
        assert_eq!(sets[10].len(), 600);
        let mut seen = std::collections::HashSet::new();
        for (set, qs) in QuestionSet::ALL.iter().zip(&sets) {
            for q in qs {
                assert!(
                    seen.insert(q.prompt.clone()),
                    "{} repeats {:?}",
                    set.name(),
                    q.prompt
                );
            }
        }
        // The confirmation set is what it always was: its first question is the generator's.
        assert_eq!(
            sets[1][0].prompt,
            crate::tasks::long::confirm::confirmation_set()[0].prompt
        );
        for s in QuestionSet::ALL {
            assert_eq!(s.name().parse::<QuestionSet>().unwrap(), s);
        }
        // The titles the speed/quality picture prints (pareto.md's section headings).
        let described: Vec<String> = QuestionSet::ALL.iter().map(|s| s.describe()).collect();
        assert_eq!(
            described,
            [
                "held-out long-math questions 1-100",
                "the confirmation generator's 300 questions, then held-out long-math questions 101-400",
                "the confirmation generator's questions 301-600, then held-out long-math questions 401-700",
                "the confirmation generator's questions 601-900, then held-out long-math questions 701-1000",
                "the confirmation generator's questions 901-1200, then held-out long-math questions 1001-1300",
                "the confirmation generator's questions 1201-1500, then held-out long-math questions 1301-1600",
                "the confirmation generator's questions 1501-1800, then held-out long-math questions 1601-1900",
                "the confirmation generator's questions 1801-2100, then held-out long-math questions 1901-2200",
                "the confirmation generator's questions 2101-2400, then held-out long-math questions 2201-2500",
                "the confirmation generator's questions 2401-2700, then held-out long-math questions 2501-2800",
                "the confirmation generator's questions 2701-3000, then held-out long-math questions 2801-3100",
            ]
        );
        // The held-out part of a set follows the previous set's: fresh2's first held-out question
        // is held-out question 701 (0-based 700).
        let held = crate::tasks::held_out_stream(TaskKind::LongMath, 701);
        assert_eq!(sets[3][300].prompt, held[700].prompt);
        assert!(QuestionSet::Tuning < QuestionSet::Fresh2);
        assert!(QuestionSet::Fresh2 < QuestionSet::Fresh3);
        assert_eq!(QuestionSet::PICTURE, QuestionSet::ALL[..5]);
    }

    #[test]
    fn unknown_set_names_list_every_set() {
        let e = "fresh10".parse::<QuestionSet>().unwrap_err().to_string();
        assert!(e.contains("\"fresh10\""), "{e}");
        for s in QuestionSet::ALL {
            assert!(e.contains(s.name()), "{e}");
        }
    }
}
