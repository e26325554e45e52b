//! Bidirectional attention over KV-cache *segments*, without assembling the keys first.
//!
//! A diffusion LM's window attends to the cached prefix plus its own fresh keys, and a sparse refresh
//! attends to the cache with a few rows replaced. Concatenating those key sets into one tensor per
//! layer per step copies the whole cache every step; this kernel instead takes a list of
//! [`KvSegment`]s (each a run of key/value rows in caller memory, possibly with rows to skip) and
//! runs one online softmax across all of them.
//!
//! Layout: queries are `q_rows x heads x head_dim` with row stride `heads * head_dim`; a segment's
//! rows are `kv_heads x head_dim` with an explicit row stride (so a `(positions, batch, kv_heads,
//! head_dim)` cache can be read for one batch item without a copy). Query head `h` reads key/value
//! head `h / (heads / kv_heads)` (GQA). Scores are computed and accumulated in f32 whatever the
//! storage type.
//!
//! Determinism: every output row is computed by one task, sequentially over the keys in segment
//! order, in blocks of [`KEY_BLOCK`] keys whose scores are each a sum over the head dimension in
//! order (queries in the vector lanes, no reduction across lanes), so the result is bit-identical
//! for any number of threads and for the SIMD width the compiler picks.

use std::ops::Range;

use half::{bf16, f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

pub use crate::attention_ref::attention_reference;
#[cfg(target_arch = "x86_64")]
use crate::attention_x86::{self as wide, AT_ONCE_WIDE};
use crate::{Error, Result};

/// Keys processed per softmax block (their K/V rows are converted to f32 once per block).
pub const KEY_BLOCK: usize = 64;
/// Query rows one task handles together at most (they share the converted key/value blocks: a
/// block of 16 converted every key four times as often: 8% of the 1.1M model's forward).
pub const QUERY_BLOCK: usize = 64;
/// Query rows one task handles together at least.
const MIN_QUERY_BLOCK: usize = 16;
/// Tasks per pool thread the query blocks are made small enough for (down to
/// [`MIN_QUERY_BLOCK`]), so a short window still spreads over the pool.
const TASKS_PER_THREAD: usize = 4;

/// The query rows per task for `q_rows` queries over `kv_heads` heads on `threads` threads.
/// Each output row is computed alone, so the block size never changes the results.
fn query_block(q_rows: usize, kv_heads: usize, threads: usize) -> usize {
    let mut qb = QUERY_BLOCK;
    while qb > MIN_QUERY_BLOCK && q_rows.div_ceil(qb) * kv_heads < TASKS_PER_THREAD * threads {
        qb /= 2;
    }
    qb
}

/// A storage element the kernels read: f32, f16 or bf16.
pub trait Element: Copy + Send + Sync + 'static {
    /// +0.0.
    const ZERO: Self;
    /// Widen a slice into `out` (same length).
    fn to_f32_slice(src: &[Self], out: &mut [f32]);
    /// Narrow a slice from `src` (same length), rounding to nearest even.
    fn from_f32_slice(src: &[f32], out: &mut [Self]);
    /// [`Element::to_f32_slice`] inlined into AVX-512 code (f16: `vcvtph2ps` in place of the
    /// `half` crate's call per eight elements, which took a tenth of the attention's time).
    ///
    /// # Safety
    /// The CPU runs AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn to_f32_slice_avx512(src: &[Self], out: &mut [f32]) {
        Self::to_f32_slice(src, out)
    }
}

impl Element for f32 {
    const ZERO: Self = 0.0;
    fn to_f32_slice(src: &[f32], out: &mut [f32]) {
        out.copy_from_slice(src);
    }
    fn from_f32_slice(src: &[f32], out: &mut [f32]) {
        out.copy_from_slice(src);
    }
}

impl Element for f16 {
    const ZERO: Self = f16::ZERO;
    fn to_f32_slice(src: &[f16], out: &mut [f32]) {
        src.convert_to_f32_slice(out);
    }
    fn from_f32_slice(src: &[f32], out: &mut [f16]) {
        out.convert_from_f32_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn to_f32_slice_avx512(src: &[f16], out: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len();
        assert_eq!(
            n,
            out.len(),
            "widening {n} halves into {} floats",
            out.len()
        );
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: elements `i..i + 16` are inside both slices; the caller runs AVX-512 F.
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            i += 16;
        }
        for (o, x) in out[i..].iter_mut().zip(&src[i..]) {
            *o = x.to_f32();
        }
    }
}

impl Element for bf16 {
    const ZERO: Self = bf16::ZERO;
    fn to_f32_slice(src: &[bf16], out: &mut [f32]) {
        src.convert_to_f32_slice(out);
    }
    fn from_f32_slice(src: &[f32], out: &mut [bf16]) {
        out.convert_from_f32_slice(src);
    }
}

/// Rows of a segment that take no part in the attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip<'a> {
    /// Every row takes part.
    None,
    /// Rows `start..end` (segment-relative) are ignored (e.g. cached rows of the window's own
    /// positions, whose fresh K/V come in another segment).
    Range {
        /// First ignored row.
        start: usize,
        /// One past the last ignored row.
        end: usize,
    },
    /// These rows (segment-relative, sorted ascending, unique) are ignored (e.g. positions being
    /// refreshed).
    Sorted(&'a [usize]),
}

impl Skip<'_> {
    pub(crate) fn contains(&self, row: usize, cursor: &mut usize) -> bool {
        match self {
            Skip::None => false,
            Skip::Range { start, end } => (*start..*end).contains(&row),
            Skip::Sorted(s) => {
                while *cursor < s.len() && s[*cursor] < row {
                    *cursor += 1;
                }
                *cursor < s.len() && s[*cursor] == row
            }
        }
    }
}

/// A run of key/value rows in caller memory.
#[derive(Debug, Clone, Copy)]
pub struct KvSegment<'a, T> {
    /// Keys: row `r`, head `h`, dim `i` at `k[r * row_stride + h * head_dim + i]`.
    pub k: &'a [T],
    /// Values, same addressing as `k`.
    pub v: &'a [T],
    /// Number of rows.
    pub rows: usize,
    /// Elements between consecutive rows (at least `kv_heads * head_dim`).
    pub row_stride: usize,
    /// Rows to ignore.
    pub skip: Skip<'a>,
}

/// Head geometry of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Query rows.
    pub q_rows: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

pub(crate) fn check<Q, T>(
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    s: AttnShape,
    out_len: usize,
) -> Result<()> {
    let bad = |what: String| {
        Err(Error::Shape {
            op: "attention",
            what,
        })
    };
    if s.heads == 0 || s.kv_heads == 0 || s.head_dim == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        return bad(format!(
            "{} query heads over {} key/value heads of dim {}",
            s.heads, s.kv_heads, s.head_dim
        ));
    }
    let q_len = s.q_rows * s.heads * s.head_dim;
    if q.len() < q_len || out_len < q_len {
        return bad(format!(
            "{} query rows x {} heads x {} need {q_len} elements; q has {}, out {out_len}",
            s.q_rows,
            s.heads,
            s.head_dim,
            q.len()
        ));
    }
    let row = s.kv_heads * s.head_dim;
    for (i, g) in segs.iter().enumerate() {
        if g.rows == 0 {
            continue;
        }
        let need = (g.rows - 1) * g.row_stride + row;
        if g.row_stride < row || g.k.len() < need || g.v.len() < need {
            return bad(format!(
                "segment {i}: {} rows of stride {} need {need} elements (row {row}); k has {}, v {}",
                g.rows,
                g.row_stride,
                g.k.len(),
                g.v.len()
            ));
        }
        if let Skip::Sorted(p) = g.skip {
            if p.windows(2).any(|w| w[0] >= w[1]) {
                return bad(format!(
                    "segment {i}: skipped rows are not sorted and unique"
                ));
            }
        }
    }
    Ok(())
}

/// `out = softmax(scale * q k^T) v` per query head over every non-skipped row of `segs`.
///
/// `out` has the layout and element type of `q`, which need not be the keys' and values' (an f32
/// model with an f16 cache reads its f32 queries as they are). Rows whose keys are all skipped (or
/// no keys at all) produce zeros.
pub fn attention<Q: Element, T: Element>(
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    shape: AttnShape,
    scale: f32,
    out: &mut [Q],
) -> Result<()> {
    attention_with(crate::isa::Isa::best(), q, segs, shape, scale, out)
}

/// [`attention`] on an explicit SIMD path (an error if this CPU does not run it). Every path gives
/// bit-identical results.
pub fn attention_with<Q: Element, T: Element>(
    isa: crate::isa::Isa,
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    shape: AttnShape,
    scale: f32,
    out: &mut [Q],
) -> Result<()> {
    isa.require()?;
    check(q, segs, shape, out.len())?;
    if !scale.is_finite() {
        return Err(Error::Shape {
            op: "attention",
            what: format!("scale {scale} is not finite"),
        });
    }
    let AttnShape {
        q_rows,
        heads,
        kv_heads,
        head_dim: d,
    } = shape;
    if q_rows == 0 {
        return Ok(());
    }
    let group = heads / kv_heads;
    let q_row_len = heads * d;
    let out = &mut out[..q_rows * q_row_len];
    // One task per (query block, kv head): it owns the output rows of the `group` query heads of that
    // kv head for the block's query rows, and writes them itself (tasks never share an element).
    let qblock = query_block(q_rows, kv_heads, rayon::current_num_threads());
    let qblocks = q_rows.div_ceil(qblock);
    let tasks = qblocks * kv_heads;
    let dst = OutPtr(out.as_mut_ptr());
    let run = |t: usize| {
        let (qb, kh) = (t / kv_heads, t % kv_heads);
        let rows = qb * qblock..((qb + 1) * qblock).min(q_rows);
        crate::scratch::with(|sc| {
            let acc = task_dispatch(isa, q, segs, shape, scale, rows.clone(), kh, &mut sc.attn);
            for (ri, r) in rows.enumerate() {
                for g in 0..group {
                    let h = kh * group + g;
                    let src = &acc[(ri * group + g) * d..][..d];
                    // SAFETY: row `r`, head `h` is inside `out` and written by this task only.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(dst.get().add(r * q_row_len + h * d), d)
                    };
                    Q::from_f32_slice(src, o);
                }
            }
        })
    };
    if rayon::current_num_threads() <= 1 || tasks <= 1 {
        (0..tasks).for_each(run);
    } else {
        (0..tasks).into_par_iter().with_max_len(1).for_each(run);
    }
    Ok(())
}

/// The output pointer, shared by tasks that write disjoint rows and heads.
struct OutPtr<T>(*mut T);
// SAFETY: each task writes its own (row, head) slices, and `out` outlives the parallel region.
unsafe impl<T> Send for OutPtr<T> {}
unsafe impl<T> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    fn get(&self) -> *mut T {
        self.0
    }
}

/// [`task`] compiled for the widest SIMD the CPU runs. The body uses explicit lanes and no fused
/// multiply-add (Rust never contracts `a * b + c`; `f32::mul_add` over these arrays is not
/// vectorised by the compiler, measured: five times slower), so every path computes
/// bit-identical results; only the vector width the compiler may use differs. (On AArch64 NEON
/// is the baseline, so the plain `task` is already the NEON code for every NEON path.)
#[allow(clippy::too_many_arguments)]
fn task_dispatch<'b, Q: Element, T: Element>(
    isa: crate::isa::Isa,
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    s: AttnShape,
    scale: f32,
    rows: Range<usize>,
    kh: usize,
    buf: &'b mut Vec<f32>,
) -> &'b mut [f32] {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::isa::Isa;
        match isa {
            Isa::Avx512 | Isa::Avx512Vnni => {
                // SAFETY: the CPU runs AVX-512 F/BW/VL (`attention_with` checked the path).
                return unsafe { task_avx512(q, segs, s, scale, rows, kh, buf) };
            }
            Isa::Avx2 | Isa::AvxVnni => {
                // SAFETY: the CPU runs AVX2 (`attention_with` checked the path).
                return unsafe { task_avx2(q, segs, s, scale, rows, kh, buf) };
            }
            _ => {}
        }
    }
    let _ = isa;
    task::<false, Q, T>(q, segs, s, scale, rows, kh, buf)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn task_avx512<'b, Q: Element, T: Element>(
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    s: AttnShape,
    scale: f32,
    rows: Range<usize>,
    kh: usize,
    buf: &'b mut Vec<f32>,
) -> &'b mut [f32] {
    // `true`: the AVX-512 micro-kernels, which this function's target features compile.
    task::<true, Q, T>(q, segs, s, scale, rows, kh, buf)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn task_avx2<'b, Q: Element, T: Element>(
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    s: AttnShape,
    scale: f32,
    rows: Range<usize>,
    kh: usize,
    buf: &'b mut Vec<f32>,
) -> &'b mut [f32] {
    task::<false, Q, T>(q, segs, s, scale, rows, kh, buf)
}

/// The attention of query rows `rows` for the `group` query heads of kv head `kh`; returns
/// `(rows, group, d)` f32, in `buf` (a reused buffer, grown to a whole query block's arrays so one
/// size serves every task of a call).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn task<'b, const WIDE: bool, Q: Element, T: Element>(
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    s: AttnShape,
    scale: f32,
    rows: Range<usize>,
    kh: usize,
    buf: &'b mut Vec<f32>,
) -> &'b mut [f32] {
    let d = s.head_dim;
    let group = s.heads / s.kv_heads;
    let nq = rows.len() * group;
    let nq_max = QUERY_BLOCK * group;
    let all = crate::work_buf::grow(
        buf,
        2 * nq_max * d + 2 * nq_max + (2 * d + nq_max) * KEY_BLOCK,
    );
    let (acc, rest) = all.split_at_mut(nq_max * d);
    let (qt, rest) = rest.split_at_mut(nq_max * d);
    let (m, rest) = rest.split_at_mut(nq_max);
    let (l, rest) = rest.split_at_mut(nq_max);
    let (kb, rest) = rest.split_at_mut(KEY_BLOCK * d);
    let (vb, sc) = rest.split_at_mut(KEY_BLOCK * d);
    let (acc, qt, m, l) = (
        &mut acc[..nq * d],
        &mut qt[..nq * d],
        &mut m[..nq],
        &mut l[..nq],
    );
    let sc = &mut sc[..KEY_BLOCK * nq];
    // Queries of this task in f32, pre-scaled, transposed (`d x nq`: the queries in the lanes),
    // once per task; each is widened into its accumulator row first (zeroed after).
    for (ri, r) in rows.clone().enumerate() {
        for g in 0..group {
            let h = kh * group + g;
            let i = ri * group + g;
            let row = &mut acc[i * d..][..d];
            Q::to_f32_slice(&q[r * s.heads * d + h * d..][..d], row);
            for (t, x) in qt[i..].iter_mut().step_by(nq).zip(row.iter()) {
                *t = x * scale;
            }
        }
    }
    acc.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    for seg in segs {
        let mut cursor = 0usize;
        let mut r = 0usize;
        while r < seg.rows {
            // Gather up to KEY_BLOCK non-skipped rows, converted to f32.
            let mut nk = 0;
            while r < seg.rows && nk < KEY_BLOCK {
                if !seg.skip.contains(r, &mut cursor) {
                    let off = r * seg.row_stride + kh * d;
                    let (k, v) = (&seg.k[off..off + d], &seg.v[off..off + d]);
                    let (ko, vo) = (&mut kb[nk * d..(nk + 1) * d], &mut vb[nk * d..(nk + 1) * d]);
                    #[cfg(target_arch = "x86_64")]
                    if WIDE {
                        // SAFETY: `WIDE` is only instantiated by AVX-512 code.
                        unsafe {
                            T::to_f32_slice_avx512(k, ko);
                            T::to_f32_slice_avx512(v, vo);
                        }
                        nk += 1;
                        r += 1;
                        continue;
                    }
                    T::to_f32_slice(k, ko);
                    T::to_f32_slice(v, vo);
                    nk += 1;
                }
                r += 1;
            }
            if nk > 0 {
                block::<WIDE>(qt, &kb[..nk * d], &vb[..nk * d], d, nk, sc, m, l, acc);
            }
        }
    }
    for (i, li) in l.iter().enumerate() {
        let inv = if *li > 0.0 { 1.0 / li } else { 0.0 };
        acc[i * d..(i + 1) * d].iter_mut().for_each(|x| *x *= inv);
    }
    acc
}

/// `e^x` for `x <= 0` (scores minus their running maximum), branch-free so that a loop over a block
/// vectorises ([`crate::expf`]). Inputs below -87 are clamped (their weight is below 2^-125 of the
/// maximum's, i.e. 0 in f32 sums).
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    crate::expf::exp_clamped(x, 0.0)
}

/// Queries in the vector lanes of the scores and the softmax.
const LANES: usize = 16;
/// Keys whose scores are computed together (independent add chains sharing each query load), and
/// queries whose value sums are (independent chains sharing each value load).
const AT_ONCE: usize = 4;

/// One key block: scores, online-softmax update, value accumulation, with the queries in the
/// lanes (`qt` is `d x nq`): a score is a sum over the head dimension in order, one multiply and
/// one add per element, and a query's softmax sums its keys in order, lane by lane, so nothing is
/// reduced across lanes and the bits are the same at any SIMD width. The scores go to `sc`
/// key-major (`nk x nq`). `WIDE` (only from AVX-512 code: [`task_dispatch`]) runs whole 16-lane
/// blocks through the eight-chain micro-kernels of `attention_x86.rs`, the same operations in the same order.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn block<const WIDE: bool>(
    qt: &[f32],
    kb: &[f32],
    vb: &[f32],
    d: usize,
    nk: usize,
    sc: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
) {
    let nq = m.len();
    let sc = &mut sc[..nk * nq];
    #[cfg(target_arch = "x86_64")]
    let at_once = if WIDE { AT_ONCE_WIDE } else { AT_ONCE };
    #[cfg(not(target_arch = "x86_64"))]
    let at_once = AT_ONCE;
    let mut batch = [0usize; 8];
    let mut nb = 0;
    let mut i0 = 0;
    while i0 < nq {
        let w = (nq - i0).min(LANES);
        let mut j = 0;
        #[cfg(target_arch = "x86_64")]
        if WIDE && w == LANES {
            assert!(qt.len() >= d * nq && kb.len() >= nk * d && sc.len() >= nk * nq);
            while j + AT_ONCE_WIDE <= nk {
                // SAFETY: `WIDE` is only instantiated by AVX-512 code; lanes `i0..i0 + 16` of
                // `qt`'s `d` rows, keys `j..j + 8` and their score rows are in bounds (asserted).
                unsafe { wide::scores(qt, kb, d, nq, i0, j, sc) };
                j += AT_ONCE_WIDE;
            }
        }
        while j + AT_ONCE <= nk {
            scores::<AT_ONCE>(qt, kb, d, nq, i0, w, j, sc);
            j += AT_ONCE;
        }
        while j < nk {
            scores::<1>(qt, kb, d, nq, i0, w, j, sc);
            j += 1;
        }
        // The block maximum of each query (exact in any order), the weights, their sum in key
        // order.
        let mut mx = [f32::NEG_INFINITY; LANES];
        let mut sum = [0f32; LANES];
        mx[..w].copy_from_slice(&m[i0..i0 + w]);
        if w == LANES {
            softmax_lanes::<LANES>(&mut sc[i0..], nq, nk, &mut mx, &mut sum);
        } else {
            softmax_lanes::<0>(&mut sc[i0..], nq, nk, &mut mx[..w], &mut sum[..w]);
        }
        for lane in 0..w {
            let i = i0 + lane;
            if mx[lane] == f32::NEG_INFINITY {
                continue;
            }
            let corr = exp_neg(m[i] - mx[lane]);
            l[i] = l[i] * corr + sum[lane];
            m[i] = mx[lane];
            if corr != 1.0 {
                acc[i * d..(i + 1) * d].iter_mut().for_each(|x| *x *= corr);
            }
            batch[nb] = i;
            nb += 1;
            if nb == at_once {
                #[cfg(target_arch = "x86_64")]
                if WIDE {
                    assert!(
                        vb.len() >= nk * d && acc.len() >= nq * d && batch.iter().all(|&i| i < nq)
                    );
                    // SAFETY: AVX-512 code (above); the queries' weights, the block's values and
                    // the queries' accumulator rows are in bounds (asserted).
                    unsafe { wide::values(batch, sc, nq, nk, vb, d, acc) };
                    nb = 0;
                    continue;
                }
                values(
                    [batch[0], batch[1], batch[2], batch[3]],
                    sc,
                    nq,
                    nk,
                    vb,
                    d,
                    acc,
                );
                nb = 0;
            }
        }
        i0 += w;
    }
    let mut rest = &batch[..nb];
    while rest.len() >= AT_ONCE {
        values([rest[0], rest[1], rest[2], rest[3]], sc, nq, nk, vb, d, acc);
        rest = &rest[AT_ONCE..];
    }
    for &i in rest {
        values([i], sc, nq, nk, vb, d, acc);
    }
}

/// The softmax step of one lane group over a key block: `mx` (the running maxima on entry) takes
/// the block's maxima, each score `sc[j * nq + lane]` becomes `e^(score - max)`, and `sum` their
/// sum in key order. `W` is the lane count when it is `LANES` (fixed-size rows the compiler keeps
/// in registers: with a slice of runtime length the sums went through memory, a store-to-load
/// wait per key), 0 for a partial group of `mx.len()` lanes.
#[inline(always)]
fn softmax_lanes<const W: usize>(
    sc: &mut [f32],
    nq: usize,
    nk: usize,
    mx: &mut [f32],
    sum: &mut [f32],
) {
    if W > 0 {
        let mx: &mut [f32; W] = mx.try_into().expect("a whole lane group");
        let sum: &mut [f32; W] = sum.try_into().expect("a whole lane group");
        // Two chains of maxima (even and odd keys), then their maximum: the same value (the
        // maximum is exact in any order), half the wait.
        let mut mx2 = [f32::NEG_INFINITY; W];
        let mut j = 0;
        while j + 2 <= nk {
            let a: &[f32; W] = sc[j * nq..][..W].try_into().expect("W lanes");
            let b: &[f32; W] = sc[(j + 1) * nq..][..W].try_into().expect("W lanes");
            for l in 0..W {
                mx[l] = mx[l].max(a[l]);
                mx2[l] = mx2[l].max(b[l]);
            }
            j += 2;
        }
        if j < nk {
            let a: &[f32; W] = sc[j * nq..][..W].try_into().expect("W lanes");
            for l in 0..W {
                mx[l] = mx[l].max(a[l]);
            }
        }
        for l in 0..W {
            mx[l] = mx[l].max(mx2[l]);
        }
        let mut acc = [0f32; W];
        for j in 0..nk {
            let r: &mut [f32; W] = (&mut sc[j * nq..][..W]).try_into().expect("W lanes");
            for l in 0..W {
                r[l] = exp_neg(r[l] - mx[l]);
                acc[l] += r[l];
            }
        }
        *sum = acc;
        return;
    }
    let w = mx.len();
    for j in 0..nk {
        for (x, &v) in mx.iter_mut().zip(&sc[j * nq..][..w]) {
            *x = x.max(v);
        }
    }
    for j in 0..nk {
        let r = &mut sc[j * nq..][..w];
        for ((x, &mm), t) in r.iter_mut().zip(mx.iter()).zip(sum.iter_mut()) {
            *x = exp_neg(*x - mm);
            *t += *x;
        }
    }
}

/// The scores of keys `j..j + N` against queries `i0..i0 + w` (`w <= LANES`), into their rows of
/// the key-major `sc`: the queries in the lanes across the head dimension, N keys sharing each
/// query load.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn scores<const N: usize>(
    qt: &[f32],
    kb: &[f32],
    d: usize,
    nq: usize,
    i0: usize,
    w: usize,
    j: usize,
    sc: &mut [f32],
) {
    let ks: [&[f32]; N] = std::array::from_fn(|n| &kb[(j + n) * d..][..d]);
    let mut r = [[0f32; LANES]; N];
    if w == LANES {
        for e in 0..d {
            let qv = &qt[e * nq + i0..][..LANES];
            for (rn, k) in r.iter_mut().zip(&ks) {
                let ke = k[e];
                for (x, &qe) in rn.iter_mut().zip(qv) {
                    *x += qe * ke;
                }
            }
        }
    } else {
        for e in 0..d {
            let qv = &qt[e * nq + i0..][..w];
            for (rn, k) in r.iter_mut().zip(&ks) {
                let ke = k[e];
                for (x, &qe) in rn[..w].iter_mut().zip(qv) {
                    *x += qe * ke;
                }
            }
        }
    }
    for (n, rn) in r.iter().enumerate() {
        sc[(j + n) * nq + i0..][..w].copy_from_slice(&rn[..w]);
    }
}

/// `acc[i] += sum_j p[j][i] v[j]` for the N queries `idx` (`p` = the key-major weights in `sc`),
/// key by key in order (the operations of one pass per key over the whole row), 16 columns at a
/// time in registers across the block's keys, the N queries sharing each value load.
#[inline(always)]
fn values<const N: usize>(
    idx: [usize; N],
    sc: &[f32],
    nq: usize,
    nk: usize,
    vb: &[f32],
    d: usize,
    acc: &mut [f32],
) {
    let mut c0 = 0;
    while c0 < d {
        let w = (d - c0).min(16);
        let mut r = [[0f32; 16]; N];
        for (rn, &i) in r.iter_mut().zip(&idx) {
            rn[..w].copy_from_slice(&acc[i * d + c0..][..w]);
        }
        if w == 16 {
            for j in 0..nk {
                let v = &vb[j * d + c0..][..16];
                let p = &sc[j * nq..][..nq];
                for (rn, &i) in r.iter_mut().zip(&idx) {
                    let pj = p[i];
                    for (x, &y) in rn.iter_mut().zip(v) {
                        *x += pj * y;
                    }
                }
            }
        } else {
            for j in 0..nk {
                let v = &vb[j * d + c0..][..w];
                let p = &sc[j * nq..][..nq];
                for (rn, &i) in r.iter_mut().zip(&idx) {
                    let pj = p[i];
                    for (x, &y) in rn[..w].iter_mut().zip(v) {
                        *x += pj * y;
                    }
                }
            }
        }
        for (rn, &i) in r.iter().zip(&idx) {
            acc[i * d + c0..][..w].copy_from_slice(&rn[..w]);
        }
        c0 += w;
    }
}

#[cfg(test)]
mod tests {
    use super::exp_neg;

    #[test]
    fn exp_neg_is_accurate_and_total() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -87.0 {
            let got = exp_neg(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x -= 0.0137;
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert!(exp_neg(-1e30) >= 0.0 && exp_neg(-1e30) < 1e-37);
        assert_eq!(exp_neg(f32::NEG_INFINITY), exp_neg(-87.0));
    }
}
