//! `dllm-models` against the independent `f64` reference ([`llada_tests::reference`]) on tiny
//! random LLaDA and Dream checkpoints written in the HF layout and loaded through the public API.
//!
//! Metric everywhere: `rel = max |model - reference| / max |reference|` over all logits.
//! Tolerances (measured values in parentheses): f32 compute 1e-4 (3-4e-7, also for bf16/f16
//! storage, which the reference reads bit-identically); f16 compute 1e-2 (1.2-1.3e-3); bf16
//! compute 4e-2 (7.6-8.1e-3: 8 mantissa bits, compounded over two layers and a 256-wide head).
//! The half-precision numbers were measured on the differentiable path; the fused path has to meet
//! the same bounds.

use candle_core::DType;
use dllm_models::synthetic::{tiny_dream, tiny_llada};
use dllm_models::{DiffusionLm, LoadOptions, OpMode, Rows, TransformerConfig};
use llada_tests::fixtures::{
    canvas, full_logits, ids, load_default, load_path, rel_err, rows_of, write_model, TempDir,
};
use llada_tests::reference::{Family, Reference};

const F32_TOL: f64 = 1e-4;
const F16_TOL: f64 = 1e-2;
const BF16_TOL: f64 = 4e-2;
const LEN: usize = 40;

fn cfgs() -> [TransformerConfig; 2] {
    [tiny_llada(), tiny_dream()]
}

/// Write, load through `ModelSource::parse` + `load`, and compare the full canvas.
fn check(
    cfg: &TransformerConfig,
    store: DType,
    shards: usize,
    compute: DType,
    mode: OpMode,
    tol: f64,
) -> f64 {
    let dir = TempDir::new("ref").unwrap();
    write_model(dir.path(), cfg, 11, store, shards).unwrap();
    let reference = Reference::load(dir.path()).unwrap();
    let opts = LoadOptions {
        dtype: compute,
        mode,
        ..LoadOptions::default()
    };
    let mut m = load_path(dir.path(), &opts).unwrap().model;
    assert_eq!(m.info().dtype, compute);
    let x = ids(LEN, 250, cfg.special.mask, 1);
    let got = full_logits(&mut m, &x).unwrap();
    let want = reference.forward(&x).unwrap();
    let e = rel_err(&got, &want);
    println!(
        "{:?} stored {store:?} x{shards} computed {compute:?} {mode:?}: rel {e:.3e}",
        cfg.arch
    );
    assert!(
        e <= tol,
        "{:?} stored {store:?} in {shards} shard(s), computed in {compute:?} ({mode:?}): rel error {e:.3e} > {tol:.0e}",
        cfg.arch
    );
    e
}

#[test]
fn f32_single_file_matches_reference() {
    for cfg in cfgs() {
        check(&cfg, DType::F32, 1, DType::F32, OpMode::Fused, F32_TOL);
    }
}

#[test]
fn sharded_checkpoint_matches_reference() {
    for cfg in cfgs() {
        let dir = TempDir::new("shards").unwrap();
        write_model(dir.path(), &cfg, 11, DType::F32, 3).unwrap();
        // The layout really is sharded: an index and three files, no single file.
        assert!(dir.join("model.safetensors.index.json").is_file());
        assert!(!dir.join("model.safetensors").exists());
        for s in 1..=3 {
            assert!(dir
                .join(&format!("model-{s:05}-of-00003.safetensors"))
                .is_file());
        }
        check(&cfg, DType::F32, 3, DType::F32, OpMode::Fused, F32_TOL);
    }
}

#[test]
fn bf16_and_f16_storage_computed_in_f32() {
    // The reference reads the same rounded values from disk, so only compute error remains.
    for cfg in cfgs() {
        for store in [DType::BF16, DType::F16] {
            check(&cfg, store, 1, DType::F32, OpMode::Fused, F32_TOL);
        }
    }
}

#[test]
fn differentiable_mode_matches_reference() {
    // The training path (rms_norm_slow, explicit rotate_half, softmax attention) is a second
    // implementation of the same forward.
    for cfg in cfgs() {
        check(
            &cfg,
            DType::F32,
            1,
            DType::F32,
            OpMode::Differentiable,
            F32_TOL,
        );
    }
}

fn half_precision(mode: OpMode) {
    for cfg in cfgs() {
        check(&cfg, DType::F32, 1, DType::F16, mode, F16_TOL);
        check(&cfg, DType::BF16, 2, DType::BF16, mode, BF16_TOL);
    }
}

// The inference path in f16/bf16. candle's CPU `flash_attn::<T>` always returns f32, so the
// attention output must be cast back to the compute dtype before `o_proj`.
#[test]
fn half_precision_compute_fused() {
    half_precision(OpMode::Fused);
}

#[test]
fn half_precision_compute_differentiable() {
    half_precision(OpMode::Differentiable);
}

#[test]
fn tied_embeddings_use_the_embedding_as_head() {
    for mut cfg in cfgs() {
        cfg.tie_word_embeddings = true;
        let dir = TempDir::new("tied").unwrap();
        write_model(dir.path(), &cfg, 5, DType::F32, 1).unwrap();
        let reference = Reference::load(dir.path()).unwrap();
        assert!(reference.config().tied, "config.json must declare tying");
        let mut m = load_default(dir.path()).unwrap().model;
        let x = ids(24, 250, cfg.special.mask, 2);
        let e = rel_err(
            &full_logits(&mut m, &x).unwrap(),
            &reference.forward(&x).unwrap(),
        );
        assert!(e <= F32_TOL, "{:?} tied: rel {e:.3e}", cfg.arch);
    }
}

#[test]
fn dream_logits_are_shifted_by_one() {
    let dir = TempDir::new("shift").unwrap();
    write_model(dir.path(), &tiny_dream(), 3, DType::F32, 1).unwrap();
    let reference = Reference::load(dir.path()).unwrap();
    assert_eq!(reference.config().family, Family::Dream);
    let mut m = load_default(dir.path()).unwrap().model;
    assert!(m.info().shift_logits);
    let x = ids(LEN, 250, 255, 3);
    let got = full_logits(&mut m, &x).unwrap();
    let raw = reference.forward_raw(&x).unwrap();
    // Position 0 keeps its own raw output; position i > 0 gets the raw output of i - 1.
    assert!(rel_err(&got[..1], &raw[..1]) <= F32_TOL);
    let e = rel_err(&got[1..], &raw[..LEN - 1]);
    assert!(e <= F32_TOL, "shifted rows: rel {e:.3e}");
    // And the unshifted alignment is clearly wrong, so the check above has teeth.
    let unshifted = rel_err(&got[1..], &raw[1..]);
    assert!(
        unshifted > 1e-2,
        "unshifted alignment also matches ({unshifted:.3e})"
    );
}

#[test]
fn windowed_forwards_match_reference_rows() {
    for cfg in cfgs() {
        let dir = TempDir::new("window").unwrap();
        write_model(dir.path(), &cfg, 13, DType::F32, 1).unwrap();
        let reference = Reference::load(dir.path()).unwrap();
        let mut m = load_default(dir.path()).unwrap().model;
        let x = ids(LEN, 250, cfg.special.mask, 4);
        let c = canvas(&x);
        let want = reference.forward(&x).unwrap();
        let pick =
            |rows: &[usize]| -> Vec<Vec<f64>> { rows.iter().map(|&p| want[p].clone()).collect() };

        // Empty cache, window 0..e: the model sees only the first e tokens.
        let e = 17;
        let asked = [16, 0, 9, 1];
        let got = rows_of(&m.forward(&c, 0..e, Rows::Positions(&asked)).unwrap()).unwrap();
        let short = reference.forward(&x[..e]).unwrap();
        let want_short: Vec<Vec<f64>> = asked.iter().map(|&p| short[p].clone()).collect();
        let err = rel_err(&got, &want_short);
        assert!(
            err <= F32_TOL,
            "{:?} window 0..{e}: rel {err:.3e}",
            cfg.arch
        );

        // Prefix cache: commit [0, 12) of a full forward, then forward [12, L) for some rows.
        m.clear_cache().unwrap();
        m.forward_full(&c, Rows::None).unwrap();
        m.commit(0..12).unwrap();
        let asked = [12, 39, 20, 13];
        let got = rows_of(&m.forward(&c, 12..LEN, Rows::Positions(&asked)).unwrap()).unwrap();
        let err = rel_err(&got, &pick(&asked));
        assert!(
            err <= F32_TOL,
            "{:?} prefix-cache rows: rel {err:.3e}",
            cfg.arch
        );

        // Dual cache: everything cached, an inner window [20, 28).
        m.clear_cache().unwrap();
        m.forward_full(&c, Rows::None).unwrap();
        m.commit(0..LEN).unwrap();
        let asked = [27, 20, 21];
        let got = rows_of(&m.forward(&c, 20..28, Rows::Positions(&asked)).unwrap()).unwrap();
        let err = rel_err(&got, &pick(&asked));
        assert!(
            err <= F32_TOL,
            "{:?} dual-cache rows: rel {err:.3e}",
            cfg.arch
        );

        // Rows::All of an inner window, in window order.
        let got = rows_of(&m.forward(&c, 30..LEN, Rows::All).unwrap()).unwrap();
        let err = rel_err(&got, &want[30..LEN]);
        assert!(
            err <= F32_TOL,
            "{:?} dual-cache all rows: rel {err:.3e}",
            cfg.arch
        );
    }
}

#[test]
fn refresh_logits_match_reference() {
    for cfg in cfgs() {
        let dir = TempDir::new("refresh").unwrap();
        write_model(dir.path(), &cfg, 15, DType::F32, 1).unwrap();
        let reference = Reference::load(dir.path()).unwrap();
        let mut m = load_default(dir.path()).unwrap().model;
        let old = ids(LEN, 250, cfg.special.mask, 5);
        m.forward_full(&canvas(&old), Rows::None).unwrap();
        m.commit(0..LEN).unwrap();

        // Same canvas, sparse refresh: the logits are those of the full forward.
        let want = reference.forward(&old).unwrap();
        let asked = [25, 10];
        let r = m
            .compute_refresh(&canvas(&old), &[3, 10, 11, 25], Some(&asked))
            .unwrap();
        let got = rows_of(r.logits.as_ref().unwrap()).unwrap();
        let want_rows: Vec<Vec<f64>> = asked.iter().map(|&p| want[p].clone()).collect();
        let err = rel_err(&got, &want_rows);
        assert!(
            err <= F32_TOL,
            "{:?} sparse refresh: rel {err:.3e}",
            cfg.arch
        );

        // Changed canvas, every position refreshed: K/V are replaced layer by layer everywhere,
        // which is exactly a full forward of the new canvas.
        let mut new = old.clone();
        for p in [2, 9, 10, 33] {
            new[p] = (new[p] + 101) % 250;
        }
        let all: Vec<usize> = (0..LEN).collect();
        let asked = [9, 34, 0];
        let got = rows_of(
            &m.refresh(&canvas(&new), &all, Some(&asked))
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        let want = reference.forward(&new).unwrap();
        let want_rows: Vec<Vec<f64>> = asked.iter().map(|&p| want[p].clone()).collect();
        let err = rel_err(&got, &want_rows);
        assert!(
            err <= F32_TOL,
            "{:?} full refresh on a new canvas: rel {err:.3e}",
            cfg.arch
        );
        // The merged cache now serves a dual-cache window of the new canvas.
        let got = rows_of(&m.forward(&canvas(&new), 8..12, Rows::All).unwrap()).unwrap();
        let err = rel_err(&got, &want[8..12]);
        assert!(
            err <= F32_TOL,
            "{:?} window after refresh: rel {err:.3e}",
            cfg.arch
        );
    }
}

#[test]
fn batched_forward_matches_reference_per_row() {
    for cfg in cfgs() {
        let dir = TempDir::new("batch").unwrap();
        write_model(dir.path(), &cfg, 19, DType::F32, 1).unwrap();
        let reference = Reference::load(dir.path()).unwrap();
        let mut m = load_default(dir.path()).unwrap().model;
        let a = ids(24, 250, cfg.special.mask, 7);
        let b = ids(24, 250, cfg.special.mask, 8);
        let both: Vec<u32> = a.iter().chain(&b).copied().collect();
        let t = candle_core::Tensor::from_vec(both, (2, 24), &candle_core::Device::Cpu).unwrap();
        let out = m.forward_full(&t, Rows::All).unwrap();
        assert_eq!(out.dims(), &[2, 24, 256]);
        for (i, x) in [a, b].iter().enumerate() {
            let got = rows_of(&out.narrow(0, i, 1).unwrap()).unwrap();
            let err = rel_err(&got, &reference.forward(x).unwrap());
            assert!(
                err <= F32_TOL,
                "{:?} batch item {i}: rel {err:.3e}",
                cfg.arch
            );
        }
    }
}

#[test]
fn checkpoints_hold_exactly_the_model_card_names() {
    use llada_tests::checkpoint::Checkpoint;
    use llada_tests::reference::{Names, RefConfig};
    for mut cfg in cfgs() {
        for tied in [false, true] {
            cfg.tie_word_embeddings = tied;
            let dir = TempDir::new("names").unwrap();
            write_model(dir.path(), &cfg, 1, DType::F32, 2).unwrap();
            let rcfg = RefConfig::read(dir.path()).unwrap();
            let ck = Checkpoint::read_dir(dir.path()).unwrap();
            let elems: usize = ck.tensors.values().map(|t| t.data.len()).sum();
            let m = load_default(dir.path()).unwrap().model;
            assert_eq!(m.info().num_params, elems, "{:?} tied={tied}", cfg.arch);
            let mut have: Vec<String> = ck.tensors.into_keys().collect();
            let mut want = Names::all(&rcfg);
            have.sort();
            want.sort();
            assert_eq!(have, want, "{:?} tied={tied}", cfg.arch);
        }
    }
}
