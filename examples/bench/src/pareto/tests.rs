//! Tests of the configurations (`specs`), their labels and `--only`.

use super::*;

fn base() -> DecodeParams {
    DecodeParams {
        gen_length: 128,
        block_length: 32,
        steps: 128,
        ..Default::default()
    }
}

#[test]
fn the_frontier_keeps_only_unbeaten_points_and_never_an_oracle() {
    // (cost, accuracy, oracle)
    let pts = [
        (10.0, 0.70, false), // 0: on (most accurate of the decoders)
        (5.0, 0.60, false),  // 1: on
        (6.0, 0.55, false),  // 2: beaten by 1
        (1.0, 0.20, false),  // 3: on (cheapest)
        (1.0, 0.99, true),   // 4: oracle, never on, beats nobody
        (5.0, 0.60, false),  // 5: ties 1: both on
    ];
    assert_eq!(frontier(&pts), vec![3, 1, 5, 0]);
}

#[test]
fn the_configurations_are_labelled_by_what_they_run_and_run_once() {
    let s = specs(&base(), false, false);
    let labels: Vec<&str> = s.rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(&labels[..2], &[VANILLA, VANILLA_T09]);
    for l in [
        "vanilla, threshold 0.8",
        "dual-cache, threshold 0.7",
        "prefix-cache",
        DEFAULTS,
        "mbsd, no selective logits (--no-sls)",
        "mbsd, no STS, threshold 0.9",
        "mbsd, theta 0.7 / 0.9, verify tau 0.9, hold, no joint check, adjacent apart",
        "mbsd, theta 0.7 / 0.9, verify tau 0.9, hold, joint check, adjacent apart",
        "mbsd, theta 0.8 / 0.95, no verification",
        "mbsd, theta 0.7 / 0.9, verify tau 0.9, hold, no joint check",
        "mbsd, theta 0.6 / 0.9, no verification, adjacent apart",
        "mbsd, theta 0.5 / 0.9, no verification, oracle revision",
    ] {
        assert!(labels.contains(&l), "{l} missing from {labels:?}");
    }
    // A label says what runs.
    let find = |l: &str| &s.rows[labels.iter().position(|x| *x == l).unwrap()];
    let st = find("mbsd, theta 0.7 / 0.9, verify tau 0.9, hold, no joint check, adjacent apart")
        .params
        .decide
        .staged()
        .unwrap();
    assert_eq!((st.visible, st.stable, st.no_adjacent), (0.7, 0.9, true));
    let v = st.verify.unwrap();
    assert!(v.tau_back == 0.9 && v.hold_on_remask && !v.suspect_dependents);
    assert_eq!(v.joint, Joint::Off);
    let joint = find("mbsd, theta 0.7 / 0.9, verify tau 0.9, hold, joint check, adjacent apart");
    let jv = joint.params.decide.staged().unwrap().verify.unwrap();
    assert!(matches!(jv.joint, Joint::On(_)));
    let plain = find("mbsd, theta 0.7 / 0.9, no verification");
    let ps = plain.params.decide.staged().unwrap();
    assert!(!ps.no_adjacent && ps.verify.is_none());
    assert!(!find("mbsd, no selective logits (--no-sls)").params.sls);
    // Every configuration runs once: equal decodings are listed, not run twice.
    for (i, a) in s.rows.iter().enumerate() {
        for b in &s.rows[i + 1..] {
            assert!(
                a.params != b.params || a.oracle != b.oracle,
                "{} = {}",
                a.label,
                b.label
            );
        }
    }
    // The defaults' own grid point (when the grid has it) is run once, as the defaults.
    let defaults_point = staged_label(&Staged::default());
    if s.same.iter().any(|x| x.0 == defaults_point) {
        assert!(s.same.contains(&(defaults_point, DEFAULTS.to_string())));
    }
    assert!(
        (38..=88).contains(&s.rows.len()),
        "{} configurations",
        s.rows.len()
    );
    // Every decoder belongs to one family; oracle rows to none.
    for r in &s.rows {
        assert_eq!(Family::of(r).is_none(), r.oracle, "{}", r.label);
    }
    assert_eq!(
        Family::of(find("mbsd, no STS, threshold 0.9")),
        Some(Family::MbsdNoVerify)
    );
    assert_eq!(Family::of(find(DEFAULTS)), Some(Family::MbsdVerify));
    // LLaDA's defaults are one block with a window of 16 and the near wait reaching 8; the
    // default before the span keeps the bench's blocks and the near wait's 2.
    let d = find(DEFAULTS).params;
    let ds = d.decide.staged().unwrap();
    assert_eq!(
        (d.block_length, d.strategy.mbsd().unwrap().span),
        (d.gen_length, Some(16))
    );
    assert_eq!(ds.near_wait.unwrap().within, 8);
    let before = find("mbsd, the default before the span (--no-span --wait-near 2)").params;
    assert_eq!(
        (before.block_length, before.strategy.mbsd().unwrap().span),
        (32, None)
    );
    assert_eq!(before.decide.staged().unwrap().near_wait.unwrap().within, 2);
    // Every row with a span is one block; the rows without one keep the bench's blocks.
    for r in &s.rows {
        let span = r.params.strategy.mbsd().and_then(|m| m.span);
        let blocks = if span.is_some() { 128 } else { 32 };
        assert_eq!(r.params.block_length, blocks, "{}", r.label);
    }
}

#[test]
fn a_dream_model_gets_its_family_defaults_spelled_out() {
    let s = specs(&base(), false, true);
    let find = |l: &str| s.rows.iter().find(|r| r.label == l).unwrap();
    let d = find(DEFAULTS).params;
    assert_eq!(d.decide, Decide::Threshold(0.9));
    let m = d.strategy.mbsd().unwrap();
    assert_eq!(
        (m.sliding, m.refresh, m.show_guess, m.fit_bucket),
        (Some(false), Some(true), Some(true), Some(false))
    );
    // Another spelling of the same decoder runs once, as the defaults.
    assert!(s.same.contains(&(
        "mbsd, no sliding, refresh (--refresh), threshold 0.9, no bucket fit".to_string(),
        DEFAULTS.to_string()
    )));
    // Its mechanisms switched off or on, each a configuration.
    for l in [
        "mbsd, no shown guess (--no-show-guess)",
        "mbsd, staged decisions (--sts --show-guess)",
        "mbsd, with bucket fit (--bucket-fit)",
        "mbsd, staged decisions, bucket fit, no shown guess (--sts --bucket-fit --no-show-guess \
         --theta-stable 0.95 --wait-near 0 --no-span)",
    ] {
        assert!(s.rows.iter().any(|r| r.label == l), "{l} missing");
    }
    // Dream's vanilla is its own algorithm, without a threshold.
    assert!(!s
        .rows
        .iter()
        .any(|r| r.label.starts_with("vanilla, threshold")));
    // On LLaDA the last one is the default before the shown guess and the near wait: a row
    // of its own, and the default before the near wait is one too.
    let llada = specs(&base(), false, false);
    for l in [
        "mbsd, staged decisions, bucket fit, no shown guess (--sts --bucket-fit --no-show-guess \
         --theta-stable 0.95 --wait-near 0 --no-span)",
        "mbsd, the default before the near wait (--no-span --theta-stable 0.95 --wait-near 0)",
    ] {
        assert!(llada.rows.iter().any(|r| r.label == l), "{l} missing");
    }
    assert!(!s
        .rows
        .iter()
        .any(|r| r.label.contains("before the near wait")));
}

#[test]
fn only_picks_an_exact_label_or_every_label_containing_the_pattern() {
    let s = specs(&base(), false, false).rows;
    let pick = |o: &[&str]| -> Vec<String> {
        select(&s, &o.iter().map(|x| x.to_string()).collect::<Vec<_>>())
            .into_iter()
            .map(|r| r.label)
            .collect()
    };
    assert_eq!(pick(&["vanilla"]), vec![VANILLA]);
    assert_eq!(pick(&["vanilla, threshold 0.9"]), vec![VANILLA_T09]);
    assert_eq!(pick(&["vanilla, threshold"]).len(), 3);
    assert_eq!(
        pick(&["prefix-cache", "mbsd (defaults)"]),
        vec!["prefix-cache", DEFAULTS]
    );
    assert!(pick(&["no such row"]).is_empty());
    assert_eq!(pick(&[]).len(), s.len());
}
