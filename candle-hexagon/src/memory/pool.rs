//! A pool of shared buffers for per-call staging and block activations.
//!
//! A call takes a buffer (the smallest idle one that fits, or a new mapping) and gives it back
//! when it is done, so concurrent calls on one device never wait for each other's staging
//! memory and no lock is held while the DSP works. A buffer some batch may still touch is never
//! handed out (its leases say so). A few idle buffers are kept for reuse, so serial calls of one
//! shape find the same buffer (and the same offsets) every time.

use std::sync::{Arc, Mutex};

use super::{DeviceBuffer, Memory};
use crate::error::Result;

/// Smallest mapping the pool creates (small calls share it).
pub const MIN_POOLED_BYTES: usize = 1 << 20;
/// Idle buffers kept for reuse; more are unmapped when they come back.
pub const MAX_IDLE_BUFFERS: usize = 4;

/// Idle buffers of a device.
#[derive(Default)]
pub(crate) struct BufferPool {
    idle: Mutex<Vec<DeviceBuffer>>,
}

impl BufferPool {
    /// A buffer of at least `need` bytes, exclusively the caller's until the guard drops.
    pub(crate) fn take(self: &Arc<Self>, mem: &Arc<Memory>, need: usize) -> Result<PooledBuffer> {
        self.take_with(mem, need, false)
    }

    /// [`Self::take`]; with `exact`, a new mapping is exactly `need` bytes (page-rounded) rather
    /// than the next power of two (callers that plan the window size their buffers themselves).
    pub(crate) fn take_with(
        self: &Arc<Self>,
        mem: &Arc<Memory>,
        need: usize,
        exact: bool,
    ) -> Result<PooledBuffer> {
        let reused = {
            let mut idle = self.idle.lock().expect("pool lock");
            let best = idle
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= need && b.is_idle())
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| idle.swap_remove(i))
        };
        let buf = match reused {
            Some(b) => b,
            None => {
                let want = if exact {
                    need
                } else {
                    need.next_power_of_two().max(MIN_POOLED_BYTES)
                };
                match mem.map(want) {
                    Ok(b) => b,
                    Err(e) if e.is_resource_exhausted() => {
                        // Give the idle mappings' address space back, then try the exact size.
                        let freed: Vec<DeviceBuffer> =
                            std::mem::take(&mut *self.idle.lock().expect("pool lock"));
                        drop(freed);
                        mem.map(need)?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        Ok(PooledBuffer {
            buf: Some(buf),
            pool: self.clone(),
        })
    }

    /// Unmap every idle buffer (their window space goes back to the planner).
    pub(crate) fn release_idle(&self) {
        let freed: Vec<DeviceBuffer> = std::mem::take(&mut *self.idle.lock().expect("pool lock"));
        drop(freed);
    }

    /// Buffers waiting for reuse.
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.lock().expect("pool lock").len()
    }
}

/// A buffer taken from the pool; returned to it on drop.
pub(crate) struct PooledBuffer {
    buf: Option<DeviceBuffer>,
    pool: Arc<BufferPool>,
}

impl std::ops::Deref for PooledBuffer {
    type Target = DeviceBuffer;

    fn deref(&self) -> &DeviceBuffer {
        self.buf.as_ref().expect("present until drop")
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut idle = self.pool.idle.lock().expect("pool lock");
            if idle.len() < MAX_IDLE_BUFFERS {
                idle.push(b);
            } else {
                drop(idle);
                drop(b);
            }
        }
    }
}
