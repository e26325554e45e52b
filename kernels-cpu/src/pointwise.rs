//! Pointwise ops of the transformer block that sit between the GEMMs: SwiGLU (`silu(gate) * up`),
//! the residual add, the rotary embedding and RMSNorm, split over the current rayon pool.
//!
//! The exponential is the attention's polynomial in plain f32 operations ([`crate::expf`]), not
//! the C library's: the same operations in the same order on every target and SIMD width (Rust
//! never fuses a multiply and an add by itself), so results are bit-identical across x86-64,
//! AArch64, thread counts and the vector width the compiler picks. On x86-64 the loops are compiled a second time for AVX2 and
//! picked at run time.

use rayon::prelude::*;

use crate::{Error, Result};

/// Elements below which an op runs on the calling thread (a parallel region costs more).
const PAR_MIN: usize = 1 << 15;
/// Elements per parallel task.
const CHUNK: usize = 1 << 13;

/// `e^x` for `x` in the range `silu` needs (clamped to [-87, 88]: no overflow, no subnormals).
#[inline(always)]
fn exp_poly(x: f32) -> f32 {
    crate::expf::exp_clamped(x, 88.0)
}

#[inline(always)]
fn swiglu_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp_poly(-g)) * u;
    }
}

#[inline(always)]
fn add_body(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn swiglu_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    swiglu_body(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_avx2(a: &[f32], b: &[f32], out: &mut [f32]) {
    add_body(a, b, out)
}

fn swiglu_chunk(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above); the body is safe code.
        return unsafe { swiglu_avx2(gate, up, out) };
    }
    swiglu_body(gate, up, out)
}

fn add_chunk(a: &[f32], b: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above); the body is safe code.
        return unsafe { add_avx2(a, b, out) };
    }
    add_body(a, b, out)
}

/// One position's rotation, every head: `x` and `out` are `heads x d`, `cos`/`sin` `d / 2`.
#[inline(always)]
fn rope_body(x: &[f32], cos: &[f32], sin: &[f32], d: usize, out: &mut [f32]) {
    for (xh, oh) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let (x1, x2) = xh.split_at(d / 2);
        let (o1, o2) = oh.split_at_mut(d / 2);
        for i in 0..d / 2 {
            let (a, b, c, s) = (x1[i], x2[i], cos[i], sin[i]);
            o1[i] = a * c - b * s;
            o2[i] = a * s + b * c;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rope_avx2(x: &[f32], cos: &[f32], sin: &[f32], d: usize, out: &mut [f32]) {
    rope_body(x, cos, sin, d, out)
}

fn rope_position(x: &[f32], cos: &[f32], sin: &[f32], d: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above); the body is safe code.
        return unsafe { rope_avx2(x, cos, sin, d, out) };
    }
    rope_body(x, cos, sin, d, out)
}

/// Rotary embedding, rotate-half form, of `x` laid out `(positions, heads, d)`: with `x1`, `x2`
/// the halves of a head and `c`, `s` its position's row of `cos`, `sin` (`(positions, d / 2)`),
/// `out = [x1 c - x2 s, x1 s + x2 c]`. The products are rounded and then added (never fused), as
/// candle's `rope_thd` computes them, so the results are its bits.
pub fn rope(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    heads: usize,
    d: usize,
    out: &mut [f32],
) -> Result<()> {
    let row = heads
        .checked_mul(d)
        .filter(|_| d.is_multiple_of(2) && d > 0);
    let Some(row) = row else {
        return Err(Error::Shape {
            op: "rope",
            what: format!("{heads} heads of {d} values (the head size must be even and positive)"),
        });
    };
    let positions = cos.len() / (d / 2);
    if x.len() != out.len()
        || cos.len() != sin.len()
        || !cos.len().is_multiple_of(d / 2)
        || x.len() != positions * row
    {
        return Err(Error::Shape {
            op: "rope",
            what: format!(
                "{} inputs, {} outputs and {}/{} cos/sin values for heads of {d} ({heads} per position)",
                x.len(),
                out.len(),
                cos.len(),
                sin.len()
            ),
        });
    }
    let one = |(p, (x, o)): (usize, (&[f32], &mut [f32]))| {
        let cs = p * (d / 2)..(p + 1) * (d / 2);
        rope_position(x, &cos[cs.clone()], &sin[cs], d, o)
    };
    if out.len() < PAR_MIN || rayon::current_num_threads() <= 1 {
        x.chunks_exact(row)
            .zip(out.chunks_exact_mut(row))
            .enumerate()
            .for_each(one);
    } else {
        x.par_chunks_exact(row)
            .zip(out.par_chunks_exact_mut(row))
            .enumerate()
            .with_min_len(CHUNK.div_ceil(row))
            .for_each(one);
    }
    Ok(())
}

/// Rows whose sums of squares run together (independent chains: one row's sum is a chain of
/// dependent adds, four cycles each).
const NORM_ROWS: usize = 8;

/// RMSNorm of `N` rows of `alpha.len()` values (candle's operations, see [`rms_norm`]).
#[inline(always)]
fn rms_rows<const N: usize>(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    let n = alpha.len();
    let rows: [&[f32]; N] = std::array::from_fn(|j| &x[j * n..(j + 1) * n]);
    let mut sum2 = [0f32; N];
    for i in 0..n {
        for (s, r) in sum2.iter_mut().zip(&rows) {
            *s += r[i] * r[i];
        }
    }
    for ((s, r), o) in sum2.iter().zip(&rows).zip(out.chunks_exact_mut(n)) {
        let m = (s / n as f32 + eps).sqrt();
        for ((o, &v), &a) in o.iter_mut().zip(r.iter()).zip(alpha) {
            *o = v / m * a;
        }
    }
}

/// RMSNorm of whole rows (a multiple of `alpha.len()` values).
#[inline(always)]
fn rms_body(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    let n = alpha.len();
    let block = NORM_ROWS * n;
    let mut xs = x.chunks_exact(block);
    let mut os = out.chunks_exact_mut(block);
    for (x, o) in (&mut xs).zip(&mut os) {
        rms_rows::<NORM_ROWS>(x, alpha, eps, o);
    }
    for (x, o) in xs
        .remainder()
        .chunks_exact(n)
        .zip(os.into_remainder().chunks_exact_mut(n))
    {
        rms_rows::<1>(x, alpha, eps, o);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rms_avx2(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    rms_body(x, alpha, eps, out)
}

fn rms_chunk(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above); the body is safe code.
        return unsafe { rms_avx2(x, alpha, eps, out) };
    }
    rms_body(x, alpha, eps, out)
}

/// RMSNorm of each row of `x` (rows of `alpha.len()` values): `out = x / m * alpha` with
/// `m = sqrt(sum(x^2) / n + eps)`, the sum of squares in f32 in order along the row and the
/// quotient rounded before the product: the operations of candle's `rms_norm` on the CPU, so its
/// bits. Eight rows' sums run as independent chains (candle's loop waits on one row's adds).
pub fn rms_norm(x: &[f32], alpha: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
    let n = alpha.len();
    if n == 0 || x.len() != out.len() || !x.len().is_multiple_of(n) || !eps.is_finite() {
        return Err(Error::Shape {
            op: "rms_norm",
            what: format!(
                "{} inputs and {} outputs in rows of {n} (eps {eps}): rows must be whole and \
                 non-empty, eps finite",
                x.len(),
                out.len()
            ),
        });
    }
    if out.len() < PAR_MIN || rayon::current_num_threads() <= 1 {
        rms_chunk(x, alpha, eps, out);
    } else {
        let block = NORM_ROWS * n;
        x.par_chunks(block)
            .zip(out.par_chunks_mut(block))
            .with_min_len(CHUNK.div_ceil(block))
            .for_each(|(x, o)| rms_chunk(x, alpha, eps, o));
    }
    Ok(())
}

fn check(what: &'static str, a: usize, b: usize, out: usize) -> Result<()> {
    if a != b || a != out {
        return Err(Error::Shape {
            op: what,
            what: format!("inputs of {a} and {b} values and an output of {out} (must be equal)"),
        });
    }
    Ok(())
}

fn run(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(&[f32], &[f32], &mut [f32]) + Sync) {
    if out.len() < PAR_MIN || rayon::current_num_threads() <= 1 {
        return f(a, b, out);
    }
    out.par_chunks_mut(CHUNK)
        .zip(a.par_chunks(CHUNK))
        .zip(b.par_chunks(CHUNK))
        .for_each(|((o, a), b)| f(a, b, o));
}

/// `out[i] = silu(gate[i]) * up[i]` with `silu(x) = x / (1 + e^-x)`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
    check("swiglu", gate.len(), up.len(), out.len())?;
    run(gate, up, out, swiglu_chunk);
    Ok(())
}

/// `out[i] = a[i] + b[i]`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
    check("add", a.len(), b.len(), out.len())?;
    run(a, b, out, add_chunk);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_c_library_closely() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp_poly(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.013;
        }
        assert!(worst < 3e-7, "relative error {worst}");
    }

    #[test]
    fn swiglu_matches_its_definition_and_the_thread_count_changes_nothing() {
        let n = 3 * PAR_MIN + 17;
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 2001) as f32 / 50.0 - 20.0)
            .collect();
        let up: Vec<f32> = (0..n)
            .map(|i| ((i * 104_729) % 997) as f32 / 300.0 - 1.5)
            .collect();
        let mut one = vec![0f32; n];
        let pool = |t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        };
        pool(1).install(|| swiglu(&gate, &up, &mut one)).unwrap();
        for (i, &o) in one.iter().enumerate() {
            let (g, u) = (gate[i] as f64, up[i] as f64);
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                (o as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{i}: {o} vs {want}"
            );
        }
        for t in [2, 3] {
            let mut many = vec![0f32; n];
            pool(t).install(|| swiglu(&gate, &up, &mut many)).unwrap();
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                many.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        // Extremes: no overflow, no NaN from a finite input.
        let g = [-1e30f32, -100.0, -87.5, 0.0, 87.5, 100.0, 1e30];
        let mut o = [0f32; 7];
        swiglu(&g, &[1.0; 7], &mut o).unwrap();
        assert!(o.iter().all(|v| v.is_finite()), "{o:?}");
        assert_eq!(o[3], 0.0);
        assert_eq!(o[6], 1e30);
    }

    #[test]
    fn rms_norm_is_candles_loop_and_threads_change_nothing() {
        let (rows, n) = (8 * 9 + 5, 768);
        let x: Vec<f32> = (0..rows * n)
            .map(|i| ((i * 7919) % 2001) as f32 / 300.0 - 3.3)
            .collect();
        let alpha: Vec<f32> = (0..n).map(|i| 0.5 + (i % 13) as f32 / 7.0).collect();
        let eps = 1e-5f32;
        let pool = |t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        };
        let mut one = vec![0f32; x.len()];
        pool(1)
            .install(|| rms_norm(&x, &alpha, eps, &mut one))
            .unwrap();
        // candle's CPU loop, written out: the sum in order, the quotient before the product.
        for (r, o) in x.chunks_exact(n).zip(one.chunks_exact(n)) {
            let sum2 = r.iter().map(|&v| v * v).sum::<f32>();
            let m = (sum2 / n as f32 + eps).sqrt();
            for ((&v, &a), &got) in r.iter().zip(&alpha).zip(o) {
                assert_eq!(got.to_bits(), (v / m * a).to_bits());
            }
        }
        for t in [2, 3] {
            let mut many = vec![0f32; x.len()];
            pool(t)
                .install(|| rms_norm(&x, &alpha, eps, &mut many))
                .unwrap();
            assert!(one
                .iter()
                .zip(&many)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        let mut o = vec![0f32; 10];
        assert!(rms_norm(&x[..10], &alpha[..4], eps, &mut o).is_err());
        assert!(rms_norm(&x[..8], &alpha[..4], eps, &mut o).is_err());
        assert!(rms_norm(&[], &[], eps, &mut []).is_err());
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let mut o = [0f32; 3];
        assert!(swiglu(&[1.0; 3], &[1.0; 2], &mut o).is_err());
        assert!(add(&[1.0; 4], &[1.0; 3], &mut o).is_err());
        // rope: an odd head size, a cos table that is not whole positions, x not matching it.
        let mut o = [0f32; 12];
        assert!(rope(&[1.0; 12], &[1.0; 3], &[1.0; 3], 2, 3, &mut o).is_err());
        assert!(rope(&[1.0; 12], &[1.0; 3], &[1.0; 3], 2, 4, &mut o).is_err());
        assert!(rope(&[1.0; 12], &[1.0; 4], &[1.0; 4], 2, 4, &mut o).is_err());
        assert!(rope(&[1.0; 16], &[1.0; 4], &[1.0; 4], 2, 4, &mut o).is_err());
    }

    #[test]
    fn rope_is_the_rotation_with_products_rounded_and_threads_change_nothing() {
        let (positions, heads, d) = (200, 6, 64);
        let n = positions * heads * d;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 2001) as f32 / 500.0 - 2.0)
            .collect();
        let angle = |p: usize, i: usize| p as f64 * 10_000f64.powf(-((2 * i) as f64) / d as f64);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..positions {
            for i in 0..d / 2 {
                cos.push(angle(p, i).cos() as f32);
                sin.push(angle(p, i).sin() as f32);
            }
        }
        let pool = |t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        };
        let mut one = vec![0f32; n];
        pool(1)
            .install(|| rope(&x, &cos, &sin, heads, d, &mut one))
            .unwrap();
        for p in 0..positions {
            for h in 0..heads {
                for i in 0..d / 2 {
                    let at = (p * heads + h) * d + i;
                    let (a, b) = (x[at], x[at + d / 2]);
                    let (c, s) = (cos[p * d / 2 + i], sin[p * d / 2 + i]);
                    // Each product rounded to f32, then the sum rounded: the exact bits.
                    assert_eq!(one[at].to_bits(), (a * c - b * s).to_bits());
                    assert_eq!(one[at + d / 2].to_bits(), (a * s + b * c).to_bits());
                }
            }
        }
        for t in [2, 3] {
            let mut many = vec![0f32; n];
            pool(t)
                .install(|| rope(&x, &cos, &sin, heads, d, &mut many))
                .unwrap();
            assert!(one
                .iter()
                .zip(&many)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
