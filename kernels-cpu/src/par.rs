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

/// Rows of activations a micro-kernel pass covers at most (keeps them in L2 while a range of
/// weight slabs passes over them).
pub(crate) const ROWS_PER_PASS: usize = 64;
/// Rows of a row group at most (bounds the per-thread buffers at this many prepared rows).
const GROUP_ROWS: usize = 256;
/// Fewest rows per thread for which tasks split the rows rather than the weight slabs.
const MIN_ROWS_PER_THREAD: usize = 16;
/// Slab ranges per thread when the weight slabs are split (room for the pool to rebalance when
/// another process takes a core).
const SLAB_TASKS_PER_THREAD: usize = 4;
/// Weight bytes of a slab range at most (it stays in L2 while the row passes go over it).
const SLAB_RANGE_BYTES: usize = 512 << 10;

/// How one call's output is cut into tasks: row groups x slab ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    /// Activation row groups (sizes differ by at most one row).
    pub groups: usize,
    /// Weight slab ranges (sizes differ by at most one slab).
    pub slab_chunks: usize,
    /// Rows of the largest group (what a task's buffers must hold).
    pub max_rows: usize,
}

/// The grid for `n_slabs` weight slabs of `slab_bytes` bytes each x `m` rows on `threads`
/// threads. With enough rows every thread gets its own row groups (a task prepares the
/// activations of its group, once per thread: nothing is prepared twice unless a thread steals
/// another's work); with few rows there is one group and the slabs are split into a multiple
/// of `threads` ranges. Slab ranges are also small enough to stay in L2.
pub(crate) fn grid(n_slabs: usize, slab_bytes: usize, m: usize, threads: usize) -> Grid {
    let threads = threads.max(1);
    let n_slabs = n_slabs.max(1);
    let mut groups = m.div_ceil(GROUP_ROWS).max(1);
    let mut slab_chunks = n_slabs.div_ceil((SLAB_RANGE_BYTES / slab_bytes.max(1)).max(1));
    if threads > 1 {
        if m >= MIN_ROWS_PER_THREAD * threads {
            groups = groups.div_ceil(threads) * threads;
        } else {
            slab_chunks = slab_chunks
                .max(threads * SLAB_TASKS_PER_THREAD)
                .div_ceil(threads)
                * threads;
        }
    }
    Grid {
        groups,
        slab_chunks: slab_chunks.min(n_slabs),
        max_rows: m.div_ceil(groups),
    }
}

/// Part `i` of `0..len` cut into `parts` ranges whose sizes differ by at most one.
fn part(len: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    i * len / parts..(i + 1) * len / parts
}

/// Run `f(slabs, rows)` over the grid ([`grid`]) covering `n_slabs` weight slabs x `m`
/// activation rows, on the current pool; tasks are ordered row group first, so a thread's
/// consecutive tasks share their rows.
pub(crate) fn for_each_tile(
    g: Grid,
    n_slabs: usize,
    m: usize,
    f: impl Fn(std::ops::Range<usize>, std::ops::Range<usize>) + Sync,
) {
    let tasks = g.groups * g.slab_chunks;
    let run = |t: usize| {
        let (r, s) = (t / g.slab_chunks, t % g.slab_chunks);
        let slabs = part(n_slabs, g.slab_chunks, s);
        let rows = part(m, g.groups, r);
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

/// `0..rows` in passes of at most [`ROWS_PER_PASS`] rows.
pub(crate) fn passes(rows: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..rows)
        .step_by(ROWS_PER_PASS)
        .map(move |r| r..(r + ROWS_PER_PASS).min(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_the_output_evenly() {
        for threads in [1, 2, 3, 8] {
            for m in [1, 2, 7, 16, 31, 32, 33, 64, 65, 70, 160, 224, 1000] {
                for (n_slabs, bytes) in [
                    (1, 64),
                    (2, 9000),
                    (3, 64),
                    (48, 49152),
                    (128, 4096),
                    (513, 1 << 20),
                ] {
                    let g = grid(n_slabs, bytes, m, threads);
                    let mut seen = vec![0u8; n_slabs * m];
                    let mut biggest = 0;
                    for t in 0..g.groups * g.slab_chunks {
                        let (r, s) = (t / g.slab_chunks, t % g.slab_chunks);
                        let (rows, slabs) = (part(m, g.groups, r), part(n_slabs, g.slab_chunks, s));
                        biggest = biggest.max(rows.len());
                        for r in rows {
                            for s in slabs.clone() {
                                seen[r * n_slabs + s] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&c| c == 1), "{threads} {m} {n_slabs}");
                    assert!(biggest <= g.max_rows && g.max_rows <= GROUP_ROWS);
                    if threads > 1 && g.groups * g.slab_chunks >= threads {
                        // Tasks are a multiple of the thread count (or every slab is one).
                        assert!(
                            (g.groups * g.slab_chunks).is_multiple_of(threads)
                                || g.slab_chunks == n_slabs,
                            "{threads} {m} {n_slabs} {g:?}"
                        );
                    }
                }
            }
        }
    }
}
