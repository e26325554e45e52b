//! GGUF matrices read in place: the file is memory-mapped and a matrix's ggml blocks are handed
//! to the packers straight from the mapping ([`RawMatrix`]), with no read buffer, no
//! [`candle_core::quantized::QTensor`] copy and no zero-filled allocation on the way (what made a
//! full-size load spend most of its time in the kernel clearing and copying pages). LLaDA's q/k
//! matrices, whose rows llama.cpp's converter permuted, are the exception: their rows are put back
//! in order into a buffer of their own (a few MB each).
//!
//! When a raw matrix is dropped, its range of the mapping is released
//! (`madvise(MADV_DONTNEED)`): the pages stay in the page cache, but stop counting in the process's
//! resident set, so a load holds the packed weights plus the matrix being packed, not the whole
//! file beside them.

use std::borrow::Cow;
use std::ops::Range;

use candle_core::quantized::GgmlDType;
use memmap2::Mmap;

use crate::limits::raw_is_finite;
use crate::{Error, Result};

/// One matrix's ggml blocks, row-major (`rows` rows of `cols` values of `dtype`), in the mapped
/// file or (rows reordered) in a buffer of its own.
pub struct RawMatrix<'a> {
    /// The ggml type of the blocks.
    pub dtype: GgmlDType,
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// The blocks.
    pub bytes: Cow<'a, [u8]>,
    /// The mapping range to release when done.
    release: Option<(&'a Mmap, Range<usize>)>,
}

impl std::fmt::Debug for RawMatrix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RawMatrix({:?}, {} x {}, {} bytes{})",
            self.dtype,
            self.rows,
            self.cols,
            self.bytes.len(),
            if self.release.is_some() {
                ", mapped"
            } else {
                ""
            }
        )
    }
}

impl<'a> RawMatrix<'a> {
    /// `range` of `map`, `rows` x `cols` of `dtype`; its rows reordered by `order` (row `r` of the
    /// result is stored row `order(r)`) when given.
    pub(crate) fn new(
        map: &'a Mmap,
        range: Range<usize>,
        dtype: GgmlDType,
        (rows, cols): (usize, usize),
        order: Option<&dyn Fn(usize) -> usize>,
    ) -> Self {
        populate(map, &range);
        let src = &map[range.clone()];
        let bytes = match order {
            None => Cow::Borrowed(src),
            Some(from) => {
                let rb = src.len() / rows.max(1);
                let mut out = vec![0u8; src.len()];
                for (r, dst) in out.chunks_exact_mut(rb).enumerate() {
                    let s = from(r);
                    dst.copy_from_slice(&src[s * rb..(s + 1) * rb]);
                }
                Cow::Owned(out)
            }
        };
        RawMatrix {
            dtype,
            rows,
            cols,
            bytes,
            release: Some((map, range)),
        }
    }

    /// The first non-finite value (plain floats) or block scale (quantized types), described.
    pub(crate) fn non_finite(&self) -> Option<String> {
        non_finite_blocks(self.dtype, &self.bytes)
    }
}

impl Drop for RawMatrix<'_> {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some((map, r)) = self.release.take() {
            let page = 4096;
            let start = r.start.div_ceil(page) * page;
            let end = (r.end / page) * page;
            if end > start {
                // SAFETY: the range lies inside the mapping of a file opened read-only and never
                // written through; MADV_DONTNEED on such a mapping drops the page-table entries
                // only, and a later read faults the same file bytes back in from the page cache,
                // so no reference into the mapping sees different bytes. Pages shared with the
                // neighbouring tensors (the range's partial first and last pages) are kept. A
                // failure only leaves the pages resident.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }
}

/// Map `range` of `map` into the page tables in one call (`MADV_POPULATE_READ`, Linux 5.14+)
/// instead of one page fault per few pages as the packers read it: the pages are in the page
/// cache after the first load, and a full-size model's load spent a good part of its system
/// time faulting them in. An older kernel refuses the advice, and the reads fault the pages in as
/// before (as they do on other systems, Android included: memmap2 offers the advice on Linux only).
fn populate(map: &Mmap, range: &Range<usize>) {
    #[cfg(target_os = "linux")]
    {
        let page = 4096;
        let start = (range.start / page) * page;
        if range.end > start {
            // A failure only leaves the pages to be faulted in by the reads.
            let _ = map.advise_range(memmap2::Advice::PopulateRead, start, range.end - start);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (map, range);
}

/// Where the block scales of a quantized type sit: the byte offsets of its f16 scale fields
/// (`d`, and `m`/`dmin` where the type has one). Types without an f16 scale (Q8_K's is f32) are
/// left to the logits check.
fn scale_fields(dt: GgmlDType) -> Option<&'static [usize]> {
    Some(match dt {
        GgmlDType::Q4_0 | GgmlDType::Q5_0 | GgmlDType::Q8_0 => &[0],
        GgmlDType::Q4_1 | GgmlDType::Q5_1 | GgmlDType::Q8_1 => &[0, 2],
        GgmlDType::Q4K | GgmlDType::Q5K => &[0, 2],
        GgmlDType::Q2K => &[80, 82],
        GgmlDType::Q3K => &[108],
        GgmlDType::Q6K => &[208],
        _ => return None,
    })
}

/// The first non-finite value of ggml data of type `dt` (plain floats, or a quantized type's
/// f16 block scales), described; `None` when all are finite.
pub(crate) fn non_finite_blocks(dt: GgmlDType, data: &[u8]) -> Option<String> {
    let plain = match dt {
        GgmlDType::F32 => Some(candle_core::DType::F32),
        GgmlDType::F16 => Some(candle_core::DType::F16),
        GgmlDType::BF16 => Some(candle_core::DType::BF16),
        _ => None,
    };
    if let Some(p) = plain {
        return (!raw_is_finite(data, p)).then(|| "a NaN or infinite value".into());
    }
    let fields = scale_fields(dt)?;
    let block = dt.type_size();
    // A scale's high byte (little-endian f16) with all exponent bits set: NaN or infinity.
    let bad = |b: &[u8]| fields.iter().any(|&f| b[f + 1] & 0x7C == 0x7C);
    // Chunks of blocks in parallel on the current pool: a full-size model's check reads every
    // block of gigabytes of mapped file (it was a fifth of the load, on one thread); the first
    // bad block of the first bad chunk is the first bad block.
    const CHUNK: usize = 1 << 14;
    use rayon::prelude::*;
    let b = data
        .par_chunks(block * CHUNK)
        .enumerate()
        .find_map_first(|(c, chunk)| {
            chunk
                .chunks_exact(block)
                .position(bad)
                .map(|i| c * CHUNK + i)
        })?;
    let chunk = &data[b * block..(b + 1) * block];
    let bits = fields
        .iter()
        .map(|&f| u16::from_le_bytes([chunk[f], chunk[f + 1]]))
        .find(|bits| bits & 0x7C00 == 0x7C00)?;
    Some(format!(
        "block {b} has a NaN or infinite scale ({})",
        half::f16::from_bits(bits)
    ))
}

/// Map `file` for reading in place. The caller checked every tensor range against the file's
/// size when it opened it; a file truncated by another process while mapped would fault (the
/// same contract as llama.cpp's mmap loading).
pub(crate) fn map_file(file: &std::fs::File, path: &std::path::Path) -> Result<Mmap> {
    // SAFETY: the mapping is read-only and private to this reader; its bytes are only read
    // through slices of it (see the module docs for the truncation caveat).
    unsafe { Mmap::map(file) }.map_err(|e| Error::file(path, format!("cannot map the file: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_non_finite_block_scale_is_named_across_chunks() {
        let block = GgmlDType::Q4_0.type_size();
        let blocks = 3 * (1 << 14) + 5;
        let one = half::f16::from_f32(0.5).to_le_bytes();
        let mut data = vec![0u8; blocks * block];
        for b in data.chunks_exact_mut(block) {
            b[..2].copy_from_slice(&one);
            // Codes with every bit pattern: only the scale decides.
            b[2..].fill(0xFF);
        }
        assert_eq!(non_finite_blocks(GgmlDType::Q4_0, &data), None);
        let put = |data: &mut [u8], at: usize, v: half::f16| {
            data[at * block..at * block + 2].copy_from_slice(&v.to_le_bytes())
        };
        // Two bad blocks in different chunks: the earlier is named, whatever thread finds which.
        put(&mut data, 3 * (1 << 14) + 1, half::f16::NAN);
        put(&mut data, 2 * (1 << 14) + 3, half::f16::INFINITY);
        let got = non_finite_blocks(GgmlDType::Q4_0, &data).unwrap();
        assert_eq!(
            got,
            format!(
                "block {} has a NaN or infinite scale (inf)",
                2 * (1 << 14) + 3
            )
        );
        // The largest finite f16 passes.
        put(&mut data, 2 * (1 << 14) + 3, half::f16::MAX);
        let got = non_finite_blocks(GgmlDType::Q4_0, &data).unwrap();
        assert!(
            got.starts_with(&format!("block {} ", 3 * (1 << 14) + 1)),
            "{got}"
        );
        // A type with two scale fields: the second (`m`) is checked too.
        let b1 = GgmlDType::Q4_1.type_size();
        let mut q41 = vec![0u8; 4 * b1];
        q41[2 * b1 + 2..2 * b1 + 4].copy_from_slice(&half::f16::NEG_INFINITY.to_le_bytes());
        let got = non_finite_blocks(GgmlDType::Q4_1, &q41).unwrap();
        assert_eq!(got, "block 2 has a NaN or infinite scale (-inf)");
    }
}
