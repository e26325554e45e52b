//! The micro-kernels of the quantized GEMM ([`crate::qgemm`]) over one *slab* (`LANES`
//! consecutive weight rows): the generic ones over any [`Simd`], and the [`RunRows`] interface
//! through which a path brings its own (AArch64 i8mm's `smmla` kernels, `aarch64/i8mm.rs`).

use crate::act::Acts;
use crate::qlayout::QFormat;
use crate::simd::Simd;

/// One slab's operands.
pub(crate) struct Slab {
    /// Codes of unit `(nt, 0)`, advanced to this slab's lanes.
    pub codes: *const u8,
    /// Scales of unit `(nt, 0)`.
    pub scales: *const u8,
    /// This slab's first row within its 32-row tile.
    pub g_off: usize,
    /// K blocks.
    pub kb_n: usize,
    /// Output column `n0` of row 0.
    pub out: *mut f32,
    /// Output row stride.
    pub ldo: usize,
    /// Bias at `n0`, or null.
    pub bias: *const f32,
    /// Valid output columns of the slab.
    pub nvalid: usize,
}

/// The micro-kernels of one path.
pub(crate) trait RunRows {
    /// Compute rows `m0..` of the slab (at most `left`); return how many were done.
    unsafe fn run(fmt: QFormat, sl: &Slab, a: &Acts, m0: usize, left: usize) -> usize;
}

/// The generic micro-kernels over `S` ([`run_rows`]).
pub(crate) struct Generic<S>(std::marker::PhantomData<S>);

impl<S: Simd> RunRows for Generic<S> {
    #[inline(always)]
    unsafe fn run(fmt: QFormat, sl: &Slab, a: &Acts, m0: usize, left: usize) -> usize {
        run_rows::<S>(fmt, sl, a, m0, left)
    }
}

/// Run the largest micro-kernel that fits `left` rows; returns the rows done.
#[inline(always)]
unsafe fn run_rows<S: Simd>(fmt: QFormat, sl: &Slab, a: &Acts, m0: usize, left: usize) -> usize {
    macro_rules! go {
        ($mr:literal) => {{
            match fmt {
                QFormat::Q4_0 => k_b32::<S, $mr, false>(sl, a, m0),
                QFormat::Q8_0 => k_b32::<S, $mr, true>(sl, a, m0),
                QFormat::Q4K => k_q4k::<S, $mr>(sl, a, m0),
                QFormat::Q6K => k_q6k::<S, $mr>(sl, a, m0),
            }
            $mr
        }};
    }
    let wide = S::LANES >= 16;
    // Taller kernels (12, 16 rows) measured slower: they spill the 8 code vectors.
    if wide && left >= 8 {
        go!(8)
    } else if left >= 4 {
        go!(4)
    } else if left >= 2 {
        go!(2)
    } else {
        go!(1)
    }
}

/// Store `MR` rows of one slab (plus bias).
#[inline(always)]
unsafe fn store_rows<S: Simd, const MR: usize>(sl: &Slab, acc: &[S::F; MR], m0: usize) {
    for (i, &v) in acc.iter().enumerate() {
        let v = if sl.bias.is_null() {
            v
        } else {
            S::fadd(v, S::load_f32(sl.bias))
        };
        S::store(sl.out.add((m0 + i) * sl.ldo), v, sl.nvalid);
    }
}

/// Q4_0 (`Q8 = false`: nibble codes, offset 8) and Q8_0 (`Q8 = true`: int8 codes) against Q8_0
/// activations.
#[inline(always)]
unsafe fn k_b32<S: Simd, const MR: usize, const Q8: bool>(sl: &Slab, a: &Acts, m0: usize) {
    let mut acc = [S::fzero(); MR];
    let kb_n = sl.kb_n;
    let tb = if Q8 { 1024 } else { 512 };
    // Group-major activations: rows m0.. of block kb start at (kb * m + m0).
    let mut x = a.q.as_ptr().add(m0 * 32);
    let mut off = a.off.as_ptr().add(m0);
    let mut sc = a.scale.as_ptr().add(m0);
    let mut t = sl.codes;
    let mut d = sl.scales.cast::<u16>().add(sl.g_off);
    for _ in 0..kb_n {
        let dw = S::load_f16(d);
        if Q8 {
            let mut w = [S::prep_s8(S::izero()); 8];
            for (j, wj) in w.iter_mut().enumerate() {
                *wj = S::prep_s8(S::iload(t.add(j * 128)));
            }
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let mut ia = S::isplat(off.add(i));
                for (j, &wj) in w.iter().enumerate() {
                    ia = S::dot4_s8(ia, wj, x.add(32 * i + 4 * j));
                }
                *acc_i = S::fma(S::itof(ia), S::fmul(dw, S::fsplat(sc.add(i))), *acc_i);
            }
        } else {
            let mut w = [S::izero(); 8];
            for p in 0..4 {
                let v = S::iload(t.add(p * 128));
                w[2 * p] = S::nib_lo(v);
                w[2 * p + 1] = S::nib_hi(v);
            }
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let mut ia = S::isplat(off.add(i));
                for (j, &wj) in w.iter().enumerate() {
                    ia = S::dot4(ia, wj, x.add(32 * i + 4 * j));
                }
                *acc_i = S::fma(S::itof(ia), S::fmul(dw, S::fsplat(sc.add(i))), *acc_i);
            }
        }
        x = x.add(a.m * 32);
        off = off.add(a.m);
        sc = sc.add(a.m);
        t = t.add(tb);
        d = d.add(32);
    }
    store_rows::<S, MR>(sl, &acc, m0);
}

/// Q4_K against Q8_K activations: per 32-value sub-block `d sc_j sum(c q) - dmin m_j sum(q)`,
/// summed over the super-block, times the activation scale.
#[inline(always)]
unsafe fn k_q4k<S: Simd, const MR: usize>(sl: &Slab, a: &Acts, m0: usize) {
    let mut acc = [S::fzero(); MR];
    let kb_n = sl.kb_n;
    let (q, fsum, sc) = (a.q.as_ptr(), a.fsum.as_ptr(), a.scale.as_ptr());
    let m = a.m;
    for sb in 0..kb_n {
        let c = sl.codes.add(sb * 4096);
        let s = sl.scales.add(sb * 640);
        let d = S::load_f16(s.cast::<u16>().add(sl.g_off));
        let dmin = S::load_f16(s.add(64).cast::<u16>().add(sl.g_off));
        let mut sacc = [S::fzero(); MR];
        for j in 0..8 {
            let t = c.add(j * 512);
            let mut w = [S::izero(); 8];
            for p in 0..4 {
                let v = S::iload(t.add(p * 128));
                w[2 * p] = S::nib_lo(v);
                w[2 * p + 1] = S::nib_hi(v);
            }
            let ws = S::fmul(d, S::load_u8(s.add(128 + j * 32 + sl.g_off)));
            let wm = S::fmul(dmin, S::load_u8(s.add(384 + j * 32 + sl.g_off)));
            // Block b = 8 sb + j of rows m0.. (group-major activations).
            let b = (sb * 8 + j) * m + m0;
            let (x, fs) = (q.add(b * 32), fsum.add(b));
            for (i, sacc_i) in sacc.iter_mut().enumerate() {
                let mut ia = S::izero();
                for (t, &wt) in w.iter().enumerate() {
                    ia = S::dot4(ia, wt, x.add(32 * i + 4 * t));
                }
                let v = S::fma(S::itof(ia), ws, *sacc_i);
                *sacc_i = S::fnma(wm, S::fsplat(fs.add(i)), v);
            }
        }
        for (i, acc_i) in acc.iter_mut().enumerate() {
            *acc_i = S::fma(sacc[i], S::fsplat(sc.add(sb * m + m0 + i)), *acc_i);
        }
    }
    store_rows::<S, MR>(sl, &acc, m0);
}

/// Q6_K against Q8_K activations: per 16-value sub-block `d sc_j sum((c - 32) q)`.
#[inline(always)]
unsafe fn k_q6k<S: Simd, const MR: usize>(sl: &Slab, a: &Acts, m0: usize) {
    let mut acc = [S::fzero(); MR];
    let kb_n = sl.kb_n;
    let (q, off, sc) = (a.q.as_ptr(), a.off.as_ptr(), a.scale.as_ptr());
    let m = a.m;
    for sb in 0..kb_n {
        let c = sl.codes.add(sb * 8192);
        let s = sl.scales.add(sb * 576);
        let d = S::load_f16(s.cast::<u16>().add(sl.g_off));
        let mut sacc = [S::fzero(); MR];
        for j in 0..8 {
            let t = c.add(j * 1024);
            let mut w = [S::izero(); 8];
            for (qq, wq) in w.iter_mut().enumerate() {
                *wq = S::iload(t.add(qq * 128));
            }
            let ws_a = S::fmul(d, S::load_i8(s.add(64 + 2 * j * 32 + sl.g_off).cast()));
            let ws_b = S::fmul(
                d,
                S::load_i8(s.add(64 + (2 * j + 1) * 32 + sl.g_off).cast()),
            );
            // Block 8 sb + j and its two 16-value groups, rows m0.. (group-major activations).
            let xb = q.add(((sb * 8 + j) * m + m0) * 32);
            let oa = off.add((sb * 16 + 2 * j) * m + m0);
            let ob = off.add((sb * 16 + 2 * j + 1) * m + m0);
            for (i, sacc_i) in sacc.iter_mut().enumerate() {
                let x = xb.add(32 * i);
                let mut ia = S::isplat(oa.add(i));
                let mut ib = S::isplat(ob.add(i));
                for t in 0..4 {
                    ia = S::dot4(ia, w[t], x.add(4 * t));
                    ib = S::dot4(ib, w[4 + t], x.add(16 + 4 * t));
                }
                let v = S::fma(S::itof(ia), ws_a, *sacc_i);
                *sacc_i = S::fma(S::itof(ib), ws_b, v);
            }
        }
        for (i, acc_i) in acc.iter_mut().enumerate() {
            *acc_i = S::fma(sacc[i], S::fsplat(sc.add(sb * m + m0 + i)), *acc_i);
        }
    }
    store_rows::<S, MR>(sl, &acc, m0);
}
