//! The swap counters of a device ([`SwapStats`]), kept apart from the runtime so the device can
//! hold them without importing the runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::kinds::SwapSnapshot;
use crate::transport::Completion;

/// Swap counters of a device (all modules), as atomics.
#[derive(Debug, Default)]
pub struct SwapStats {
    forwards: AtomicU64,
    bytes_streamed: AtomicU64,
    stall_ns: AtomicU64,
    overlapped_ns: AtomicU64,
    plans: AtomicU64,
    shape_plans: AtomicU64,
    shape_plan_evictions: AtomicU64,
    evictions: AtomicU64,
    slot_waits: AtomicU64,
}

impl SwapStats {
    pub(crate) fn snapshot(&self) -> SwapSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SwapSnapshot {
            forwards: l(&self.forwards),
            bytes_streamed: l(&self.bytes_streamed),
            stall_ns: l(&self.stall_ns),
            overlapped_ns: l(&self.overlapped_ns),
            plans: l(&self.plans),
            shape_plans: l(&self.shape_plans),
            shape_plan_evictions: l(&self.shape_plan_evictions),
            evictions: l(&self.evictions),
            slot_waits: l(&self.slot_waits),
        }
    }

    fn add(a: &AtomicU64, v: u64) {
        a.fetch_add(v, Ordering::Relaxed);
    }

    /// Count staging of `bytes` over `[start, end)`; `last` is the last batch queued before it
    /// (`None`: nothing was queued, the DSP idled throughout). The part of the staging after the
    /// DSP finished `last` is stall, the rest was overlapped.
    pub(crate) fn staged(
        &self,
        bytes: u64,
        start: Instant,
        end: Instant,
        last: Option<&Completion>,
    ) {
        let total = end.saturating_duration_since(start).as_nanos() as u64;
        let stall = match last {
            None => total,
            Some(c) => match c.done_at() {
                Some(t) => end.saturating_duration_since(t.max(start)).as_nanos() as u64,
                None => 0,
            },
        };
        Self::add(&self.bytes_streamed, bytes);
        Self::add(&self.stall_ns, stall);
        Self::add(&self.overlapped_ns, total.saturating_sub(stall));
    }

    pub(crate) fn count_forward(&self) {
        Self::add(&self.forwards, 1);
    }

    pub(crate) fn count_plan(&self) {
        Self::add(&self.plans, 1);
    }

    pub(crate) fn count_shape_plan(&self, evicted: u64) {
        Self::add(&self.shape_plans, 1);
        Self::add(&self.shape_plan_evictions, evicted);
    }

    pub(crate) fn count_evictions(&self, n: u64) {
        Self::add(&self.evictions, n);
    }

    /// Wait for `reader` (the batch still reading a staging slot) before the slot is
    /// overwritten; a wait on a batch not yet done is counted first.
    pub(crate) fn wait_for_slot(&self, reader: &Completion) {
        if !reader.is_done() {
            Self::add(&self.slot_waits, 1);
        }
        reader.wait();
    }
}
