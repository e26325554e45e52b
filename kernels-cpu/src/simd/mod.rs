//! The vector abstraction every kernel is written against, and its implementations.
//!
//! A kernel is an `#[inline(always)]` generic function over [`Simd`]; each ISA gets one
//! `#[target_feature]` entry point that instantiates it, so the intrinsics inline into code
//! compiled for that ISA. Lanes are 32-bit (`i32` or `f32`); an integer vector is also read as
//! `4 * LANES` bytes, lane `l` holding bytes `4l..4l+4`, which is the operand shape of
//! `vpdpbusd` and of the NPU's Q4_0 tiles (four consecutive codes of one row per lane).

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod portable;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// One SIMD instruction set, seen through the operations the kernels need.
///
/// # Safety
/// Every method is `unsafe`: callers guarantee the CPU supports the ISA (the entry points check
/// [`crate::Isa::is_available`]) and that pointers are valid for the bytes read or written.
pub(crate) trait Simd: Copy {
    /// 32-bit lanes per vector.
    const LANES: usize;
    /// Integer vector (`LANES` x i32, or `4 * LANES` bytes).
    type I: Copy;
    /// Float vector (`LANES` x f32).
    type F: Copy;

    /// All zero.
    unsafe fn izero() -> Self::I;
    /// Every lane `*p`.
    unsafe fn isplat(p: *const i32) -> Self::I;
    /// `4 * LANES` bytes from `p` (unaligned).
    unsafe fn iload(p: *const u8) -> Self::I;
    /// Low nibble of every byte.
    unsafe fn nib_lo(v: Self::I) -> Self::I;
    /// High nibble of every byte.
    unsafe fn nib_hi(v: Self::I) -> Self::I;
    /// `acc[l] + sum_j w.u8[4l + j] * x.i8[j]` for the four signed bytes at `x`. The unsigned
    /// bytes of `w` must be at most 127 unless the ISA has a native unsigned x signed dot
    /// (`vpmaddubsw` saturates 16-bit pair sums; codes of 4 and 6 bits are safe everywhere).
    unsafe fn dot4(acc: Self::I, w: Self::I, x: *const i8) -> Self::I;
    /// Signed weight bytes prepared once (per weight vector) for [`Simd::dot4_s8`].
    type W: Copy;
    /// Prepare signed weight bytes: with VNNI biased by 128 into unsigned bytes, otherwise
    /// split into magnitudes and signs.
    unsafe fn prep_s8(w: Self::I) -> Self::W;
    /// `acc[l] + sum_j w.i8[4l + j] * x.i8[j]`, plus `128 * sum_j x.i8[j]` on the VNNI paths
    /// (whose callers start `acc` at `-128 * sum(x)`; see `qgemm::s8_biased`). `x` must not
    /// hold -128.
    unsafe fn dot4_s8(acc: Self::I, w: Self::W, x: *const i8) -> Self::I;
    /// Convert lanes to f32.
    unsafe fn itof(v: Self::I) -> Self::F;

    /// All zero.
    unsafe fn fzero() -> Self::F;
    /// Every lane `*p`.
    unsafe fn fsplat(p: *const f32) -> Self::F;
    /// `a + b`.
    unsafe fn fadd(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b`.
    unsafe fn fmul(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c` (fused where the ISA has FMA).
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c - a * b` (fused where the ISA has FMA).
    unsafe fn fnma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `LANES` f32.
    unsafe fn load_f32(p: *const f32) -> Self::F;
    /// `LANES` IEEE halves, widened.
    unsafe fn load_f16(p: *const u16) -> Self::F;
    /// `LANES` bfloat16, widened.
    unsafe fn load_bf16(p: *const u16) -> Self::F;
    /// `LANES` unsigned bytes, converted.
    unsafe fn load_u8(p: *const u8) -> Self::F;
    /// `LANES` signed bytes, converted.
    unsafe fn load_i8(p: *const i8) -> Self::F;
    /// Lanes `p[0], p[1], p[0], p[1], ...`.
    unsafe fn splat_pair(p: *const f32) -> Self::F;
    /// With `a = [s0k0, s0k1, s1k0, s1k1, ...]` over the first `LANES / 2` outputs and `b` the
    /// same over the next ones: `[s0k0 + s0k1, s1k0 + s1k1, ...]` for all `LANES` outputs.
    unsafe fn pair_sum(a: Self::F, b: Self::F) -> Self::F;
    /// Store the first `n <= LANES` lanes.
    unsafe fn store(p: *mut f32, v: Self::F, n: usize);
}
