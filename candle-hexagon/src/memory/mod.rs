//! Shared buffers and the NPU-visible address space.
//!
//! - [`SharedMemory`]: the host side of a shared allocation (memfd here, rpcmem on a phone).
//! - [`VaWindow`]: the bounded NPU address window (budget, mapper entries, page alignment,
//!   counters), a real `mmap` reservation for the emulated DSP.
//! - [`DeviceBuffer`]: a shared allocation mapped into the window and registered with the DSP as
//!   one buffer id (the unit the kernels address: `(buffer id, byte offset)`); unregistered and
//!   unmapped on drop.
//! - the weight arena (weights packed once at load, many per mapping so a model needs few mapper
//!   entries) and the activation staging buffer (one reused mapping, grown on demand).

mod shared_buffer;
mod va_window;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use shared_buffer::SharedMemory;
pub use va_window::{page_size, round_up, Mapping, VaStats, VaWindow};

use crate::error::{Error, Result};
use crate::transport::Transport;

/// Alignment of every tensor placed in a buffer (the kernels' `KDSP_BUFFER_ALIGN`).
pub const TENSOR_ALIGN: usize = kernels_dsp::KDSP_BUFFER_ALIGN as usize;

/// `x` rounded up to [`TENSOR_ALIGN`].
pub fn align_tensor(x: usize) -> usize {
    x.div_ceil(TENSOR_ALIGN) * TENSOR_ALIGN
}

/// Memory counters of a device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Address-window counters (maps, unmaps, peak VA, entries).
    pub va: VaStats,
    /// Bytes copied from candle tensors into shared staging buffers.
    pub staged_in: u64,
    /// Bytes copied from shared staging buffers into candle tensors.
    pub staged_out: u64,
    /// Bytes of packed weights placed in weight buffers.
    pub weight_bytes: u64,
    /// Buffers whose unregister/unmap failed on drop (their id and range are never reused).
    pub release_failures: u64,
}

/// The transport plus the books: window, buffer ids, counters.
pub(crate) struct Memory {
    pub(crate) transport: Box<dyn Transport>,
    pub(crate) window: VaWindow,
    ids: Mutex<Vec<u32>>,
    staged_in: AtomicU64,
    staged_out: AtomicU64,
    weight_bytes: AtomicU64,
    release_failures: AtomicU64,
}

impl Memory {
    /// Books for `transport` over `window`; buffer ids `0..ids`.
    pub(crate) fn new(transport: Box<dyn Transport>, window: VaWindow, ids: u32) -> Self {
        Memory {
            transport,
            window,
            ids: Mutex::new((0..ids).rev().collect()),
            staged_in: AtomicU64::new(0),
            staged_out: AtomicU64::new(0),
            weight_bytes: AtomicU64::new(0),
            release_failures: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        MemoryStats {
            va: self.window.stats(),
            staged_in: self.staged_in.load(Ordering::Relaxed),
            staged_out: self.staged_out.load(Ordering::Relaxed),
            weight_bytes: self.weight_bytes.load(Ordering::Relaxed),
            release_failures: self.release_failures.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count_staged(&self, bytes_in: usize, bytes_out: usize) {
        self.staged_in.fetch_add(bytes_in as u64, Ordering::Relaxed);
        self.staged_out
            .fetch_add(bytes_out as u64, Ordering::Relaxed);
    }

    /// Allocate `len` bytes of shared memory, map them into the window and register them.
    pub(crate) fn map(self: &Arc<Self>, len: usize) -> Result<DeviceBuffer> {
        let len = round_up(len.max(1) as u64, self.window.page()) as usize;
        // Refuse before allocating anything when the window cannot take it.
        if let Err(e) = self.window.check(len as u64) {
            self.window.note_refused();
            return Err(e);
        }
        let shm = self.transport.alloc(len)?;
        let mapping = self.window.map(shm.fd(), len as u64)?;
        let Some(id) = self.ids.lock().expect("id lock").pop() else {
            let _ = self.window.unmap(mapping);
            return Err(Error::MapperEntries {
                limit: self.window.stats().entry_limit,
            });
        };
        if let Err(e) = self.transport.attach(id, &shm, &mapping) {
            let _ = self.window.unmap(mapping);
            self.ids.lock().expect("id lock").push(id);
            return Err(e);
        }
        Ok(DeviceBuffer {
            mem: self.clone(),
            id,
            shm,
            mapping: Some(mapping),
        })
    }
}

/// Shared memory mapped into the NPU window and registered with the DSP as buffer [`Self::id`].
pub struct DeviceBuffer {
    mem: Arc<Memory>,
    id: u32,
    shm: SharedMemory,
    mapping: Option<Mapping>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("id", &self.id)
            .field("len", &self.shm.len())
            .field("window_offset", &self.window_offset())
            .finish()
    }
}

impl DeviceBuffer {
    /// The buffer id tensors name in op descriptors.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Length in bytes (a page multiple).
    pub fn len(&self) -> usize {
        self.shm.len()
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.shm.is_empty()
    }

    /// Offset of the mapping in the NPU window.
    pub fn window_offset(&self) -> u64 {
        self.mapping.as_ref().map(|m| m.offset()).unwrap_or(0)
    }

    /// Copy bytes in (the caller makes sure the DSP is not using the range).
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.shm.write(off, data)
    }

    /// Copy bytes out.
    pub fn read(&self, off: usize, n: usize) -> Result<Vec<u8>> {
        self.shm.read(off, n)
    }

    /// The host view.
    pub fn shared(&self) -> &SharedMemory {
        &self.shm
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let Some(mapping) = self.mapping.take() else {
            return;
        };
        // A failure here cannot be returned; it is counted, and the id / range stay unusable
        // rather than being handed out while the DSP may still reference them.
        let detached = self.mem.transport.detach(self.id, &self.shm, &mapping);
        if detached.is_err() {
            // Not unmapping keeps the range allocated in the window, so it is never reused.
            self.mem.release_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.mem.window.unmap(mapping).is_err() {
            self.mem.release_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.mem.ids.lock().expect("id lock").push(self.id);
    }
}

/// Default minimum size of the activation staging buffer.
pub const DEFAULT_STAGING_MIN_BYTES: usize = 1 << 20;

/// The reused activation staging buffer (one mapping, grown to the largest op seen).
#[derive(Default)]
pub(crate) struct Staging {
    buf: Option<DeviceBuffer>,
}

impl Staging {
    /// Capacity of the current buffer.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.as_ref().map(|b| b.len()).unwrap_or(0)
    }

    /// Make sure at least `need` bytes are mapped; returns the buffer.
    pub(crate) fn ensure(&mut self, mem: &Arc<Memory>, need: usize) -> Result<&DeviceBuffer> {
        if self.capacity() < need {
            // Drop the old mapping first so its range and entry count towards the new one.
            self.buf = None;
            let want = need.next_power_of_two().max(DEFAULT_STAGING_MIN_BYTES);
            let buf = match mem.map(want) {
                Ok(b) => b,
                Err(e) if e.is_resource_exhausted() && want > need => mem.map(need)?,
                Err(e) => return Err(e),
            };
            self.buf = Some(buf);
        }
        Ok(self.buf.as_ref().expect("ensured above"))
    }
}

/// A range of a shared weight buffer holding one packed tensor.
#[derive(Clone)]
pub(crate) struct WeightSlot {
    pub(crate) buf: Arc<DeviceBuffer>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl std::fmt::Debug for WeightSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WeightSlot(buffer {}, +{}, {} B)",
            self.buf.id(),
            self.offset,
            self.len
        )
    }
}

impl WeightSlot {
    /// Host view of the slot (load time only: the DSP reads weights, never writes them).
    ///
    /// # Safety
    /// No other view of this slot may be alive and no op may be reading it.
    #[allow(clippy::mut_from_ref)] // see SharedMemory::slice_mut
    pub(crate) unsafe fn bytes_mut(&self) -> Result<&mut [u8]> {
        self.buf.shared().slice_mut::<u8>(self.offset, self.len)
    }

    /// Read-only host view.
    pub(crate) fn bytes(&self) -> Result<&[u8]> {
        // SAFETY: weights are written once at load, before the slot is shared.
        unsafe { self.buf.shared().slice::<u8>(self.offset, self.len) }
    }
}

/// Bump allocation of packed weights in shared chunks; a chunk lives while any slot uses it.
pub(crate) struct WeightArena {
    chunk_bytes: usize,
    current: Option<(Arc<DeviceBuffer>, usize)>,
}

impl WeightArena {
    pub(crate) fn new(chunk_bytes: usize) -> Self {
        WeightArena {
            chunk_bytes,
            current: None,
        }
    }

    /// Whether `bytes` could be placed now.
    pub(crate) fn check(&self, mem: &Memory, bytes: usize) -> Result<()> {
        let need = align_tensor(bytes.max(1));
        if let Some((buf, used)) = &self.current {
            if used + need <= buf.len() {
                return Ok(());
            }
        }
        mem.window.check(need as u64)
    }

    /// Place `bytes` (zero-filled) and return the slot.
    pub(crate) fn alloc(&mut self, mem: &Arc<Memory>, bytes: usize) -> Result<WeightSlot> {
        let need = align_tensor(bytes.max(1));
        if let Some((buf, used)) = &mut self.current {
            if *used + need <= buf.len() {
                let slot = WeightSlot {
                    buf: buf.clone(),
                    offset: *used,
                    len: bytes,
                };
                *used += need;
                mem.weight_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                return Ok(slot);
            }
        }
        // Large tensors get their own mapping and leave the current chunk alone.
        let dedicated = need > self.chunk_bytes / 2;
        let buf = if dedicated {
            Arc::new(mem.map(need)?)
        } else {
            match mem.map(self.chunk_bytes) {
                Ok(b) => Arc::new(b),
                Err(Error::VaBudget { .. }) => Arc::new(mem.map(need)?),
                Err(e) => return Err(e),
            }
        };
        if !dedicated {
            self.current = Some((buf.clone(), need));
        }
        mem.weight_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(WeightSlot {
            buf,
            offset: 0,
            len: bytes,
        })
    }
}
