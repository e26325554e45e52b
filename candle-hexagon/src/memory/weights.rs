//! Packed weights held once, in shared memory.
//!
//! A weight-owning module packs its linear weights at load time straight into one shared
//! allocation (memfd here, rpcmem on a phone), the *weight file*, each weight at a page-aligned
//! offset. The host reads them through [`WeightBytes`], read-only views of that memory (the CPU
//! refresh path of `dllm-models` runs on them in place). When the transport maps ranges of a
//! shared allocation ([`crate::transport::Transport::maps_shared_ranges`]: the emulated DSP),
//! making a weight resident maps its range of the same file into the NPU window, read-only
//! ([`super::Memory::map_weights`]; the emulated DSP maps it into its window, FastRPC with
//! `fastrpc_mmap` of the rpcmem fd at the weight's offset): one copy of the weights, not a host
//! copy plus a mapped copy. What still copies from these bytes: the `somr` staging slots
//! (streamed weights), and everything on a transport that cannot map ranges of a file this size
//! (FastRPC's offsets are 32-bit signed: a weight file over 2 GiB is copied).

use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{round_up, Memory, SharedMemory};
use crate::error::{Error, InputProblem, Result};

/// The weight file being filled at load time: nothing else can see it yet.
pub(crate) struct WeightFileBuilder {
    shm: SharedMemory,
    page: usize,
    used: usize,
    ranges: Vec<(usize, usize)>,
}

impl WeightFileBuilder {
    /// A zero-filled weight file of at least `capacity` bytes (the sum of the weights' lengths,
    /// each rounded up to a page). Pages never written cost no memory.
    pub(crate) fn new(mem: &Memory, capacity: usize) -> Result<Self> {
        let page = mem.window.page() as usize;
        let len = round_up(capacity.max(1) as u64, page as u64) as usize;
        Ok(WeightFileBuilder {
            shm: mem.transport.alloc(len)?,
            page,
            used: 0,
            ranges: Vec::new(),
        })
    }

    /// `len` rounded up to the file's page: what one weight takes in the file and in a mapping.
    pub(crate) fn footprint(page: usize, len: usize) -> usize {
        round_up(len.max(1) as u64, page as u64) as usize
    }

    /// Append a weight of `len` bytes written by `fill` (given exactly those bytes, zeroed);
    /// returns its index.
    pub(crate) fn push(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<usize> {
        let off = self.used;
        let end = off + Self::footprint(self.page, len);
        if end > self.shm.len() {
            return Err(Error::input(
                "weight file",
                InputProblem::OutOfRange {
                    what: "weight file",
                    offset: off as u64,
                    len: len as u64,
                    size: self.shm.len() as u64,
                },
            ));
        }
        // SAFETY: the builder owns the file and nothing maps or views it yet (no WeightBytes,
        // no DSP mapping exist before `seal`); the slice lives only during `fill`.
        let dst = unsafe { self.shm.slice_mut::<u8>(off, len) }?;
        fill(dst)?;
        self.used = end;
        self.ranges.push((off, len));
        Ok(self.ranges.len() - 1)
    }

    /// Freeze the file: from now on nothing writes it. The weights' read-only views, in push
    /// order.
    pub(crate) fn seal(self, mem: &Arc<Memory>) -> Vec<WeightBytes> {
        let bytes: u64 = self.ranges.iter().map(|r| r.1 as u64).sum();
        let shared = mem.transport.maps_shared_ranges()
            && self.shm.len() <= mem.transport.max_shared_bytes();
        let gauge = if shared {
            &mem.shared_weight_bytes
        } else {
            &mem.host_weight_bytes
        };
        gauge.fetch_add(bytes, Ordering::Relaxed);
        // The packed bytes were written through the host view; from now on the NPU maps resident
        // ranges itself, and the host reads only what the CPU refresh path and staging touch:
        // dropping the view's pages keeps a resident weight from counting twice (host view and
        // window) in the resident set. Nothing references the file during `seal`.
        self.shm.drop_host_view_pages();
        let file = Arc::new(WeightFile {
            shm: self.shm,
            mem: mem.clone(),
            bytes,
            shared,
        });
        self.ranges
            .into_iter()
            .map(|(offset, len)| WeightBytes {
                file: file.clone(),
                offset,
                len,
            })
            .collect()
    }
}

/// A sealed weight file: shared memory no one writes any more, freed when the last view and the
/// last mapping of it are gone.
pub(crate) struct WeightFile {
    shm: SharedMemory,
    mem: Arc<Memory>,
    bytes: u64,
    shared: bool,
}

impl WeightFile {
    /// The allocation (its fd is what a resident mapping maps). Memory-module only, and never
    /// written through: the views hand out `&[u8]` of it.
    pub(super) fn shm(&self) -> &SharedMemory {
        &self.shm
    }

    /// True when resident weights are mapped from this file in place (no copy).
    pub(crate) fn shared(&self) -> bool {
        self.shared
    }
}

impl Drop for WeightFile {
    fn drop(&mut self) {
        let gauge = if self.shared {
            &self.mem.shared_weight_bytes
        } else {
            &self.mem.host_weight_bytes
        };
        gauge.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// One packed weight as the host holds it: a read-only view of its range of the weight file,
/// cheap to clone. The NPU reads the same pages when the weight is resident (no copy).
#[derive(Clone)]
pub struct WeightBytes {
    file: Arc<WeightFile>,
    offset: usize,
    len: usize,
}

impl WeightBytes {
    /// Byte offset of the weight in its weight file (a page multiple).
    pub fn file_offset(&self) -> usize {
        self.offset
    }

    pub(crate) fn file(&self) -> &Arc<WeightFile> {
        &self.file
    }
}

impl Deref for WeightBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: [offset, offset + len) lies inside the file (checked by the builder's push),
        // which lives as long as `self.file`. The file was sealed before this view existed and
        // nothing writes it afterwards: the host has no writer for a sealed file, and the DSP
        // maps weight ranges read-only (`Memory::map_weights`; the kernels only read weight
        // operands, and the emulated window mapping is PROT_READ) or receives copies.
        unsafe { std::slice::from_raw_parts(self.file.shm.as_ptr().add(self.offset), self.len) }
    }
}

impl AsRef<[u8]> for WeightBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightBytes")
            .field("file_offset", &self.offset)
            .field("len", &self.len)
            .field("shared_with_npu", &self.file.shared)
            .finish()
    }
}
