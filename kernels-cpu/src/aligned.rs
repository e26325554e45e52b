//! A byte buffer aligned to a cache line, so packed weight tiles never straddle one.

/// Owned bytes starting on a 64-byte boundary.
///
/// The bytes live in a `Vec<u8>` of `len + 63` zeros, from the allocator's zeroed allocation
/// (`calloc`: for a weight matrix, fresh pages the kernel zero-fills on first touch, so nothing
/// writes the buffer twice and the packing threads fault its pages in where they write them; a
/// `vec!` of an over-aligned element type was a single-threaded `memset` of every byte, a third of
/// a full-size model's load), starting `off` bytes in.
pub(crate) struct AlignedBytes {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let buf = vec![0u8; len.saturating_add(63)];
        // A heap pointer's offset to the next 64-byte boundary is at most 63 (`align_offset` of
        // a `u8` pointer never returns `usize::MAX`); moving the Vec keeps its heap bytes where
        // they are.
        let off = buf.as_ptr().align_offset(64).min(63);
        huge_pages(&buf);
        Self { buf, off, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf[self.off..self.off + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

/// Ask for transparent huge pages over the 2 MiB-aligned part of a weight-sized buffer
/// (`MADV_HUGEPAGE`; Linux's default `madvise` mode gives them only on request): its first
/// touches then fault in 2 MiB at a time instead of 4 KiB. Advice only: refused or unsupported,
/// the buffer stays in small pages.
fn huge_pages(buf: &[u8]) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        const HUGE: usize = 2 << 20;
        let (at, end) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
        let start = at.div_ceil(HUGE) * HUGE;
        let stop = (end / HUGE) * HUGE;
        if stop > start {
            // SAFETY: advice on whole pages inside this live allocation; MADV_HUGEPAGE changes
            // how the kernel backs the range, never its contents.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    stop - start,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = buf;
}

impl Clone for AlignedBytes {
    fn clone(&self) -> Self {
        // A cloned Vec may sit at another offset from a 64-byte boundary: copy into a new one.
        let mut c = Self::zeroed(self.len);
        c.as_mut_slice().copy_from_slice(self.as_slice());
        c
    }
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBytes({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::AlignedBytes;

    #[test]
    fn zeroed_bytes_start_on_a_cache_line_and_clones_do_too() {
        for len in [0usize, 1, 63, 64, 65, 4096, 1 << 20, (1 << 20) + 7] {
            let mut a = AlignedBytes::zeroed(len);
            assert_eq!(a.as_slice().len(), len);
            assert_eq!(a.as_slice().as_ptr() as usize % 64, 0, "len {len}");
            assert!(a.as_slice().iter().all(|&b| b == 0), "len {len}");
            for (i, b) in a.as_mut_slice().iter_mut().enumerate() {
                *b = i as u8;
            }
            // Keep a misaligning allocation alive so the clone's Vec lands somewhere else.
            let _pad: Vec<u8> = Vec::with_capacity(24);
            let c = a.clone();
            assert_eq!(c.as_slice().as_ptr() as usize % 64, 0, "clone, len {len}");
            assert_eq!(c.as_slice(), a.as_slice());
        }
    }
}
