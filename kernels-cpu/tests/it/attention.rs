//! The segment attention kernel against its f64 reference, and the properties the model relies on:
//! skipping, segment order independence, GQA, thread-count invariance.

use half::{bf16, f16};
use kernels_cpu::attention::{
    attention, attention_reference, attention_with, AttnShape, Element, KvSegment, Skip,
};
use kernels_cpu::isa::Isa;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec<T: Element>(&mut self, n: usize) -> Vec<T> {
        let f: Vec<f32> = (0..n).map(|_| self.next()).collect();
        let mut o = vec![T::ZERO; n];
        T::from_f32_slice(&f, &mut o);
        o
    }
}

fn to_f64<T: Element>(x: &[T]) -> Vec<f64> {
    let mut o = vec![0f32; x.len()];
    T::to_f32_slice(x, &mut o);
    o.into_iter().map(f64::from).collect()
}

fn max_err(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A cache of `rows` rows with `stride` elements per row (batch-interleaved layouts have stride >
/// kv_heads * head_dim), plus a window segment; the window's own cached rows skipped.
fn case<T: Element>(seed: u64, s: AttnShape, cached: usize, stride_mult: usize, tol: f64) {
    let mut rng = Rng(seed | 1);
    let row = s.kv_heads * s.head_dim;
    let stride = row * stride_mult;
    let kc: Vec<T> = rng.vec(cached * stride);
    let vc: Vec<T> = rng.vec(cached * stride);
    let nw = s.q_rows;
    let kw: Vec<T> = rng.vec(nw * row);
    let vw: Vec<T> = rng.vec(nw * row);
    let q: Vec<T> = rng.vec(s.q_rows * s.heads * s.head_dim);
    let skip = if cached >= 3 {
        Skip::Range {
            start: cached / 3,
            end: cached / 3 + (cached / 3).min(nw),
        }
    } else {
        Skip::None
    };
    let segs = [
        KvSegment {
            k: &kc,
            v: &vc,
            rows: cached,
            row_stride: stride,
            skip,
        },
        KvSegment {
            k: &kw,
            v: &vw,
            rows: nw,
            row_stride: row,
            skip: Skip::None,
        },
    ];
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let mut out = vec![T::ZERO; q.len()];
    attention(&q, &segs, s, scale, &mut out).unwrap();
    let want = attention_reference(&q, &segs, s, scale).unwrap();
    let e = max_err(&to_f64(&out), &want);
    assert!(e < tol, "{s:?} cached {cached}: max error {e} >= {tol}");

    // Segment order does not matter beyond rounding, and splitting the cache into two segments with
    // an equivalent skip gives the same function.
    let half = cached / 2;
    let (k1, k2) = kc.split_at(half * stride);
    let (v1, v2) = vc.split_at(half * stride);
    let skip_rows: Vec<usize> = match skip {
        Skip::Range { start, end } => (start..end).collect(),
        _ => vec![],
    };
    let s1: Vec<usize> = skip_rows.iter().copied().filter(|&r| r < half).collect();
    let s2: Vec<usize> = skip_rows
        .iter()
        .filter(|&&r| r >= half)
        .map(|r| r - half)
        .collect();
    let segs2 = [
        KvSegment {
            k: &kw,
            v: &vw,
            rows: nw,
            row_stride: row,
            skip: Skip::None,
        },
        KvSegment {
            k: k2,
            v: v2,
            rows: cached - half,
            row_stride: stride,
            skip: Skip::Sorted(&s2),
        },
        KvSegment {
            k: k1,
            v: v1,
            rows: half,
            row_stride: stride,
            skip: Skip::Sorted(&s1),
        },
    ];
    let mut out2 = vec![T::ZERO; q.len()];
    attention(&q, &segs2, s, scale, &mut out2).unwrap();
    let e2 = max_err(&to_f64(&out2), &want);
    assert!(e2 < tol, "{s:?} split segments: max error {e2}");
}

#[test]
fn matches_the_reference_f32() {
    let shapes = [
        AttnShape {
            q_rows: 1,
            heads: 1,
            kv_heads: 1,
            head_dim: 8,
        },
        AttnShape {
            q_rows: 32,
            heads: 4,
            kv_heads: 4,
            head_dim: 32,
        },
        AttnShape {
            q_rows: 17,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
        },
        AttnShape {
            q_rows: 33,
            heads: 6,
            kv_heads: 3,
            head_dim: 20,
        },
        AttnShape {
            q_rows: 5,
            heads: 2,
            kv_heads: 1,
            head_dim: 128,
        },
    ];
    for (i, s) in shapes.iter().enumerate() {
        for cached in [0usize, 1, 63, 64, 65, 200] {
            for stride_mult in [1, 2] {
                case::<f32>(
                    i as u64 * 7919 + cached as u64,
                    *s,
                    cached,
                    stride_mult,
                    2e-5,
                );
            }
        }
    }
}

#[test]
fn matches_the_reference_half() {
    let s = AttnShape {
        q_rows: 19,
        heads: 8,
        kv_heads: 4,
        head_dim: 64,
    };
    for cached in [0usize, 70, 150] {
        // Inputs are exactly representable; the error is the rounding of the output.
        case::<f16>(cached as u64 + 3, s, cached, 2, 2e-3);
        case::<bf16>(cached as u64 + 5, s, cached, 1, 1.6e-2);
    }
}

#[test]
fn fully_skipped_rows_give_zeros_and_bad_shapes_are_errors() {
    let s = AttnShape {
        q_rows: 2,
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
    };
    let q = vec![1f32; 16];
    let k = vec![1f32; 12];
    let segs = [KvSegment {
        k: &k,
        v: &k,
        rows: 3,
        row_stride: 4,
        skip: Skip::Range { start: 0, end: 3 },
    }];
    let mut out = vec![7f32; 16];
    attention(&q, &segs, s, 1.0, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0.0), "{out:?}");

    let short = [KvSegment {
        k: &k[..10],
        v: &k,
        rows: 3,
        row_stride: 4,
        skip: Skip::None,
    }];
    let e = attention(&q, &short, s, 1.0, &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("segment 0"), "{e}");
    let bad_gqa = AttnShape {
        heads: 3,
        kv_heads: 2,
        ..s
    };
    assert!(attention(&q, &segs, bad_gqa, 1.0, &mut out).is_err());
    let unsorted = [KvSegment {
        k: &k,
        v: &k,
        rows: 3,
        row_stride: 4,
        skip: Skip::Sorted(&[2, 1]),
    }];
    assert!(attention(&q, &unsorted, s, 1.0, &mut out).is_err());
    assert!(attention(&q, &segs, s, f32::NAN, &mut out).is_err());
}

#[test]
fn bit_identical_for_any_thread_count() {
    let s = AttnShape {
        q_rows: 40,
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
    };
    let mut rng = Rng(99);
    let row = s.kv_heads * s.head_dim;
    let k: Vec<f32> = rng.vec(300 * row);
    let v: Vec<f32> = rng.vec(300 * row);
    let q: Vec<f32> = rng.vec(s.q_rows * s.heads * s.head_dim);
    let segs = [KvSegment {
        k: &k,
        v: &v,
        rows: 300,
        row_stride: row,
        skip: Skip::Sorted(&[3, 77, 299]),
    }];
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut out = vec![0f32; q.len()];
        pool.install(|| attention(&q, &segs, s, 0.125, &mut out).unwrap());
        out
    };
    let one = run(1);
    for t in [2, 3, 7] {
        assert!(
            run(t)
                .iter()
                .zip(&one)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{t} threads"
        );
    }
}

#[test]
fn every_simd_path_gives_the_same_bits() {
    let s = AttnShape {
        q_rows: 21,
        heads: 6,
        kv_heads: 3,
        head_dim: 80,
    };
    let mut rng = Rng(7);
    let row = s.kv_heads * s.head_dim;
    let k: Vec<half::f16> = rng.vec(130 * row);
    let v: Vec<half::f16> = rng.vec(130 * row);
    let q: Vec<half::f16> = rng.vec(s.q_rows * s.heads * s.head_dim);
    let segs = [KvSegment {
        k: &k,
        v: &v,
        rows: 130,
        row_stride: row,
        skip: Skip::Range { start: 40, end: 61 },
    }];
    let run = |isa: Isa| {
        let mut out = vec![half::f16::ZERO; q.len()];
        attention_with(isa, &q, &segs, s, 0.1, &mut out).unwrap();
        out
    };
    let portable = run(Isa::Portable);
    for isa in Isa::available() {
        let o = run(isa);
        assert!(
            o.iter()
                .zip(&portable)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{isa}"
        );
    }
    // f32 queries and output (every bit of the f32 sums shows), a head size that is not a
    // multiple of 16 (partial column chunks), several whole 16-query lane groups per task and a
    // key count that leaves every remainder (eight-key, four-key and single-key chunks).
    let s = AttnShape {
        q_rows: 37,
        heads: 4,
        kv_heads: 2,
        head_dim: 72,
    };
    let row = s.kv_heads * s.head_dim;
    let rows = 64 + 47;
    let k: Vec<half::f16> = rng.vec(rows * row);
    let v: Vec<half::f16> = rng.vec(rows * row);
    let q: Vec<f32> = rng.vec(s.q_rows * s.heads * s.head_dim);
    let segs = [KvSegment {
        k: &k,
        v: &v,
        rows,
        row_stride: row,
        skip: Skip::None,
    }];
    let run = |isa: Isa| {
        let mut out = vec![0f32; q.len()];
        attention_with(isa, &q, &segs, s, 0.3, &mut out).unwrap();
        out
    };
    let portable = run(Isa::Portable);
    for isa in Isa::available() {
        let o = run(isa);
        let same = o
            .iter()
            .zip(&portable)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        assert_eq!(
            same,
            o.len(),
            "{isa}: f32 output differs from the portable path"
        );
    }
}
