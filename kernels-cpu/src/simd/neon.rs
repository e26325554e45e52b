//! AArch64 paths: Advanced SIMD (NEON, 4 lanes of 128-bit vectors), with or without the
//! dot-product extension.
//!
//! Without it, the unsigned x signed byte dot of one lane is `smull`/`smull2` (byte products to
//! i16), `addp` (pairs to i16) and `sadalp` (pairs again, widened into the i32 accumulator). The
//! codes it is fed are at most 127 in magnitude against activations in -127..=127, so a pair sum
//! is at most 2 * 128 * 127 < 2^15 and the i16 stage never wraps; int8 weights need no bias.
//! With dotprod it is one `sdot` by element (the four activation bytes in lane 0). `sdot` has
//! no stable intrinsic in Rust 1.96 (`vdotq_s32` is unstable), so it is written with `asm!` inside
//! the `#[target_feature(enable = "dotprod")]` entry points this code is inlined into.
//!
//! Half weights are widened with `fcvtl` (half-precision conversion is part of every AArch64
//! NEON unit, Armv8.0), through `asm!` because Rust's `float16x4_t` is unstable.
//! `fma`/`fnma` are the fused `fmla`/`fmls`, as on x86, so every aarch64 path computes the same
//! bits as the x86 paths for the same operations in the same order.

use std::arch::aarch64::*;
use std::arch::asm;

use super::Simd;

/// NEON; `DOT` adds FEAT_DotProd's `sdot`.
#[derive(Clone, Copy)]
pub(crate) struct Neon<const DOT: bool>;

/// `acc[l] + sum_j w[4l + j] * x[j]` for the four signed bytes at `x`: one `sdot` by element.
/// The bytes travel as the bits of an `f32` so that the compiler loads them with `ldr s` (which
/// takes an immediate offset) straight into the register the indexed `sdot` reads.
///
/// # Safety
/// The CPU runs FEAT_DotProd (the caller is compiled with `target_feature(enable = "dotprod")`).
#[inline(always)]
unsafe fn sdot_bcast(acc: int32x4_t, w: int8x16_t, x: *const i8) -> int32x4_t {
    let x4 = x.cast::<f32>().read_unaligned();
    let mut acc = acc;
    asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[0]",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        x = in(vreg) x4,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// The same dot without the extension: `smull` + `smull2` + `addp` + `sadalp`.
#[inline(always)]
unsafe fn dot_widening(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    let hi = vmull_high_s8(w, x);
    vpadalq_s16(acc, vpaddq_s16(lo, hi))
}

/// Four activation bytes at `x` in every lane.
#[inline(always)]
unsafe fn bcast4(x: *const i8) -> int8x16_t {
    vreinterpretq_s8_u32(vdupq_n_u32(x.cast::<u32>().read_unaligned()))
}

impl<const DOT: bool> Simd for Neon<DOT> {
    const LANES: usize = 4;
    type I = int32x4_t;
    type F = float32x4_t;

    #[inline(always)]
    unsafe fn izero() -> int32x4_t {
        vdupq_n_s32(0)
    }
    #[inline(always)]
    unsafe fn isplat(p: *const i32) -> int32x4_t {
        vdupq_n_s32(p.read())
    }
    #[inline(always)]
    unsafe fn iload(p: *const u8) -> int32x4_t {
        vreinterpretq_s32_u8(vld1q_u8(p))
    }
    #[inline(always)]
    unsafe fn nib_lo(v: int32x4_t) -> int32x4_t {
        vreinterpretq_s32_u8(vandq_u8(vreinterpretq_u8_s32(v), vdupq_n_u8(0x0f)))
    }
    #[inline(always)]
    unsafe fn nib_hi(v: int32x4_t) -> int32x4_t {
        vreinterpretq_s32_u8(vshrq_n_u8::<4>(vreinterpretq_u8_s32(v)))
    }
    #[inline(always)]
    unsafe fn dot4(acc: int32x4_t, w: int32x4_t, x: *const i8) -> int32x4_t {
        // Codes of at most 127 read the same as signed bytes.
        Self::dot4_s8(acc, vreinterpretq_s8_s32(w), x)
    }
    type W = int8x16_t;
    #[inline(always)]
    unsafe fn prep_s8(w: int32x4_t) -> int8x16_t {
        vreinterpretq_s8_s32(w)
    }
    #[inline(always)]
    unsafe fn dot4_s8(acc: int32x4_t, w: int8x16_t, x: *const i8) -> int32x4_t {
        if DOT {
            sdot_bcast(acc, w, x)
        } else {
            dot_widening(acc, w, bcast4(x))
        }
    }
    #[inline(always)]
    unsafe fn itof(v: int32x4_t) -> float32x4_t {
        vcvtq_f32_s32(v)
    }
    #[inline(always)]
    unsafe fn fzero() -> float32x4_t {
        vdupq_n_f32(0.0)
    }
    #[inline(always)]
    unsafe fn fsplat(p: *const f32) -> float32x4_t {
        vdupq_n_f32(p.read())
    }
    #[inline(always)]
    unsafe fn fadd(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        vaddq_f32(a, b)
    }
    #[inline(always)]
    unsafe fn fmul(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        vmulq_f32(a, b)
    }
    #[inline(always)]
    unsafe fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        vfmaq_f32(c, a, b)
    }
    #[inline(always)]
    unsafe fn fnma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        vfmsq_f32(c, a, b)
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> float32x4_t {
        vld1q_f32(p)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> float32x4_t {
        f16x4_to_f32(vld1_u16(p))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> float32x4_t {
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p)))
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> float32x4_t {
        let b = vreinterpret_u8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned()));
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))))
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> float32x4_t {
        let b = vreinterpret_s8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned()));
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(b))))
    }
    #[inline(always)]
    unsafe fn splat_pair(p: *const f32) -> float32x4_t {
        vreinterpretq_f32_u64(vdupq_n_u64(p.cast::<u64>().read_unaligned()))
    }
    #[inline(always)]
    unsafe fn pair_sum(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // faddp: [a0 + a1, a2 + a3, b0 + b1, b2 + b3].
        vpaddq_f32(a, b)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: float32x4_t, n: usize) {
        if n >= 4 {
            vst1q_f32(p, v);
        } else {
            let mut t = [0f32; 4];
            vst1q_f32(t.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(t.as_ptr(), p, n);
        }
    }
}

/// Four IEEE halves widened with `fcvtl`.
#[inline(always)]
pub(crate) unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    asm!(
        "fcvtl {out:v}.4s, {h:v}.4h",
        out = lateout(vreg) out,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}
