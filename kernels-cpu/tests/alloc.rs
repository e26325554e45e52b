//! A steady-state GEMM or attention (a call of a shape its threads have run before) allocates
//! nothing, on the calling thread or the pool's threads: work buffers are per thread, grown once
//! and kept. Counted with a global allocator, in a test binary of its own (one test, so no other
//! test allocates meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use half::f16;
use kernels_cpu::attention::{attention, AttnShape, KvSegment, Skip};
use kernels_cpu::{DenseMatrix, GgmlType, QuantMatrix};

mod common;
use common::{random_blocks, Rng};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::SeqCst) {
            ALLOCS.fetch_add(1, Ordering::SeqCst);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::SeqCst) {
            ALLOCS.fetch_add(1, Ordering::SeqCst);
        }
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if COUNTING.load(Ordering::SeqCst) {
            ALLOCS.fetch_add(1, Ordering::SeqCst);
        }
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations (by any thread) while `f` runs.
fn count(f: impl FnOnce()) -> usize {
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    f();
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCS.load(Ordering::SeqCst)
}

#[test]
fn steady_state_kernels_allocate_nothing() {
    let mut rng = Rng::new(5);
    let (n, k) = (200, 512);
    let quant: Vec<QuantMatrix> = [
        ("q4_0", GgmlType::Q4_0),
        ("q8_0", GgmlType::Q8_0),
        ("q4_k", GgmlType::Q4K),
        ("q6_k", GgmlType::Q6K),
    ]
    .into_iter()
    .map(|(ty, gt)| QuantMatrix::from_ggml(gt, n, k, &random_blocks(ty, n, k, &mut rng)).unwrap())
    .collect();
    let w32 = rng.vec(n * k);
    let w16: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
    let dense = [
        DenseMatrix::from_f32(&w32, n, k).unwrap(),
        DenseMatrix::from_f16(&w16, n, k).unwrap(),
    ];
    let bias = rng.vec(n);
    let s = AttnShape {
        q_rows: 40,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
    };
    let kv_rows = 150;
    let (kc, vc) = (rng.vec(kv_rows * 64), rng.vec(kv_rows * 64));
    let q = rng.vec(s.q_rows * 128);
    let mut att = vec![0f32; q.len()];

    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for m in [1, 7, 33, 160] {
            let x = rng.vec(m * k);
            let mut out = vec![0f32; m * n];
            let mut calls = || {
                for w in &quant {
                    w.view().gemm(&x, m, Some(&bias), &mut out).unwrap();
                }
                for w in &dense {
                    w.view().gemm(&x, m, Some(&bias), &mut out).unwrap();
                }
                let segs = [KvSegment {
                    k: &kc,
                    v: &vc,
                    rows: kv_rows,
                    row_stride: 64,
                    skip: Skip::Range { start: 3, end: 9 },
                }];
                attention(&q, &segs, s, 0.125, &mut att).unwrap();
            };
            // Warm every thread's buffers: each pool thread calls the kernels itself (a caller
            // inside the pool always runs a task of its call).
            pool.broadcast(|_| {
                let x = x.clone();
                let mut out = vec![0f32; m * n];
                let mut att = vec![0f32; q.len()];
                for w in &quant {
                    w.view().gemm(&x, m, Some(&bias), &mut out).unwrap();
                }
                for w in &dense {
                    w.view().gemm(&x, m, Some(&bias), &mut out).unwrap();
                }
                let segs = [KvSegment {
                    k: &kc,
                    v: &vc,
                    rows: kv_rows,
                    row_stride: 64,
                    skip: Skip::None,
                }];
                attention(&q, &segs, s, 0.125, &mut att).unwrap();
            });
            pool.install(&mut calls);
            // Called from a pool thread. The count is process-wide, and rayon's own deques grow
            // and shrink now and then (seen once under load: 1 allocation at 2 threads, 1 row),
            // so the least of three rounds of 3 calls must be 0: a kernel that allocates per call
            // allocates in every round.
            let inside = (0..3)
                .map(|_| pool.install(|| count(|| (0..3).for_each(|_| calls()))))
                .min()
                .unwrap_or(0);
            assert_eq!(
                inside, 0,
                "{threads} threads, {m} rows: allocations inside the pool"
            );
            // Called from outside the pool (rayon queues each call's job on its injector, which
            // allocates a block of slots now and then: not the kernels' doing).
            let outside = count(|| (0..3).for_each(|_| pool.install(&mut calls)));
            println!("{threads} threads, {m} rows: {outside} allocations in 3 calls from outside");
        }
    }
}
