//! Leases: which bytes of which buffer a submitted batch may still read or write.
//!
//! A batch names memory only through its descriptors (`buffer id`, offset, dims, strides), so the
//! bytes an op touches are known before it runs: the destination is written, the sources are
//! read. [`crate::HexagonDevice::submit`] records those ranges on each buffer *before* the batch
//! reaches the DSP, tied to the batch's [`Completion`]; they stay until the batch has finished (or
//! will never run), whether or not anybody waits on its fence. Every safe host access to a
//! [`super::DeviceBuffer`] checks its range against the live leases under the buffer's lock and
//! fails with [`Error::Busy`] on a conflict (host read vs in-flight write; host write vs any
//! in-flight access), so safe code cannot race the DSP. Non-conflicting access proceeds: the
//! CPU may read cached KV rows while the NPU appends new ones.

use std::sync::{Arc, Mutex, MutexGuard};

use kernels_dsp::*;

use crate::error::{Error, Result};
use crate::transport::Completion;

/// At most this many separate byte runs are tracked per tensor; more are merged into their hull
/// (conservative: a hull can only add conflicts, never hide one).
const MAX_RUNS_PER_TENSOR: u64 = 64;

/// How a batch touches a byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// One byte range of one buffer that an op of a batch reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Touch {
    pub(crate) buffer: u32,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) access: Access,
    pub(crate) op: &'static str,
}

#[derive(Debug, Clone)]
struct Lease {
    start: u64,
    end: u64,
    access: Access,
    op: &'static str,
    done: Completion,
}

/// The live leases of one buffer; its lock is also held for the duration of each checked host
/// copy, so a batch cannot be registered (and hence start) in the middle of one.
#[derive(Debug, Default)]
pub(crate) struct BufferLeases {
    leases: Mutex<Vec<Lease>>,
}

impl BufferLeases {
    fn lock(&self) -> MutexGuard<'_, Vec<Lease>> {
        let mut g = self.leases.lock().expect("lease lock");
        g.retain(|l| !l.done.is_done());
        g
    }

    pub(crate) fn add(&self, t: &Touch, done: &Completion) {
        self.lock().push(Lease {
            start: t.start,
            end: t.end,
            access: t.access,
            op: t.op,
            done: done.clone(),
        });
    }

    /// True when no batch in flight touches the buffer.
    pub(crate) fn is_idle(&self) -> bool {
        self.lock().is_empty()
    }

    /// Run `f` while holding the lock, after checking that host accesses `(start, end, access)`
    /// of buffer `id` conflict with no batch in flight.
    pub(crate) fn with_checked<T>(
        &self,
        id: u32,
        ranges: &[(u64, u64, Access)],
        f: impl FnOnce() -> T,
    ) -> Result<T> {
        let g = self.lock();
        for &(start, end, access) in ranges {
            let Some(l) = g.iter().find(|l| {
                l.start < end
                    && start < l.end
                    && (access == Access::Write || l.access == Access::Write)
            }) else {
                continue;
            };
            return Err(Error::Busy {
                buffer: id,
                host: match access {
                    Access::Read => "read",
                    Access::Write => "write",
                },
                start,
                end,
                dsp: match l.access {
                    Access::Read => "reads",
                    Access::Write => "writes",
                },
                op: l.op,
                dsp_start: l.start,
                dsp_end: l.end,
            });
        }
        let out = f();
        drop(g);
        Ok(out)
    }
}

/// The registry from buffer ids to their leases (ids are what descriptors name).
#[derive(Debug, Default)]
pub(crate) struct LeaseTable {
    by_id: Mutex<std::collections::HashMap<u32, Arc<BufferLeases>>>,
}

impl LeaseTable {
    pub(crate) fn insert(&self, id: u32, l: Arc<BufferLeases>) {
        self.by_id.lock().expect("lease table").insert(id, l);
    }

    pub(crate) fn remove(&self, id: u32) {
        self.by_id.lock().expect("lease table").remove(&id);
    }

    /// Record every touch of a batch against `done` (one buffer lock at a time). Ids that name no
    /// buffer of this session are skipped: the DSP rejects those ops.
    pub(crate) fn register(&self, touches: &[Touch], done: &Completion) {
        let table = self.by_id.lock().expect("lease table");
        let targets: Vec<(Arc<BufferLeases>, &Touch)> = touches
            .iter()
            .filter_map(|t| table.get(&t.buffer).map(|b| (b.clone(), t)))
            .collect();
        drop(table);
        for (b, t) in targets {
            b.add(t, done);
        }
    }
}

/// Bytes per element (plain types) or per 32-value block.
fn unit(dtype: u32) -> Option<u64> {
    match dtype {
        KDSP_DTYPE_F32 | KDSP_DTYPE_I32 => Some(4),
        KDSP_DTYPE_F16 => Some(2),
        KDSP_DTYPE_Q8_0 => Some(KDSP_Q8_0_BLOCK_BYTES as u64),
        KDSP_DTYPE_Q4_0 => Some(KDSP_Q4_0_BLOCK_BYTES as u64),
        _ => None,
    }
}

/// The byte runs `[start, end)` a tensor descriptor covers, as the kernels' validator computes
/// its extent (`kdsp_resolve`); contiguous dims are merged, the rest enumerated (or hulled).
/// A descriptor the DSP would reject still gets a conservative range.
pub(crate) fn tensor_runs(t: &kdsp_tensor) -> Vec<(u64, u64)> {
    tensor_runs_exact(t).0
}

/// [`tensor_runs`], and whether the runs are exactly the bytes the tensor covers (`false` when
/// they were widened to a hull or to everything): only exact runs may be taken as overwritten.
pub(crate) fn tensor_runs_exact(t: &kdsp_tensor) -> (Vec<(u64, u64)>, bool) {
    let everything = (vec![(t.offset.min(u64::MAX - 1), u64::MAX)], false);
    let ne = t.ne.map(|n| n.max(1) as u64);
    if t.layout != KDSP_LAYOUT_ROW_MAJOR {
        let tile = if t.layout == KDSP_LAYOUT_Q4_0_TILES {
            (KDSP_Q4_TILE_NIBBLE_BYTES + KDSP_Q4_TILE_SCALE_BYTES) as u64
        } else {
            KDSP_F16_TILE_BYTES as u64
        };
        let bytes = ne[0].div_ceil(32) * ne[1].div_ceil(32) * tile;
        return match t.offset.checked_add(bytes) {
            Some(end) => (vec![(t.offset, end)], true),
            None => everything,
        };
    }
    let Some(u) = unit(t.dtype) else {
        return everything;
    };
    let row = if matches!(t.dtype, KDSP_DTYPE_Q8_0 | KDSP_DTYPE_Q4_0) {
        ne[0] / 32 * u
    } else {
        ne[0] * u
    };
    // Merge leading dims that continue the run; the first one that does not ends the merging.
    let mut span = row;
    let mut first_outer = 4;
    for (i, (&n, &nb)) in ne.iter().zip(&t.nb).enumerate().skip(1) {
        if n == 1 {
            continue;
        }
        if nb == span {
            span = match span.checked_mul(n) {
                Some(s) => s,
                None => return everything,
            };
        } else {
            first_outer = i;
            break;
        }
    }
    let outer: Vec<usize> = (first_outer..4).filter(|&i| ne[i] > 1).collect();
    let count: u64 = outer.iter().map(|&i| ne[i]).product();
    if count > MAX_RUNS_PER_TENSOR {
        let mut hull = row;
        for (&n, &nb) in ne.iter().zip(&t.nb).skip(1) {
            let step = (n - 1).checked_mul(nb);
            match step.and_then(|s| hull.checked_add(s)) {
                Some(h) => hull = h,
                None => return everything,
            }
        }
        return match t.offset.checked_add(hull) {
            Some(end) => (vec![(t.offset, end)], false),
            None => everything,
        };
    }
    let mut runs = Vec::with_capacity(count as usize);
    for k in 0..count {
        let mut rem = k;
        let mut base = t.offset;
        for &i in &outer {
            let idx = rem % ne[i];
            rem /= ne[i];
            match idx.checked_mul(t.nb[i]).and_then(|o| base.checked_add(o)) {
                Some(b) => base = b,
                None => return everything,
            }
        }
        match base.checked_add(span) {
            Some(end) => runs.push((base, end)),
            None => return everything,
        }
    }
    (runs, true)
}

/// Every byte range the ops of a batch touch, merged per buffer and access.
pub(crate) fn batch_touches(ops: &[kdsp_op], labels: impl Fn(usize) -> &'static str) -> Vec<Touch> {
    let mut out: Vec<Touch> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let n_src = (op.n_src as usize).min(KDSP_MAX_SRC as usize);
        let tensors = std::iter::once((&op.dst, Access::Write))
            .chain(op.src[..n_src].iter().map(|s| (s, Access::Read)));
        for (t, access) in tensors {
            for (start, end) in tensor_runs(t) {
                out.push(Touch {
                    buffer: t.buffer_id,
                    start,
                    end,
                    access,
                    op: labels(i),
                });
            }
        }
    }
    out.sort_by_key(|t| (t.buffer, t.access == Access::Write, t.start));
    let mut merged: Vec<Touch> = Vec::with_capacity(out.len());
    for t in out {
        match merged.last_mut() {
            Some(m) if m.buffer == t.buffer && m.access == t.access && t.start <= m.end => {
                m.end = m.end.max(t.end);
            }
            _ => merged.push(t),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_rows(off: u64, ne: [u32; 4], nb: [u64; 4]) -> kdsp_tensor {
        kdsp_tensor {
            buffer_id: 3,
            dtype: KDSP_DTYPE_F16,
            layout: KDSP_LAYOUT_ROW_MAJOR,
            offset: off,
            ne,
            nb,
            ..Default::default()
        }
    }

    #[test]
    fn runs_follow_the_descriptor() {
        // contiguous: one run
        let t = f16_rows(256, [8, 2, 3, 1], [2, 16, 32, 96]);
        assert_eq!(tensor_runs(&t), vec![(256, 256 + 96)]);
        // KV rows [len, len + n) of two batch items in a cache of capacity 10 rows of 32 B:
        // one run per batch item, the cached rows between them untouched
        let t = f16_rows(4 * 32, [16, 3, 2, 1], [2, 32, 320, 640]);
        assert_eq!(tensor_runs(&t), vec![(128, 224), (448, 544)]);
        // a column block of wider rows: one run per row
        let t = f16_rows(8, [4, 3, 1, 1], [2, 40, 120, 120]);
        assert_eq!(tensor_runs(&t), vec![(8, 16), (48, 56), (88, 96)]);
        // too many runs: the hull
        let t = f16_rows(0, [4, 100, 1, 1], [2, 40, 4000, 4000]);
        assert_eq!(tensor_runs(&t), vec![(0, 99 * 40 + 8)]);
        // tiles
        let w = kdsp_tensor {
            layout: KDSP_LAYOUT_HMX_WEIGHT_TILES,
            dtype: KDSP_DTYPE_F16,
            offset: 128,
            ne: [33, 64, 1, 1],
            ..Default::default()
        };
        assert_eq!(tensor_runs(&w), vec![(128, 128 + 4 * 2048)]);
        // overflowing descriptors cover everything from their offset
        let t = f16_rows(8, [4, 3, 1, 1], [2, u64::MAX / 2, 0, 0]);
        assert_eq!(tensor_runs(&t), vec![(8, u64::MAX)]);
    }

    #[test]
    fn conflicts_follow_read_write_rules_and_end_with_the_batch() {
        let l = BufferLeases::default();
        let done = Completion::default();
        let touch = |start, end, access| Touch {
            buffer: 1,
            start,
            end,
            access,
            op: "op",
        };
        l.add(&touch(100, 200, Access::Write), &done);
        l.add(&touch(0, 100, Access::Read), &done);
        let chk = |s, e, a| l.with_checked(1, &[(s, e, a)], || ());
        assert!(chk(0, 100, Access::Read).is_ok(), "read vs read");
        assert!(chk(200, 300, Access::Write).is_ok(), "disjoint write");
        let e = chk(150, 160, Access::Read).unwrap_err().to_string();
        assert!(
            e.contains("host read") && e.contains("writes [100, 200)"),
            "{e}"
        );
        assert!(chk(50, 60, Access::Write).is_err(), "write vs read");
        assert!(!l.is_idle());
        done.set();
        assert!(chk(50, 160, Access::Write).is_ok());
        assert!(l.is_idle());
    }

    #[test]
    fn batch_touches_merge_per_buffer_and_access() {
        let a = f16_rows(0, [8, 1, 1, 1], [2, 16, 16, 16]);
        let b = f16_rows(16, [8, 1, 1, 1], [2, 16, 16, 16]);
        let op = kdsp_op::new(KDSP_OP_CPY, b, &[a]);
        let op2 = kdsp_op::new(
            KDSP_OP_CPY,
            f16_rows(32, [8, 1, 1, 1], [2, 16, 16, 16]),
            &[b],
        );
        let t = batch_touches(&[op, op2], |_| "cpy");
        let got: Vec<_> = t.iter().map(|t| (t.start, t.end, t.access)).collect();
        assert_eq!(
            got,
            vec![(0, 32, Access::Read), (16, 48, Access::Write)],
            "{t:?}"
        );
    }
}
