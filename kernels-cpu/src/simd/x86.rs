//! x86-64 paths: AVX2 (8 lanes) and AVX-512 (16 lanes), each with or without VNNI.
//!
//! Without VNNI the unsigned x signed byte dot is `vpmaddubsw` (pairs to saturating i16) then
//! `vpmaddwd` by ones (to i32); the kernels only feed it codes of at most 6 bits against int8
//! activations, whose pair sums (|2 * 63 * 128| < 2^15) never saturate. With VNNI it is one
//! `vpdpbusd`, whose signed operand the compiler folds into a broadcast memory load.

use std::arch::x86_64::*;

use super::Simd;

/// AVX2 + FMA + F16C; `VNNI` adds AVX-VNNI's 256-bit `vpdpbusd`.
#[derive(Clone, Copy)]
pub(crate) struct V256<const VNNI: bool>;

/// AVX-512 F/BW/VL; `VNNI` adds AVX512-VNNI's `vpdpbusd`.
#[derive(Clone, Copy)]
pub(crate) struct V512<const VNNI: bool>;

impl<const VNNI: bool> Simd for V256<VNNI> {
    const LANES: usize = 8;
    type I = __m256i;
    type F = __m256;

    #[inline(always)]
    unsafe fn izero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn isplat(p: *const i32) -> __m256i {
        _mm256_set1_epi32(p.read())
    }
    #[inline(always)]
    unsafe fn iload(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.cast())
    }
    #[inline(always)]
    unsafe fn nib_lo(v: __m256i) -> __m256i {
        _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
    }
    #[inline(always)]
    unsafe fn nib_hi(v: __m256i) -> __m256i {
        _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f))
    }
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, w: __m256i, x: *const i8) -> __m256i {
        let xb = _mm256_set1_epi32(x.cast::<i32>().read_unaligned());
        if VNNI {
            _mm256_dpbusd_avx_epi32(acc, w, xb)
        } else {
            let pairs = _mm256_maddubs_epi16(w, xb);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    type W = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn prep_s8(w: __m256i) -> Self::W {
        if VNNI {
            (_mm256_xor_si256(w, _mm256_set1_epi8(-128)), w)
        } else {
            (_mm256_abs_epi8(w), w)
        }
    }
    #[inline(always)]
    unsafe fn dot4_s8(acc: __m256i, w: Self::W, x: *const i8) -> __m256i {
        let xb = _mm256_set1_epi32(x.cast::<i32>().read_unaligned());
        if VNNI {
            _mm256_dpbusd_avx_epi32(acc, w.0, xb)
        } else {
            // |w| * (x with w's sign): pair sums stay within 2 * 128 * 127 < 2^15.
            let pairs = _mm256_maddubs_epi16(w.0, _mm256_sign_epi8(xb, w.1));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn itof(v: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(v)
    }
    #[inline(always)]
    unsafe fn fzero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn fsplat(p: *const f32) -> __m256 {
        _mm256_broadcast_ss(&*p)
    }
    #[inline(always)]
    unsafe fn fadd(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> __m256 {
        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())))
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())))
    }
    #[inline(always)]
    unsafe fn splat_pair(p: *const f32) -> __m256 {
        _mm256_castpd_ps(_mm256_set1_pd(p.cast::<f64>().read_unaligned()))
    }
    #[inline(always)]
    unsafe fn pair_sum(a: __m256, b: __m256) -> __m256 {
        // hadd interleaves 128-bit halves: [a01 a23 b01 b23 | a45 a67 b45 b67].
        let h = _mm256_hadd_ps(a, b);
        _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(h), 0b11_01_10_00))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256, n: usize) {
        if n >= 8 {
            _mm256_storeu_ps(p, v);
        } else {
            let mut t = [0f32; 8];
            _mm256_storeu_ps(t.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(t.as_ptr(), p, n);
        }
    }
}

impl<const VNNI: bool> Simd for V512<VNNI> {
    const LANES: usize = 16;
    type I = __m512i;
    type F = __m512;

    #[inline(always)]
    unsafe fn izero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn isplat(p: *const i32) -> __m512i {
        _mm512_set1_epi32(p.read())
    }
    #[inline(always)]
    unsafe fn iload(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p.cast())
    }
    #[inline(always)]
    unsafe fn nib_lo(v: __m512i) -> __m512i {
        _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
    }
    #[inline(always)]
    unsafe fn nib_hi(v: __m512i) -> __m512i {
        _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f))
    }
    #[inline(always)]
    unsafe fn dot4(acc: __m512i, w: __m512i, x: *const i8) -> __m512i {
        let xb = _mm512_set1_epi32(x.cast::<i32>().read_unaligned());
        if VNNI {
            _mm512_dpbusd_epi32(acc, w, xb)
        } else {
            let pairs = _mm512_maddubs_epi16(w, xb);
            _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
        }
    }
    type W = (__m512i, __mmask64);
    #[inline(always)]
    unsafe fn prep_s8(w: __m512i) -> Self::W {
        if VNNI {
            (_mm512_xor_si512(w, _mm512_set1_epi8(-128)), 0)
        } else {
            (_mm512_abs_epi8(w), _mm512_movepi8_mask(w))
        }
    }
    #[inline(always)]
    unsafe fn dot4_s8(acc: __m512i, w: Self::W, x: *const i8) -> __m512i {
        let xb = _mm512_set1_epi32(x.cast::<i32>().read_unaligned());
        if VNNI {
            _mm512_dpbusd_epi32(acc, w.0, xb)
        } else {
            // Negate x where w < 0 (where w == 0, |w| = 0 cancels x anyway).
            let sx = _mm512_mask_sub_epi8(xb, w.1, _mm512_setzero_si512(), xb);
            let pairs = _mm512_maddubs_epi16(w.0, sx);
            _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn itof(v: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(v)
    }
    #[inline(always)]
    unsafe fn fzero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn fsplat(p: *const f32) -> __m512 {
        _mm512_set1_ps(p.read())
    }
    #[inline(always)]
    unsafe fn fadd(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> __m512 {
        let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())))
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())))
    }
    #[inline(always)]
    unsafe fn splat_pair(p: *const f32) -> __m512 {
        _mm512_castpd_ps(_mm512_set1_pd(p.cast::<f64>().read_unaligned()))
    }
    #[inline(always)]
    unsafe fn pair_sum(a: __m512, b: __m512) -> __m512 {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        _mm512_add_ps(
            _mm512_permutex2var_ps(a, even, b),
            _mm512_permutex2var_ps(a, odd, b),
        )
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512, n: usize) {
        if n >= 16 {
            _mm512_storeu_ps(p, v);
        } else {
            _mm512_mask_storeu_ps(p, ((1u32 << n) - 1) as __mmask16, v);
        }
    }
}
