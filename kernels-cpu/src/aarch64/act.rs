//! The activation quantizer for AArch64 NEON, bit-identical to the portable one in
//! [`crate::act`]: Q8_0 rounds half away from zero with `fcvtas` (exactly `roundf`), Q8_K half
//! to even with `fcvtns` (ggml's `nearest_int`); both narrow with saturation as Rust's `as i8`
//! does. The block maximum uses `fmaxnm`, which ignores NaN as `f32::max` does.

use std::arch::aarch64::*;

use half::f16;

use crate::act_row::{sums, ActSpec, RowOut};

/// Store 16 i32 lanes (four vectors) as 16 saturated bytes; returns their sum.
#[inline(always)]
unsafe fn narrow16(p: *mut i8, v: [int32x4_t; 4]) -> i32 {
    let lo = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
    let hi = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
    let b = vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
    vst1q_s8(p, b);
    vaddlvq_s8(b) as i32
}

/// One row, NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn row_neon(x: &[f32], mut o: RowOut<'_>, spec: ActSpec) {
    let bl = if spec.k_quant { 256 } else { 32 };
    let nv = bl / 4;
    let mut s16 = [0i32; 16];
    for b in 0..x.len() / bl {
        let xp = x.as_ptr().add(b * bl);
        let qp = o.q.as_mut_ptr().add(b * bl);
        let mut amax = vdupq_n_f32(0.0);
        for v in 0..nv {
            amax = vmaxnmq_f32(amax, vabsq_f32(vld1q_f32(xp.add(4 * v))));
        }
        let amax = vmaxnmvq_f32(amax);
        let load4 = |v16: usize| -> [float32x4_t; 4] {
            std::array::from_fn(|i| vld1q_f32(xp.add(16 * v16 + 4 * i)))
        };
        if spec.k_quant {
            if amax == 0.0 {
                std::ptr::write_bytes(qp, 0, bl);
                o.scale[b] = 0.0;
                s16[..bl / 16].fill(0);
            } else {
                // The first value of largest magnitude, with its sign.
                let max = *std::slice::from_raw_parts(xp, bl)
                    .iter()
                    .find(|v| v.abs() == amax)
                    .expect("amax is attained");
                let iscale = -127.0 / max;
                let (is, top) = (vdupq_n_f32(iscale), vdupq_n_s32(127));
                for (v16, s) in s16.iter_mut().enumerate().take(bl / 16) {
                    let i = load4(v16).map(|t| vminq_s32(vcvtnq_s32_f32(vmulq_f32(is, t)), top));
                    *s = narrow16(qp.add(16 * v16), i);
                }
                o.scale[b] = 1.0 / iscale;
            }
        } else {
            let d = amax / 127.0;
            let id = vdupq_n_f32(if d != 0.0 { 1.0 / d } else { 0.0 });
            for (v16, s) in s16.iter_mut().enumerate().take(bl / 16) {
                let i = load4(v16).map(|t| vcvtaq_s32_f32(vmulq_f32(t, id)));
                *s = narrow16(qp.add(16 * v16), i);
            }
            o.scale[b] = f16::from_f32(d).to_f32();
        }
        sums(&mut o, spec, b * (bl / 16), &s16[..bl / 16]);
    }
}
