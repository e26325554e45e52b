//! A hash of the exact bits a few fixed kernel calls produce on one path: every weight type on
//! ragged shapes (with a bias), and an attention over f16 K/V. Two builds whose paths run the same
//! operations in the same order (the SIMD paths of x86-64 and AArch64 all use fused multiply-add
//! in the generic bodies' order) print the same value, which `generate`'s aarch64 test compares
//! across the two architectures. This file is also compiled into that test (`#[path]`).

use half::f16;
use kernels_cpu::attention::{attention_with, AttnShape, KvSegment, Skip};
use kernels_cpu::{DenseMatrix, GgmlType, Isa, QuantMatrix};

use super::{random_blocks, Rng};

/// FNV-1a over 32-bit words.
struct Fnv(u64);

impl Fnv {
    fn words(&mut self, w: impl IntoIterator<Item = u32>) {
        for v in w {
            for b in v.to_le_bytes() {
                self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
}

/// The fingerprint of `isa` (which this CPU must run).
pub fn fingerprint(isa: Isa) -> u64 {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    let mut rng = Rng::new(2027);
    for (ty, gt) in [
        ("q4_0", GgmlType::Q4_0),
        ("q8_0", GgmlType::Q8_0),
        ("q4_k", GgmlType::Q4K),
        ("q6_k", GgmlType::Q6K),
    ] {
        let (n, k, m) = (45, gt.block_len() * 2, 11);
        let w = QuantMatrix::from_ggml(gt, n, k, &random_blocks(ty, n, k, &mut rng)).unwrap();
        let (x, b) = (rng.vec(m * k), rng.vec(n));
        let mut out = vec![0f32; m * n];
        w.view().gemm_with(isa, &x, m, Some(&b), &mut out).unwrap();
        h.words(out.iter().map(|v| v.to_bits()));
    }
    let (n, k, m) = (37, 77, 9);
    let w32 = rng.vec(n * k);
    let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
    let wb: Vec<half::bf16> = w32.iter().map(|&v| half::bf16::from_f32(v)).collect();
    for w in [
        DenseMatrix::from_f32(&w32, n, k).unwrap(),
        DenseMatrix::from_f16(&w16, n, k).unwrap(),
        DenseMatrix::from_bf16(&wb, n, k).unwrap(),
    ] {
        let (x, b) = (rng.vec(m * k), rng.vec(n));
        let mut out = vec![0f32; m * n];
        w.view().gemm_with(isa, &x, m, Some(&b), &mut out).unwrap();
        h.words(out.iter().map(|v| v.to_bits()));
    }
    let s = AttnShape {
        q_rows: 7,
        heads: 4,
        kv_heads: 2,
        head_dim: 24,
    };
    let f = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    let rows = 70;
    let (kc, vc) = (f(rng.vec(rows * 48)), f(rng.vec(rows * 48)));
    let q = f(rng.vec(s.q_rows * 96));
    let segs = [KvSegment {
        k: &kc,
        v: &vc,
        rows,
        row_stride: 48,
        skip: Skip::Range { start: 9, end: 16 },
    }];
    let mut out = vec![f16::ZERO; q.len()];
    attention_with(isa, &q, &segs, s, 0.2, &mut out).unwrap();
    h.words(out.iter().map(|v| v.to_bits() as u32));
    h.0
}
