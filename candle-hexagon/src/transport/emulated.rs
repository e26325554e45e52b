//! The emulated DSP: a host thread that owns a kernels-dsp context and executes batches.
//!
//! The thread is DSP worker 0; `workers - 1` more pthreads are started by `kdsp_ctx_init`. The
//! scratch arena (the VTCM stand-in) is private to the thread. Buffers reach it only as
//! addresses inside the reserved NPU window (the crate's `VaWindow`), where each shared
//! memfd is mapped a second time, so the DSP side never dereferences a host pointer it was not
//! given through a mapping. Batches arrive in the same wire format a FastRPC skel receives.
//!
//! This is the kernels-dsp *host build* (portable C, pthreads) on x86 threads: it shows that the
//! backend computes the right thing and really overlaps with CPU work; it says nothing about
//! Hexagon speed.

use std::alloc::Layout;
use std::ffi::CStr;

use kernels_dsp::*;

use super::{check_status, Batch, Completion, Fence, JobQueue, OpCheck, Transport};
use crate::error::{ConfigProblem, Error, KernelStatus, Result, TransportFault};
use crate::memory::{Mapping, SharedMemory};

/// A 128-byte aligned, zeroed heap allocation.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), 128).map_err(|_| {
            Error::config(
                "scratch_bytes",
                ConfigProblem::Unallocatable {
                    bytes: len,
                    align: 128,
                },
            )
        })?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Transport(TransportFault::ContextAlloc {
                bytes: len,
            }));
        }
        Ok(Aligned { ptr, layout })
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// State owned by the DSP thread.
struct Dsp {
    ctx: *mut kdsp_ctx,
    // Declared after ctx: dropped after the context is released in Drop.
    _mem: Aligned,
    _scratch: Aligned,
}

impl Drop for Dsp {
    fn drop(&mut self) {
        // SAFETY: ctx was initialised by kdsp_ctx_init and is released once, on its thread.
        unsafe { kdsp_ctx_release(self.ctx) };
    }
}

/// The emulated transport.
pub struct EmulatedTransport {
    queue: JobQueue<Dsp>,
    info: String,
    workers: usize,
}

impl std::fmt::Debug for EmulatedTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description())
    }
}

impl EmulatedTransport {
    /// Start the DSP thread with `workers` kernel workers, a buffer table of `max_buffers` ids and
    /// `scratch_bytes` of scratch.
    pub fn start(workers: usize, max_buffers: u32, scratch_bytes: u64) -> Result<Self> {
        let cfg = kdsp_ctx_config {
            n_workers: workers as u32,
            max_buffers,
            scratch_bytes,
        };
        let queue = JobQueue::start("hexagon-dsp", move || {
            // SAFETY: cfg is a valid pointer; returns 0 for an invalid config.
            let bytes = unsafe { kdsp_ctx_bytes(&cfg) };
            if bytes == 0 {
                return Err(Error::config(
                    "workers",
                    ConfigProblem::KernelsReject {
                        workers: cfg.n_workers as usize,
                        buffers: cfg.max_buffers as usize,
                    },
                ));
            }
            let mem = Aligned::new(bytes as usize)?;
            let scratch = Aligned::new(scratch_bytes as usize)?;
            let mut ctx = std::ptr::null_mut();
            // SAFETY: mem is `bytes` long and 128-aligned (>= 16); scratch is 128-aligned and
            // scratch_bytes long; both outlive the context (owned by Dsp).
            let st =
                unsafe { kdsp_ctx_init(mem.ptr.cast(), bytes, scratch.ptr.cast(), &cfg, &mut ctx) };
            check_status("kdsp_ctx_init", st)?;
            Ok(Dsp {
                ctx,
                _mem: mem,
                _scratch: scratch,
            })
        })?;
        // SAFETY: returns a static NUL-terminated string.
        let build = unsafe { CStr::from_ptr(kdsp_build_info()) }
            .to_string_lossy()
            .into_owned();
        Ok(EmulatedTransport {
            queue,
            info: build,
            workers,
        })
    }
}

// SAFETY: the context pointer is only ever used on the DSP thread, inside queued jobs.
unsafe impl Send for Dsp {}

impl Transport for EmulatedTransport {
    fn name(&self) -> &'static str {
        "emulated"
    }

    fn description(&self) -> String {
        format!(
            "emulated DSP thread ({} workers) running the host build of {}",
            self.workers, self.info
        )
    }

    fn needs_reserved_window(&self) -> bool {
        true
    }

    fn alloc(&self, len: usize) -> Result<SharedMemory> {
        SharedMemory::memfd("candle-hexagon", len)
    }

    fn maps_shared_ranges(&self) -> bool {
        // attach() registers the window mapping itself, whatever part of a file it shows.
        true
    }

    unsafe fn attach(
        &self,
        id: u32,
        _shm: &SharedMemory,
        _range: std::ops::Range<usize>,
        mapping: &Mapping,
    ) -> Result<()> {
        let addr = mapping
            .npu_addr()
            .ok_or(Error::Transport(TransportFault::NotInWindow { buffer: id }))?
            as usize;
        let len = mapping.len();
        self.queue.call(move |d: &mut Dsp| {
            // SAFETY: [addr, addr + len) is a live window mapping until detach() runs, which
            // the queue orders after every batch submitted before it.
            let st = unsafe { kdsp_buffer_register(d.ctx, id, addr as *mut _, len) };
            check_status("kdsp_buffer_register", st)
        })
    }

    fn detach(
        &self,
        id: u32,
        _shm: &SharedMemory,
        _range: std::ops::Range<usize>,
        _mapping: &Mapping,
    ) -> Result<()> {
        self.queue.call(move |d: &mut Dsp| {
            // SAFETY: valid context on its own thread.
            let st = unsafe { kdsp_buffer_unregister(d.ctx, id) };
            check_status("kdsp_buffer_unregister", st)
        })
    }

    fn submit(&self, batch: &Batch, done: &Completion) -> Result<Fence> {
        let wire = batch.to_wire();
        self.queue.submit_with(done.clone(), move |d: &mut Dsp| {
            let n = wire.n_ops();
            let mut statuses = vec![KDSP_STATUS_NOT_RUN; n];
            let bytes = wire.as_bytes();
            // SAFETY: bytes is an 8-byte aligned serialized batch; statuses has n entries.
            let first = unsafe {
                kdsp_execute_batch(
                    d.ctx,
                    bytes.as_ptr().cast(),
                    bytes.len() as u64,
                    statuses.as_mut_ptr(),
                    n as u32,
                )
            };
            if first != KDSP_STATUS_OK && !statuses.contains(&first) {
                // The header itself was rejected: no op ran.
                return Err(Error::Transport(TransportFault::BatchHeader {
                    status: KernelStatus(first),
                }));
            }
            Ok(statuses)
        })
    }

    fn check(&self, op: &kdsp_op) -> Result<OpCheck> {
        let op = *op;
        self.queue.call(move |d: &mut Dsp| {
            let mut scratch = 0u64;
            // SAFETY: valid context and op; check mode never touches tensor memory.
            let st = unsafe { kdsp_op_check(d.ctx, &op, &mut scratch) };
            Ok(OpCheck {
                status: st,
                scratch,
            })
        })
    }

    fn pause(&self) {
        self.queue.pause();
    }

    fn resume(&self) {
        self.queue.resume();
    }
}
