//! The AVX-512 micro-kernels of the attention's key blocks (`attention::block`): eight
//! independent chains of 16 lanes each, a multiply then an add per element in the order of the
//! generic loops, so the same bits as every other path. (With four chains, as the generic body
//! runs on paths with 16 vector registers, each add waited on the one before: half the attention's
//! time.)

use std::arch::x86_64::*;

/// Keys whose scores, and queries whose value sums, are computed together: 32 registers hold
/// eight 16-lane chains, so the adds' latency is hidden. The chains are independent, so their
/// number never changes the bits.
pub(crate) const AT_ONCE_WIDE: usize = 8;
/// (The short name the kernels use.)
const N: usize = AT_ONCE_WIDE;

/// Scores of keys `j..j + 8` against the 16 queries `i0..i0 + 16`.
///
/// # Safety
/// AVX-512 F; `qt` holds `d` rows of `nq` lanes with `i0 + 16 <= nq`, `kb` keys `j..j + 8`
/// of `d` elements, `sc` their score rows of `nq`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scores(
    qt: &[f32],
    kb: &[f32],
    d: usize,
    nq: usize,
    i0: usize,
    j: usize,
    sc: &mut [f32],
) {
    let (q, k) = (qt.as_ptr().add(i0), kb.as_ptr().add(j * d));
    let mut r = [_mm512_setzero_ps(); N];
    for e in 0..d {
        let qv = _mm512_loadu_ps(q.add(e * nq));
        for (n, rn) in r.iter_mut().enumerate() {
            let ke = _mm512_set1_ps(*k.add(n * d + e));
            *rn = _mm512_add_ps(*rn, _mm512_mul_ps(qv, ke));
        }
    }
    let out = sc.as_mut_ptr().add(j * nq + i0);
    for (n, rn) in r.iter().enumerate() {
        _mm512_storeu_ps(out.add(n * nq), *rn);
    }
}

/// `acc[i] += sum_j p[j][i] v[j]` for the eight queries `idx`, 16 columns at a time.
///
/// # Safety
/// AVX-512 F; `sc` holds `nk` rows of `nq` weights, `vb` `nk` rows of `d` values, `acc` the
/// queries' rows of `d`, every `idx[n] < nq`.
#[inline(always)]
pub(crate) unsafe fn values(
    idx: [usize; N],
    sc: &[f32],
    nq: usize,
    nk: usize,
    vb: &[f32],
    d: usize,
    acc: &mut [f32],
) {
    let (p, v, a) = (sc.as_ptr(), vb.as_ptr(), acc.as_mut_ptr());
    let mut c0 = 0;
    while c0 < d {
        let w = (d - c0).min(16);
        let mask = if w == 16 {
            !0
        } else {
            ((1u32 << w) - 1) as __mmask16
        };
        let mut r = [_mm512_setzero_ps(); N];
        for (rn, &i) in r.iter_mut().zip(&idx) {
            *rn = _mm512_maskz_loadu_ps(mask, a.add(i * d + c0));
        }
        for j in 0..nk {
            let vj = _mm512_maskz_loadu_ps(mask, v.add(j * d + c0));
            let pj = p.add(j * nq);
            for (rn, &i) in r.iter_mut().zip(&idx) {
                *rn = _mm512_add_ps(*rn, _mm512_mul_ps(_mm512_set1_ps(*pj.add(i)), vj));
            }
        }
        for (rn, &i) in r.iter().zip(&idx) {
            _mm512_mask_storeu_ps(a.add(i * d + c0), mask, *rn);
        }
        c0 += w;
    }
}
