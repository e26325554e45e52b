//! The quantized GEMM against a scalar f64 reference, on every ISA path this machine has plus
//! the portable one, on random shapes including ragged ones (rows not a multiple of the tile or
//! the slab; activation row counts that exercise every micro-kernel height).

use crate::common;

use common::*;
use kernels_cpu::{GgmlType, Isa, QFormat, QuantMatrix, QuantView};

const TYPES: [(&str, GgmlType); 4] = [
    ("q4_0", GgmlType::Q4_0),
    ("q8_0", GgmlType::Q8_0),
    ("q4_k", GgmlType::Q4K),
    ("q6_k", GgmlType::Q6K),
];

fn check(ty: &str, gt: GgmlType, n: usize, k: usize, m: usize, bias: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let blocks = random_blocks(ty, n, k, &mut rng);
    let x = rng.vec(m * k);
    let b = bias.then(|| rng.vec(n));
    let w = dequant(ty, &blocks, n, k);
    let a = quantized_acts(ty, &x);
    let (mut want, mag) = matmul_ref(&a, &w, m, n, k);
    if let Some(b) = &b {
        for (i, v) in want.iter_mut().enumerate() {
            *v += b[i % n] as f64;
        }
    }
    let packed = QuantMatrix::from_ggml(gt, n, k, &blocks).unwrap();
    for isa in Isa::available() {
        let mut out = vec![f32::NAN; m * n];
        packed
            .view()
            .gemm_with(isa, &x, m, b.as_deref(), &mut out)
            .unwrap();
        assert_close(
            &format!("{ty} {isa} n={n} k={k} m={m}"),
            &out,
            &want,
            &mag,
            2e-6,
        );
    }
}

#[test]
fn every_type_every_path_random_ragged_shapes() {
    let mut rng = Rng::new(7);
    for (ty, gt) in TYPES {
        let kb = gt.block_len();
        for case in 0..6 {
            let n = 1 + rng.below(70);
            let k = kb * (1 + rng.below(if kb == 32 { 9 } else { 3 }));
            let m = 1 + rng.below(40);
            check(ty, gt, n, k, m, case % 2 == 0, 100 + case as u64);
        }
        // Every micro-kernel height and a slab tail.
        for m in [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33] {
            check(ty, gt, 37, kb * 2, m, true, m as u64);
        }
    }
}

#[test]
fn packed_rows_dequantize_like_the_ggml_rows() {
    let mut rng = Rng::new(3);
    for (ty, gt) in TYPES {
        let (n, k) = (35, gt.block_len() * 3);
        let blocks = random_blocks(ty, n, k, &mut rng);
        let want = dequant(ty, &blocks, n, k);
        let packed = QuantMatrix::from_ggml(gt, n, k, &blocks).unwrap();
        let mut row = vec![0f32; k];
        for r in 0..n {
            packed.view().dequantize_row(r, &mut row).unwrap();
            let mut direct = vec![0f32; k];
            let rb = gt.row_bytes(k).unwrap();
            kernels_cpu::ggml::dequantize_row(gt, &blocks[r * rb..(r + 1) * rb], &mut direct)
                .unwrap();
            for c in 0..k {
                assert_eq!(row[c], direct[c], "{ty} packed row {r} col {c}");
                assert!(
                    (row[c] as f64 - want[r * k + c]).abs()
                        <= 1e-6 * want[r * k + c].abs().max(1e-3),
                    "{ty} row {r} col {c}"
                );
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(11);
    for (ty, gt) in TYPES {
        let (n, k, m) = (200, gt.block_len() * 4, 70);
        let blocks = random_blocks(ty, n, k, &mut rng);
        let x = rng.vec(m * k);
        let packed = QuantMatrix::from_ggml(gt, n, k, &blocks).unwrap();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut out = vec![0f32; m * n];
            pool.install(|| packed.view().gemm(&x, m, None, &mut out))
                .unwrap();
            out
        };
        let one = run(1);
        for t in [2, 3, 8] {
            let other = run(t);
            assert!(
                one.iter()
                    .zip(&other)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: {t} threads differ from 1"
            );
        }
    }
}

#[test]
fn bad_shapes_and_lengths_are_named_errors() {
    let blocks = vec![0u8; 18 * 4];
    // k not a multiple of the block.
    let e = QuantMatrix::from_ggml(GgmlType::Q4_0, 4, 30, &blocks).unwrap_err();
    assert!(e.to_string().contains("32-value q4_0 block"), "{e}");
    // Truncated weights.
    let e = QuantMatrix::from_ggml(GgmlType::Q4_0, 4, 32, &blocks[..70]).unwrap_err();
    assert!(e.to_string().contains("ggml weight bytes"), "{e}");
    // Unsupported type.
    let e = QuantMatrix::from_ggml(GgmlType::F16, 4, 32, &blocks).unwrap_err();
    assert!(e.to_string().contains("f16"), "{e}");
    let w = QuantMatrix::from_ggml(GgmlType::Q4_0, 4, 32, &blocks).unwrap();
    let mut out = vec![0f32; 8];
    let e = w.view().gemm(&[0.0; 63], 2, None, &mut out).unwrap_err();
    assert!(e.to_string().contains("activations"), "{e}");
    let e = w
        .view()
        .gemm(&[0.0; 64], 2, Some(&[0.0; 3]), &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("bias"), "{e}");
    let e = QuantView::new(QFormat::Q4_0, 4, 32, &[0u8; 10]).unwrap_err();
    assert!(e.to_string().contains("packed weights"), "{e}");
    // Zero rows is a valid (empty) product.
    w.view().gemm(&[], 0, None, &mut []).unwrap();
}

#[test]
fn uninit_output_is_fully_written() {
    let mut rng = Rng::new(21);
    for (ty, gt) in TYPES {
        let (n, k, m) = (45, gt.block_len() * 2, 13);
        let blocks = random_blocks(ty, n, k, &mut rng);
        let x = rng.vec(m * k);
        let w = QuantMatrix::from_ggml(gt, n, k, &blocks).unwrap();
        let mut want = vec![0f32; m * n];
        w.view().gemm(&x, m, None, &mut want).unwrap();
        let mut out = vec![std::mem::MaybeUninit::new(f32::NAN); m * n];
        w.view().gemm_uninit(&x, m, None, &mut out).unwrap();
        // SAFETY: initialised above (NaN), and overwritten by the kernel.
        let got: Vec<f32> = out.iter().map(|v| unsafe { v.assume_init() }).collect();
        assert_eq!(got, want, "{ty}");
    }
    let d = kernels_cpu::DenseMatrix::from_f32(&rng.vec(37 * 50), 37, 50).unwrap();
    let x = rng.vec(9 * 50);
    let mut want = vec![0f32; 9 * 37];
    d.view().gemm(&x, 9, None, &mut want).unwrap();
    let mut out = vec![std::mem::MaybeUninit::new(f32::NAN); 9 * 37];
    d.view().gemm_uninit(&x, 9, None, &mut out).unwrap();
    let got: Vec<f32> = out.iter().map(|v| unsafe { v.assume_init() }).collect();
    assert_eq!(got, want, "dense");
}
