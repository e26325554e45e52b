//! Splitting a GEMM over output tiles on the current rayon pool.
//!
//! A task owns a rectangle of the output (a range of weight slabs x a range of activation
//! rows); rectangles are fixed by the shape alone, never by the thread count, so each output
//! element is computed by the same code in the same order whatever the pool size.

use rayon::prelude::*;

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: tasks built by `for_each_tile` write disjoint rectangles of the output, and the
// borrow the pointer came from outlives the parallel region.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Rows of activations a task covers at most (keeps a task's activation rows in L2).
const ROWS_PER_TASK: usize = 64;

/// Run `f(slabs, rows)` over a grid covering `n_slabs` weight slabs x `m` activation rows.
/// Tasks are sized from the shape only (so the split is the same on every pool), and small
/// enough that a few threads find work even for one-row activations.
pub(crate) fn for_each_tile(
    n_slabs: usize,
    m: usize,
    f: impl Fn(std::ops::Range<usize>, std::ops::Range<usize>) + Sync,
) {
    // Aim for a few dozen tasks: enough to balance any realistic pool, few enough that the
    // per-task cost (reloading a slab's activations) stays small.
    let row_chunks = m.div_ceil(ROWS_PER_TASK).max(1);
    let rows_per = m.div_ceil(row_chunks).max(1);
    let slab_chunks = (32 / row_chunks).clamp(1, n_slabs.max(1));
    let slabs_per = n_slabs.div_ceil(slab_chunks).max(1);
    let tasks: Vec<(usize, usize)> = (0..n_slabs.div_ceil(slabs_per))
        .flat_map(|s| (0..row_chunks).map(move |r| (s, r)))
        .collect();
    let run = |&(s, r): &(usize, usize)| {
        let slabs = s * slabs_per..((s + 1) * slabs_per).min(n_slabs);
        let rows = r * rows_per..((r + 1) * rows_per).min(m);
        if !rows.is_empty() && !slabs.is_empty() {
            f(slabs, rows)
        }
    };
    if rayon::current_num_threads() <= 1 || tasks.len() <= 1 {
        tasks.iter().for_each(run);
    } else {
        tasks.par_iter().for_each(run);
    }
}
