//! The exponential the kernels share: Cody-Waite range reduction `x = n ln2 + r`, Cephes'
//! degree-6 polynomial for `e^r` (relative error about 1e-7), scaled by `2^n` through the
//! exponent bits. Branch-free plain f32 operations, so a loop over it vectorises and gives the
//! same bits on every target, SIMD width and thread count (the C library's `expf` promises
//! neither).

/// `e^x` for `x` clamped to `[-87, hi]`, `hi <= 88` (no overflow, no subnormal scale).
#[inline(always)]
pub(crate) fn exp_clamped(x: f32, hi: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.clamp(-87.0, hi);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    e * f32::from_bits(((ni + 127) as u32) << 23)
}
