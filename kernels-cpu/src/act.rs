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

/// Quantized activations: `m` rows of `k` int8 codes plus per-group scales and sums.
#[derive(Debug, Default)]
pub(crate) struct Acts {
    /// Values per row.
    pub k: usize,
    /// `m * k` codes.
    pub q: Vec<i8>,
    /// One scale per `scale_group` values of a row.
    pub scale: Vec<f32>,
    /// `-offset * sum(q)` per `off_group` values of a row.
    pub off: Vec<i32>,
    /// `sum(q)` as f32 per 32 values of a row (the Q4_K min term), when asked for.
    pub fsum: Vec<f32>,
}

/// Which scheme and which sums.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActSpec {
    /// Q8_K (256-value scale groups) instead of Q8_0 (32).
    pub k_quant: bool,
    /// Values per offset sum (16 or 32).
    pub off_group: usize,
    /// The weight code offset `o` (0 for none).
    pub offset: i32,
    /// Also produce `fsum`.
    pub fsum: bool,
}

impl ActSpec {
    fn scale_group(self) -> usize {
        if self.k_quant {
            256
        } else {
            32
        }
    }
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

/// Quantize `x` (`m` rows of `k`, `k` a multiple of the scheme's group) for `spec`.
pub(crate) fn quantize(x: &[f32], m: usize, k: usize, spec: ActSpec) -> Acts {
    let sg = spec.scale_group();
    let og = spec.off_group;
    debug_assert!(k % sg == 0 && k % og == 0 && x.len() == m * k);
    let fs_row = if spec.fsum { k / 32 } else { 0 };
    let mut a = Acts {
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
    let row = |r: usize| {
        let p = p;
        // SAFETY: row `r` of each array is in bounds (sized above) and written by this call only.
        let (q, scale, off, fsum) = unsafe {
            (
                std::slice::from_raw_parts_mut(p.q.add(r * k), k),
                std::slice::from_raw_parts_mut(p.scale.add(r * (k / sg)), k / sg),
                std::slice::from_raw_parts_mut(p.off.add(r * (k / og)), k / og),
                std::slice::from_raw_parts_mut(p.fsum.add(r * fs_row), fs_row),
            )
        };
        quantize_row(&x[r * k..(r + 1) * k], q, scale, spec);
        for (o, g) in off.iter_mut().zip(q.chunks(og)) {
            *o = -spec.offset * g.iter().map(|&v| v as i32).sum::<i32>();
        }
        for (f, g) in fsum.iter_mut().zip(q.chunks(32)) {
            *f = g.iter().map(|&v| v as i32).sum::<i32>() as f32;
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
    a
}

fn quantize_row(x: &[f32], q: &mut [i8], scale: &mut [f32], spec: ActSpec) {
    if spec.k_quant {
        for ((xb, qb), d) in x.chunks(256).zip(q.chunks_mut(256)).zip(scale.iter_mut()) {
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in xb {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                qb.fill(0);
                *d = 0.0;
                continue;
            }
            let iscale = -127.0 / max;
            for (o, &v) in qb.iter_mut().zip(xb) {
                *o = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            *d = 1.0 / iscale;
        }
    } else {
        for ((xb, qb), d) in x.chunks(32).zip(q.chunks_mut(32)).zip(scale.iter_mut()) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let dd = amax / 127.0;
            let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
            for (o, &v) in qb.iter_mut().zip(xb) {
                *o = (v * id).round() as i8;
            }
            *d = f16::from_f32(dd).to_f32();
        }
    }
}
