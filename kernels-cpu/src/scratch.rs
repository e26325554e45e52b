//! Work buffers reused across calls: one set per thread, grown on demand and kept, so a GEMM or
//! an attention of a shape this thread has run before allocates nothing.
//!
//! A task takes its thread's set out of the thread-local slot for its duration and puts it back
//! after ([`with`]); a call that runs while the set is out (a kernel called from inside another
//! kernel's task on the same thread, which the kernels never do) finds an empty set and allocates
//! its own, so the slot is never borrowed twice.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::act::{Acts, RowBufs};

/// One thread's work buffers.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Quantized activations of the rows a task covers ([`crate::qgemm`]).
    pub acts: Acts,
    /// One row's quantizer output before it is laid group-major.
    pub row: RowBufs,
    /// K-pair-major activations of the rows a task covers ([`crate::dense`]).
    pub pairs: Vec<f32>,
    /// Attention's per-task arrays ([`crate::attention`]).
    pub attn: Vec<f32>,
    /// Which activations `acts` or `pairs` hold: `(call, first row, end row)`, so a thread that
    /// runs several tasks of one call over the same rows prepares them once.
    pub tag: (u64, usize, usize),
}

// Why a thread-local and not a buffer passed in: the GEMMs run on whatever rayon pool the
// caller installed (the model's own, or the global one), and a buffer must belong to the worker
// thread that fills it, for the whole call, without a lock. This is a cache of memory, not
// configuration: no option or behaviour depends on it, results are the same bits with a fresh
// buffer, and it is freed with its thread. (Options and pools are passed explicitly.)
thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

static CALLS: AtomicU64 = AtomicU64::new(1);

/// A number no other kernel call of this process has (the `call` of [`Scratch::tag`]).
pub(crate) fn call_id() -> u64 {
    CALLS.fetch_add(1, Ordering::Relaxed)
}

/// Run `f` with this thread's work buffers.
pub(crate) fn with<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|slot| {
        let mut s = slot.take();
        let r = f(&mut s);
        slot.set(s);
        r
    })
}
