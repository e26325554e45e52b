//! Host-side shared memory: a file-descriptor-backed allocation the host writes and the DSP maps.
//!
//! On a phone this is an rpcmem (dma-buf / ION) buffer from `rpcmem_alloc` with its fd from
//! `rpcmem_to_fd`; on the host the stand-in is a `memfd_create` file mapped `MAP_SHARED`. Either
//! way the DSP never receives a host pointer: it maps the *file descriptor* into its own address
//! space, so the same pages are visible through two mappings.

use std::os::fd::RawFd;
use std::ptr::NonNull;

use crate::error::{Error, InputProblem, Result};

type Release = Box<dyn FnOnce() + Send + Sync>;

/// A shared allocation: host pointer, length and file descriptor, released on drop.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    fd: RawFd,
    release: Option<Release>,
}

// SAFETY: the memory is plain bytes owned by this value (no thread affinity). Its safe methods
// copy bytes in and out; the crate-internal views (`slice`, `slice_mut`) are `unsafe` and their
// callers uphold the aliasing rules: once the memory is registered with the DSP (a
// `DeviceBuffer`), host views are taken only under the buffer's lease lock, after checking the
// batches in flight (`memory::leases`), shared for reads and exclusive for writes.
unsafe impl Send for SharedMemory {}
// SAFETY: as above: concurrent `&SharedMemory` users either copy (each copy is a plain read or
// write of bytes no Rust reference aliases) or hold a view under the lease lock.
unsafe impl Sync for SharedMemory {}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory")
            .field("len", &self.len)
            .field("fd", &self.fd)
            .finish()
    }
}

impl SharedMemory {
    /// A new zero-filled memfd of `len` bytes (`len` > 0), mapped shared into the host.
    /// [`Error::Unsupported`] on targets without memfd (see [`super::SHARED_MEMORY_SUPPORTED`]).
    pub fn memfd(name: &str, len: usize) -> Result<Self> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            Self::memfd_linux(name, len)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = (name, len);
            Err(Error::Unsupported {
                what: "memfd shared memory",
                os: std::env::consts::OS,
            })
        }
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn memfd_linux(name: &str, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::input("shared memory", InputProblem::ZeroLength));
        }
        let cname = std::ffi::CString::new(name).map_err(|_| {
            Error::input(
                "shared memory",
                InputProblem::NulInName {
                    name: name.to_string(),
                },
            )
        })?;
        // SAFETY: valid C string; flags are plain constants.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os("memfd_create"));
        }
        // SAFETY: fd is ours.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = Error::last_os("ftruncate (memfd)");
            // SAFETY: closing our own fd.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: mapping our own fd, length as truncated.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = Error::last_os("mmap (memfd host view)");
            // SAFETY: closing our own fd.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let addr = p as usize;
        Ok(SharedMemory {
            ptr: NonNull::new(p as *mut u8).expect("mmap never returns NULL on success"),
            len,
            fd,
            release: Some(Box::new(move || {
                // SAFETY: the mapping and fd created above, released exactly once.
                unsafe {
                    libc::munmap(addr as *mut libc::c_void, len);
                    libc::close(fd);
                }
            })),
        })
    }

    /// Wrap memory allocated elsewhere (e.g. `rpcmem_alloc`); `release` frees it on drop.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until `release` runs, and `fd` must
    /// be the file descriptor backing it.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, fd: RawFd, release: Release) -> Self {
        SharedMemory {
            ptr,
            len,
            fd,
            release: Some(release),
        }
    }

    /// Drop the host view's page-table entries (`madvise(MADV_DONTNEED)`): the memory is a
    /// shared mapping, so its contents stay (in the memfd, or the rpcmem buffer) and a later host
    /// access faults the same bytes back in. What it saves is accounting and page tables: a page
    /// the host wrote at load and the NPU window maps again would otherwise count twice in the
    /// process's resident set. A mapping that does not support it is left as it is.
    pub(crate) fn drop_host_view_pages(&self) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        // SAFETY: MADV_DONTNEED on a MAP_SHARED mapping discards no data (the pages belong to the
        // shared object); the range is this mapping's own. Callers hold no references into it
        // across the call.
        unsafe {
            libc::madvise(self.as_ptr().cast(), self.len(), libc::MADV_DONTNEED);
        }
    }

    /// Host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (allocations are non-empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The backing file descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    fn check(&self, off: usize, n: usize) -> Result<()> {
        if off.checked_add(n).is_none_or(|e| e > self.len) {
            return Err(Error::input(
                "shared memory",
                InputProblem::OutOfRange {
                    what: "buffer",
                    offset: off as u64,
                    len: n as u64,
                    size: self.len as u64,
                },
            ));
        }
        Ok(())
    }

    /// Copy `data` in at `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        // SAFETY: bounds checked; the source is a distinct Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
        Ok(())
    }

    /// Copy `n` bytes out from `off`.
    pub fn read(&self, off: usize, n: usize) -> Result<Vec<u8>> {
        self.check(off, n)?;
        let mut v = vec![0u8; n];
        // SAFETY: bounds checked.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), v.as_mut_ptr(), n) };
        Ok(v)
    }

    /// A shared typed view of `[off, off + n * size_of::<T>())`.
    ///
    /// # Safety
    /// No mutable view of the range may be alive while this one is, and the DSP must not write
    /// it. `off` must be aligned for `T`.
    pub(crate) unsafe fn slice<T>(&self, off: usize, n: usize) -> Result<&[T]> {
        self.check(off, n * std::mem::size_of::<T>())?;
        let p = self.ptr.as_ptr().add(off);
        debug_assert_eq!(p as usize % std::mem::align_of::<T>(), 0);
        Ok(std::slice::from_raw_parts(p as *const T, n))
    }

    /// A mutable typed view of `[off, off + n * size_of::<T>())`.
    ///
    /// # Safety
    /// No other view of the range may be alive, and the DSP must not be using it. `off` must be
    /// aligned for `T`.
    // Shared memory is outside Rust's ownership (the DSP writes it too), like an `UnsafeCell`:
    // exclusivity is the caller's obligation, stated above, not the borrow checker's.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<T>(&self, off: usize, n: usize) -> Result<&mut [T]> {
        self.check(off, n * std::mem::size_of::<T>())?;
        let p = self.ptr.as_ptr().add(off);
        debug_assert_eq!(p as usize % std::mem::align_of::<T>(), 0);
        Ok(std::slice::from_raw_parts_mut(p as *mut T, n))
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_is_zeroed_bounded_and_shared_through_the_fd() {
        let m = SharedMemory::memfd("t", 8192).unwrap();
        assert_eq!(m.read(8000, 4).unwrap(), vec![0; 4]);
        m.write(10, &[7, 8]).unwrap();
        assert!(m.write(8191, &[1, 2]).is_err());
        assert!(m.read(usize::MAX, 2).is_err());
        // A second mapping of the same fd sees the write: this is what the DSP side relies on.
        // SAFETY: mapping our fd read-only and unmapping it below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_SHARED,
                m.fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: p maps 8192 readable bytes.
        unsafe {
            assert_eq!(*(p as *const u8).add(11), 8);
            libc::munmap(p, 8192);
        }
        assert!(SharedMemory::memfd("t", 0).is_err());
    }
}
