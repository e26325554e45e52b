//! Activation quantizers for x86 (AVX2, AVX-512), bit-identical to the portable ones in
//! [`crate::act`]: Q8_0 rounds half away from zero (`trunc(t + copysign(0.5 - 2^-25, t))`, the
//! exact `roundf`), Q8_K rounds half to even (the default MXCSR mode of `cvtps2dq`, ggml's
//! `nearest_int`).

use std::arch::x86_64::*;

use half::f16;

use crate::act_row::{sums, ActSpec, RowOut};

/// The largest float below 0.5: `trunc(t + copysign(HALF_DOWN, t)) == t.round()` for every `t`.
const HALF_DOWN: f32 = 0.499_999_97;

/// One row, AVX-512.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn row_avx512(x: &[f32], mut o: RowOut<'_>, spec: ActSpec) {
    let bl = if spec.k_quant { 256 } else { 32 };
    let nv = bl / 16;
    let mut s16 = [0i32; 16];
    let sign = _mm512_set1_epi32(i32::MIN);
    let half = _mm512_castps_si512(_mm512_set1_ps(HALF_DOWN));
    for b in 0..x.len() / bl {
        let xp = x.as_ptr().add(b * bl);
        let qp = o.q.as_mut_ptr().add(b * bl);
        let mut amax = _mm512_setzero_ps();
        for v in 0..nv {
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xp.add(16 * v))));
        }
        let amax = _mm512_reduce_max_ps(amax);
        if spec.k_quant {
            if amax == 0.0 {
                std::ptr::write_bytes(qp, 0, bl);
                o.scale[b] = 0.0;
                s16[..nv].fill(0);
            } else {
                // The first value of largest magnitude, with its sign.
                let av = _mm512_set1_ps(amax);
                let mut max = 0f32;
                for v in 0..nv {
                    let m = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(
                        _mm512_abs_ps(_mm512_loadu_ps(xp.add(16 * v))),
                        av,
                    );
                    if m != 0 {
                        max = *xp.add(16 * v + m.trailing_zeros() as usize);
                        break;
                    }
                }
                let iscale = -127.0 / max;
                let is = _mm512_set1_ps(iscale);
                let top = _mm512_set1_epi32(127);
                for (v, s) in s16.iter_mut().enumerate().take(nv) {
                    let t = _mm512_mul_ps(is, _mm512_loadu_ps(xp.add(16 * v)));
                    let i = _mm512_min_epi32(_mm512_cvtps_epi32(t), top);
                    _mm_storeu_si128(qp.add(16 * v).cast(), _mm512_cvtepi32_epi8(i));
                    *s = _mm512_reduce_add_epi32(i);
                }
                o.scale[b] = 1.0 / iscale;
            }
        } else {
            let d = amax / 127.0;
            let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            for (v, s) in s16.iter_mut().enumerate().take(nv) {
                let t = _mm512_mul_ps(_mm512_loadu_ps(xp.add(16 * v)), id);
                let c = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(t), sign), half);
                let r = _mm512_add_ps(t, _mm512_castsi512_ps(c));
                let i = _mm512_cvttps_epi32(r);
                _mm_storeu_si128(qp.add(16 * v).cast(), _mm512_cvtepi32_epi8(i));
                *s = _mm512_reduce_add_epi32(i);
            }
            o.scale[b] = f16::from_f32(d).to_f32();
        }
        sums(&mut o, spec, b * nv, &s16[..nv]);
    }
}

/// Horizontal max of 8 lanes.
#[inline(always)]
unsafe fn hmax256(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    _mm_cvtss_f32(m)
}

/// Horizontal sum of 8 i32 lanes.
#[inline(always)]
unsafe fn hsum256(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Store 16 i32 lanes (two vectors, values within i8) as 16 bytes.
#[inline(always)]
unsafe fn store16(p: *mut i8, a: __m256i, b: __m256i) {
    let w = _mm256_packs_epi32(a, b); // [a0..3 b0..3 | a4..7 b4..7] as i16
    let w = _mm256_permute4x64_epi64(w, 0b11_01_10_00); // [a0..7 | b0..7]
    let bytes = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(p.cast(), bytes);
}

/// One row, AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn row_avx2(x: &[f32], mut o: RowOut<'_>, spec: ActSpec) {
    let bl = if spec.k_quant { 256 } else { 32 };
    let nv = bl / 8;
    let mut s16 = [0i32; 16];
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let half = _mm256_set1_ps(HALF_DOWN);
    for b in 0..x.len() / bl {
        let xp = x.as_ptr().add(b * bl);
        let qp = o.q.as_mut_ptr().add(b * bl);
        let mut amax = _mm256_setzero_ps();
        for v in 0..nv {
            amax = _mm256_max_ps(amax, _mm256_and_ps(abs, _mm256_loadu_ps(xp.add(8 * v))));
        }
        let amax = hmax256(amax);
        // Per 16 values: quantize two vectors, store, sum.
        let mut quant16 = |v2: usize, f: &dyn Fn(__m256) -> __m256i| {
            let i0 = f(_mm256_loadu_ps(xp.add(16 * v2)));
            let i1 = f(_mm256_loadu_ps(xp.add(16 * v2 + 8)));
            store16(qp.add(16 * v2), i0, i1);
            s16[v2] = hsum256(_mm256_add_epi32(i0, i1));
        };
        if spec.k_quant {
            if amax == 0.0 {
                std::ptr::write_bytes(qp, 0, bl);
                o.scale[b] = 0.0;
                s16[..bl / 16].fill(0);
            } else {
                let max = *std::slice::from_raw_parts(xp, bl)
                    .iter()
                    .find(|v| v.abs() == amax)
                    .expect("amax is attained");
                let iscale = -127.0 / max;
                let is = _mm256_set1_ps(iscale);
                let top = _mm256_set1_epi32(127);
                for v2 in 0..bl / 16 {
                    quant16(v2, &|x| {
                        _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(is, x)), top)
                    });
                }
                o.scale[b] = 1.0 / iscale;
            }
        } else {
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            for v2 in 0..bl / 16 {
                quant16(v2, &|x| {
                    let t = _mm256_mul_ps(x, id);
                    let c = _mm256_or_ps(_mm256_and_ps(t, sign), half);
                    _mm256_cvttps_epi32(_mm256_add_ps(t, c))
                });
            }
            o.scale[b] = f16::from_f32(d).to_f32();
        }
        sums(&mut o, spec, b * (bl / 16), &s16[..bl / 16]);
    }
}
