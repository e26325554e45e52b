//! Splitting a GEMM over output tiles on the current rayon pool, in one parallel region.
//!
//! A task owns a rectangle of the output (a range of weight slabs x a range of activation rows)
//! and prepares the activations of its rows itself (packs or quantizes them into its thread's
//! reused buffers, [`crate::scratch`]), so an op is one parallel region with no serial step
//! before it. Each output element is computed by the same operations in the same order whatever
//! rectangle it falls in (the micro-kernels keep one accumulator per output), so the split may
//! depend on the thread count while the results stay bit-identical for any thread count.

use rayon::prelude::*;

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: tasks built by `for_each_tile` write disjoint rectangles of the output, and the
// borrow the pointer came from outlives the parallel region.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// Rows of activations a task covers at most (keeps a task's activation rows in L2 and bounds
/// the per-thread buffers at this many rows).
const ROWS_PER_TASK: usize = 64;
/// Fewest rows per thread for which tasks split the rows rather than the weight slabs.
const MIN_ROWS_PER_THREAD: usize = 16;
/// Slab ranges per thread when the weight slabs are split (room for the pool to rebalance when
/// another process takes a core).
const SLAB_TASKS_PER_THREAD: usize = 4;

/// How one call's output is cut into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    /// Activation row ranges (sizes differ by at most one row).
    pub row_chunks: usize,
    /// Weight slab ranges (sizes differ by at most one slab).
    pub slab_chunks: usize,
    /// Rows of the largest row range (what a task's buffers must hold).
    pub max_rows: usize,
}

/// The grid for `n_slabs` weight slabs x `m` rows on `threads` threads. With enough rows every
/// thread gets whole row ranges (each task prepares only its own rows, nothing is prepared
/// twice); with few rows the slabs are split into equal ranges, a multiple of `threads` of them,
/// and each thread prepares the few rows once.
pub(crate) fn grid(n_slabs: usize, m: usize, threads: usize) -> Grid {
    let threads = threads.max(1);
    let n_slabs = n_slabs.max(1);
    let mut row_chunks = m.div_ceil(ROWS_PER_TASK).max(1);
    let mut slab_chunks = 1;
    if threads > 1 {
        if m >= MIN_ROWS_PER_THREAD * threads {
            row_chunks = row_chunks.div_ceil(threads) * threads;
        } else {
            slab_chunks = (threads * SLAB_TASKS_PER_THREAD).min(n_slabs);
        }
    }
    Grid {
        row_chunks,
        slab_chunks,
        max_rows: m.div_ceil(row_chunks),
    }
}

/// Part `i` of `0..len` cut into `parts` ranges whose sizes differ by at most one.
fn part(len: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    i * len / parts..(i + 1) * len / parts
}

/// Run `f(slabs, rows)` over the grid ([`grid`]) covering `n_slabs` weight slabs x `m`
/// activation rows, on the current pool; tasks are ordered row range first, so threads that
/// take neighbouring tasks share rows.
pub(crate) fn for_each_tile(
    g: Grid,
    n_slabs: usize,
    m: usize,
    f: impl Fn(std::ops::Range<usize>, std::ops::Range<usize>) + Sync,
) {
    let tasks = g.row_chunks * g.slab_chunks;
    let run = |t: usize| {
        let (r, s) = (t / g.slab_chunks, t % g.slab_chunks);
        let slabs = part(n_slabs, g.slab_chunks, s);
        let rows = part(m, g.row_chunks, r);
        if !rows.is_empty() && !slabs.is_empty() {
            f(slabs, rows)
        }
    };
    if rayon::current_num_threads() <= 1 || tasks <= 1 {
        (0..tasks).for_each(run);
    } else {
        (0..tasks).into_par_iter().with_max_len(1).for_each(run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_the_output_evenly() {
        for threads in [1, 2, 3, 8] {
            for m in [1, 2, 7, 16, 31, 32, 33, 64, 65, 70, 160, 224, 1000] {
                for n_slabs in [1, 2, 3, 48, 128, 513] {
                    let g = grid(n_slabs, m, threads);
                    let mut seen = vec![0u8; n_slabs * m];
                    let mut biggest = 0;
                    let mut sizes = Vec::new();
                    for t in 0..g.row_chunks * g.slab_chunks {
                        let (r, s) = (t / g.slab_chunks, t % g.slab_chunks);
                        let (rows, slabs) =
                            (part(m, g.row_chunks, r), part(n_slabs, g.slab_chunks, s));
                        biggest = biggest.max(rows.len());
                        sizes.push(rows.len() * slabs.len());
                        for r in rows {
                            for s in slabs.clone() {
                                seen[r * n_slabs + s] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&c| c == 1), "{threads} {m} {n_slabs}");
                    assert!(biggest <= g.max_rows && g.max_rows <= ROWS_PER_TASK);
                    if threads > 1 && g.row_chunks * g.slab_chunks >= threads {
                        // Tasks are a multiple of the thread count (or every slab is one).
                        assert!(
                            (g.row_chunks * g.slab_chunks).is_multiple_of(threads)
                                || g.slab_chunks == n_slabs,
                            "{threads} {m} {n_slabs} {g:?}"
                        );
                    }
                }
            }
        }
    }
}
