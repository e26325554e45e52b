//! Which SIMD paths this CPU runs, and every one of them against the portable path on random
//! shapes with ragged edges (weight rows not a multiple of the slab or the tile, activation row
//! counts that leave every micro-kernel height and a lone leftover row, K not a multiple of the
//! dense tile or even of 2).
//!
//! The SIMD paths (x86-64: AVX2, AVX-VNNI, AVX-512, AVX-512 VNNI; AArch64: NEON, NEON + dotprod,
//! NEON + i8mm) all run the generic bodies' operations in the same order with fused multiply-add,
//! so they must agree with each other bit for bit; the portable path multiplies and adds
//! separately, so it agrees with them within the rounding of the float stage (and with the f64
//! reference, in `quant.rs` / `dense.rs`). Activation quantization and attention are
//! bit-identical on every path, portable included (`act.rs`'s unit test, `attention.rs`).
//!
//! Under `KERNELS_CPU_EXPECT_PATHS=a,b,c` (set by `generate`'s aarch64 test for each emulated
//! CPU model) the list of paths must be exactly that.

use crate::common;

use common::fingerprint::fingerprint;
use common::*;
use half::{bf16, f16};
use kernels_cpu::{DenseMatrix, DenseType, GgmlType, Isa, QuantMatrix};

fn names(paths: &[Isa]) -> String {
    paths.iter().map(|i| i.name()).collect::<Vec<_>>().join(",")
}

#[test]
fn reports_the_paths_this_cpu_runs() {
    let avail = Isa::available();
    let best = Isa::best();
    announce(&format!(
        "kernels-cpu paths on {}: {} (gemm runs {best}); fingerprint {best} {:016x}",
        std::env::consts::ARCH,
        names(&avail),
        fingerprint(best),
    ));
    assert_eq!(avail[0], Isa::Portable);
    assert_eq!(Some(&best), avail.last());
    let arch_paths: &[Isa] = match std::env::consts::ARCH {
        "x86_64" => &[Isa::Avx2, Isa::AvxVnni, Isa::Avx512, Isa::Avx512Vnni],
        // NEON is part of every AArch64 Linux CPU.
        "aarch64" => {
            assert!(avail.contains(&Isa::Neon), "{}", names(&avail));
            &[Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm]
        }
        _ => &[],
    };
    assert!(
        avail[1..].iter().all(|i| arch_paths.contains(i)),
        "a path of another architecture: {}",
        names(&avail)
    );
    if let Ok(want) = std::env::var("KERNELS_CPU_EXPECT_PATHS") {
        assert_eq!(names(&avail), want, "KERNELS_CPU_EXPECT_PATHS");
    }
    // A path this CPU lacks is an error naming it, not a crash.
    if let Some(&missing) = Isa::ALL.iter().find(|i| !i.is_available()) {
        let w = DenseMatrix::from_f32(&[1.0; 4], 2, 2).unwrap();
        let e = w
            .view()
            .gemm_with(missing, &[1.0; 2], 1, None, &mut [0.0; 2])
            .unwrap_err();
        assert!(e.to_string().contains(missing.name()), "{e}");
    }
}

/// `got` within `tol * mag` of the portable result, element by element.
fn close_to_portable(what: &str, got: &[f32], portable: &[f32], mag: &[f64], tol: f64) {
    for (i, ((&g, &p), &s)) in got.iter().zip(portable).zip(mag).enumerate() {
        assert!(
            (g as f64 - p as f64).abs() <= tol * s + 1e-30,
            "{what}: element {i}: {g} vs portable {p} (magnitude {s})"
        );
    }
}

/// Runs `gemm(isa, out)` on every path; each must match portable within the tolerance, and the
/// SIMD paths each other bit for bit. Returns how many elements equalled portable's exactly.
fn compare_paths(
    what: &str,
    len: usize,
    mag: &[f64],
    tol: f64,
    gemm: impl Fn(Isa, &mut [f32]),
) -> (usize, usize) {
    let mut portable = vec![f32::NAN; len];
    gemm(Isa::Portable, &mut portable);
    let mut first_simd: Option<(Isa, Vec<f32>)> = None;
    let mut exact = 0;
    for isa in Isa::available().into_iter().skip(1) {
        let mut out = vec![f32::NAN; len];
        gemm(isa, &mut out);
        close_to_portable(&format!("{what} {isa}"), &out, &portable, mag, tol);
        exact += out.iter().zip(&portable).filter(|(a, b)| a == b).count();
        match &first_simd {
            None => first_simd = Some((isa, out)),
            Some((other, o)) => {
                if let Some(i) = (0..len).find(|&i| o[i].to_bits() != out[i].to_bits()) {
                    panic!(
                        "{what}: {isa} and {other} differ at element {i}: {} vs {}",
                        out[i], o[i]
                    );
                }
            }
        }
    }
    (exact, len * (Isa::available().len() - 1))
}

#[test]
fn every_quantized_path_matches_the_portable_path() {
    let mut rng = Rng::new(41);
    let (mut exact, mut total) = (0, 0);
    for (ty, gt) in [
        ("q4_0", GgmlType::Q4_0),
        ("q8_0", GgmlType::Q8_0),
        ("q4_k", GgmlType::Q4K),
        ("q6_k", GgmlType::Q6K),
    ] {
        let kb = gt.block_len();
        let mut shapes: Vec<(usize, usize, usize)> = (0..5)
            .map(|_| {
                let n = 1 + rng.below(75);
                let k = kb * (1 + rng.below(if kb == 32 { 8 } else { 3 }));
                (n, k, 1 + rng.below(37))
            })
            .collect();
        // Every micro-kernel height (pairs of rows, and the leftover row), slab tails of 1..3.
        shapes.extend([1, 2, 3, 5, 7, 8, 9, 11, 17].map(|m| (33 + m % 4, kb, m)));
        for (case, (n, k, m)) in shapes.into_iter().enumerate() {
            let blocks = random_blocks(ty, n, k, &mut rng);
            let x = rng.vec(m * k);
            let bias = (case % 2 == 0).then(|| rng.vec(n));
            let w = QuantMatrix::from_ggml(gt, n, k, &blocks).unwrap();
            let a = quantized_acts(ty, &x);
            let (_, mag) = matmul_ref(&a, &dequant(ty, &blocks, n, k), m, n, k);
            let (e, t) = compare_paths(&format!("{ty} n={n} k={k} m={m}"), m * n, &mag, 4e-6, {
                |isa, out| {
                    w.view()
                        .gemm_with(isa, &x, m, bias.as_deref(), out)
                        .unwrap()
                }
            });
            exact += e;
            total += t;
        }
    }
    announce(&format!(
        "kernels-cpu quantized GEMMs: {exact} of {total} SIMD outputs bit-equal to portable's \
         (the rest within 4e-6 of the magnitude; SIMD paths equal each other)"
    ));
}

#[test]
fn every_dense_path_matches_the_portable_path() {
    let mut rng = Rng::new(43);
    for ty in [DenseType::F32, DenseType::F16, DenseType::BF16] {
        let mut shapes: Vec<(usize, usize, usize)> = (0..5)
            .map(|_| (1 + rng.below(75), 1 + rng.below(140), 1 + rng.below(31)))
            .collect();
        shapes.extend([1, 2, 3, 4, 6, 7, 12, 13, 25].map(|m| (34 + m % 3, 63 + m % 2, m)));
        for (case, (n, k, m)) in shapes.into_iter().enumerate() {
            let w32 = rng.vec(n * k);
            let (mat, w): (DenseMatrix, Vec<f64>) = match ty {
                DenseType::F32 => (
                    DenseMatrix::from_f32(&w32, n, k).unwrap(),
                    w32.iter().map(|&v| v as f64).collect(),
                ),
                DenseType::F16 => {
                    let h: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
                    let w = h.iter().map(|v| v.to_f64()).collect();
                    (DenseMatrix::from_f16(&h, n, k).unwrap(), w)
                }
                DenseType::BF16 => {
                    let h: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
                    let w = h.iter().map(|v| v.to_f64()).collect();
                    (DenseMatrix::from_bf16(&h, n, k).unwrap(), w)
                }
            };
            let x = rng.vec(m * k);
            let bias = (case % 2 == 1).then(|| rng.vec(n));
            let a: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let (_, mag) = matmul_ref(&a, &w, m, n, k);
            compare_paths(
                &format!("{ty:?} n={n} k={k} m={m}"),
                m * n,
                &mag,
                2e-6,
                |isa, out| {
                    mat.view()
                        .gemm_with(isa, &x, m, bias.as_deref(), out)
                        .unwrap()
                },
            );
        }
    }
}
