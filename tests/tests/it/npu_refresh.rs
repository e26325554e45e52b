//! The sparse refresh of a model whose stack the NPU holds runs on the CPU over the NPU module's
//! own packed weights (paper §3.3: the CPU path "reuses the same HMX-specialized weights"):
//! kernels-cpu reads the fp16 HMX tiles and the Q4_0 tiles in place, fused q/k/v and gate/up as
//! the NPU runs them, with no second copy of the matrices. Checked here: the CPU layers own no
//! matrix bytes (they share the NPU's), and refresh logits computed through those tiles match an
//! f64 forward over the checkpoint's row-major weights.

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use candle_hexagon::{HexagonConfig, HexagonDevice};
use dllm_models::synthetic::{tiny_dream, tiny_llada};
use dllm_models::{
    Backend, DiffusionLm, DiffusionTransformer, LoadOptions, Rows, TransformerConfig,
};
use llada_tests::fixtures::{
    canvas, hexagon, ids, load_path, rel_err, rows_of, write_model, TempDir,
};
use llada_tests::gguf_fixture::write_gguf;
use llada_tests::reference::{RefConfig, Reference};

const LEN: usize = 48;

fn load(path: &std::path::Path, backend: Backend) -> DiffusionTransformer {
    let opts = LoadOptions {
        backend,
        ..Default::default()
    };
    load_path(path, &opts).unwrap().model
}

/// Refresh logits of `m` (the canvas cached and committed, positions refreshed, rows asked for)
/// against the f64 reference, as a relative error.
fn refresh_error(
    m: &mut DiffusionTransformer,
    reference: &Reference,
    cfg: &TransformerConfig,
) -> f64 {
    let x = ids(LEN, cfg.vocab_size as u32 - 3, cfg.special.mask, 7);
    m.forward_full(&canvas(&x), Rows::None).unwrap();
    m.commit(0..LEN).unwrap();
    let asked = [30, 9, 41];
    let r = m
        .compute_refresh(&canvas(&x), &[3, 9, 10, 30, 41], Some(&asked))
        .unwrap();
    let got = rows_of(r.logits.as_ref().unwrap()).unwrap();
    let want = reference.forward(&x).unwrap();
    let want: Vec<Vec<f64>> = asked.iter().map(|&p| want[p].clone()).collect();
    rel_err(&got, &want)
}

/// The model runs its blocks on the NPU and its CPU layers read the NPU's bytes only.
fn assert_shares_the_npu_weights(hex: &DiffusionTransformer, cpu: &DiffusionTransformer) {
    assert!(hex.runs_blocks_on_npu());
    let (h, c) = (
        hex.weights().cpu_linear_bytes(),
        cpu.weights().cpu_linear_bytes(),
    );
    assert_eq!(
        h.owned, 0,
        "the NPU model's CPU layers hold their own copy: {h:?}"
    );
    assert!(h.shared_with_npu > 0, "{h:?}");
    // The CPU model packs the same matrices in the same tile layouts (dims are multiples of 32):
    // the bytes the refresh reads are exactly as many as a CPU model owns.
    assert_eq!(c.shared_with_npu, 0, "{c:?}");
    assert_eq!(
        h.shared_with_npu, c.owned,
        "NPU-shared {h:?} vs CPU-owned {c:?}"
    );
}

#[test]
fn refresh_over_the_npus_fp16_tiles_matches_the_row_major_reference() {
    // LLaDA (MHA, no biases) and Dream (GQA, q/k/v biases fused into the q/k/v tiles' bias,
    // shifted logits), f16 checkpoints: the fp16 tiles hold the checkpoint's values exactly.
    for cfg in [tiny_llada(), tiny_dream()] {
        let dir = TempDir::new("npu-refresh-f16").unwrap();
        write_model(dir.path(), &cfg, 21, DType::F16, 1).unwrap();
        let reference = Reference::load(dir.path()).unwrap();
        let mut cpu = load(dir.path(), Backend::Cpu);
        let mut hex = load(dir.path(), hexagon(64 << 20));
        assert_shares_the_npu_weights(&hex, &cpu);
        let (e_cpu, e_hex) = (
            refresh_error(&mut cpu, &reference, &cfg),
            refresh_error(&mut hex, &reference, &cfg),
        );
        eprintln!(
            "{:?} f16: refresh logits vs f64 reference: CPU model {e_cpu:.2e}, \
             NPU model's CPU path (fp16 tiles, fp16 KV) {e_hex:.2e}",
            cfg.arch
        );
        // The NPU path's cached K/V are fp16 (the CPU model's f32): that rounding is the error.
        assert!(e_hex <= 2e-3, "{:?}: {e_hex:.3e}", cfg.arch);
    }
}

#[test]
fn refresh_over_the_npus_q4_0_tiles_matches_the_dequantized_reference() {
    let cfg = tiny_llada();
    let dir = TempDir::new("npu-refresh-q4").unwrap();
    write_model(dir.path(), &cfg, 22, DType::F32, 1).unwrap();
    let out = TempDir::new("npu-refresh-q4-out").unwrap();
    let path = out.join("tiny-q4_0.gguf");
    let fixture = write_gguf(dir.path(), &path, GgmlDType::Q4_0).unwrap();
    // An f64 forward over exactly the values the file stores (row-major, dequantized).
    let reference =
        Reference::new(RefConfig::read(dir.path()).unwrap(), fixture.effective).unwrap();
    let mut cpu = load(&path, Backend::Cpu);
    let mut hex = load(&path, hexagon(64 << 20));
    assert_shares_the_npu_weights(&hex, &cpu);
    let (e_cpu, e_hex) = (
        refresh_error(&mut cpu, &reference, &cfg),
        refresh_error(&mut hex, &reference, &cfg),
    );
    eprintln!(
        "llada Q4_0: refresh logits vs f64 reference: CPU model {e_cpu:.2e}, \
         NPU model's CPU path (Q4_0 tiles, fp16 KV) {e_hex:.2e}"
    );
    // Both quantize activations to Q8_0 (the error's main part); the NPU path adds fp16 K/V.
    assert!(e_hex <= 1.5 * e_cpu, "{e_hex:.3e} vs CPU {e_cpu:.3e}");
}

#[test]
fn the_npu_cache_rejects_foreign_and_malformed_refreshes_before_writing() {
    // The device cache is checked as the host cache is: a refresh of another sequence (same
    // model, same epoch) or one with more K/V rows than positions leaves every cached row as it
    // was; the sequence's own refresh merges.
    let cfg = tiny_llada();
    let dir = TempDir::new("npu-refresh-token").unwrap();
    write_model(dir.path(), &cfg, 23, DType::F16, 1).unwrap();
    let hex = load(dir.path(), hexagon(64 << 20));
    assert!(hex.runs_blocks_on_npu());
    let x = ids(LEN, cfg.vocab_size as u32 - 3, cfg.special.mask, 7);
    let mut revised = x.clone();
    for p in [3usize, 9, 30] {
        revised[p] = (revised[p] + 11) % (cfg.vocab_size as u32 - 3);
    }
    let (mut a, mut b) = (hex.new_sequence().unwrap(), hex.new_sequence().unwrap());
    for m in [&mut a, &mut b] {
        m.forward_full(&canvas(&x), Rows::None).unwrap();
        m.commit(0..LEN).unwrap();
    }
    let snapshot = |m: &DiffusionTransformer| -> Vec<Vec<f32>> {
        m.cache_snapshot()
            .unwrap()
            .into_iter()
            .flat_map(|(k, v)| [k, v])
            .map(|t| {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect()
    };
    let r = a
        .compute_refresh(&canvas(&revised), &[3, 9, 30], None)
        .unwrap();
    let before = snapshot(&b);
    assert_eq!(before.len(), 2 * cfg.num_layers);
    assert!(matches!(
        b.apply_refresh(&r),
        Err(dllm_models::Error::RefreshFromOtherSequence { .. })
    ));
    assert!(
        snapshot(&b) == before,
        "a foreign refresh changed the device cache"
    );
    // 3 positions, 22 rows in the last layer's values.
    let wide: Vec<usize> = (0..22).collect();
    let r22 = a.compute_refresh(&canvas(&revised), &wide, None).unwrap();
    let mut bad = r.clone();
    bad.values[cfg.num_layers - 1] = r22.values[cfg.num_layers - 1].clone();
    let before = snapshot(&a);
    assert!(matches!(
        a.apply_refresh(&bad),
        Err(dllm_models::Error::MalformedRefresh(
            dllm_models::RefreshDefect::RowCount {
                rows: 22,
                positions: 3,
                ..
            }
        ))
    ));
    assert!(
        snapshot(&a) == before,
        "a malformed refresh changed the device cache"
    );
    a.apply_refresh(&r).unwrap();
    assert!(snapshot(&a) != before, "the valid refresh wrote nothing");
}

#[test]
fn a_cpu_refresh_copies_bytes_in_proportion_to_its_rows_not_to_the_cache() {
    // The CPU refresh attends over every cached row of every layer, reading the device cache's
    // own bytes in place: nothing is copied out of it, and the merge writes only the refreshed
    // rows' K/V. So the bytes moved by a refresh + merge are the same for a cache of 32 rows and
    // one of 160, and grow with the refreshed rows alone.
    let cfg = tiny_llada();
    let dir = TempDir::new("npu-refresh-bytes").unwrap();
    write_model(dir.path(), &cfg, 29, DType::F16, 1).unwrap();
    let dev = HexagonDevice::open(HexagonConfig {
        va_window_bytes: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    let model = load(dir.path(), Backend::Hexagon(dev.clone()));
    assert!(model.runs_blocks_on_npu());
    // f16 K and V of one position in every layer.
    let row_bytes = (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim() * 2) as u64;
    for (len, rows) in [(32usize, 1usize), (160, 1), (160, 5)] {
        let mut s = model.new_sequence().unwrap();
        let x = ids(len, cfg.vocab_size as u32 - 3, cfg.special.mask, 7);
        s.forward_full(&canvas(&x), Rows::None).unwrap();
        s.commit(0..len).unwrap();
        let mut revised = x.clone();
        let positions: Vec<usize> = (0..rows).map(|i| 3 + 5 * i).collect();
        for &p in &positions {
            revised[p] = (revised[p] + 11) % (cfg.vocab_size as u32 - 3);
        }
        let before = dev.counters();
        let r = s
            .compute_refresh(&canvas(&revised), &positions, Some(&positions))
            .unwrap();
        let read = dev.counters().since(&before);
        s.apply_refresh(&r).unwrap();
        let merged = dev.counters().since(&before);
        assert_eq!(
            (read.bytes_staged_in, read.bytes_staged_out),
            (0, 0),
            "a refresh of {rows} rows over a cache of {len} copied bytes: {read:?}"
        );
        assert_eq!(
            (merged.bytes_staged_in, merged.bytes_staged_out),
            (rows as u64 * row_bytes, 0),
            "the merge of {rows} rows (cache of {len})"
        );
        assert!(r.logits.is_some());
    }
}
