//! Generator determinism, held-out exclusion, task mix and answer checking.

use std::collections::{HashMap, HashSet};

use dllm_tasks::rng::Rng;
use dllm_tasks::tasks::{choice, completion, math, yesno};
use dllm_tasks::{
    check, extract_answer, generate, held_out_prompts, is_held_out, test_set, test_suite,
    train_stream, Example, TaskKind, TrainStream, Verdict, TEST_SET_SIZE,
};

fn ex(kind: TaskKind, prompt: &str, response: &str, answer: &str) -> Example {
    Example {
        kind,
        prompt: prompt.into(),
        response: response.into(),
        answer: answer.into(),
    }
}

#[test]
fn same_seed_same_examples() {
    for kind in TaskKind::ALL {
        let a: Vec<Example> = {
            let mut r = Rng::new(123);
            (0..500).map(|_| generate(kind, &mut r)).collect()
        };
        let b: Vec<Example> = {
            let mut r = Rng::new(123);
            (0..500).map(|_| generate(kind, &mut r)).collect()
        };
        let c: Vec<Example> = {
            let mut r = Rng::new(124);
            (0..500).map(|_| generate(kind, &mut r)).collect()
        };
        assert_eq!(a, b, "{kind}");
        assert_ne!(a, c, "{kind}: seed ignored");
        assert!(a.iter().all(|e| e.kind == kind));
    }
    let a: Vec<Example> = train_stream(5).take(1_000).collect();
    let b: Vec<Example> = train_stream(5).take(1_000).collect();
    let c: Vec<Example> = train_stream(6).take(1_000).collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

/// Golden examples: if one of these changes, the suite changed, every trained checkpoint's
/// scores are no longer comparable, and the tokenizer must be rebuilt.
#[test]
fn golden_first_examples() {
    let golden = [
        (
            TaskKind::Math,
            "Mia has 33 eggs. She buys 3 more. How many eggs does Mia have now?",
            "33 + 3 = 36. Answer: 36",
            "36",
        ),
        (
            TaskKind::YesNo,
            "The bear is small. The mouse is cold. The pig is dry. Is the pig wet?",
            "The pig is dry. Answer: no",
            "no",
        ),
        (
            TaskKind::Choice,
            "Which of these is a fruit? A. violin B. yellow C. rake D. banana",
            "A: instrument B: colour C: tool D: fruit. Answer: D",
            "D",
        ),
        (
            TaskKind::Completion,
            "Later that day, it started to rain, so Tom opened his",
            "umbrella. Answer: umbrella",
            "umbrella",
        ),
    ];
    for (kind, prompt, response, answer) in golden {
        assert_eq!(test_set(kind)[0], ex(kind, prompt, response, answer));
    }
    let first: Vec<String> = TaskKind::ALL
        .iter()
        .map(|&k| generate(k, &mut Rng::new(0)).prompt)
        .collect();
    assert_eq!(first, GOLDEN_SEED0);
    assert_eq!(train_stream(0).next().unwrap().prompt, GOLDEN_TRAIN0);
}

const GOLDEN_SEED0: [&str; 4] = [
    "Finn has 44 eggs. He wins 5 more. How many eggs does Finn have now?",
    "The bear is sad. The fox is short. The frog is quiet. Is the bear sad?",
    "Which of these is an instrument? A. brown B. violin C. drill D. Jupiter",
    "It was Leo's birthday, so he blew out the",
];
const GOLDEN_TRAIN0: &str = "Which of these is a shape? A. banana B. rake C. hexagon D. green";

#[test]
fn test_set_is_200_unique_prompts_per_task() {
    let mut all = HashSet::new();
    for kind in TaskKind::EVERY {
        let set = test_set(kind);
        assert_eq!(set.len(), TEST_SET_SIZE);
        assert!(set.iter().all(|e| e.kind == kind));
        let prompts: HashSet<&str> = set.iter().map(|e| e.prompt.as_str()).collect();
        assert_eq!(prompts.len(), TEST_SET_SIZE, "{kind}: duplicate prompts");
        all.extend(set.into_iter().map(|e| e.prompt));
        // Stable across calls.
        assert_eq!(test_set(kind), test_set(kind));
    }
    // Both suites' held-out prompts, all distinct; the short suite is still 4 x 200.
    assert_eq!(all.len(), 8 * TEST_SET_SIZE);
    assert_eq!(held_out_prompts(), &all);
    assert_eq!(test_suite().len(), 4 * TEST_SET_SIZE);
    assert!(test_suite().iter().all(|e| is_held_out(&e.prompt)));
}

#[test]
fn train_stream_never_yields_a_held_out_prompt() {
    let held = held_out_prompts();
    let mut counts = HashMap::new();
    let mut distinct = HashSet::new();
    for e in train_stream(0).take(200_000) {
        assert!(
            !held.contains(&e.prompt),
            "held-out prompt in training: {e:?}"
        );
        *counts.entry(e.kind).or_insert(0usize) += 1;
        distinct.insert(e.prompt);
    }
    // Uniform task mix: 50_000 expected each, binomial sd ~ 190.
    for kind in TaskKind::ALL {
        let n = counts[&kind];
        assert!((49_000..51_000).contains(&n), "{kind}: {n}");
    }
    // Plenty of variety beyond the test set.
    assert!(
        distinct.len() > 100_000,
        "only {} distinct prompts",
        distinct.len()
    );
}

#[test]
fn every_task_has_room_for_held_out_and_training() {
    // The completion task has the smallest prompt space: people x openings x scenarios.
    let space = completion::SCENARIOS.len() * completion::OPENINGS.len() * 24;
    assert!(
        space >= 10 * TEST_SET_SIZE,
        "completion prompt space {space}"
    );
    let mut distinct = HashSet::new();
    for e in train_stream(9)
        .filter(|e| e.kind == TaskKind::Completion)
        .take(60_000)
    {
        distinct.insert(e.prompt);
    }
    assert!(distinct.len() + TEST_SET_SIZE <= space);
    assert!(
        distinct.len() > space * 8 / 10,
        "training reaches {} of {space}",
        distinct.len()
    );
}

#[test]
fn held_out_examples_were_not_reachable_from_the_train_rng_by_accident() {
    // The held-out filter redraws; make sure redraws are rare (< 10%) so the training
    // distribution is essentially the generators' own.
    let mut rng = Rng::new(77);
    let mut hits = 0;
    for _ in 0..20_000 {
        if is_held_out(&completion::generate(&mut rng).prompt) {
            hits += 1;
        }
    }
    assert!(hits < 2_000, "{hits}");
}

#[test]
fn train_stream_resumes_from_saved_state() {
    let mut s = train_stream(3);
    s.nth(10);
    let state = s.rng_state();
    let rest: Vec<Example> = s.take(50).collect();
    let resumed: Vec<Example> = TrainStream::from_rng_state(state).take(50).collect();
    assert_eq!(rest, resumed);
}

#[test]
fn answers_are_balanced_in_training_and_test() {
    let mut letters = HashMap::new();
    let mut yes = 0usize;
    let mut yesno_n = 0usize;
    let mut ops = HashMap::new();
    let (mut first_side, mut second_side) = (0usize, 0usize);
    for e in train_stream(1).take(40_000) {
        match e.kind {
            TaskKind::Choice => *letters.entry(e.answer.clone()).or_insert(0usize) += 1,
            TaskKind::YesNo => {
                yesno_n += 1;
                yes += (e.answer == "yes") as usize;
                // Which side of its pair the stated adjective is on says nothing either.
                let stated = e.response.split(' ').nth(3).unwrap().trim_end_matches('.');
                if yesno::ANTONYMS.iter().any(|(a, _)| *a == stated) {
                    first_side += 1;
                } else {
                    second_side += 1;
                }
            }
            TaskKind::Math => *ops.entry(e.response.contains(" + ")).or_insert(0usize) += 1,
            TaskKind::Completion => {}
            long => panic!("the short suite's stream yielded {long}"),
        }
    }
    assert_eq!(letters.len(), 4);
    for (l, n) in &letters {
        assert!((2_250..2_750).contains(n), "letter {l}: {n} of ~10000");
    }
    assert!(
        (yes as f64 / yesno_n as f64 - 0.5).abs() < 0.03,
        "{yes}/{yesno_n}"
    );
    let first_share = first_side as f64 / (first_side + second_side) as f64;
    assert!(
        (first_share - 0.5).abs() < 0.03,
        "stated adjectives: {first_side} / {second_side}"
    );
    assert!((ops[&true] as f64 / (ops[&true] + ops[&false]) as f64 - 0.5).abs() < 0.03);

    let test_yes = test_set(TaskKind::YesNo)
        .iter()
        .filter(|e| e.answer == "yes")
        .count();
    assert!((80..=120).contains(&test_yes), "test yes {test_yes}/200");
    let mut test_letters = HashMap::new();
    for e in test_set(TaskKind::Choice) {
        *test_letters.entry(e.answer).or_insert(0usize) += 1;
    }
    for (l, n) in &test_letters {
        assert!((30..=70).contains(n), "test letter {l}: {n}/200");
    }
}

#[test]
fn answers_are_consistent_with_responses() {
    for e in train_stream(2).take(10_000).chain(test_suite()) {
        assert_eq!(
            extract_answer(&e.response),
            Some(e.answer.as_str()),
            "{e:?}"
        );
        assert_eq!(
            check(&e, &e.response),
            Verdict {
                exact: true,
                final_answer: true
            }
        );
        match e.kind {
            TaskKind::Math => assert!(e.answer.len() == 2 && e.answer.parse::<u32>().is_ok()),
            TaskKind::YesNo => assert!(e.answer == "yes" || e.answer == "no"),
            TaskKind::Choice => assert!(choice::LETTERS.contains(&e.answer.as_str())),
            TaskKind::Completion => {
                assert!(completion::SCENARIOS
                    .iter()
                    .any(|(_, end)| *end == e.answer))
            }
            long => panic!("the short suite yielded {long}"),
        }
    }
    // Module vocabularies are what the prompts use.
    let m = math::generate(&mut Rng::new(1));
    assert!(math::ITEMS.iter().any(|i| m.prompt.contains(i)));
    let y = yesno::generate(&mut Rng::new(1));
    assert!(yesno::ANIMALS.iter().any(|a| y.prompt.contains(a)));
    assert!(yesno::ANTONYMS
        .iter()
        .any(|(a, b)| y.prompt.contains(a) || y.prompt.contains(b)));
}

#[test]
fn extract_answer_cases() {
    let cases: &[(&str, Option<&str>)] = &[
        ("23 + 5 = 28. Answer: 28", Some("28")),
        ("Answer: 28<eos><eos>", Some("28")),
        ("Answer:   walk to school  ", Some("walk to school")),
        ("Answer: B. Answer: C", Some("C")),
        ("B. apple. Answer: B<eos>Answer: C", Some("B")),
        ("Answer:", None),
        ("Answer:   <eos>", None),
        ("The dog is blue.", None),
        ("", None),
        ("answer: yes", None),
    ];
    for (resp, want) in cases {
        assert_eq!(extract_answer(resp), *want, "{resp:?}");
    }
}

#[test]
fn check_cases() {
    let math = ex(TaskKind::Math, "p", "23 + 5 = 28. Answer: 28", "28");
    let comp = ex(
        TaskKind::Completion,
        "p",
        "walk to school. Answer: walk to school",
        "walk to school",
    );
    let cases: &[(&Example, &str, bool, bool)] = &[
        (&math, "23 + 5 = 28. Answer: 28", true, true),
        (&math, " 23 +  5 = 28.\nAnswer: 28 ", true, true),
        (&math, "23 + 5 = 28. Answer: 28<eos><eos><eos>", true, true),
        (&math, "23 + 5 = 27. Answer: 28", false, true),
        (&math, "23 + 5 = 28. Answer: 27", false, false),
        (&math, "23 + 5 = 28. Answer: 288", false, false),
        (&math, "23 + 5 = 28. Answer: 28.", false, false),
        (&math, "23 + 5 = 28.", false, false),
        (&math, "Answer: 28", false, true),
        (&math, "", false, false),
        (&math, "23 + 5 = 28. Answer: 28 and more", false, false),
        (
            &comp,
            "walk to school. Answer: walk  to\tschool",
            true,
            true,
        ),
        (
            &comp,
            "walk to school. Answer: walk to school.",
            false,
            false,
        ),
        (
            &comp,
            "walk to school. Answer: walk to school<eos>junk",
            true,
            true,
        ),
        (&comp, "walk to school. Answer: walk", false, false),
    ];
    for (e, resp, exact, fin) in cases {
        assert_eq!(
            check(e, resp),
            Verdict {
                exact: *exact,
                final_answer: *fin
            },
            "{resp:?}"
        );
    }
}

#[test]
fn task_names_round_trip_and_bad_names_error() {
    for kind in TaskKind::ALL {
        assert_eq!(kind.to_string().parse::<TaskKind>().unwrap(), kind);
        assert_eq!(kind.paper_dataset().parse::<TaskKind>().unwrap(), kind);
        assert_eq!(TaskKind::ALL[kind.index()], kind);
    }
    assert_eq!("YesNo".parse::<TaskKind>().unwrap(), TaskKind::YesNo);
    let err = "bogus".parse::<TaskKind>().unwrap_err();
    assert!(err.to_string().contains("\"bogus\""), "{err}");
    let json = serde_json::to_string(&TaskKind::Completion).unwrap();
    assert_eq!(json, "\"completion\"");
}
