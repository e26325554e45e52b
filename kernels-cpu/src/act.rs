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

use crate::act_row::{ActSpec, RowOut};
use crate::isa::Isa;
use crate::work_buf::grow;
use half::f16;

/// Quantized activations: `m` rows of `k` int8 codes plus per-group scales and sums, stored
/// group-major (group `g` of every row, then group `g + 1`): a micro-kernel over rows
/// `m0..m0 + MR` finds their codes, scales and sums for one group at one address plus constant
/// offsets, and advances every array by a constant stride per group. The arrays are buffers
/// reused across calls ([`crate::scratch`]) and may be longer than `m` rows need.
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

/// One row's quantizer output (row-major), before it is laid group-major into [`Acts`].
#[derive(Debug, Default)]
pub(crate) struct RowBufs {
    q: Vec<i8>,
    scale: Vec<f32>,
    off: Vec<i32>,
    fsum: Vec<f32>,
}

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

/// Quantize `x` (`m` rows of `k`, `k` a multiple of the scheme's group) for `spec` into `a`
/// (group-major), with the row quantizer compiled for `isa` (which the caller has checked this
/// CPU runs). `a` and `row` are reused buffers: they grow to hold `cap_rows` rows (at least `m`)
/// and never shrink, so a later call of at most `cap_rows` rows allocates nothing. Serial: a
/// GEMM task quantizes the rows it covers, in parallel with the other tasks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_into(
    a: &mut Acts,
    row: &mut RowBufs,
    x: &[f32],
    m: usize,
    cap_rows: usize,
    k: usize,
    spec: ActSpec,
    isa: Isa,
) {
    let sg = spec.scale_group();
    let og = spec.off_group;
    debug_assert!(k.is_multiple_of(sg) && k.is_multiple_of(og) && x.len() == m * k);
    let fs_row = if spec.fsum { k / 32 } else { 0 };
    let cap = cap_rows.max(m);
    a.m = m;
    a.k = k;
    grow(&mut a.q, cap * k);
    grow(&mut a.scale, cap * (k / sg));
    grow(&mut a.off, cap * (k / og));
    grow(&mut a.fsum, cap * fs_row);
    let f = row_fn(isa);
    for (r, xr) in x.chunks_exact(k).enumerate() {
        let o = RowOut {
            q: grow(&mut row.q, k),
            scale: grow(&mut row.scale, k / sg),
            off: grow(&mut row.off, k / og),
            fsum: grow(&mut row.fsum, fs_row),
        };
        // SAFETY: `f` runs on an ISA the caller checked.
        unsafe { f(xr, o, spec) };
        // Group-major: group `g` of row `r` at `g * m + r` (codes: 32-byte units).
        for (g, c) in row.q[..k].chunks_exact(32).enumerate() {
            a.q[(g * m + r) * 32..][..32].copy_from_slice(c);
        }
        for (g, &v) in row.scale[..k / sg].iter().enumerate() {
            a.scale[g * m + r] = v;
        }
        for (g, &v) in row.off[..k / og].iter().enumerate() {
            a.off[g * m + r] = v;
        }
        for (g, &v) in row.fsum[..fs_row].iter().enumerate() {
            a.fsum[g * m + r] = v;
        }
    }
}

/// [`quantize_into`] fresh buffers, trimmed to `m` rows (tests).
#[cfg(test)]
pub(crate) fn quantize(x: &[f32], m: usize, k: usize, spec: ActSpec, isa: Isa) -> Acts {
    let mut a = Acts::default();
    quantize_into(&mut a, &mut RowBufs::default(), x, m, m, k, spec, isa);
    a
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
