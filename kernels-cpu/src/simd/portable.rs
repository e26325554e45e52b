//! The portable path: 8-lane arrays and plain loops (the compiler vectorises them for the
//! target's baseline). Without hardware FMA, `fma` is a multiply then an add.

use super::Simd;

/// Eight lanes of plain Rust.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

const L: usize = 8;

impl Simd for Portable {
    const LANES: usize = L;
    type I = [i32; L];
    type F = [f32; L];

    #[inline(always)]
    unsafe fn izero() -> Self::I {
        [0; L]
    }
    #[inline(always)]
    unsafe fn isplat(p: *const i32) -> Self::I {
        [p.read(); L]
    }
    #[inline(always)]
    unsafe fn iload(p: *const u8) -> Self::I {
        let mut v = [0i32; L];
        for (l, x) in v.iter_mut().enumerate() {
            *x = i32::from_le_bytes(p.add(4 * l).cast::<[u8; 4]>().read());
        }
        v
    }
    #[inline(always)]
    unsafe fn nib_lo(v: Self::I) -> Self::I {
        v.map(|x| x & 0x0f0f_0f0f)
    }
    #[inline(always)]
    unsafe fn nib_hi(v: Self::I) -> Self::I {
        v.map(|x| ((x as u32 >> 4) & 0x0f0f_0f0f) as i32)
    }
    #[inline(always)]
    unsafe fn dot4(acc: Self::I, w: Self::I, x: *const i8) -> Self::I {
        let x = x.cast::<[i8; 4]>().read();
        let mut out = acc;
        for l in 0..L {
            let b = w[l].to_le_bytes();
            for j in 0..4 {
                out[l] += b[j] as i32 * x[j] as i32;
            }
        }
        out
    }
    type W = [i32; L];
    #[inline(always)]
    unsafe fn prep_s8(w: Self::I) -> Self::W {
        w
    }
    #[inline(always)]
    unsafe fn dot4_s8(acc: Self::I, w: Self::W, x: *const i8) -> Self::I {
        let x = x.cast::<[i8; 4]>().read();
        let mut out = acc;
        for l in 0..L {
            let b = w[l].to_le_bytes();
            for j in 0..4 {
                out[l] += b[j] as i8 as i32 * x[j] as i32;
            }
        }
        out
    }
    #[inline(always)]
    unsafe fn itof(v: Self::I) -> Self::F {
        v.map(|x| x as f32)
    }
    #[inline(always)]
    unsafe fn fzero() -> Self::F {
        [0.0; L]
    }
    #[inline(always)]
    unsafe fn fsplat(p: *const f32) -> Self::F {
        [p.read(); L]
    }
    #[inline(always)]
    unsafe fn fadd(a: Self::F, b: Self::F) -> Self::F {
        std::array::from_fn(|l| a[l] + b[l])
    }
    #[inline(always)]
    unsafe fn fmul(a: Self::F, b: Self::F) -> Self::F {
        std::array::from_fn(|l| a[l] * b[l])
    }
    #[inline(always)]
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        std::array::from_fn(|l| a[l] * b[l] + c[l])
    }
    #[inline(always)]
    unsafe fn fnma(a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        std::array::from_fn(|l| c[l] - a[l] * b[l])
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> Self::F {
        p.cast::<[f32; L]>().read_unaligned()
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::F {
        p.cast::<[u16; L]>()
            .read_unaligned()
            .map(|h| half::f16::from_bits(h).to_f32())
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::F {
        p.cast::<[u16; L]>()
            .read_unaligned()
            .map(|h| f32::from_bits((h as u32) << 16))
    }
    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> Self::F {
        p.cast::<[u8; L]>().read().map(|b| b as f32)
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self::F {
        p.cast::<[i8; L]>().read().map(|b| b as f32)
    }
    #[inline(always)]
    unsafe fn splat_pair(p: *const f32) -> Self::F {
        let (a, b) = (p.read_unaligned(), p.add(1).read_unaligned());
        std::array::from_fn(|l| if l % 2 == 0 { a } else { b })
    }
    #[inline(always)]
    unsafe fn pair_sum(a: Self::F, b: Self::F) -> Self::F {
        std::array::from_fn(|l| {
            let src = if l < L / 2 { &a } else { &b };
            let i = 2 * (l % (L / 2));
            src[i] + src[i + 1]
        })
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::F, n: usize) {
        for (l, x) in v.iter().enumerate().take(n) {
            p.add(l).write_unaligned(*x);
        }
    }
}
