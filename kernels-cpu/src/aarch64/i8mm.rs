//! Quantized micro-kernels on FEAT_I8MM's `smmla`: `acc[2i + j] += sum_k a[i][k] b[j][k]` for two
//! rows `a` and two rows `b` of 8 signed bytes, 32 multiply-adds per instruction (`sdot` does 16).
//!
//! A slab is 4 weight rows; a micro-kernel runs it against `2 * MP` activation rows, `MP` pairs.
//! Operands, per 32-value block:
//! - weights: in the packed layout a 16-byte load holds 4 rows x 4 codes (Q4_0/Q4_K: the low
//!   nibbles are values `8p..8p+4` and the high nibbles `8p+4..8p+8` of chunk `p`; Q8_0/Q6_K:
//!   chunk `q` holds values `4q..4q+4`); `zip1`/`zip2` on 32-bit lanes make rows (0, 1) and
//!   (2, 3) with 8 consecutive values each: four operands per row pair.
//! - activations: rows `i` and `i + 1` of a block are adjacent 32-byte records in the
//!   group-major layout, so one `ld4` on 64-bit lanes yields the four operands `[row i values
//!   8p..8p+8, row i+1 values 8p..8p+8]`.
//!
//! The result is a 2x2 block `[x_i w_0, x_i w_1, x_{i+1} w_0, x_{i+1} w_1]`. The float stage
//! runs on that arrangement with the weight scales as `[d0, d1, d0, d1]` and the activation
//! scales as `[s_i, s_i, s_{i+1}, s_{i+1}]`: every output element sees exactly the generic
//! kernel's operations (the integer sums are exact in any order), so the results are the
//! generic path's bits. The accumulators are put back into rows once, at the store.

use std::arch::aarch64::*;
use std::arch::asm;

use crate::act::Acts;
use crate::qgemm_rows::{Generic, RunRows, Slab};
use crate::qlayout::QFormat;
use crate::simd::neon::{f16x4_to_f32, Neon};
use crate::simd::Simd;

/// The `smmla` micro-kernels (one leftover activation row goes through the `sdot` kernel).
pub(crate) struct Mmla;

impl RunRows for Mmla {
    #[inline(always)]
    unsafe fn run(fmt: QFormat, sl: &Slab, a: &Acts, m0: usize, left: usize) -> usize {
        macro_rules! go {
            ($mp:literal) => {{
                match fmt {
                    QFormat::Q4_0 => k_b32::<$mp, false>(sl, a, m0),
                    QFormat::Q8_0 => k_b32::<$mp, true>(sl, a, m0),
                    QFormat::Q4K => k_q4k::<$mp>(sl, a, m0),
                    QFormat::Q6K => k_q6k::<$mp>(sl, a, m0),
                }
                2 * $mp
            }};
        }
        if left >= 8 {
            go!(4)
        } else if left >= 4 {
            go!(2)
        } else if left >= 2 {
            go!(1)
        } else {
            Generic::<Neon<true>>::run(fmt, sl, a, m0, 1)
        }
    }
}

/// `acc + a b^T` for 2x8 signed byte matrices `a`, `b` (row-major in the vectors).
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!(
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// One 32-value block of a 4-row slab: `w[h][p]` = rows `2h`, `2h + 1`, values `8p..8p+8` each.
type WBlock = [[int8x16_t; 4]; 2];

/// Rows (0, 1) and (2, 3) of `lo` (values `a` of 4 rows) and `hi` (values `b`), `a` then `b`.
#[inline(always)]
unsafe fn zip_rows(lo: uint8x16_t, hi: uint8x16_t) -> [int8x16_t; 2] {
    let (lo, hi) = (vreinterpretq_u32_u8(lo), vreinterpretq_u32_u8(hi));
    [
        vreinterpretq_s8_u32(vzip1q_u32(lo, hi)),
        vreinterpretq_s8_u32(vzip2q_u32(lo, hi)),
    ]
}

/// A nibble block (Q4_0, Q4_K sub-block) at `t`, this slab's lanes.
#[inline(always)]
unsafe fn w_nibbles(t: *const u8) -> WBlock {
    let mut w = [[vdupq_n_s8(0); 4]; 2];
    for p in 0..4 {
        let v = vld1q_u8(t.add(p * 128));
        let [r01, r23] = zip_rows(vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(v));
        (w[0][p], w[1][p]) = (r01, r23);
    }
    w
}

/// A byte block (Q8_0, Q6_K sub-block) at `t`, this slab's lanes.
#[inline(always)]
unsafe fn w_bytes(t: *const u8) -> WBlock {
    let mut w = [[vdupq_n_s8(0); 4]; 2];
    for p in 0..4 {
        let a = vld1q_u8(t.add(2 * p * 128));
        let b = vld1q_u8(t.add((2 * p + 1) * 128));
        let [r01, r23] = zip_rows(a, b);
        (w[0][p], w[1][p]) = (r01, r23);
    }
    w
}

/// Activation rows `i`, `i + 1` of one block (64 bytes at `x`): `[i: 8p..8p+8, i+1: 8p..8p+8]`.
#[inline(always)]
unsafe fn x_pair(x: *const i8) -> [int8x16_t; 4] {
    let v = vld4q_s64(x.cast());
    [
        vreinterpretq_s8_s64(v.0),
        vreinterpretq_s8_s64(v.1),
        vreinterpretq_s8_s64(v.2),
        vreinterpretq_s8_s64(v.3),
    ]
}

/// `[p0, p0, p1, p1]`.
#[inline(always)]
unsafe fn dup_pair_f32(p: *const f32) -> float32x4_t {
    let v = vreinterpretq_f32_u64(vdupq_n_u64(p.cast::<u64>().read_unaligned()));
    vzip1q_f32(v, v)
}

/// `[p0, p0, p1, p1]`.
#[inline(always)]
unsafe fn dup_pair_i32(p: *const i32) -> int32x4_t {
    let v = vreinterpretq_s32_u64(vdupq_n_u64(p.cast::<u64>().read_unaligned()));
    vzip1q_s32(v, v)
}

/// `[v0, v1, v0, v1]` and `[v2, v3, v2, v3]`: per-weight-row values in the 2x2 arrangement.
#[inline(always)]
unsafe fn halves(v: float32x4_t) -> [float32x4_t; 2] {
    let d = vreinterpretq_f64_f32(v);
    [
        vreinterpretq_f32_f64(vdupq_laneq_f64::<0>(d)),
        vreinterpretq_f32_f64(vdupq_laneq_f64::<1>(d)),
    ]
}

/// `acc + sum_{p in ps} smmla(x[p], w[p])`.
#[inline(always)]
unsafe fn dots(
    acc: int32x4_t,
    x: &[int8x16_t; 4],
    w: &[int8x16_t; 4],
    ps: std::ops::Range<usize>,
) -> int32x4_t {
    let mut acc = acc;
    for p in ps {
        acc = smmla(acc, x[p], w[p]);
    }
    acc
}

/// Rows `m0..m0 + 2 MP` from their 2x2 accumulators (per pair: weight rows 0-1 and 2-3), plus
/// bias.
#[inline(always)]
unsafe fn store_pairs<const MP: usize>(sl: &Slab, acc: &[[float32x4_t; 2]; MP], m0: usize) {
    for (pi, acc_p) in acc.iter().enumerate() {
        let (a, b) = (
            vreinterpretq_f64_f32(acc_p[0]),
            vreinterpretq_f64_f32(acc_p[1]),
        );
        for (i, r) in [vzip1q_f64(a, b), vzip2q_f64(a, b)].into_iter().enumerate() {
            let mut v = vreinterpretq_f32_f64(r);
            if !sl.bias.is_null() {
                v = vaddq_f32(v, vld1q_f32(sl.bias));
            }
            Neon::<true>::store(sl.out.add((m0 + 2 * pi + i) * sl.ldo), v, sl.nvalid);
        }
    }
}

/// The end of a K-quant super-block: `acc += sacc * scale` per row (`sc`: the scales of rows
/// `m0..`).
#[inline(always)]
unsafe fn end_superblock<const MP: usize>(
    acc: &mut [[float32x4_t; 2]; MP],
    sacc: &[[float32x4_t; 2]; MP],
    sc: *const f32,
) {
    for (pi, acc_p) in acc.iter_mut().enumerate() {
        let s = dup_pair_f32(sc.add(2 * pi));
        for h in 0..2 {
            acc_p[h] = vfmaq_f32(acc_p[h], sacc[pi][h], s);
        }
    }
}

/// Q4_0 (`Q8 = false`) and Q8_0 (`Q8 = true`) against Q8_0 activations (see `qgemm_rows::k_b32`).
#[inline(always)]
unsafe fn k_b32<const MP: usize, const Q8: bool>(sl: &Slab, a: &Acts, m0: usize) {
    let mut acc = [[vdupq_n_f32(0.0); 2]; MP];
    let tb = if Q8 { 1024 } else { 512 };
    let mut x = a.q.as_ptr().add(m0 * 32);
    let mut off = a.off.as_ptr().add(m0);
    let mut sc = a.scale.as_ptr().add(m0);
    let mut t = sl.codes;
    let mut d = sl.scales.cast::<u16>().add(sl.g_off);
    for _ in 0..sl.kb_n {
        let dw = halves(f16x4_to_f32(vld1_u16(d)));
        let w = if Q8 { w_bytes(t) } else { w_nibbles(t) };
        for (pi, acc_p) in acc.iter_mut().enumerate() {
            let xs = x_pair(x.add(64 * pi));
            let o = dup_pair_i32(off.add(2 * pi));
            let s = dup_pair_f32(sc.add(2 * pi));
            for h in 0..2 {
                let ia = dots(o, &xs, &w[h], 0..4);
                acc_p[h] = vfmaq_f32(acc_p[h], vcvtq_f32_s32(ia), vmulq_f32(dw[h], s));
            }
        }
        x = x.add(a.m * 32);
        off = off.add(a.m);
        sc = sc.add(a.m);
        t = t.add(tb);
        d = d.add(32);
    }
    store_pairs(sl, &acc, m0);
}

/// Q4_K against Q8_K activations (see `qgemm_rows::k_q4k`).
#[inline(always)]
unsafe fn k_q4k<const MP: usize>(sl: &Slab, a: &Acts, m0: usize) {
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[zero; 2]; MP];
    let (q, fsum, sc) = (a.q.as_ptr(), a.fsum.as_ptr(), a.scale.as_ptr());
    let m = a.m;
    for sb in 0..sl.kb_n {
        let c = sl.codes.add(sb * 4096);
        let s = sl.scales.add(sb * 640);
        let d = f16x4_to_f32(vld1_u16(s.cast::<u16>().add(sl.g_off)));
        let dmin = f16x4_to_f32(vld1_u16(s.add(64).cast::<u16>().add(sl.g_off)));
        let mut sacc = [[zero; 2]; MP];
        for j in 0..8 {
            let w = w_nibbles(c.add(j * 512));
            let ws = halves(vmulq_f32(
                d,
                Neon::<true>::load_u8(s.add(128 + j * 32 + sl.g_off)),
            ));
            let wm = halves(vmulq_f32(
                dmin,
                Neon::<true>::load_u8(s.add(384 + j * 32 + sl.g_off)),
            ));
            let b = (sb * 8 + j) * m + m0;
            let (x, fs) = (q.add(b * 32), fsum.add(b));
            for (pi, sacc_p) in sacc.iter_mut().enumerate() {
                let xs = x_pair(x.add(64 * pi));
                let f = dup_pair_f32(fs.add(2 * pi));
                for h in 0..2 {
                    let ia = dots(vdupq_n_s32(0), &xs, &w[h], 0..4);
                    let v = vfmaq_f32(sacc_p[h], vcvtq_f32_s32(ia), ws[h]);
                    sacc_p[h] = vfmsq_f32(v, wm[h], f);
                }
            }
        }
        end_superblock(&mut acc, &sacc, sc.add(sb * m + m0));
    }
    store_pairs(sl, &acc, m0);
}

/// Q6_K against Q8_K activations (see `qgemm_rows::k_q6k`): values 0..16 and 16..32 of a sub-block
/// are two groups with their own scale and code-offset sum.
#[inline(always)]
unsafe fn k_q6k<const MP: usize>(sl: &Slab, a: &Acts, m0: usize) {
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[zero; 2]; MP];
    let (q, off, sc) = (a.q.as_ptr(), a.off.as_ptr(), a.scale.as_ptr());
    let m = a.m;
    for sb in 0..sl.kb_n {
        let c = sl.codes.add(sb * 8192);
        let s = sl.scales.add(sb * 576);
        let d = f16x4_to_f32(vld1_u16(s.cast::<u16>().add(sl.g_off)));
        let mut sacc = [[zero; 2]; MP];
        for j in 0..8 {
            let w = w_bytes(c.add(j * 1024));
            let sc_i8 = |g: usize| Neon::<true>::load_i8(s.add(64 + g * 32 + sl.g_off).cast());
            let ws_a = halves(vmulq_f32(d, sc_i8(2 * j)));
            let ws_b = halves(vmulq_f32(d, sc_i8(2 * j + 1)));
            let xb = q.add(((sb * 8 + j) * m + m0) * 32);
            let oa = off.add((sb * 16 + 2 * j) * m + m0);
            let ob = off.add((sb * 16 + 2 * j + 1) * m + m0);
            for (pi, sacc_p) in sacc.iter_mut().enumerate() {
                let xs = x_pair(xb.add(64 * pi));
                let (oa, ob) = (dup_pair_i32(oa.add(2 * pi)), dup_pair_i32(ob.add(2 * pi)));
                for h in 0..2 {
                    let ia = dots(oa, &xs, &w[h], 0..2);
                    let ib = dots(ob, &xs, &w[h], 2..4);
                    let v = vfmaq_f32(sacc_p[h], vcvtq_f32_s32(ia), ws_a[h]);
                    sacc_p[h] = vfmaq_f32(v, vcvtq_f32_s32(ib), ws_b[h]);
                }
            }
        }
        end_superblock(&mut acc, &sacc, sc.add(sb * m + m0));
    }
    store_pairs(sl, &acc, m0);
}
