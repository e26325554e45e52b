//! How op batches reach the DSP: one [`Transport`] trait, two implementations.
//!
//! - [`emulated`]: a DSP thread on the host running the kernels-dsp host build (the default when
//!   no phone is attached). Buffers are memfds mapped into a reserved address window.
//! - [`fastrpc`] (feature `fastrpc`): `libcdsprpc.so` loaded with `dlopen`, rpcmem buffers,
//!   `fastrpc_mmap`, a `remote_handle64` to the kdsp skel in an unsigned PD. Tested end to end
//!   against the host shim library built by this crate (`dsp/fastrpc_shim.c`).
//!
//! Both serialize batches in the kernels' wire format (`kdsp_batch_header` + ops) and complete
//! them through a [`Fence`], so the host can overlap CPU work with DSP work.

pub mod emulated;
#[cfg(feature = "fastrpc")]
pub mod fastrpc;
mod queue;

pub(crate) use queue::JobQueue;
pub use queue::{Completion, Fence};

use kernels_dsp::{kdsp_batch_header, kdsp_op, KDSP_ABI_VERSION, KDSP_BATCH_MAGIC};

use crate::error::{Error, KernelStatus, Result};
use crate::memory::shared_buffer::SharedMemory;
use crate::memory::va_window::Mapping;

/// The result of validating one op on the DSP without running it (`kdsp_op_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpCheck {
    /// `KDSP_STATUS_*`.
    pub status: u32,
    /// Scratch bytes the op needs (valid when `status` is OK).
    pub scratch: u64,
}

/// An ordered list of ops with a label each (labels name failing ops in errors).
#[derive(Clone, Default)]
pub struct Batch {
    ops: Vec<kdsp_op>,
    labels: Vec<&'static str>,
    flags: u32,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("labels", &self.labels)
            .field("flags", &self.flags)
            .finish()
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append an op.
    pub fn push(&mut self, label: &'static str, op: kdsp_op) {
        self.ops.push(op);
        self.labels.push(label);
    }

    /// Set `kdsp_exec_flags` (e.g. `KDSP_EXEC_CONTINUE_ON_ERROR`).
    pub fn set_flags(&mut self, flags: u32) {
        self.flags = flags;
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The label of op `i`.
    pub fn label(&self, i: usize) -> &'static str {
        self.labels.get(i).copied().unwrap_or("op")
    }

    /// The ops.
    pub fn ops(&self) -> &[kdsp_op] {
        &self.ops
    }

    /// The ops, to rewrite operands before submission.
    pub(crate) fn ops_mut(&mut self) -> &mut [kdsp_op] {
        &mut self.ops
    }

    /// The labels, one per op.
    pub(crate) fn labels(&self) -> &[&'static str] {
        &self.labels
    }

    /// The wire format `kdsp_execute_batch` takes: header, then the ops verbatim. Stored in
    /// `u64`s so the bytes are 8-byte aligned as the DSP side requires.
    pub fn to_wire(&self) -> WireBatch {
        let header = kdsp_batch_header {
            magic: KDSP_BATCH_MAGIC,
            abi_version: KDSP_ABI_VERSION,
            n_ops: self.ops.len() as u32,
            flags: self.flags,
        };
        let op_bytes = std::mem::size_of::<kdsp_op>();
        let bytes = std::mem::size_of::<kdsp_batch_header>() + self.ops.len() * op_bytes;
        let mut words = vec![0u64; bytes.div_ceil(8)];
        // SAFETY: words holds at least `bytes` bytes; header and ops are plain-old-data with
        // explicit padding (asserted by the ABI's static asserts), copied byte for byte.
        unsafe {
            let dst = words.as_mut_ptr() as *mut u8;
            std::ptr::copy_nonoverlapping(
                &header as *const kdsp_batch_header as *const u8,
                dst,
                std::mem::size_of::<kdsp_batch_header>(),
            );
            std::ptr::copy_nonoverlapping(
                self.ops.as_ptr() as *const u8,
                dst.add(std::mem::size_of::<kdsp_batch_header>()),
                self.ops.len() * op_bytes,
            );
        }
        WireBatch {
            words,
            bytes,
            n_ops: self.ops.len(),
        }
    }
}

/// A serialized batch (8-byte aligned).
#[derive(Debug, Clone)]
pub struct WireBatch {
    words: Vec<u64>,
    bytes: usize,
    n_ops: usize,
}

impl WireBatch {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `bytes` <= 8 * words.len().
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.bytes) }
    }

    /// Number of ops.
    pub fn n_ops(&self) -> usize {
        self.n_ops
    }
}

/// A way to reach a DSP. Implementations must run submitted work in submission order.
pub trait Transport: Send + Sync {
    /// Short name (`emulated`, `fastrpc`).
    fn name(&self) -> &'static str;

    /// One line describing the DSP side (kernel build, library).
    fn description(&self) -> String;

    /// True when buffers must be mapped into a real host reservation (the emulated DSP reads
    /// them through the window); false when the DSP maps buffers itself.
    fn needs_reserved_window(&self) -> bool;

    /// Allocate `len` bytes (a page multiple) of host memory the DSP can map.
    fn alloc(&self, len: usize) -> Result<SharedMemory>;

    /// True when [`Transport::attach`] takes a page-aligned *range* of a shared allocation, so
    /// packed weights written once into shared memory at load time can be made resident by
    /// mapping them in place, without a copy (the emulated DSP maps the range into its window;
    /// FastRPC maps it by fd and offset). False: every buffer is a whole allocation of its own,
    /// and resident weights are copied into one.
    fn maps_shared_ranges(&self) -> bool {
        false
    }

    /// The largest allocation whose ranges [`Transport::attach`] can map in place (FastRPC's
    /// `fastrpc_mmap` takes a 32-bit signed offset: 2 GiB); a larger weight file is copied as
    /// when ranges cannot be mapped.
    fn max_shared_bytes(&self) -> usize {
        usize::MAX
    }

    /// Make bytes `range` of `shm` (the whole allocation, or a page-aligned range of it when
    /// [`Transport::maps_shared_ranges`]), placed at `mapping` in the NPU window, buffer `id` on
    /// the DSP.
    ///
    /// # Safety
    /// From now until [`Transport::detach`] returns, batches may read and write `shm`'s memory
    /// from the DSP thread: the caller must keep every host access to it from racing a submitted
    /// batch that has not completed (the device does so with leases, see
    /// [`crate::DeviceBuffer`]), and keep `shm` and `mapping` alive until detached.
    unsafe fn attach(
        &self,
        id: u32,
        shm: &SharedMemory,
        range: std::ops::Range<usize>,
        mapping: &Mapping,
    ) -> Result<()>;

    /// Undo [`Transport::attach`] (the same `range`).
    fn detach(
        &self,
        id: u32,
        shm: &SharedMemory,
        range: std::ops::Range<usize>,
        mapping: &Mapping,
    ) -> Result<()>;

    /// Queue a batch; the fence yields one `KDSP_STATUS_*` per op. `done` must be set when the
    /// DSP has finished with the batch (or will never run it), and not before: the device keeps
    /// the batch's memory leased until then.
    fn submit(&self, batch: &Batch, done: &Completion) -> Result<Fence>;

    /// Validate one op against the registered buffers without running it.
    fn check(&self, op: &kdsp_op) -> Result<OpCheck>;

    /// Hold queued work until [`Transport::resume`] (tests use it to show that submission does
    /// not block).
    fn pause(&self);

    /// Release held work.
    fn resume(&self);
}

/// A status returned by a kernels-dsp entry point (not by an op of a batch) as a `Result`.
pub(crate) fn check_status(call: &'static str, st: kernels_dsp::kdsp_status_t) -> Result<()> {
    if st == kernels_dsp::KDSP_STATUS_OK {
        Ok(())
    } else {
        Err(Error::Kernel {
            op: call,
            index: 0,
            status: KernelStatus(st),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_header_then_ops() {
        let mut b = Batch::new();
        let op = kdsp_op {
            opcode: 4,
            n_src: 2,
            ..Default::default()
        };
        b.push("a", op);
        b.push("b", op);
        let w = b.to_wire();
        let bytes = w.as_bytes();
        assert_eq!(bytes.len(), 16 + 2 * 440);
        assert_eq!(&bytes[0..4], &KDSP_BATCH_MAGIC.to_le_bytes());
        assert_eq!(&bytes[4..8], &KDSP_ABI_VERSION.to_le_bytes());
        assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
        assert_eq!(&bytes[16..20], &4u32.to_le_bytes());
        assert_eq!(&bytes[456..460], &4u32.to_le_bytes());
        assert_eq!(w.as_bytes().as_ptr() as usize % 8, 0);
        assert_eq!(b.label(1), "b");
    }
}
