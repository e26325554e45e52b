//! The dense GEMM (f32 / f16 / bf16 weights in HMX tile order) against an f64 reference on every
//! path, ragged shapes included (K not a multiple of the tile or even of 2, rows not a multiple of
//! the slab), plus the layout itself checked against the NPU's definition.

use crate::common;

use common::*;
use half::{bf16, f16};
use kernels_cpu::{DenseMatrix, DenseType, DenseView, Isa};

fn check(ty: DenseType, n: usize, k: usize, m: usize, bias: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let w32 = rng.vec(n * k);
    let x = rng.vec(m * k);
    let b = bias.then(|| rng.vec(n));
    let (mat, w) = match ty {
        DenseType::F32 => (
            DenseMatrix::from_f32(&w32, n, k).unwrap(),
            w32.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        ),
        DenseType::F16 => {
            let h: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
            (
                DenseMatrix::from_f16(&h, n, k).unwrap(),
                h.iter().map(|v| v.to_f64()).collect(),
            )
        }
        DenseType::BF16 => {
            let h: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                DenseMatrix::from_bf16(&h, n, k).unwrap(),
                h.iter().map(|v| v.to_f64()).collect(),
            )
        }
    };
    let a: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let (mut want, mag) = matmul_ref(&a, &w, m, n, k);
    if let Some(b) = &b {
        for (i, v) in want.iter_mut().enumerate() {
            *v += b[i % n] as f64;
        }
    }
    for isa in Isa::available() {
        let mut out = vec![f32::NAN; m * n];
        mat.view()
            .gemm_with(isa, &x, m, b.as_deref(), &mut out)
            .unwrap();
        assert_close(
            &format!("{ty:?} {isa} n={n} k={k} m={m}"),
            &out,
            &want,
            &mag,
            1e-6,
        );
    }
}

#[test]
fn every_type_every_path_random_ragged_shapes() {
    let mut rng = Rng::new(5);
    for ty in [DenseType::F32, DenseType::F16, DenseType::BF16] {
        for case in 0..6 {
            let (n, k, m) = (1 + rng.below(70), 1 + rng.below(150), 1 + rng.below(30));
            check(ty, n, k, m, case % 2 == 1, case as u64);
        }
        for m in [1, 2, 3, 5, 6, 7, 11, 12, 13, 25] {
            check(ty, 41, 67, m, true, 50 + m as u64);
        }
    }
}

#[test]
fn f16_layout_is_the_npu_hmx_weight_tile_layout() {
    // kdsp_ops.h: element (k, n) of a 32x32 tile at byte (k/2)*128 + n*4 + (k%2)*2, tiles
    // (nt, kt) at (nt*KT + kt)*2048, padding zero.
    let (n, k) = (40, 70);
    let mut rng = Rng::new(9);
    let w: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.f32())).collect();
    let mat = DenseMatrix::from_f16(&w, n, k).unwrap();
    let bytes = mat.view().bytes();
    let kt_n = k.div_ceil(32);
    assert_eq!(bytes.len(), n.div_ceil(32) * kt_n * 2048);
    for row in 0..n.div_ceil(32) * 32 {
        for col in 0..kt_n * 32 {
            let (nt, kt, nn, kk) = (row / 32, col / 32, row % 32, col % 32);
            let at = (nt * kt_n + kt) * 2048 + (kk / 2) * 128 + nn * 4 + (kk % 2) * 2;
            let got = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
            let want = if row < n && col < k {
                w[row * k + col].to_bits()
            } else {
                0
            };
            assert_eq!(got, want, "element ({row}, {col})");
        }
    }
    // A view over the same bytes (as the NPU's buffer would be) computes the same product.
    let view = DenseView::hmx_f16_tiles(bytes, n, k).unwrap();
    let x = rng.vec(3 * k);
    let (mut a, mut b) = (vec![0f32; 3 * n], vec![0f32; 3 * n]);
    view.gemm(&x, 3, None, &mut a).unwrap();
    mat.view().gemm(&x, 3, None, &mut b).unwrap();
    assert_eq!(a, b);
    let mut row = vec![0f32; k];
    view.row(7, &mut row).unwrap();
    assert!(row
        .iter()
        .zip(&w[7 * k..8 * k])
        .all(|(a, b)| *a == b.to_f32()));
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(13);
    let (n, k, m) = (150, 200, 45);
    let w = rng.vec(n * k);
    let x = rng.vec(m * k);
    let mat = DenseMatrix::from_f32(&w, n, k).unwrap();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut out = vec![0f32; m * n];
        pool.install(|| mat.view().gemm(&x, m, None, &mut out))
            .unwrap();
        out
    };
    let one = run(1);
    for t in [2, 5] {
        assert!(
            one.iter()
                .zip(run(t))
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{t} threads"
        );
    }
}

#[test]
fn bad_shapes_are_named_errors() {
    let e = DenseMatrix::from_f32(&[0.0; 5], 2, 3).unwrap_err();
    assert!(e.to_string().contains("dense weight bytes"), "{e}");
    let e = DenseMatrix::from_f32(&[], 0, 3).unwrap_err();
    assert!(e.to_string().contains("no elements"), "{e}");
    let e = DenseView::hmx_f16_tiles(&[0u8; 100], 32, 32).unwrap_err();
    assert!(e.to_string().contains("dense weight tiles"), "{e}");
}

#[test]
fn a_matrix_filled_a_few_rows_at_a_time_is_the_matrix_packed_whole() {
    // What a streaming loader does: rows arrive in chunks (and, for a permuted tensor, one row
    // at a time out of order); the tiles must be the ones packed from the whole row-major matrix.
    let (n, k) = (70, 45);
    let w = Rng::new(9).vec(n * k);
    let raw: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let whole = DenseMatrix::from_row_major(DenseType::F32, n, k, &raw).unwrap();
    let mut chunked = DenseMatrix::zeroed(DenseType::F32, n, k).unwrap();
    let row_bytes = chunked.row_bytes();
    assert_eq!(row_bytes, k * 4);
    for (i, chunk) in raw.chunks(row_bytes * 32).enumerate() {
        chunked.set_rows(i * 32, chunk).unwrap();
    }
    assert_eq!(whole.view().bytes(), chunked.view().bytes());
    let mut reversed = DenseMatrix::zeroed(DenseType::F32, n, k).unwrap();
    for r in (0..n).rev() {
        reversed
            .set_rows(r, &raw[r * row_bytes..(r + 1) * row_bytes])
            .unwrap();
    }
    assert_eq!(whole.view().bytes(), reversed.view().bytes());
    // Rows past the end and partial rows are errors, and change nothing.
    let before = reversed.view().bytes().to_vec();
    let e = reversed.set_rows(n - 1, &raw[..2 * row_bytes]).unwrap_err();
    assert!(e.to_string().contains("inside the 70 rows"), "{e}");
    assert!(reversed.set_rows(0, &raw[..row_bytes - 4]).is_err());
    assert!(reversed.set_rows(n + 1, &raw[..row_bytes]).is_err());
    assert_eq!(before, reversed.view().bytes());
}
