//! Token fingerprints of every built-in decoder: for each strategy and its switches, on the shipped
//! LLaDA and Dream models, on the CPU and on the Hexagon device, a hash of what the decoder did —
//! the generated tokens, and every forward it asked for (window, rows, cache, refresh and re-score
//! counts) — over a few held-out questions.
//!
//! The table pins behaviour across refactors of the decoder: a change that moves any token or any
//! forward of any configuration changes its hash. A change that is *meant* to change a decoder
//! updates its rows here, in the same commit, and says why (`FINGERPRINT_PRINT=1` prints the
//! current table).

use dllm_decode::{
    Decide, DecodeParams, Decoder, DreamAlg, MbsdParams, Outcome, Remasking, Staged, Strategy,
};
use dllm_models::{Backend, LoadedModel};
use dllm_tasks::eval::questions;
use dllm_tasks::TaskKind;
use llada_tests::fixtures::{hexagon, shipped};

/// FNV-1a over 64-bit words.
fn fnv(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The hash of one generation: its tokens, counters and every forward of its trace.
fn digest(g: &Outcome) -> u64 {
    let mut w: Vec<u64> = g.generated().iter().map(|&t| t as u64).collect();
    w.extend([
        g.forwards as u64,
        g.steps as u64,
        g.tokens_decoded as u64,
        g.drafts_accepted as u64,
        g.revised as u64,
    ]);
    for t in &g.trace {
        w.extend([
            t.step as u64,
            t.start as u64,
            t.end as u64,
            t.rows as u64,
            t.cached as u64,
            // (Where the first revision design's CPU refresh counts were: 0 without it.)
            t.shadows as u64,
            0,
            t.lookahead as u64,
        ]);
    }
    fnv(w)
}

struct Case {
    name: &'static str,
    params: DecodeParams,
    oracle: bool,
}

fn case(name: &'static str, params: DecodeParams) -> Case {
    Case {
        name,
        params,
        oracle: false,
    }
}

fn short(strategy: Strategy) -> DecodeParams {
    DecodeParams {
        gen_length: 24,
        block_length: 8,
        steps: 24,
        strategy,
        ..Default::default()
    }
}

fn long(strategy: Strategy) -> DecodeParams {
    DecodeParams {
        gen_length: 128,
        block_length: 32,
        steps: 128,
        strategy,
        ..Default::default()
    }
}

/// mbsd's switches as they were when the table was recorded (lookahead on, no shown guess).
fn legacy() -> MbsdParams {
    MbsdParams {
        lookahead: true,
        show_guess: Some(false),
        // The bucket fit became per family (off on Dream) after these pins were taken.
        fit_bucket: Some(true),
        // So did the left trim.
        trim_left: false,
        ..MbsdParams::default()
    }
}

/// Multi-block speculative decoding with staged decisions at `visible` / `stable` and no
/// verification (the decoder before verification existed).
fn mbsd(p: fn(Strategy) -> DecodeParams, visible: f32, stable: f32) -> DecodeParams {
    DecodeParams {
        decide: Decide::Staged(Staged {
            visible,
            stable,
            no_adjacent: false,
            wait_left: 0,
            near_wait: None,
            verify: None,
        }),
        ..p(Strategy::Mbsd(legacy()))
    }
}

fn mbsd_with(
    p: fn(Strategy) -> DecodeParams,
    decide: Decide,
    f: impl Fn(&mut MbsdParams),
) -> DecodeParams {
    let mut m = legacy();
    f(&mut m);
    DecodeParams {
        decide,
        ..p(Strategy::Mbsd(m))
    }
}

fn short_cases() -> Vec<Case> {
    let p = short;
    vec![
        case("vanilla", p(Strategy::Vanilla)),
        case(
            "vanilla half steps",
            DecodeParams {
                steps: 12,
                ..p(Strategy::Vanilla)
            },
        ),
        case(
            "vanilla threshold 0.9",
            DecodeParams {
                decide: Decide::Threshold(0.9),
                ..p(Strategy::Vanilla)
            },
        ),
        case(
            "vanilla random t0.5",
            DecodeParams {
                remasking: Remasking::Random,
                temperature: 0.5,
                seed: 3,
                ..p(Strategy::Vanilla)
            },
        ),
        case(
            "vanilla cfg 1",
            DecodeParams {
                cfg_scale: 1.0,
                ..p(Strategy::Vanilla)
            },
        ),
        case(
            "vanilla eos switches",
            DecodeParams {
                logits_eos_inf: true,
                confidence_eos_eot_inf: true,
                early_stop: false,
                ..p(Strategy::Vanilla)
            },
        ),
        case(
            "prefix-cache",
            DecodeParams {
                steps: 12,
                ..p(Strategy::PrefixCache)
            },
        ),
        case(
            "dual-cache threshold 0.9",
            DecodeParams {
                decide: Decide::Threshold(0.9),
                ..p(Strategy::DualCache)
            },
        ),
        case("mbsd", mbsd(p, 0.9, 0.9)),
    ]
}

fn long_cases() -> Vec<Case> {
    let p = long;
    let staged = |v: f32| {
        Decide::Staged(Staged {
            visible: v,
            stable: 0.9,
            no_adjacent: false,
            wait_left: 0,
            near_wait: None,
            verify: None,
        })
    };
    let mut schedule = mbsd_with(p, Decide::Schedule, |_| {});
    schedule.steps = 32;
    let mut no_sls = DecodeParams {
        decide: Decide::Threshold(0.9),
        ..p(Strategy::DualCache)
    };
    no_sls.sls = false;
    vec![
        case(
            "vanilla threshold 0.9",
            DecodeParams {
                decide: Decide::Threshold(0.9),
                ..p(Strategy::Vanilla)
            },
        ),
        case(
            "dual-cache threshold 0.9",
            DecodeParams {
                decide: Decide::Threshold(0.9),
                ..p(Strategy::DualCache)
            },
        ),
        case(
            "prefix-cache threshold 0.8",
            DecodeParams {
                decide: Decide::Threshold(0.8),
                ..p(Strategy::PrefixCache)
            },
        ),
        case("dual-cache no sls", no_sls),
        case("mbsd", mbsd(p, 0.9, 0.9)),
        case("mbsd 0.7/0.9", mbsd(p, 0.7, 0.9)),
        case(
            "mbsd shown guess",
            mbsd_with(p, Decide::Threshold(0.9), |m| m.show_guess = Some(true)),
        ),
        case("mbsd defaults", mbsd_defaults(p, false)),
        case("mbsd before the span", before_span(p)),
        case(
            "mbsd no sts 0.9",
            mbsd_with(p, Decide::Threshold(0.9), |_| {}),
        ),
        case("mbsd schedule", schedule),
        case(
            "mbsd no sliding/lookahead",
            mbsd_with(p, staged(0.9), |m| {
                m.sliding = Some(false);
                m.lookahead = false;
            }),
        ),
        case(
            "mbsd draft context",
            mbsd_with(p, staged(0.9), |m| m.draft_context = Some(0.5)),
        ),
        case(
            "mbsd no bucket fit",
            mbsd_with(p, staged(0.9), |m| m.fit_bucket = Some(false)),
        ),
        Case {
            name: "mbsd oracle",
            params: mbsd(p, 0.7, 0.9),
            oracle: true,
        },
    ]
}

fn dream_cases() -> Vec<Case> {
    let p = short;
    let alg = |alg: DreamAlg| {
        let mut d = p(Strategy::Vanilla);
        d.dream.alg = alg;
        d
    };
    let mut origin = alg(DreamAlg::Origin);
    origin.temperature = 0.7;
    origin.seed = 5;
    let mut sampled = alg(DreamAlg::MaskgitPlus);
    sampled.dream.alg_temp = Some(0.5);
    sampled.temperature = 0.3;
    sampled.dream.top_p = Some(0.9);
    sampled.dream.top_k = Some(5);
    sampled.seed = 9;
    vec![
        case("dream maskgit_plus", alg(DreamAlg::MaskgitPlus)),
        case("dream topk_margin", alg(DreamAlg::TopkMargin)),
        case("dream entropy", alg(DreamAlg::Entropy)),
        case("dream origin sampled", origin),
        case("dream alg_temp sampled", sampled),
        case(
            "dual-cache threshold 0.9",
            DecodeParams {
                decide: Decide::Threshold(0.9),
                ..p(Strategy::DualCache)
            },
        ),
        case("mbsd", mbsd(p, 0.9, 0.9)),
    ]
}

fn dream_long_cases() -> Vec<Case> {
    let p = long;
    vec![
        case(
            "prefix-cache threshold 0.9",
            DecodeParams {
                decide: Decide::Threshold(0.9),
                ..p(Strategy::PrefixCache)
            },
        ),
        case("mbsd", mbsd(p, 0.9, 0.9)),
        case("mbsd 0.7/0.9", mbsd(p, 0.7, 0.9)),
        case("mbsd defaults", mbsd_defaults(p, true)),
        case("mbsd defaults, no guess agreement", {
            let mut q = mbsd_defaults(p, true);
            if let Strategy::Mbsd(m) = &mut q.strategy {
                m.guess_agreement = false;
            }
            q
        }),
    ]
}

/// The decoder's defaults for a model with (`shift_logits`: Dream) or without shifted logits, as
/// the tools run them given no decision flag: on LLaDA the span, so one block.
fn mbsd_defaults(p: fn(Strategy) -> DecodeParams, shift_logits: bool) -> DecodeParams {
    let s = Strategy::Mbsd(MbsdParams::for_family(shift_logits));
    let q = DecodeParams {
        decide: s.default_decide(shift_logits),
        ..p(s)
    };
    match q.one_block() {
        true => DecodeParams {
            block_length: q.gen_length,
            ..q
        },
        false => q,
    }
}

/// LLaDA's default before the span: blocks, the near wait reaching 2 positions.
fn before_span(p: fn(Strategy) -> DecodeParams) -> DecodeParams {
    let staged = Staged {
        near_wait: Some(dllm_decode::NearWait {
            within: 2,
            ..dllm_decode::params::DEFAULT_NEAR_WAIT
        }),
        ..Staged::default()
    };
    DecodeParams {
        decide: Decide::Staged(staged),
        ..p(Strategy::Mbsd(MbsdParams::default()))
    }
}

/// The digest of every case over the first `n` held-out questions of `kinds`.
fn run(m: &mut LoadedModel, kinds: &[TaskKind], n: usize, cases: &[Case]) -> Vec<(String, u64)> {
    let tok = m
        .tokenizer
        .clone()
        .expect("shipped models carry a tokenizer");
    let qs = questions(kinds, Some(n));
    cases
        .iter()
        .map(|c| {
            let mut words = Vec::new();
            for q in &qs {
                let prompt = tok.encode_prompt(&q.prompt, false).unwrap();
                let mut d = Decoder::new(c.params);
                if c.oracle {
                    let mut r =
                        dllm_tasks::tokenizer::encode_response(tok.inner(), &q.response).unwrap();
                    r.resize(c.params.gen_length, m.model.info().special.eos);
                    d = d.oracle_revision(r);
                }
                let g = d
                    .run(&mut m.model, &prompt, &mut ())
                    .unwrap_or_else(|e| panic!("{}: {e}", c.name));
                words.push(digest(&g));
            }
            (c.name.to_string(), fnv(words))
        })
        .collect()
}

fn check(label: &str, got: &[(String, u64)], want: &[(&str, u64)]) {
    if std::env::var_os("FINGERPRINT_PRINT").is_some() {
        eprintln!("// {label}");
        for (n, h) in got {
            eprintln!("(\"{n}\", 0x{h:016x}),");
        }
    }
    let got: Vec<(&str, u64)> = got.iter().map(|(n, h)| (n.as_str(), *h)).collect();
    assert_eq!(got, want, "{label}: a decoder's tokens or forwards changed");
}

use dllm_models::DiffusionLm;

#[test]
fn llada_decoders_keep_their_fingerprints() {
    let mut m = shipped("tiny-llada", Backend::Cpu);
    let got = run(
        &mut m,
        &[TaskKind::Math, TaskKind::Completion],
        3,
        &short_cases(),
    );
    check("tiny-llada cpu", &got, TINY_LLADA_CPU);
    let mut m = shipped("tiny-llada-long", Backend::Cpu);
    let got = run(&mut m, &[TaskKind::LongMath], 3, &long_cases());
    check("tiny-llada-long cpu", &got, TINY_LLADA_LONG_CPU);
}

#[test]
fn dream_decoders_keep_their_fingerprints() {
    let mut m = shipped("tiny-dream", Backend::Cpu);
    let got = run(
        &mut m,
        &[TaskKind::Math, TaskKind::Completion],
        3,
        &dream_cases(),
    );
    check("tiny-dream cpu", &got, TINY_DREAM_CPU);
    let mut m = shipped("tiny-dream-long", Backend::Cpu);
    let got = run(&mut m, &[TaskKind::LongMath], 2, &dream_long_cases());
    check("tiny-dream-long cpu", &got, TINY_DREAM_LONG_CPU);
}

#[test]
fn decoders_on_the_hexagon_device_keep_their_fingerprints() {
    let cases: Vec<Case> = long_cases()
        .into_iter()
        .filter(|c| {
            [
                "dual-cache threshold 0.9",
                "mbsd",
                "mbsd 0.7/0.9",
                "mbsd shown guess",
                "mbsd defaults",
            ]
            .contains(&c.name)
        })
        .collect();
    let mut m = shipped("tiny-llada-long", hexagon(256 << 20));
    let got = run(&mut m, &[TaskKind::LongMath], 2, &cases);
    check("tiny-llada-long hexagon", &got, TINY_LLADA_LONG_HEX);
    let mut m = shipped("tiny-dream", hexagon(256 << 20));
    let got = run(&mut m, &[TaskKind::Math], 2, &dream_cases()[..1]);
    check("tiny-dream hexagon", &got, TINY_DREAM_HEX);
    let mut m = shipped("tiny-dream-long", hexagon(256 << 20));
    let got = run(&mut m, &[TaskKind::LongMath], 2, &dream_long_cases()[3..]);
    check("tiny-dream-long hexagon", &got, TINY_DREAM_LONG_HEX);
}

const TINY_LLADA_CPU: &[(&str, u64)] = &[
    ("vanilla", 0xb7dea4170647cc76),
    ("vanilla half steps", 0xfdaca8ca8a36a694),
    ("vanilla threshold 0.9", 0x0c828b5692141b1d),
    ("vanilla random t0.5", 0xb7dea4170647cc76),
    ("vanilla cfg 1", 0xb7dea4170647cc76),
    ("vanilla eos switches", 0x3d78f67428305c23),
    ("prefix-cache", 0x4222cc42ea7d4865),
    ("dual-cache threshold 0.9", 0x0c828b5692141b1d),
    ("mbsd", 0x1cfc858958c9fb84),
];
const TINY_LLADA_LONG_CPU: &[(&str, u64)] = &[
    ("vanilla threshold 0.9", 0x9220769b39ecf104),
    ("dual-cache threshold 0.9", 0x9c42c521c1cb2a99),
    ("prefix-cache threshold 0.8", 0x0bf548a958005c71),
    ("dual-cache no sls", 0x9dbea6403562b1a1),
    ("mbsd", 0x5fc6f3957d0a7647),
    ("mbsd 0.7/0.9", 0xa625c096f171bab2),
    // The shown guess with the table's legacy switches (lookahead on) at threshold 0.9.
    ("mbsd shown guess", 0x1ad249830e5228fc),
    // The decoder's defaults (on LLaDA: one block with a window of 16, the shown guess and its
    // rows fitted in the bucket, the near wait reaching 8, theta 0.9 / 0.9, no lookahead).
    ("mbsd defaults", 0xab8ded6234941b78),
    // LLaDA's default before the span (blocks of 32, the near wait reaching 2): the previous
    // "mbsd defaults" fingerprint.
    ("mbsd before the span", 0x848f829fb0f0e893),
    ("mbsd no sts 0.9", 0x5fc6f3957d0a7647),
    ("mbsd schedule", 0xc034323b67d6dc1b),
    ("mbsd no sliding/lookahead", 0x1e01c37a4a2804dc),
    ("mbsd draft context", 0x73af59a9cd1c4aa7),
    ("mbsd no bucket fit", 0x3c2c3d237c1a3af5),
    ("mbsd oracle", 0xa625c096f171bab2),
];
const TINY_DREAM_CPU: &[(&str, u64)] = &[
    ("dream maskgit_plus", 0x518a783f6040bf2d),
    ("dream topk_margin", 0x518a783f6040bf2d),
    ("dream entropy", 0x518a783f6040bf2d),
    ("dream origin sampled", 0xa2a9868366990e72),
    ("dream alg_temp sampled", 0x518a783f6040bf2d),
    ("dual-cache threshold 0.9", 0x0c828b5692141b1d),
    // Dream's mbsd refreshes at each block start instead of sliding (the family's window); the
    // bucket fit counts the row before a shifted window (2026-12-06).
    ("mbsd", 0xecce8974e80f3475),
];
const TINY_DREAM_LONG_CPU: &[(&str, u64)] = &[
    ("prefix-cache threshold 0.9", 0x0024569763108b17),
    // The bucket fit counts the row before a shifted window (2026-12-06).
    ("mbsd", 0x9da5ead439706f04),
    ("mbsd 0.7/0.9", 0x993a4ec7256a2498),
    // The decoder's defaults on Dream: the refresh window, the threshold rule at 0.9, no bucket
    // fit, the left trim, the shown guess with guess agreement (2026-12-07).
    ("mbsd defaults", 0xf8301c1e128def66),
    // The defaults before guess agreement: the previous "mbsd defaults" fingerprint.
    ("mbsd defaults, no guess agreement", 0x221738d41b34539d),
];
const TINY_DREAM_LONG_HEX: &[(&str, u64)] = &[
    ("mbsd defaults", 0xf8301c1e128def66),
    ("mbsd defaults, no guess agreement", 0x221738d41b34539d),
];
const TINY_LLADA_LONG_HEX: &[(&str, u64)] = &[
    ("dual-cache threshold 0.9", 0x4fc242637f657d87),
    ("mbsd", 0xdb62278ae82d9716),
    ("mbsd 0.7/0.9", 0x896e7d31284ef832),
    ("mbsd shown guess", 0xf4d7950b1b551a77),
    ("mbsd defaults", 0x28bef2cf81769b88),
];
const TINY_DREAM_HEX: &[(&str, u64)] = &[("dream maskgit_plus", 0xb3ba12e2d80c95db)];
