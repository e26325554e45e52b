//! Tokenizer: special ids, prompt format, lossless round trip, lengths, determinism.

use std::sync::OnceLock;

use dllm_tasks::tokenizer::{
    self, build_suite_tokenizer, check_special_tokens, decode, decode_response, default_corpus,
    encode_prompt, encode_response, sft_row, to_json, tokenizer_vocab_size, train_tokenizer,
    truncate_at_eos, SPECIAL_TOKENS,
};
use dllm_tasks::{
    test_suite, train_stream, Error, BOS_ID, EOS_ID, MASK_ID, MAX_PROMPT_TOKENS,
    MAX_RESPONSE_TOKENS, PAD_ID, SEP_ID, UNK_ID,
};
use tokenizers::Tokenizer;

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| build_suite_tokenizer().expect("suite tokenizer"))
}

#[test]
fn special_tokens_have_fixed_ids() {
    let t = tok();
    let expected = [
        ("<pad>", PAD_ID),
        ("<unk>", UNK_ID),
        ("<bos>", BOS_ID),
        ("<eos>", EOS_ID),
        ("<sep>", SEP_ID),
        ("[MASK]", MASK_ID),
    ];
    for (i, (name, id)) in expected.into_iter().enumerate() {
        assert_eq!(id, i as u32);
        assert_eq!(SPECIAL_TOKENS[i], name);
        assert_eq!(t.token_to_id(name), Some(id), "{name}");
        assert_eq!(t.id_to_token(id).as_deref(), Some(name));
    }
    check_special_tokens(t).unwrap();
    // Special tokens in text are recognised as themselves, not split into bytes.
    assert_eq!(encode_response(t, "[MASK]").unwrap(), [MASK_ID]);
}

#[test]
fn vocab_size_is_small_and_words_are_whole_tokens() {
    let n = tokenizer_vocab_size(tok());
    assert!((300..=1000).contains(&n), "vocab size {n}");
    // The closed vocabulary saturates BPE: every word of every suite text is one token
    // (digits one token each), which is what makes copying a single-token operation.
    for e in test_suite() {
        for text in [&e.prompt, &e.response] {
            for word in text.split(' ') {
                // GPT-2 pre-tokenisation splits off punctuation and the possessive 's.
                let core = word
                    .trim_end_matches(['.', '?', ',', ':'])
                    .trim_end_matches("'s");
                if core.is_empty() || core.chars().all(|c| c.is_ascii_digit()) {
                    continue;
                }
                let ids = encode_response(tok(), core).unwrap();
                assert_eq!(ids.len(), 1, "{core:?} -> {ids:?} in {text:?}");
            }
        }
    }
}

#[test]
fn digits_are_one_token_each() {
    let t = tok();
    let digit_ids: Vec<u32> = (0..10)
        .map(|d| {
            // Alone, a digit is the normaliser's leading space, then the digit.
            let ids = encode_response(t, &d.to_string()).unwrap();
            assert_eq!(ids.len(), 2);
            ids[1]
        })
        .collect();
    let ids = encode_response(t, "1234567890").unwrap();
    assert_eq!(
        &ids[1..],
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 0].map(|d| digit_ids[d])
    );
    // A digit's token does not depend on what precedes it.
    let ids = encode_response(t, "has 23 apples").unwrap();
    assert!(
        ids.windows(2).any(|w| w == [digit_ids[2], digit_ids[3]]),
        "{ids:?}"
    );
}

#[test]
fn prompt_encoding_is_bos_prompt_sep() {
    let t = tok();
    for e in test_suite() {
        let ids = encode_prompt(t, &e.prompt).unwrap();
        let body = encode_response(t, &e.prompt).unwrap();
        assert_eq!(ids[0], BOS_ID);
        assert_eq!(*ids.last().unwrap(), SEP_ID);
        assert_eq!(&ids[1..ids.len() - 1], body.as_slice());
        assert!(
            !body.iter().any(|&i| i < 6),
            "special id inside {:?}",
            e.prompt
        );
    }
    // The pair form is a full training row without padding.
    let enc = t
        .encode(("Is the dog red?", "The dog is blue. Answer: no"), true)
        .unwrap();
    let ids = enc.get_ids();
    let p = encode_prompt(t, "Is the dog red?").unwrap();
    let r = encode_response(t, "The dog is blue. Answer: no").unwrap();
    assert_eq!(ids, [p, r, vec![EOS_ID]].concat());
}

#[test]
fn round_trip_is_lossless() {
    let t = tok();
    let mut n = 0;
    let texts = train_stream(31)
        .take(5_000)
        .chain(test_suite())
        .flat_map(|e| {
            [
                e.prompt.clone(),
                e.response.clone(),
                format!("{} {}", e.prompt, e.response),
            ]
        });
    for s in texts {
        let ids = encode_response(t, &s).unwrap();
        assert_eq!(decode(t, &ids).unwrap(), s);
        // The prompt block decodes to the prompt: specials are dropped.
        let ids = encode_prompt(t, &s).unwrap();
        assert_eq!(decode(t, &ids).unwrap(), s);
        n += 1;
    }
    assert!(n >= 15_000);
    // Outside the suite too: spacing, unseen characters, non-ASCII, numbers.
    for s in [
        "",
        " ",
        "  leading and trailing  ",
        "\ttab\nnewline",
        "Ünïcödé — “quotes” 日本語 🙂",
        "x=12345, y=-0.5",
        "Answer:  B",
        "a\u{00B2}b",
    ] {
        let ids = encode_response(t, s).unwrap();
        assert_eq!(decode(t, &ids).unwrap(), s, "{s:?}");
    }
}

#[test]
fn every_example_fits_the_length_limits() {
    let t = tok();
    let (mut max_p, mut max_r) = (0, 0);
    for e in train_stream(8).take(40_000).chain(test_suite()) {
        let p = encode_prompt(t, &e.prompt).unwrap().len();
        let r = encode_response(t, &e.response).unwrap().len();
        max_p = max_p.max(p);
        max_r = max_r.max(r);
        assert!(p <= MAX_PROMPT_TOKENS, "prompt {p} tokens: {e:?}");
        assert!(r <= MAX_RESPONSE_TOKENS, "response {r} tokens: {e:?}");
    }
    // The limits are tight (a trainer sizes rows with them), not arbitrary headroom.
    assert!(max_p + 4 > MAX_PROMPT_TOKENS, "max prompt {max_p}");
    assert!(max_r + 4 > MAX_RESPONSE_TOKENS, "max response {max_r}");
    // The evaluator's default generation length fits a response and its EOS.
    const { assert!(MAX_RESPONSE_TOKENS < 32) };
}

#[test]
fn sft_row_pads_with_eos() {
    let t = tok();
    let (ids, plen) = sft_row(t, "Is the dog red?", "The dog is blue. Answer: no", 12).unwrap();
    let p = encode_prompt(t, "Is the dog red?").unwrap();
    let r = encode_response(t, "The dog is blue. Answer: no").unwrap();
    assert_eq!(plen, p.len());
    assert_eq!(ids.len(), p.len() + 12);
    assert_eq!(&ids[..plen], p.as_slice());
    assert_eq!(&ids[plen..plen + r.len()], r.as_slice());
    assert!(ids[plen + r.len()..].iter().all(|&i| i == EOS_ID));
    // Decoding the generated part gives the response back.
    assert_eq!(
        decode_response(t, &ids[plen..]).unwrap(),
        "The dog is blue. Answer: no"
    );
    assert_eq!(truncate_at_eos(&[7, 8, EOS_ID, 9]), &[7, 8]);
    assert_eq!(truncate_at_eos(&[7, 8]), &[7, 8]);
    // A response with no room for EOS is an error, not a silently truncated row.
    let err = sft_row(t, "p", "The dog is blue. Answer: no", r.len()).unwrap_err();
    assert!(matches!(err, Error::TooLong { .. }), "{err}");
}

#[test]
fn suite_tokenizer_is_deterministic_and_reloads() {
    let a = to_json(tok()).unwrap();
    let b = to_json(&build_suite_tokenizer().unwrap()).unwrap();
    assert_eq!(a, b, "two builds differ");
    let dir = std::env::temp_dir().join(format!("dllm-tasks-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    tokenizer::save(tok(), &path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), a);
    let loaded = tokenizer::load(&path).unwrap();
    let s = "Which of these is a fruit? A. violin B. silver C. Neptune D. apple";
    assert_eq!(
        encode_prompt(&loaded, s).unwrap(),
        encode_prompt(tok(), s).unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let missing = tokenizer::load(dir.join("nope.json")).unwrap_err();
    assert!(
        matches!(missing, Error::Model(_))
            && missing.to_string().contains("no such tokenizer file"),
        "{missing}"
    );
}

#[test]
fn small_vocab_and_bad_sizes() {
    // A capped vocabulary still round-trips (words split into sub-words) and keeps the ids.
    let t = train_tokenizer(300, default_corpus(2_000)).unwrap();
    assert!(tokenizer_vocab_size(&t) <= 300);
    check_special_tokens(&t).unwrap();
    let s = "After school, the soup was cold, so Anna heated it in the";
    let ids = encode_response(&t, s).unwrap();
    assert!(ids.len() > encode_response(tok(), s).unwrap().len());
    assert_eq!(decode(&t, &ids).unwrap(), s);
    assert!(matches!(
        train_tokenizer(100, default_corpus(10)),
        Err(Error::InvalidArgument(_))
    ));
    // Loading a tokenizer with other special ids is refused.
    let bad: Tokenizer = to_json(tok())
        .unwrap()
        .replace("[MASK]", "[MSK]")
        .parse()
        .unwrap();
    let err = check_special_tokens(&bad).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SpecialToken {
                name: "[MASK]",
                expected: 5,
                found: None
            }
        ),
        "{err}"
    );
}
