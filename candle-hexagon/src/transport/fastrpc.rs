//! The FastRPC transport: `libcdsprpc.so` loaded at run time with `dlopen`.
//!
//! Session set-up follows the open FastRPC headers (`remote.h`, `rpcmem.h` of quic/fastrpc):
//! 1. `remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE, {domain: CDSP, enable: 1})` so the
//!    skel loads into an unsigned PD (no signing);
//! 2. `remote_handle64_open("file:///libkdsp_skel.so?kdsp_skel_handle_invoke&_modver=1.0&_dom=cdsp")`;
//! 3. method 2 (`init`) creates the kernels' context on the DSP.
//!
//! Buffers: `rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, len)` + `rpcmem_to_fd`,
//! mapped into the DSP process with `fastrpc_mmap(CDSP, fd, addr, 0, len, FASTRPC_MAP_FD)` and
//! registered by fd (method 3); the skel finds the DSP address of the fd itself. Batches travel in
//! the kernels' wire format (method 5) with one status per op coming back. The remote methods are
//! listed in `dsp/kdsp_rpc.h`.
//!
//! All invocations run on one host thread in submission order (the same job queue as the
//! emulated DSP), so `submit` returns a fence at once. In this repository the library is the host
//! shim (`dsp/fastrpc_shim.c`, see [`crate::shim_library_path`]); see the crate README for what has
//! not been verified on hardware.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use kernels_dsp::*;

use super::{check_status, Batch, Completion, Fence, JobQueue, OpCheck, Transport};
use crate::error::{Error, InputProblem, LibraryProblem, Result, TransportFault};
use crate::memory::{Mapping, SharedMemory};

/// Domain id of the compute DSP.
pub const CDSP_DOMAIN_ID: c_int = 3;
/// `RPCMEM_HEAP_ID_SYSTEM`.
pub const RPCMEM_HEAP_ID_SYSTEM: c_int = 25;
/// `RPCMEM_DEFAULT_FLAGS` (cached).
pub const RPCMEM_DEFAULT_FLAGS: u32 = 1;
/// `FASTRPC_MAP_FD` of `enum fastrpc_map_flags`.
pub const FASTRPC_MAP_FD: c_int = 2;
/// `DSPRPC_CONTROL_UNSIGNED_MODULE` of `enum session_control_req_id`.
pub const DSPRPC_CONTROL_UNSIGNED_MODULE: u32 = 2;
/// The URI of the kdsp skel on the compute DSP.
pub const KDSP_SKEL_URI: &str =
    "file:///libkdsp_skel.so?kdsp_skel_handle_invoke&_modver=1.0&_dom=cdsp";
/// Method numbers of `dsp/kdsp_rpc.h` (user methods start at 2).
pub mod method {
    /// Create the kernels' context.
    pub const INIT: u32 = 2;
    /// Register an fd-mapped buffer.
    pub const REGISTER: u32 = 3;
    /// Unregister a buffer.
    pub const UNREGISTER: u32 = 4;
    /// Run a serialized batch.
    pub const EXECUTE: u32 = 5;
    /// Check one op.
    pub const CHECK: u32 = 6;
    /// Build info string.
    pub const INFO: u32 = 7;
}
const INFO_BYTES: usize = 128;

/// `REMOTE_SCALARS_MAKE(method, in, out)`.
pub const fn scalars(method: u32, n_in: u32, n_out: u32) -> u32 {
    ((method & 0x1f) << 24) | ((n_in & 0xff) << 16) | ((n_out & 0xff) << 8)
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RemoteBuf {
    pv: *mut c_void,
    n_len: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RemoteDma {
    fd: i32,
    offset: u32,
}

/// `remote_arg` of `remote.h`.
#[repr(C)]
#[derive(Clone, Copy)]
union RemoteArg {
    buf: RemoteBuf,
    h: u32,
    h64: u64,
    dma: RemoteDma,
}

type RpcmemAlloc = unsafe extern "C" fn(c_int, u32, c_int) -> *mut c_void;
type RpcmemFree = unsafe extern "C" fn(*mut c_void);
type RpcmemToFd = unsafe extern "C" fn(*mut c_void) -> c_int;
type FastrpcMmap = unsafe extern "C" fn(c_int, c_int, *mut c_void, c_int, usize, c_int) -> c_int;
type FastrpcMunmap = unsafe extern "C" fn(c_int, c_int, *mut c_void, usize) -> c_int;
type HandleOpen = unsafe extern "C" fn(*const c_char, *mut u64) -> c_int;
type HandleInvoke = unsafe extern "C" fn(u64, u32, *mut RemoteArg) -> c_int;
type HandleClose = unsafe extern "C" fn(u64) -> c_int;
type SessionControl = unsafe extern "C" fn(u32, *mut c_void, u32) -> c_int;

/// The resolved library. Never `dlclose`d: the real library runs threads of its own.
struct Lib {
    name: String,
    rpcmem_alloc: RpcmemAlloc,
    rpcmem_free: RpcmemFree,
    rpcmem_to_fd: RpcmemToFd,
    fastrpc_mmap: FastrpcMmap,
    fastrpc_munmap: FastrpcMunmap,
    open: HandleOpen,
    invoke: HandleInvoke,
    close: HandleClose,
    session_control: SessionControl,
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null NUL-terminated string from dlerror.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn dlopen(library: &Path) -> Result<(*mut c_void, String)> {
    let name = library.display().to_string();
    let c = CString::new(name.clone()).map_err(|_| Error::Library {
        library: name.clone(),
        problem: LibraryProblem::NulInName,
    })?;
    // SAFETY: valid C string; RTLD_LOCAL keeps its symbols out of the global namespace.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(Error::Library {
            library: name,
            problem: LibraryProblem::Dlopen {
                system_message: dl_error(),
            },
        });
    }
    Ok((h, name))
}

fn sym(h: *mut c_void, lib: &str, name: &'static str) -> Result<*mut c_void> {
    let c = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: h is a live dlopen handle, c a valid C string.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    if p.is_null() {
        return Err(Error::Library {
            library: lib.into(),
            problem: LibraryProblem::MissingSymbol { symbol: name },
        });
    }
    Ok(p)
}

impl Lib {
    fn open(library: &Path) -> Result<Arc<Lib>> {
        let (h, name) = dlopen(library)?;
        // SAFETY (all transmutes): the symbols have these C signatures in the FastRPC headers
        // (remote.h, rpcmem.h); a library exporting them with other signatures is not libcdsprpc.
        unsafe {
            Ok(Arc::new(Lib {
                rpcmem_alloc: std::mem::transmute::<*mut c_void, RpcmemAlloc>(sym(
                    h,
                    &name,
                    "rpcmem_alloc",
                )?),
                rpcmem_free: std::mem::transmute::<*mut c_void, RpcmemFree>(sym(
                    h,
                    &name,
                    "rpcmem_free",
                )?),
                rpcmem_to_fd: std::mem::transmute::<*mut c_void, RpcmemToFd>(sym(
                    h,
                    &name,
                    "rpcmem_to_fd",
                )?),
                fastrpc_mmap: std::mem::transmute::<*mut c_void, FastrpcMmap>(sym(
                    h,
                    &name,
                    "fastrpc_mmap",
                )?),
                fastrpc_munmap: std::mem::transmute::<*mut c_void, FastrpcMunmap>(sym(
                    h,
                    &name,
                    "fastrpc_munmap",
                )?),
                open: std::mem::transmute::<*mut c_void, HandleOpen>(sym(
                    h,
                    &name,
                    "remote_handle64_open",
                )?),
                invoke: std::mem::transmute::<*mut c_void, HandleInvoke>(sym(
                    h,
                    &name,
                    "remote_handle64_invoke",
                )?),
                close: std::mem::transmute::<*mut c_void, HandleClose>(sym(
                    h,
                    &name,
                    "remote_handle64_close",
                )?),
                session_control: std::mem::transmute::<*mut c_void, SessionControl>(sym(
                    h,
                    &name,
                    "remote_session_control",
                )?),
                name,
            }))
        }
    }
}

/// An open `remote_handle64` to the kdsp skel; lives on the RPC thread.
struct Session {
    lib: Arc<Lib>,
    handle: u64,
}

impl Session {
    fn invoke(
        &self,
        method: u32,
        call: &'static str,
        ins: &[&[u8]],
        outs: &mut [&mut [u8]],
    ) -> Result<()> {
        let mut args: Vec<RemoteArg> = Vec::with_capacity(ins.len() + outs.len());
        for b in ins {
            args.push(RemoteArg {
                buf: RemoteBuf {
                    pv: b.as_ptr() as *mut c_void,
                    n_len: b.len(),
                },
            });
        }
        for b in outs.iter_mut() {
            args.push(RemoteArg {
                buf: RemoteBuf {
                    pv: b.as_mut_ptr().cast(),
                    n_len: b.len(),
                },
            });
        }
        let sc = scalars(method, ins.len() as u32, outs.len() as u32);
        // SAFETY: args describe live buffers for the duration of the call (inputs are only read).
        let rc = unsafe { (self.lib.invoke)(self.handle, sc, args.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::FastRpc { call, code: rc });
        }
        Ok(())
    }

    fn status_call(&self, method: u32, call: &'static str, input: &[u8]) -> Result<u32> {
        let mut out = [0u8; 4];
        self.invoke(method, call, &[input], &mut [&mut out])?;
        Ok(u32::from_le_bytes(out))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the handle came from remote_handle64_open and is closed once.
        unsafe { (self.lib.close)(self.handle) };
    }
}

/// The FastRPC transport.
pub struct FastRpcTransport {
    lib: Arc<Lib>,
    queue: JobQueue<Session>,
    info: String,
    workers: usize,
}

impl FastRpcTransport {
    /// Load `library`, request an unsigned PD on the CDSP, open the skel and create a context with
    /// `workers` workers, `max_buffers` buffer ids and `scratch_bytes` of scratch.
    pub fn open(
        library: &Path,
        workers: usize,
        max_buffers: u32,
        scratch_bytes: u64,
    ) -> Result<Self> {
        let lib = Lib::open(library)?;
        let mut ctl: [c_int; 2] = [CDSP_DOMAIN_ID, 1];
        // SAFETY: the struct remote_rpc_control_unsigned_module {int domain; int enable;}.
        let rc = unsafe {
            (lib.session_control)(
                DSPRPC_CONTROL_UNSIGNED_MODULE,
                ctl.as_mut_ptr().cast(),
                std::mem::size_of_val(&ctl) as u32,
            )
        };
        if rc != 0 {
            return Err(Error::FastRpc {
                call: "remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE)",
                code: rc,
            });
        }
        let l = lib.clone();
        let queue = JobQueue::start("hexagon-fastrpc", move || {
            let uri = CString::new(KDSP_SKEL_URI).expect("no NUL");
            let mut handle = 0u64;
            // SAFETY: valid URI and out pointer.
            let rc = unsafe { (l.open)(uri.as_ptr(), &mut handle) };
            if rc != 0 {
                return Err(Error::FastRpc {
                    call: "remote_handle64_open",
                    code: rc,
                });
            }
            let s = Session { lib: l, handle };
            let cfg = kdsp_ctx_config {
                n_workers: workers as u32,
                max_buffers,
                scratch_bytes,
            };
            // SAFETY: kdsp_ctx_config is 16 bytes of plain integers.
            let bytes = unsafe {
                std::slice::from_raw_parts((&cfg as *const kdsp_ctx_config).cast::<u8>(), 16)
            };
            check_status(
                "kdsp init",
                s.status_call(method::INIT, "kdsp init", bytes)?,
            )?;
            Ok(s)
        })?;
        let info = queue.call(|s: &mut Session| {
            let mut out = [0u8; INFO_BYTES];
            s.invoke(method::INFO, "kdsp info", &[], &mut [&mut out])?;
            let end = out.iter().position(|&b| b == 0).unwrap_or(INFO_BYTES);
            Ok(String::from_utf8_lossy(&out[..end]).into_owned())
        })?;
        Ok(FastRpcTransport {
            lib,
            queue,
            info,
            workers,
        })
    }
}

impl Transport for FastRpcTransport {
    fn name(&self) -> &'static str {
        "fastrpc"
    }

    fn description(&self) -> String {
        format!(
            "FastRPC via {} (CDSP, unsigned PD, {} workers): {}",
            self.lib.name, self.workers, self.info
        )
    }

    fn needs_reserved_window(&self) -> bool {
        false
    }

    fn alloc(&self, len: usize) -> Result<SharedMemory> {
        let size = c_int::try_from(len).map_err(|_| {
            Error::input(
                "rpcmem_alloc",
                InputProblem::TooLarge {
                    what: "size",
                    value: len as u64,
                    limit: "rpcmem_alloc's 2 GB limit",
                },
            )
        })?;
        // SAFETY: plain call; NULL on failure.
        let p =
            unsafe { (self.lib.rpcmem_alloc)(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, size) };
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(Error::Transport(TransportFault::RpcmemAlloc { bytes: len }));
        };
        // SAFETY: p is a live rpcmem buffer.
        let fd = unsafe { (self.lib.rpcmem_to_fd)(p) };
        if fd < 0 {
            // SAFETY: freeing what we allocated.
            unsafe { (self.lib.rpcmem_free)(p) };
            return Err(Error::FastRpc {
                call: "rpcmem_to_fd",
                code: fd,
            });
        }
        let free = self.lib.rpcmem_free;
        let lib = self.lib.clone();
        let addr = p as usize;
        // SAFETY: rpcmem buffers are valid for `len` bytes until rpcmem_free.
        Ok(unsafe {
            SharedMemory::from_raw(
                ptr,
                len,
                fd,
                Box::new(move || {
                    let _keep_loaded = &lib;
                    free(addr as *mut c_void)
                }),
            )
        })
    }

    fn maps_shared_ranges(&self) -> bool {
        // attach() maps the buffer's range of the rpcmem fd by offset and registers that range.
        true
    }

    fn max_shared_bytes(&self) -> usize {
        i32::MAX as usize
    }

    unsafe fn attach(
        &self,
        id: u32,
        shm: &SharedMemory,
        range: std::ops::Range<usize>,
        _mapping: &Mapping,
    ) -> Result<()> {
        let (fd, len) = (shm.fd(), range.len());
        let offset = i32::try_from(range.start).map_err(|_| {
            Error::input(
                "fastrpc_mmap",
                InputProblem::TooLarge {
                    what: "offset",
                    value: range.start as u64,
                    limit: "its 32-bit argument",
                },
            )
        })?;
        if range.end > shm.len() {
            return Err(Error::input(
                "fastrpc_mmap",
                InputProblem::OutOfRange {
                    what: "buffer",
                    offset: range.start as u64,
                    len: range.len() as u64,
                    size: shm.len() as u64,
                },
            ));
        }
        // The host address of the range: fastrpc_mmap takes the fd's mapping plus the offset.
        let addr = shm.as_ptr() as usize + range.start;
        // SAFETY: fd/addr/offset/len describe a range of one live rpcmem buffer.
        let rc = unsafe {
            (self.lib.fastrpc_mmap)(
                CDSP_DOMAIN_ID,
                fd,
                addr as *mut c_void,
                offset,
                len,
                FASTRPC_MAP_FD,
            )
        };
        if rc != 0 {
            return Err(Error::FastRpc {
                call: "fastrpc_mmap",
                code: rc,
            });
        }
        let reg = self.queue.call(move |s: &mut Session| {
            let mut msg = [0u8; 24];
            msg[0..4].copy_from_slice(&id.to_le_bytes());
            msg[4..8].copy_from_slice(&fd.to_le_bytes());
            msg[8..12].copy_from_slice(&(offset as u32).to_le_bytes());
            msg[16..24].copy_from_slice(&(len as u64).to_le_bytes());
            check_status(
                "kdsp register",
                s.status_call(method::REGISTER, "kdsp register", &msg)?,
            )
        });
        if let Err(e) = reg {
            // SAFETY: undoing the mapping made above.
            unsafe { (self.lib.fastrpc_munmap)(CDSP_DOMAIN_ID, fd, addr as *mut c_void, len) };
            return Err(e);
        }
        Ok(())
    }

    fn detach(
        &self,
        id: u32,
        shm: &SharedMemory,
        range: std::ops::Range<usize>,
        _mapping: &Mapping,
    ) -> Result<()> {
        // Through the queue: every batch submitted before this has finished when it returns.
        self.queue.call(move |s: &mut Session| {
            check_status(
                "kdsp unregister",
                s.status_call(method::UNREGISTER, "kdsp unregister", &id.to_le_bytes())?,
            )
        })?;
        // SAFETY: the mapping made in attach().
        let rc = unsafe {
            (self.lib.fastrpc_munmap)(
                CDSP_DOMAIN_ID,
                shm.fd(),
                shm.as_ptr().add(range.start).cast(),
                range.len(),
            )
        };
        if rc != 0 {
            return Err(Error::FastRpc {
                call: "fastrpc_munmap",
                code: rc,
            });
        }
        Ok(())
    }

    fn submit(&self, batch: &Batch, done: &Completion) -> Result<Fence> {
        let wire = batch.to_wire();
        self.queue
            .submit_with(done.clone(), move |s: &mut Session| {
                let n = wire.n_ops();
                let mut out = vec![0u8; 4 * n];
                s.invoke(
                    method::EXECUTE,
                    "kdsp execute",
                    &[wire.as_bytes()],
                    &mut [&mut out],
                )?;
                Ok(out
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect())
            })
    }

    fn check(&self, op: &kdsp_op) -> Result<OpCheck> {
        let op = *op;
        self.queue.call(move |s: &mut Session| {
            // SAFETY: kdsp_op is 440 bytes of plain data with explicit padding.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&op as *const kdsp_op).cast::<u8>(),
                    std::mem::size_of::<kdsp_op>(),
                )
            };
            let mut out = [0u8; 16];
            s.invoke(method::CHECK, "kdsp check", &[bytes], &mut [&mut out])?;
            Ok(OpCheck {
                status: u32::from_le_bytes(out[0..4].try_into().expect("4 bytes")),
                scratch: u64::from_le_bytes(out[8..16].try_into().expect("8 bytes")),
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

/// Counters of the host shim (`kdsp_shim_stats`, not part of libcdsprpc): live rpcmem buffers,
/// live DSP mappings, total maps, total unmaps, invocations, unsigned PD requested. `None` when
/// `library` is not the shim.
pub fn shim_stats(library: &Path) -> Option<[u64; 6]> {
    let (h, name) = dlopen(library).ok()?;
    let f = sym(h, &name, "kdsp_shim_stats").ok()?;
    // SAFETY: the shim exports `void kdsp_shim_stats(uint64_t out[6])`.
    let f: unsafe extern "C" fn(*mut u64) = unsafe { std::mem::transmute(f) };
    let mut out = [0u64; 6];
    // SAFETY: out has 6 slots.
    unsafe { f(out.as_mut_ptr()) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_match_remote_h() {
        // REMOTE_SCALARS_MAKEX(0, 5, 1, 1, 0, 0)
        assert_eq!(scalars(5, 1, 1), 0x0501_0100);
        assert_eq!(std::mem::size_of::<RemoteArg>(), 16);
        let _ = RemoteArg { h: 0 };
        let _ = RemoteArg { h64: 0 };
        let _ = RemoteArg {
            dma: RemoteDma { fd: 0, offset: 0 },
        };
    }

    #[test]
    fn a_missing_library_is_a_named_error() {
        let e = FastRpcTransport::open(Path::new("/nonexistent/libcdsprpc.so"), 1, 4, 8 << 20)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/libcdsprpc.so"), "{e}");
    }
}
