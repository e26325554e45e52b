//! Activations quantized once per matmul, in the two ggml schemes the weight formats pair with.
//!
//! - Q8_0 (for Q4_0 and Q8_0 weights): per 32 values, `d = amax / 127`, `q = round(x / d)`
//!   (ties away from zero), and the scale the dot product uses is `d` rounded to f16, exactly
//!   as ggml's `quantize_row_q8_0_ref`.
//! - Q8_K (for the K-quants): per 256 values, `iscale = -127 / max` where `max` is the value of
//!   largest magnitude, `q = nearest_int(iscale * x)` (ties to even), `d = 1 / iscale`, as
//!   ggml's `quantize_row_q8_K_ref`.
//!
//! Besides the int8 codes the kernels need per-group integer sums, which turn a weight code
//! offset into a constant: `sum (c - o) x = sum c x - o sum x`. They are precomputed here
//! (already multiplied by the offset) so the inner loops start their integer accumulator from
//! them.

use half::f16;
use rayon::prelude::*;

use crate::act_row::{ActSpec, RowOut};
use crate::isa::Isa;

/// Quantized activations: `m` rows of `k` int8 codes plus per-group scales and sums, stored
/// group-major (group `g` of every row, then group `g + 1`): a micro-kernel over rows
/// `m0..m0 + MR` finds their codes, scales and sums for one group at one address plus constant
/// offsets, and advances every array by a constant stride per group.
#[derive(Debug, Default)]
pub(crate) struct Acts {
    /// Rows.
    pub m: usize,
    /// Values per row.
    pub k: usize,
    /// Codes: value `32 b + j` of row `r` at `(b * m + r) * 32 + j`.
    pub q: Vec<i8>,
    /// Scale of group `g` (32 values for Q8_0, 256 for Q8_K) of row `r` at `g * m + r`.
    pub scale: Vec<f32>,
    /// `-offset * sum(q)` of `off_group`-value group `g` of row `r` at `g * m + r`.
    pub off: Vec<i32>,
    /// `sum(q)` as f32 of 32-value block `b` of row `r` at `b * m + r` (the Q4_K min term),
    /// when asked for.
    pub fsum: Vec<f32>,
}

/// Rows per parallel task when quantizing.
const ROWS_PER_TASK: usize = 8;

/// Raw row pointers into the output arrays, shared by tasks that each write whole rows.
#[derive(Clone, Copy)]
struct Rows {
    q: *mut i8,
    scale: *mut f32,
    off: *mut i32,
    fsum: *mut f32,
}
// SAFETY: every task writes the rows it was given and nothing else.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

type RowFn = unsafe fn(&[f32], RowOut<'_>, ActSpec);

/// The row quantizer for `isa` (all bit-identical).
fn row_fn(isa: Isa) -> RowFn {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => crate::act_x86::row_avx2,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => crate::act_x86::row_avx512,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonDotprod | Isa::NeonI8mm => crate::aarch64::act::row_neon,
        _ => row_portable,
    }
}

unsafe fn row_portable(x: &[f32], o: RowOut<'_>, spec: ActSpec) {
    quantize_row(x, o, spec)
}

/// Quantize `x` (`m` rows of `k`, `k` a multiple of the scheme's group) for `spec`, with the
/// row quantizer compiled for `isa` (which the caller has checked this CPU runs).
pub(crate) fn quantize(x: &[f32], m: usize, k: usize, spec: ActSpec, isa: Isa) -> Acts {
    let sg = spec.scale_group();
    let og = spec.off_group;
    debug_assert!(k.is_multiple_of(sg) && k.is_multiple_of(og) && x.len() == m * k);
    let fs_row = if spec.fsum { k / 32 } else { 0 };
    let mut a = Acts {
        m,
        k,
        q: vec![0; m * k],
        scale: vec![0.0; m * (k / sg)],
        off: vec![0; m * (k / og)],
        fsum: vec![0.0; m * fs_row],
    };
    let p = Rows {
        q: a.q.as_mut_ptr(),
        scale: a.scale.as_mut_ptr(),
        off: a.off.as_mut_ptr(),
        fsum: a.fsum.as_mut_ptr(),
    };
    let f = row_fn(isa);
    let row = |r: usize| {
        // Capture the whole (Sync) struct, not its raw-pointer fields one by one.
        #[allow(clippy::redundant_locals)]
        let p = p;
        // SAFETY: row `r` of each array is in bounds (sized above) and written by this call
        // only; `f` runs on an ISA the caller checked.
        unsafe {
            let o = RowOut {
                q: std::slice::from_raw_parts_mut(p.q.add(r * k), k),
                scale: std::slice::from_raw_parts_mut(p.scale.add(r * (k / sg)), k / sg),
                off: std::slice::from_raw_parts_mut(p.off.add(r * (k / og)), k / og),
                fsum: std::slice::from_raw_parts_mut(p.fsum.add(r * fs_row), fs_row),
            };
            f(&x[r * k..(r + 1) * k], o, spec)
        }
    };
    if rayon::current_num_threads() > 1 && m > ROWS_PER_TASK {
        (0..m)
            .into_par_iter()
            .with_min_len(ROWS_PER_TASK)
            .for_each(row);
    } else {
        (0..m).for_each(row);
    }
    group_major(a, m)
}

/// Re-lay row-major arrays (as the row quantizers write them) group-major (see [`Acts`]).
fn group_major(a: Acts, m: usize) -> Acts {
    fn t<T: Copy + Default>(v: &[T], m: usize, unit: usize) -> Vec<T> {
        if v.is_empty() {
            return Vec::new();
        }
        let groups = v.len() / m / unit;
        let mut out = vec![T::default(); v.len()];
        for (r, row) in v.chunks_exact(groups * unit).enumerate() {
            for (g, x) in row.chunks_exact(unit).enumerate() {
                out[(g * m + r) * unit..][..unit].copy_from_slice(x);
            }
        }
        out
    }
    Acts {
        m,
        k: a.k,
        q: t(&a.q, m, 32),
        scale: t(&a.scale, m, 1),
        off: t(&a.off, m, 1),
        fsum: t(&a.fsum, m, 1),
    }
}

/// Sum of int8 codes.
fn sum_i8(q: &[i8]) -> i32 {
    q.iter().map(|&v| v as i32).sum()
}

fn quantize_row(x: &[f32], o: RowOut<'_>, spec: ActSpec) {
    if spec.k_quant {
        for ((xb, qb), d) in x
            .chunks_exact(256)
            .zip(o.q.chunks_exact_mut(256))
            .zip(o.scale.iter_mut())
        {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            if amax == 0.0 {
                qb.fill(0);
                *d = 0.0;
                continue;
            }
            // ggml takes the first value of largest magnitude, with its sign.
            let max = *xb
                .iter()
                .find(|v| v.abs() == amax)
                .expect("amax is attained");
            let iscale = -127.0 / max;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            *d = 1.0 / iscale;
        }
    } else {
        for ((xb, qb), d) in x
            .chunks_exact(32)
            .zip(o.q.chunks_exact_mut(32))
            .zip(o.scale.iter_mut())
        {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let dd = amax / 127.0;
            let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = (v * id).round() as i8;
            }
            *d = f16::from_f32(dd).to_f32();
        }
    }
    for (off, g) in o.off.iter_mut().zip(o.q.chunks_exact(spec.off_group)) {
        *off = -spec.offset * sum_i8(g);
    }
    for (f, g) in o.fsum.iter_mut().zip(o.q.chunks_exact(32)) {
        *f = sum_i8(g) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows with ties (amax 127 makes d = 1, so x.5 values round at a tie), zeros, a negative
    /// largest magnitude, and random values.
    fn rows(k: usize) -> Vec<f32> {
        let mut v = Vec::new();
        let mut s = 12345u32;
        for r in 0..6 {
            for j in 0..k {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let u = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                v.push(match r {
                    0 => {
                        if j % 32 == 0 {
                            127.0
                        } else {
                            (j % 13) as f32 - 6.5
                        }
                    }
                    1 => {
                        if j % 256 == 7 {
                            -127.0
                        } else {
                            (j % 9) as f32 * 0.5 - 2.0
                        }
                    }
                    2 => 0.0,
                    3 => {
                        if j < 32 {
                            0.0
                        } else {
                            u
                        }
                    }
                    _ => u * 10.0,
                });
            }
        }
        v
    }

    #[test]
    fn every_isa_quantizes_bit_identically() {
        let k = 512;
        let x = rows(k);
        let m = x.len() / k;
        for spec in [
            ActSpec {
                k_quant: false,
                off_group: 32,
                offset: 8,
                fsum: false,
            },
            ActSpec {
                k_quant: true,
                off_group: 16,
                offset: 32,
                fsum: false,
            },
            ActSpec {
                k_quant: true,
                off_group: 32,
                offset: 0,
                fsum: true,
            },
        ] {
            let want = quantize(&x, m, k, spec, Isa::Portable);
            // Ties really occur and round as specified.
            if spec.k_quant {
                // Row 1: iscale = 1; -1.5, -0.5, 0.5 round half to even.
                // (group-major: row 1's first block follows row 0's)
                assert_eq!([want.q[32 + 1], want.q[32 + 3], want.q[32 + 5]], [-2, 0, 0]);
            } else {
                // Row 0: d = 1; -5.5, -4.5 round half away from zero.
                assert_eq!(&want.q[1..3], &[-6i8, -5]);
            }
            for isa in Isa::available() {
                let got = quantize(&x, m, k, spec, isa);
                assert_eq!(got.q, want.q, "{isa} {spec:?} codes");
                assert_eq!(got.scale, want.scale, "{isa} {spec:?} scales");
                assert_eq!(got.off, want.off, "{isa} {spec:?} sums");
                assert_eq!(got.fsum, want.fsum, "{isa} {spec:?} fsums");
            }
        }
    }
}
