//! The long suite: generators, held-out exclusion, lengths in tokens, its tokenizer, answer and
//! per-step checking on hand-written right and wrong answers.

use std::collections::HashSet;
use std::sync::OnceLock;

use dllm_tasks::tasks::long::{
    check_steps, generate_scaled, steps, Scale, StepScore, SMALL_MAX_RESPONSE_TOKENS,
};
use dllm_tasks::tokenizer::LONG_MIN_RESPONSE_TOKENS;
use dllm_tasks::tokenizer::{
    build_long_suite_tokenizer, build_suite_tokenizer, decode, decode_response, encode_prompt,
    encode_response, sft_row, suite_of, to_json,
};
use dllm_tasks::train::Batcher;
use dllm_tasks::{
    check, generate, held_out_prompts, suite_train_stream, test_set, train_stream, Example, Rng,
    Suite, TaskKind, EOS_ID, LONG_GEN_LENGTH, LONG_MAX_PROMPT_TOKENS, LONG_MAX_RESPONSE_TOKENS,
    TEST_SET_SIZE,
};
use tokenizers::Tokenizer;

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| build_long_suite_tokenizer().expect("long suite tokenizer"))
}

#[test]
fn generators_are_deterministic() {
    for kind in TaskKind::LONG {
        let a: Vec<Example> = {
            let mut r = Rng::new(77);
            (0..50).map(|_| generate(kind, &mut r)).collect()
        };
        let b: Vec<Example> = {
            let mut r = Rng::new(77);
            (0..50).map(|_| generate(kind, &mut r)).collect()
        };
        assert_eq!(a, b, "{kind}");
        assert!(a.iter().all(|e| e.kind == kind));
        let distinct: HashSet<&str> = a.iter().map(|e| e.prompt.as_str()).collect();
        assert!(distinct.len() >= 49, "{kind}: prompts repeat");
    }
    let s1: Vec<Example> = suite_train_stream(Suite::Long, 3).take(40).collect();
    let s2: Vec<Example> = suite_train_stream(Suite::Long, 3).take(40).collect();
    assert_eq!(s1, s2);
    // The short suite's stream is the historical one.
    let short: Vec<Example> = suite_train_stream(Suite::Short, 3).take(40).collect();
    assert_eq!(short, train_stream(3).take(40).collect::<Vec<_>>());
}

#[test]
fn test_sets_are_fixed_unique_and_never_trained_on() {
    let held = held_out_prompts();
    for kind in TaskKind::LONG {
        let set = test_set(kind);
        assert_eq!(set.len(), TEST_SET_SIZE);
        assert_eq!(set, test_set(kind));
        let unique: HashSet<&str> = set.iter().map(|e| e.prompt.as_str()).collect();
        assert_eq!(unique.len(), TEST_SET_SIZE, "{kind}");
        assert!(set.iter().all(|e| held.contains(&e.prompt)));
    }
    let mut seen = [0usize; 4];
    for ex in suite_train_stream(Suite::Long, 1).take(20_000) {
        assert!(
            !held.contains(&ex.prompt),
            "held-out prompt in training: {ex:?}"
        );
        assert_eq!(ex.kind.suite(), Suite::Long);
        seen[ex.kind.index_in_suite()] += 1;
    }
    assert!(
        seen.iter().all(|&n| (4_500..5_500).contains(&n)),
        "{seen:?}"
    );
    // Weighted mixes follow the weights.
    let mut w = [0usize; 4];
    let stream = suite_train_stream(Suite::Long, 2)
        .with_weights([2, 2, 1, 1])
        .unwrap();
    for ex in stream.take(6_000) {
        w[ex.kind.index_in_suite()] += 1;
    }
    assert!(
        w[0] > 1_800 && w[1] > 1_800 && w[2] < 1_200 && w[3] < 1_200,
        "{w:?}"
    );
}

/// The held-out sets are small; a contaminated stream would repeat their prompts. Training
/// prompts that collide with a held-out prompt are redrawn, so the train stream can be
/// checked against them directly (above); here the generators are checked to have room:
/// a large sample of fresh prompts is overwhelmingly new.
#[test]
fn prompt_spaces_are_large() {
    for kind in TaskKind::LONG {
        let mut r = Rng::new(123);
        let prompts: HashSet<String> = (0..5_000).map(|_| generate(kind, &mut r).prompt).collect();
        assert!(
            prompts.len() > 4_900,
            "{kind}: {} distinct of 5000",
            prompts.len()
        );
    }
}

#[test]
fn lengths_fit_the_canvas() {
    let t = tok();
    let examples = suite_train_stream(Suite::Long, 9)
        .take(8_000)
        .chain(TaskKind::LONG.into_iter().flat_map(test_set));
    let (mut pmax, mut rmin, mut rmax) = (0, usize::MAX, 0);
    for ex in examples {
        let p = encode_prompt(t, &ex.prompt).unwrap().len();
        let r = encode_response(t, &ex.response).unwrap().len();
        pmax = pmax.max(p);
        rmin = rmin.min(r);
        rmax = rmax.max(r);
        assert!(p <= LONG_MAX_PROMPT_TOKENS, "{p} prompt tokens: {ex:?}");
        assert!(
            (LONG_MIN_RESPONSE_TOKENS..=LONG_MAX_RESPONSE_TOKENS).contains(&r),
            "{r} response tokens: {ex:?}"
        );
        let (row, pl) = sft_row(t, &ex.prompt, &ex.response, LONG_GEN_LENGTH).unwrap();
        assert_eq!(pl, p);
        assert_eq!(row.len(), p + LONG_GEN_LENGTH);
        assert_eq!(row[pl + r], EOS_ID);
    }
    eprintln!("prompt max {pmax}, response {rmin}..={rmax} tokens");
    const { assert!(LONG_MAX_RESPONSE_TOKENS < LONG_GEN_LENGTH) };
}

#[test]
fn tokenizer_is_deterministic_lossless_and_line_starts_match_words() {
    let t = tok();
    assert_eq!(
        to_json(t).unwrap(),
        to_json(&build_long_suite_tokenizer().unwrap()).unwrap()
    );
    assert_eq!(
        t.get_vocab_size(true),
        dllm_tasks::tokenizer::LONG_VOCAB_SIZE
    );
    for ex in TaskKind::LONG
        .into_iter()
        .flat_map(|k| test_set(k).into_iter().take(20))
    {
        for text in [&ex.prompt, &ex.response] {
            let ids = encode_response(t, text).unwrap();
            assert_eq!(&decode(t, &ids).unwrap(), text);
        }
        let mut ids = encode_response(t, &ex.response).unwrap();
        ids.extend([EOS_ID, EOS_ID]);
        assert_eq!(decode_response(t, &ids).unwrap(), ex.response);
    }
    // A word at the start of a line is the same token as anywhere else.
    let a = encode_response(t, "Ben is taller than Cara.\nCara is taller than Dan.").unwrap();
    let cara = encode_response(t, "Cara").unwrap();
    assert_eq!(cara.len(), 1);
    assert_eq!(a.iter().filter(|&&i| i == cara[0]).count(), 2, "{a:?}");
    // Every long-suite word is one token (digits one each), so copying a word is copying a token.
    for e in TaskKind::LONG
        .into_iter()
        .flat_map(|k| test_set(k).into_iter().take(50))
    {
        for text in [&e.prompt, &e.response] {
            for word in text.split([' ', '\n']) {
                let core = word.trim_end_matches(['.', '?', ',', ':']);
                if core.is_empty() || core.chars().any(|c| c.is_ascii_digit()) {
                    continue;
                }
                assert_eq!(
                    encode_response(t, core).unwrap().len(),
                    1,
                    "{core:?} in {text:?}"
                );
            }
        }
    }
    // The long tokenizer extends the short one: same ids for every short token, and short-suite
    // text tokenizes identically.
    let short = build_suite_tokenizer().unwrap();
    for (token, id) in short.get_vocab(true) {
        assert_eq!(t.token_to_id(&token), Some(id), "{token:?}");
    }
    for e in dllm_tasks::test_suite().iter().take(400) {
        assert_eq!(
            encode_prompt(t, &e.prompt).unwrap(),
            encode_prompt(&short, &e.prompt).unwrap()
        );
        assert_eq!(
            encode_response(t, &e.response).unwrap(),
            encode_response(&short, &e.response).unwrap()
        );
    }
    // Each suite recognises its own tokenizer.
    assert_eq!(suite_of(t).unwrap(), Suite::Long);
    assert_eq!(
        suite_of(&build_suite_tokenizer().unwrap()).unwrap(),
        Suite::Short
    );
}

fn ex(kind: TaskKind, response: &str, answer: &str) -> Example {
    Example {
        kind,
        prompt: "p".into(),
        response: response.into(),
        answer: answer.into(),
    }
}

#[test]
fn worked_answers_are_checked_step_by_step() {
    let math = ex(
        TaskKind::LongMath,
        "January: 23+7=30\nFebruary: 30-5=25\nMarch: 25*2=50\nAnswer: 50",
        "50",
    );
    // Right, with different whitespace and trailing EOS text.
    let right = "January: 23+7=30\nFebruary:  30-5=25\n March: 25*2=50\nAnswer: 50<eos><eos>";
    let v = check(&math, right);
    assert!(v.exact && v.final_answer);
    assert_eq!(
        check_steps(&math, right),
        Some(StepScore { right: 3, total: 3 })
    );
    // A wrong middle step carried through: two steps and the answer wrong.
    let wrong = "January: 23+7=30\nFebruary: 30-5=26\nMarch: 26*2=52\nAnswer: 52";
    let v = check(&math, wrong);
    assert!(!v.exact && !v.final_answer);
    assert_eq!(
        check_steps(&math, wrong),
        Some(StepScore { right: 1, total: 3 })
    );
    // Right answer from wrong work: final answer right, steps not.
    let lucky = "January: 23+7=31\nFebruary: 31-5=25\nMarch: 25*2=50\nAnswer: 50";
    let v = check(&math, lucky);
    assert!(!v.exact && v.final_answer);
    assert_eq!(check_steps(&math, lucky).unwrap().right, 1);
    // A missing line shifts every later line: they no longer match.
    let skipped = "January: 23+7=30\nMarch: 25*2=50\nAnswer: 50";
    assert_eq!(check_steps(&math, skipped).unwrap().right, 1);
    // Nothing generated.
    assert_eq!(
        check_steps(&math, ""),
        Some(StepScore { right: 0, total: 3 })
    );
    assert!(!check(&math, "").final_answer);

    let yes = ex(
        TaskKind::LongYesNo,
        "Ben is taller than Dan.\nDan is taller than Gina.\nSo Ben is taller than Gina.\nAnswer: yes",
        "yes",
    );
    let flipped = "Ben is taller than Dan.\nDan is taller than Gina.\nSo Ben is taller than Gina.\nAnswer: no";
    assert!(!check(&yes, flipped).final_answer);
    assert_eq!(
        check_steps(&yes, flipped).unwrap(),
        StepScore { right: 3, total: 3 }
    );
    assert_eq!(steps(&yes.response).len(), 3);

    // Short-suite answers are not worked.
    let short = ex(TaskKind::Math, "23 + 5 = 28. Answer: 28", "28");
    assert_eq!(check_steps(&short, "23 + 5 = 28. Answer: 28"), None);
}

#[test]
fn generated_references_pass_their_own_checks() {
    for kind in TaskKind::LONG {
        for e in test_set(kind) {
            let v = check(&e, &e.response);
            assert!(v.exact && v.final_answer, "{e:?}");
            let s = check_steps(&e, &e.response).unwrap();
            assert_eq!(s.right, s.total);
            assert!(s.total >= 6, "{e:?}");
            // Every line but the last is a step; the last is the answer.
            assert_eq!(e.response.lines().count(), s.total + 1);
            assert_eq!(
                e.response.lines().last().unwrap(),
                format!("Answer: {}", e.answer)
            );
        }
    }
}

#[test]
fn suite_and_task_names_round_trip() {
    for kind in TaskKind::EVERY {
        assert_eq!(kind.name().parse::<TaskKind>().unwrap(), kind);
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(json, format!("\"{}\"", kind.name()));
        assert!(kind.suite().tasks().contains(&kind));
        assert_eq!(kind.is_worked(), kind.suite() == Suite::Long);
    }
    assert_eq!(
        "long-gsm8k".parse::<TaskKind>().unwrap(),
        TaskKind::LongMath
    );
    for s in Suite::ALL {
        assert_eq!(s.name().parse::<Suite>().unwrap(), s);
    }
    assert!("medium"
        .parse::<Suite>()
        .unwrap_err()
        .to_string()
        .contains("medium"));
}

#[test]
fn small_training_instances_are_short_and_optional() {
    let t = tok();
    for kind in TaskKind::LONG {
        let mut r = Rng::new(4);
        for _ in 0..1_500 {
            let e = generate_scaled(kind, &mut r, Scale::Small);
            let n = encode_response(t, &e.response).unwrap().len();
            assert!(n <= SMALL_MAX_RESPONSE_TOKENS, "{n} tokens: {e:?}");
            let v = check(&e, &e.response);
            assert!(v.exact && v.final_answer, "{e:?}");
            assert!(check_steps(&e, &e.response).unwrap().total >= 1);
        }
        // Full scale is the plain generator, draw for draw.
        let (mut a, mut b) = (Rng::new(8), Rng::new(8));
        for _ in 0..50 {
            assert_eq!(
                generate(kind, &mut a),
                generate_scaled(kind, &mut b, Scale::Full)
            );
        }
    }
    // Fraction 0 is the stream without small instances; a fraction mixes them in (never a
    // held-out prompt) and the batcher gives them the short canvas.
    let plain: Vec<Example> = suite_train_stream(Suite::Long, 5).take(30).collect();
    let zero: Vec<Example> = suite_train_stream(Suite::Long, 5)
        .with_small_fraction(0.0)
        .unwrap()
        .take(30)
        .collect();
    assert_eq!(plain, zero);
    let held = held_out_prompts();
    let mixed = suite_train_stream(Suite::Long, 5)
        .with_small_fraction(0.5)
        .unwrap();
    let small = mixed
        .clone()
        .take(4_000)
        .inspect(|e| assert!(!held.contains(&e.prompt)))
        .filter(|e| encode_response(t, &e.response).unwrap().len() < LONG_MIN_RESPONSE_TOKENS)
        .count();
    assert!((1_800..2_200).contains(&small), "{small} small of 4000");
    let mut batcher = Batcher::with_gen_lens(mixed, 4, vec![128, 64]);
    let mut seen = HashSet::new();
    for _ in 0..12 {
        let b = batcher.next_batch(t).unwrap();
        let len = b.rows[0].len() - b.prompt_len;
        assert!(b.rows.iter().all(|r| r.len() == b.prompt_len + len));
        seen.insert(len);
    }
    assert_eq!(seen, HashSet::from([64, 128]));
    assert!(suite_train_stream(Suite::Short, 1)
        .with_small_fraction(0.5)
        .is_err());
    assert!(suite_train_stream(Suite::Long, 1)
        .with_small_fraction(1.5)
        .is_err());
}
