//! The bounded NPU-visible address window.
//!
//! A Hexagon DSP process has a 32-bit virtual address space; about 3 GiB of it can hold FastRPC
//! mappings of one session, and the session has a limited number of mapper entries. [`VaWindow`]
//! models exactly that: a page-granular first-fit allocator over `[0, size)` with an entry limit,
//! returning [`Error::VaBudget`] / [`Error::MapperEntries`] instead of failing later.
//!
//! With a *reserved* window (the emulated DSP) the range is a real `PROT_NONE` reservation of the
//! host address space and every mapping is a real `mmap(MAP_SHARED | MAP_FIXED)` of the buffer's
//! file descriptor into it, so the DSP thread sees the memory only through the window. With an
//! *accounting* window (FastRPC) the DSP maps the buffer itself (`fastrpc_mmap`) and the host keeps
//! the same books, so the budget error is the same whatever the transport.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::Mutex;

use crate::error::{ConfigProblem, Error, InputProblem, Result};

/// The host page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// `x` rounded up to a multiple of `align` (a power of two).
pub fn round_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

/// Counters of one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VaStats {
    /// Window size in bytes.
    pub window_bytes: u64,
    /// Mapper entries of the session.
    pub entry_limit: usize,
    /// Successful maps.
    pub maps: u64,
    /// Unmaps.
    pub unmaps: u64,
    /// Maps refused for lack of address space or entries.
    pub refused: u64,
    /// Bytes mapped now.
    pub mapped_bytes: u64,
    /// Peak of `mapped_bytes`.
    pub peak_mapped_bytes: u64,
    /// Entries in use now.
    pub entries: usize,
    /// Peak of `entries`.
    pub peak_entries: usize,
}

/// One mapping in the window. Give it back with [`VaWindow::unmap`].
#[derive(Debug)]
pub struct Mapping {
    offset: u64,
    len: u64,
    npu_addr: Option<usize>,
}

impl Mapping {
    /// Byte offset of the mapping in the window.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes (page multiple).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false (mappings are at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address the DSP uses (reserved windows only).
    pub fn npu_addr(&self) -> Option<*mut u8> {
        self.npu_addr.map(|a| a as *mut u8)
    }
}

struct State {
    /// Free ranges: offset -> length, coalesced.
    free: BTreeMap<u64, u64>,
    stats: VaStats,
}

/// A host `PROT_NONE` reservation, released on drop.
struct Reservation {
    base: usize,
    len: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: base/len is the reservation made in VaWindow::reserve; every mapping inside it
        // was replaced by PROT_NONE again before its Mapping was released.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// The NPU address window: allocator, limits, counters and (optionally) the host reservation.
pub struct VaWindow {
    size: u64,
    entry_limit: usize,
    page: u64,
    reservation: Option<Reservation>,
    state: Mutex<State>,
}

impl std::fmt::Debug for VaWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaWindow")
            .field("size", &self.size)
            .field("entry_limit", &self.entry_limit)
            .field("reserved", &self.reservation.is_some())
            .finish()
    }
}

impl VaWindow {
    fn with(size: u64, entry_limit: usize, reservation: Option<Reservation>, page: u64) -> Self {
        let mut free = BTreeMap::new();
        free.insert(0, size);
        VaWindow {
            size,
            entry_limit,
            page,
            reservation,
            state: Mutex::new(State {
                free,
                stats: VaStats {
                    window_bytes: size,
                    entry_limit,
                    ..Default::default()
                },
            }),
        }
    }

    /// A window of `size` bytes (rounded up to pages) backed by a real host reservation.
    pub fn reserve(size: u64, entry_limit: usize) -> Result<Self> {
        let page = page_size();
        let size = round_up(size.max(1), page);
        let len = usize::try_from(size).map_err(|_| {
            Error::config(
                "va_window_bytes",
                ConfigProblem::HostAddressSpace { bytes: size },
            )
        })?;
        // SAFETY: a fresh anonymous PROT_NONE mapping; MAP_NORESERVE so it costs no commit charge.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os("mmap (reserve NPU window)"));
        }
        Ok(Self::with(
            size,
            entry_limit,
            Some(Reservation {
                base: p as usize,
                len,
            }),
            page,
        ))
    }

    /// A window that only keeps the books (the DSP maps buffers itself).
    pub fn accounting(size: u64, entry_limit: usize) -> Self {
        let page = page_size();
        Self::with(round_up(size.max(1), page), entry_limit, None, page)
    }

    /// The page size mappings are rounded to.
    pub fn page(&self) -> u64 {
        self.page
    }

    /// Counters.
    pub fn stats(&self) -> VaStats {
        self.state.lock().expect("window lock").stats
    }

    /// The largest free contiguous range.
    #[cfg(test)]
    pub fn largest_free(&self) -> u64 {
        let st = self.state.lock().expect("window lock");
        st.free.values().copied().max().unwrap_or(0)
    }

    fn budget_error(&self, st: &State, need: u64) -> Error {
        Error::VaBudget {
            need,
            have: st.free.values().copied().max().unwrap_or(0),
            window: self.size,
            in_use: st.stats.mapped_bytes,
        }
    }

    /// Whether a mapping of `len` bytes would succeed now (no side effects).
    pub fn check(&self, len: u64) -> Result<()> {
        let need = round_up(len.max(1), self.page);
        let st = self.state.lock().expect("window lock");
        if st.stats.entries >= self.entry_limit {
            return Err(Error::MapperEntries {
                limit: self.entry_limit,
            });
        }
        if !st.free.values().any(|&l| l >= need) {
            return Err(self.budget_error(&st, need));
        }
        Ok(())
    }

    /// Count a mapping refused by a caller after [`Self::check`].
    pub fn note_refused(&self) {
        self.state.lock().expect("window lock").stats.refused += 1;
    }

    /// Place `len` bytes (rounded up to pages) of `fd` into the window.
    pub fn map(&self, fd: RawFd, len: u64) -> Result<Mapping> {
        self.map_range(fd, 0, len, true)
    }

    /// Place `len` bytes (rounded up to pages) of `fd` from `file_offset` (a page multiple) into
    /// the window, read-only unless `writable`. The same books as [`Self::map`]: the mapping
    /// takes window space and an entry whether or not the memory is shared with other mappings.
    pub fn map_range(
        &self,
        fd: RawFd,
        file_offset: u64,
        len: u64,
        writable: bool,
    ) -> Result<Mapping> {
        if !file_offset.is_multiple_of(self.page) {
            return Err(Error::input(
                "NPU window",
                InputProblem::NotMultiple {
                    what: "file offset",
                    value: file_offset,
                    multiple: self.page,
                    unit: "byte page",
                },
            ));
        }
        let file_offset = libc::off_t::try_from(file_offset).map_err(|_| {
            Error::input(
                "NPU window",
                InputProblem::TooLarge {
                    what: "file offset",
                    value: file_offset,
                    limit: "off_t",
                },
            )
        })?;
        let need = round_up(len.max(1), self.page);
        let mut st = self.state.lock().expect("window lock");
        if st.stats.entries >= self.entry_limit {
            st.stats.refused += 1;
            return Err(Error::MapperEntries {
                limit: self.entry_limit,
            });
        }
        // First fit in address order keeps the low end dense and large ranges at the top.
        let Some((&off, &flen)) = st.free.iter().find(|(_, &l)| l >= need) else {
            st.stats.refused += 1;
            return Err(self.budget_error(&st, need));
        };
        let npu_addr = match &self.reservation {
            Some(r) => {
                let addr = r.base + off as usize;
                let prot = if writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                };
                // SAFETY: [addr, addr + need) lies inside our reservation and is currently a
                // PROT_NONE placeholder that nothing else uses; MAP_FIXED replaces it atomically.
                let p = unsafe {
                    libc::mmap(
                        addr as *mut libc::c_void,
                        need as usize,
                        prot,
                        libc::MAP_SHARED | libc::MAP_FIXED,
                        fd,
                        file_offset,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(Error::last_os("mmap (map into NPU window)"));
                }
                Some(addr)
            }
            None => None,
        };
        st.free.remove(&off);
        if flen > need {
            st.free.insert(off + need, flen - need);
        }
        let s = &mut st.stats;
        s.maps += 1;
        s.entries += 1;
        s.peak_entries = s.peak_entries.max(s.entries);
        s.mapped_bytes += need;
        s.peak_mapped_bytes = s.peak_mapped_bytes.max(s.mapped_bytes);
        Ok(Mapping {
            offset: off,
            len: need,
            npu_addr,
        })
    }

    /// Remove a mapping and give its range back.
    pub fn unmap(&self, m: Mapping) -> Result<()> {
        if let (Some(r), Some(addr)) = (&self.reservation, m.npu_addr) {
            debug_assert_eq!(addr, r.base + m.offset as usize);
            // Replace the file mapping by a PROT_NONE placeholder in one call: a plain munmap
            // would open a hole that another thread's mmap could take before we re-reserve it.
            // SAFETY: the range is exactly a mapping we made inside the reservation.
            let p = unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    m.len as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::last_os("mmap (unmap from NPU window)"));
            }
        }
        let mut st = self.state.lock().expect("window lock");
        let (mut off, mut len) = (m.offset, m.len);
        // Coalesce with the free neighbours on both sides.
        if let Some((&poff, &plen)) = st.free.range(..off).next_back() {
            if poff + plen == off {
                st.free.remove(&poff);
                off = poff;
                len += plen;
            }
        }
        if let Some(&nlen) = st.free.get(&(off + len)) {
            st.free.remove(&(off + len));
            len += nlen;
        }
        st.free.insert(off, len);
        let s = &mut st.stats;
        s.unmaps += 1;
        s.entries -= 1;
        s.mapped_bytes -= m.len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn first_fit_coalesces_and_reports_need_and_have() {
        let w = VaWindow::accounting(8 * MIB, 16);
        let a = w.map(-1, 3 * MIB).unwrap();
        let b = w.map(-1, 3 * MIB).unwrap();
        let c = w.map(-1, 2 * MIB).unwrap();
        assert_eq!((a.offset(), b.offset(), c.offset()), (0, 3 * MIB, 6 * MIB));
        match w.map(-1, 1).unwrap_err() {
            Error::VaBudget { need, have, .. } => assert_eq!((need, have), (w.page(), 0)),
            e => panic!("{e}"),
        }
        w.unmap(a).unwrap();
        w.unmap(c).unwrap();
        // Two separate holes of 3 and 2 MiB: 4 MiB does not fit, the error names the 3 MiB hole.
        match w.map(-1, 4 * MIB).unwrap_err() {
            Error::VaBudget { need, have, .. } => assert_eq!((need, have), (4 * MIB, 3 * MIB)),
            e => panic!("{e}"),
        }
        w.unmap(b).unwrap();
        assert_eq!(w.largest_free(), 8 * MIB, "all holes coalesce");
        let s = w.stats();
        assert_eq!((s.maps, s.unmaps, s.refused), (3, 3, 2));
        assert_eq!((s.peak_mapped_bytes, s.mapped_bytes), (8 * MIB, 0));
    }

    #[test]
    fn entry_limit_is_enforced() {
        let w = VaWindow::accounting(8 * MIB, 2);
        let a = w.map(-1, 1).unwrap();
        let _b = w.map(-1, 1).unwrap();
        assert!(matches!(
            w.map(-1, 1),
            Err(Error::MapperEntries { limit: 2 })
        ));
        assert!(matches!(w.check(1), Err(Error::MapperEntries { .. })));
        w.unmap(a).unwrap();
        w.check(1).unwrap();
        assert_eq!(w.stats().peak_entries, 2);
    }

    #[test]
    fn reserved_window_maps_a_memfd_for_real() {
        let w = VaWindow::reserve(4 * MIB, 4).unwrap();
        let shm = crate::memory::SharedMemory::memfd("va-test", 2 * w.page() as usize).unwrap();
        shm.write(0, &[1, 2, 3, 4]).unwrap();
        let m = w.map(shm.fd(), shm.len() as u64).unwrap();
        let p = m.npu_addr().unwrap();
        // The window view and the host view are the same pages.
        // SAFETY: the mapping is live and at least one page long.
        unsafe {
            assert_eq!(std::slice::from_raw_parts(p, 4), &[1, 2, 3, 4]);
            *p.add(5) = 9;
        }
        assert_eq!(shm.read(5, 1).unwrap(), vec![9]);
        w.unmap(m).unwrap();
        assert_eq!(w.stats().mapped_bytes, 0);
    }

    #[test]
    fn a_range_of_a_file_maps_in_place_at_its_offset() {
        let w = VaWindow::reserve(4 * MIB, 4).unwrap();
        let page = w.page() as usize;
        let shm = crate::memory::SharedMemory::memfd("va-range", 3 * page).unwrap();
        shm.write(page, &[5, 6, 7]).unwrap();
        // The second page only, read-only: one page of the window, the file's own bytes.
        let m = w.map_range(shm.fd(), page as u64, 1, false).unwrap();
        assert_eq!(m.len(), page as u64);
        let p = m.npu_addr().unwrap();
        // SAFETY: the mapping is live and one page long; only read.
        assert_eq!(unsafe { std::slice::from_raw_parts(p, 3) }, &[5, 6, 7]);
        // A later host write shows through: the same pages, not a copy.
        shm.write(page + 1, &[9]).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { *p.add(1) }, 9);
        let e = w.map_range(shm.fd(), 1, 1, false).unwrap_err();
        assert!(matches!(
            e.input_problem(),
            Some(InputProblem::NotMultiple { value: 1, .. })
        ));
        assert_eq!(w.stats().mapped_bytes, page as u64);
        w.unmap(m).unwrap();
    }
}
