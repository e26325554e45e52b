//! Shared buffers and the NPU-visible address space.
//!
//! - [`SharedMemory`]: the host side of a shared allocation (memfd here, rpcmem on a phone).
//! - [`VaWindow`]: the bounded NPU address window (budget, mapper entries, page alignment,
//!   counters), a real `mmap` reservation for the emulated DSP.
//! - [`DeviceBuffer`]: a shared allocation mapped into the window and registered with the DSP as
//!   one buffer id (the unit the kernels address: `(buffer id, byte offset)`); unregistered and
//!   unmapped on drop.
//! - the weight arena (weights packed once at load, many per mapping so a model needs few mapper
//!   entries) and the buffer pool (staging and activation buffers taken per call and returned,
//!   so concurrent calls never wait for each other's buffer).
//! - leases (`leases.rs`): the byte ranges submitted batches may still touch; every safe host
//!   access to a [`DeviceBuffer`] is checked against them.
//! - the weight file (`weights.rs`): a module's packed linear weights, written once at load time
//!   into shared memory; the host reads them in place ([`WeightBytes`]) and resident weights are
//!   mapped from the same memory ([`DeviceBuffer`]s over a range of it), not copied.

pub(crate) mod leases;
mod pool;
pub(crate) mod shared_buffer;
pub(crate) mod va_window;
mod weights;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use pool::MAX_IDLE_BUFFERS;
pub(crate) use pool::{BufferPool, PooledBuffer};
pub use shared_buffer::SharedMemory;
pub use va_window::{page_size, round_up, Mapping, VaStats, VaWindow};
pub use weights::WeightBytes;
pub(crate) use weights::{WeightFile, WeightFileBuilder};

use crate::error::{Error, InputProblem, Result};
use crate::transport::Transport;
use leases::{Access, BufferLeases, LeaseTable};

/// True when this target has the shared memory the backend is built on (memfd: Linux and
/// Android). Elsewhere the crate compiles as a stub: [`crate::HexagonDevice::open`] returns
/// [`Error::Unsupported`].
pub const SHARED_MEMORY_SUPPORTED: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// `Ok` on a target with memfd shared memory, else [`Error::Unsupported`] for `what`.
pub fn check_target(what: &'static str) -> Result<()> {
    check_os(what, std::env::consts::OS)
}

/// [`check_target`] for a given OS name (`std::env::consts::OS` spelling), so the stub's error is
/// testable on any host.
fn check_os(what: &'static str, os: &'static str) -> Result<()> {
    if matches!(os, "linux" | "android") {
        Ok(())
    } else {
        Err(Error::Unsupported { what, os })
    }
}

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
    /// Bytes the host copied into shared buffers (staging, block inputs, KV rows written).
    pub staged_in: u64,
    /// Bytes the host copied out of shared buffers (results, KV rows read).
    pub staged_out: u64,
    /// Bytes of packed weights placed in weight buffers.
    pub weight_bytes: u64,
    /// Buffers whose unregister/unmap failed on drop (their id and range are never reused).
    pub release_failures: u64,
    /// Packed linear weights held now in host memory the NPU never maps (the host copy when the
    /// transport cannot map ranges of shared memory, so resident weights are copied). Norm
    /// vectors and RoPE tables (pinned, one copy in one mapping) are not counted.
    pub host_weight_bytes: u64,
    /// Packed linear weights held now in shared memory that the host reads in place and the NPU
    /// maps in place when they are resident: the one copy of the weights.
    pub shared_weight_bytes: u64,
    /// Packed linear weight bytes the NPU side holds now in mappings that are separate copies
    /// (not the memory of the host bytes): resident weights copied into their own mappings,
    /// the `naive` / `paging` policies' on-demand mappings, and the capacity of the `somr`
    /// staging slots (streamed weights are copied through them).
    pub npu_weight_bytes: u64,
}

/// The transport plus the books: window, buffer ids, counters.
pub(crate) struct Memory {
    pub(crate) transport: Box<dyn Transport>,
    pub(crate) window: VaWindow,
    pub(crate) leases: LeaseTable,
    ids: Mutex<Vec<u32>>,
    staged_in: AtomicU64,
    staged_out: AtomicU64,
    weight_bytes: AtomicU64,
    release_failures: AtomicU64,
    host_weight_bytes: AtomicU64,
    shared_weight_bytes: AtomicU64,
    npu_weight_bytes: AtomicU64,
}

impl Memory {
    /// Books for `transport` over `window`; buffer ids `0..ids`.
    pub(crate) fn new(transport: Box<dyn Transport>, window: VaWindow, ids: u32) -> Self {
        Memory {
            transport,
            window,
            leases: LeaseTable::default(),
            ids: Mutex::new((0..ids).rev().collect()),
            staged_in: AtomicU64::new(0),
            staged_out: AtomicU64::new(0),
            weight_bytes: AtomicU64::new(0),
            release_failures: AtomicU64::new(0),
            host_weight_bytes: AtomicU64::new(0),
            shared_weight_bytes: AtomicU64::new(0),
            npu_weight_bytes: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        MemoryStats {
            va: self.window.stats(),
            staged_in: self.staged_in.load(Ordering::Relaxed),
            staged_out: self.staged_out.load(Ordering::Relaxed),
            weight_bytes: self.weight_bytes.load(Ordering::Relaxed),
            release_failures: self.release_failures.load(Ordering::Relaxed),
            host_weight_bytes: self.host_weight_bytes.load(Ordering::Relaxed),
            shared_weight_bytes: self.shared_weight_bytes.load(Ordering::Relaxed),
            npu_weight_bytes: self.npu_weight_bytes.load(Ordering::Relaxed),
        }
    }

    /// Count `bytes` of packed weights placed in shared buffers.
    pub(crate) fn count_weights(&self, bytes: u64) {
        self.weight_bytes.fetch_add(bytes, Ordering::Relaxed);
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
        self.register(Backing::Owned(shm), mapping)
    }

    /// Map `[offset, offset + len)` of a sealed weight file (`offset` a page multiple) into the
    /// window, read-only, and register it: resident weights in place, no allocation and no
    /// copy. The window's budget and entry limit apply as to [`Self::map`]. Only for a file whose
    /// transport maps shared ranges ([`WeightFile::shared`]).
    pub(crate) fn map_weights(
        self: &Arc<Self>,
        file: &Arc<WeightFile>,
        offset: usize,
        len: usize,
    ) -> Result<DeviceBuffer> {
        let page = self.window.page();
        let len = round_up(len.max(1) as u64, page) as usize;
        if !file.shared() || offset.checked_add(len).is_none_or(|e| e > file.shm().len()) {
            let (offset, len, size) = (offset as u64, len as u64, file.shm().len() as u64);
            let problem = if file.shared() {
                InputProblem::OutOfRange {
                    what: "weight file",
                    offset,
                    len,
                    size,
                }
            } else {
                InputProblem::NotShared { offset, len, size }
            };
            return Err(Error::input("weight mapping", problem));
        }
        let mapping = self
            .window
            .map_range(file.shm().fd(), offset as u64, len as u64, false)?;
        self.register(
            Backing::Weights {
                file: file.clone(),
                offset,
                len,
            },
            mapping,
        )
    }

    /// Give `mapping` of `backing` a buffer id and register it with the DSP.
    fn register(self: &Arc<Self>, backing: Backing, mapping: Mapping) -> Result<DeviceBuffer> {
        let Some(id) = self.ids.lock().expect("id lock").pop() else {
            let _ = self.window.unmap(mapping);
            return Err(Error::MapperEntries {
                limit: self.window.stats().entry_limit,
            });
        };
        // SAFETY: the memory becomes a DeviceBuffer, whose host access is checked against the
        // leases of submitted batches (or refused: a weight-file range is read-only, and nothing
        // writes a sealed weight file); the backing and mapping live in it until Drop detaches
        // them.
        let range = backing.range();
        if let Err(e) = unsafe { self.transport.attach(id, backing.shm(), range, &mapping) } {
            let _ = self.window.unmap(mapping);
            self.ids.lock().expect("id lock").push(id);
            return Err(e);
        }
        let leases = Arc::new(BufferLeases::default());
        self.leases.insert(id, leases.clone());
        Ok(DeviceBuffer {
            mem: self.clone(),
            id,
            backing,
            mapping: Some(mapping),
            leases,
            weight_copy_bytes: 0,
        })
    }
}

/// The memory behind a [`DeviceBuffer`].
enum Backing {
    /// An allocation of its own, host-writable through the checked methods.
    Owned(SharedMemory),
    /// A page-aligned range of a sealed weight file, mapped read-only: the host reads these
    /// bytes through [`WeightBytes`], never through the buffer.
    Weights {
        file: Arc<WeightFile>,
        offset: usize,
        len: usize,
    },
}

impl Backing {
    /// The allocation the transport attaches (the whole weight file for a range of it).
    fn shm(&self) -> &SharedMemory {
        match self {
            Backing::Owned(s) => s,
            Backing::Weights { file, .. } => file.shm(),
        }
    }

    /// The bytes of [`Self::shm`] the buffer is (page-rounded).
    fn range(&self) -> std::ops::Range<usize> {
        match self {
            Backing::Owned(s) => 0..s.len(),
            Backing::Weights { offset, len, .. } => *offset..*offset + *len,
        }
    }
}

/// Shared memory mapped into the NPU window and registered with the DSP as buffer [`Self::id`].
///
/// Host access is checked: [`Self::read`], [`Self::write`] and friends fail with
/// [`Error::Busy`] when a submitted batch that has not finished may write the bytes (for a read)
/// or touch them at all (for a write). The `*_unchecked` forms are for callers that synchronise
/// with the DSP themselves.
pub struct DeviceBuffer {
    mem: Arc<Memory>,
    id: u32,
    backing: Backing,
    mapping: Option<Mapping>,
    leases: Arc<BufferLeases>,
    /// Bytes counted in [`MemoryStats::npu_weight_bytes`] for this buffer.
    weight_copy_bytes: u64,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("id", &self.id)
            .field("len", &self.len())
            .field("window_offset", &self.window_offset())
            .field("weight_file_range", &self.weight_file_offset().is_some())
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
        match &self.backing {
            Backing::Owned(s) => s.len(),
            Backing::Weights { len, .. } => *len,
        }
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// For a buffer mapping a range of a weight file in place: the range's offset in the file.
    pub(crate) fn weight_file_offset(&self) -> Option<usize> {
        match &self.backing {
            Backing::Owned(_) => None,
            Backing::Weights { offset, .. } => Some(*offset),
        }
    }

    /// The host memory of an owned buffer; a weight-file range has no host access here.
    fn owned(&self) -> Result<&SharedMemory> {
        match &self.backing {
            Backing::Owned(s) => Ok(s),
            Backing::Weights { .. } => Err(Error::input(
                "device buffer",
                InputProblem::ReadOnlyWeights { buffer: self.id },
            )),
        }
    }

    /// Count this buffer's `bytes` as a copy of weights the NPU side holds
    /// ([`MemoryStats::npu_weight_bytes`]) until the buffer is dropped.
    pub(crate) fn hold_weight_copy(&mut self, bytes: u64) {
        self.weight_copy_bytes += bytes;
        self.mem
            .npu_weight_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// Offset of the mapping in the NPU window.
    pub fn window_offset(&self) -> u64 {
        self.mapping.as_ref().map(|m| m.offset()).unwrap_or(0)
    }

    /// True when no submitted batch that may touch this buffer is still running or queued.
    pub fn is_idle(&self) -> bool {
        self.leases.is_idle()
    }

    /// Copy `data` in at `off`. Fails with [`Error::Busy`] while a batch in flight may read or
    /// write any of those bytes, and with [`Error::InvalidInput`] outside the buffer.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.with_host_bytes(off, data.len(), |dst| {
            dst.copy_from_slice(data);
        })
    }

    /// Copy `n` bytes out from `off`. Fails with [`Error::Busy`] while a batch in flight may
    /// write any of those bytes (batches that only read them do not conflict).
    pub fn read(&self, off: usize, n: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.read_into(off, &mut v)?;
        Ok(v)
    }

    /// [`Self::read`] into a caller's slice.
    pub fn read_into(&self, off: usize, out: &mut [u8]) -> Result<()> {
        self.with_host_view(off, out.len(), |src| {
            out.copy_from_slice(src);
        })
    }

    /// Copy `n` bytes from `src` to `dst` inside the buffer (the ranges may overlap, like
    /// `memmove`). Checked like a read of the source and a write of the destination.
    pub fn copy_within(&self, src: usize, dst: usize, n: usize) -> Result<()> {
        let lo = src.min(dst);
        let hi = src
            .max(dst)
            .checked_add(n)
            .ok_or_else(|| self.bounds(lo, n))?;
        self.check_bounds(lo, hi - lo)?;
        let shm = self.owned()?;
        let ranges = [
            (src as u64, (src + n) as u64, Access::Read),
            (dst as u64, (dst + n) as u64, Access::Write),
        ];
        self.leases.with_checked(self.id, &ranges, || {
            // SAFETY: bounds checked; no batch in flight reads or writes the destination nor
            // writes the source, and none can be registered while the lock is held;
            // ptr::copy allows the ranges to overlap.
            unsafe { std::ptr::copy(shm.as_ptr().add(src), shm.as_ptr().add(dst), n) }
        })
    }

    /// Copy `data` in at `off` without checking for batches in flight.
    ///
    /// # Safety
    /// No batch that may read or write `[off, off + data.len())` may be queued or running (its
    /// fence has completed), and no other thread may access those bytes during the call.
    pub unsafe fn write_unchecked(&self, off: usize, data: &[u8]) -> Result<()> {
        self.owned()?.write(off, data)
    }

    /// Copy `n` bytes out without checking for batches in flight.
    ///
    /// # Safety
    /// No batch that may write `[off, off + n)` may be queued or running, and no other thread may
    /// write those bytes during the call.
    pub unsafe fn read_unchecked(&self, off: usize, n: usize) -> Result<Vec<u8>> {
        self.owned()?.read(off, n)
    }

    fn bounds(&self, off: usize, n: usize) -> Error {
        Error::input(
            "device buffer",
            InputProblem::BufferRange {
                buffer: self.id,
                offset: off as u64,
                len: n as u64,
                size: self.len() as u64,
            },
        )
    }

    fn check_bounds(&self, off: usize, n: usize) -> Result<()> {
        if off.checked_add(n).is_none_or(|e| e > self.len()) {
            return Err(self.bounds(off, n));
        }
        Ok(())
    }

    /// Run `f` on the host bytes `[off, off + n)` to write them, after checking the range
    /// against the batches in flight as a write (no batch in flight may read or write it); the
    /// buffer's lease lock is held meanwhile, so no batch touching the buffer can be registered
    /// (and start) during `f`. The one place host code gets a mutable view of a buffer's shared
    /// memory; reads go through [`Self::with_host_view`] / [`Self::read_in_place`]. A weight-file
    /// range refuses (its bytes are read through `WeightBytes`).
    pub(crate) fn with_host_bytes<T>(
        &self,
        off: usize,
        n: usize,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T> {
        self.check_bounds(off, n)?;
        let shm = self.owned()?;
        self.leases.with_checked(
            self.id,
            &[(off as u64, (off + n) as u64, Access::Write)],
            || {
                // SAFETY: bounds checked; as a write the range conflicts with no batch in flight
                // (none reads or writes it) and none can start while the lock is held; host
                // callers of one buffer, readers included, are serialised by the same lock, so
                // the slice is the only view of these bytes; it does not outlive the call.
                let bytes = unsafe { shm.slice_mut::<u8>(off, n) }.expect("bounds checked");
                f(bytes)
            },
        )
    }

    /// Run `f` on a shared view of the host bytes `[off, off + n)`, checked as a read (batches
    /// in flight that only read the range do not conflict): [`Self::read_in_place`] for one
    /// range, without its lists (this is every staged read's path).
    pub(crate) fn with_host_view<T>(
        &self,
        off: usize,
        n: usize,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<T> {
        self.check_bounds(off, n)?;
        let shm = self.owned()?;
        self.leases.with_checked(
            self.id,
            &[(off as u64, (off + n) as u64, Access::Read)],
            || {
                // SAFETY: as in `read_in_place`: bounds checked, no batch in flight writes the
                // range and none can be registered while the lock is held, host writers take
                // the same lock; the view does not outlive the call.
                let bytes = unsafe { shm.slice::<u8>(off, n) }.expect("bounds checked");
                f(bytes)
            },
        )
    }

    /// Run `f` on shared views of the host bytes of `ranges` (`(offset, len)` each) after
    /// checking them against the batches in flight as reads: no copy. The buffer's lease lock is
    /// held meanwhile, so no batch can be registered on the buffer during `f` (batches already in
    /// flight may keep reading anything and writing outside the ranges), and no host writer of
    /// the buffer can run either (they take the same lock).
    pub(crate) fn read_in_place<T>(
        &self,
        ranges: &[(usize, usize)],
        f: impl FnOnce(&[&[u8]]) -> T,
    ) -> Result<T> {
        for &(off, n) in ranges {
            self.check_bounds(off, n)?;
        }
        let shm = self.owned()?;
        let checked: Vec<(u64, u64, Access)> = ranges
            .iter()
            .map(|&(off, n)| (off as u64, (off + n) as u64, Access::Read))
            .collect();
        self.leases.with_checked(self.id, &checked, || {
            // SAFETY: bounds checked; no batch in flight writes the ranges and none can be
            // registered while the lock is held; host writers of this buffer need the same lock
            // (`with_host_bytes`), so no mutable view of it exists during `f`; the views do not
            // outlive the call.
            let views: Vec<&[u8]> = ranges
                .iter()
                .map(|&(off, n)| unsafe { shm.slice::<u8>(off, n) }.expect("bounds checked"))
                .collect();
            f(&views)
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.mem
            .npu_weight_bytes
            .fetch_sub(self.weight_copy_bytes, Ordering::Relaxed);
        let Some(mapping) = self.mapping.take() else {
            return;
        };
        // A failure here cannot be returned; it is counted, and the id / range stay unusable
        // rather than being handed out while the DSP may still reference them.
        let detached =
            self.mem
                .transport
                .detach(self.id, self.backing.shm(), self.backing.range(), &mapping);
        if detached.is_err() {
            // Not unmapping keeps the range allocated in the window, so it is never reused.
            self.mem.release_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // The detach above ran after every batch submitted before it: none can touch the
        // buffer any more, so its leases go with it.
        self.mem.leases.remove(self.id);
        if self.mem.window.unmap(mapping).is_err() {
            self.mem.release_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.mem.ids.lock().expect("id lock").push(self.id);
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
    /// Fill the slot (load time), checked like any host write.
    pub(crate) fn fill<T>(&self, f: impl FnOnce(&mut [u8]) -> Result<T>) -> Result<T> {
        self.buf.with_host_bytes(self.offset, self.len, f)?
    }

    /// A copy of the slot's bytes, checked like any host read.
    pub(crate) fn bytes(&self) -> Result<Vec<u8>> {
        self.buf.read(self.offset, self.len)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_without_memfd_get_a_named_unsupported_error() {
        assert!(check_os("x", "linux").is_ok() && check_os("x", "android").is_ok());
        for os in ["macos", "windows", "ios", "freebsd"] {
            let e = check_os("HexagonDevice::open", os).unwrap_err();
            assert!(matches!(e, Error::Unsupported { .. }));
            let m = e.to_string();
            assert!(
                m.contains("HexagonDevice::open is unsupported")
                    && m.contains(&format!("`{os}`"))
                    && m.contains("memfd"),
                "{m}"
            );
        }
        assert_eq!(check_target("x").is_ok(), SHARED_MEMORY_SUPPORTED);
    }

    /// Only compiled where the crate is a stub: the device must refuse to open, by name.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    #[test]
    fn the_stub_device_does_not_open() {
        let e = crate::HexagonDevice::emulated().unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert!(SharedMemory::memfd("x", 4096).is_err());
    }
}
