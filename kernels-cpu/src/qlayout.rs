//! The packed layouts of quantized weights: 32-row tiles whose 32-bit lanes hold four
//! consecutive codes of one row, the operand shape of `vpdpbusd` and of HVX's `vrmpy`.
//!
//! A matrix `W[N][K]` is cut into units of 32 rows x one K block (32 values for Q4_0/Q8_0, a
//! 256-value super-block for the K-quants). All units' codes come first, unit `(nt, kb)` at
//! `(nt * KB + kb) * code_bytes`, then all units' scales, unit `(nt, kb)` at
//! `NT * KB * code_bytes + (nt * KB + kb) * scale_bytes`. Rows past `N` are padding that
//! dequantizes to zero.
//!
//! - **Q4_0** is exactly the NPU's `KDSP_LAYOUT_Q4_0_TILES` (kernels-dsp `kdsp_ops.h`): 512 B
//!   of codes, byte `p*128 + r*4 + i = c(r, 8p+i) | c(r, 8p+4+i) << 4`, then 32 f16 `d` (64 B).
//!   Padding: code 8, `d = 0`. The CPU and the NPU read the same bytes.
//! - **Q8_0**: 1024 B of int8, byte `q*128 + r*4 + i = w(r, 4q+i)`, then 32 f16 `d`.
//! - **Q4_K**: eight 32-value sub-tiles of 512 B in the Q4_0 nibble arrangement (codes 0..15),
//!   then `d[32]`, `dmin[32]` (f16), `sc[8][32]`, `m[8][32]` (6-bit values in bytes): 640 B.
//! - **Q6_K**: eight 32-value sub-tiles of 1024 B, byte `q*128 + r*4 + i` = the 6-bit code
//!   (0..63) of value `4q+i`, then `d[32]` (f16) and `sc[16][32]` (i8): 576 B. Codes are stored
//!   one per byte (8 bits instead of 6: a simpler and faster inner loop for 22% more bytes).

use crate::error::{check_len, mul};
use crate::ggml::{f16_at, q4k_code, q4k_scale_min, q6k_code, GgmlType, QK_K};
use crate::{Error, Result};

/// Rows (and, for Q4_0/Q8_0, values of K) per tile.
pub const TILE: usize = 32;

/// A quantized format in its packed layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QFormat {
    /// Q4_0 tiles (the NPU layout).
    Q4_0,
    /// Q8_0 tiles.
    Q8_0,
    /// Q4_K super-block tiles.
    Q4K,
    /// Q6_K super-block tiles.
    Q6K,
}

impl QFormat {
    /// The ggml type this format packs.
    pub fn ggml(self) -> GgmlType {
        match self {
            QFormat::Q4_0 => GgmlType::Q4_0,
            QFormat::Q8_0 => GgmlType::Q8_0,
            QFormat::Q4K => GgmlType::Q4K,
            QFormat::Q6K => GgmlType::Q6K,
        }
    }

    /// The packed format of a ggml type, if it is quantized.
    pub fn of(ty: GgmlType) -> Option<QFormat> {
        match ty {
            GgmlType::Q4_0 => Some(QFormat::Q4_0),
            GgmlType::Q8_0 => Some(QFormat::Q8_0),
            GgmlType::Q4K => Some(QFormat::Q4K),
            GgmlType::Q6K => Some(QFormat::Q6K),
            _ => None,
        }
    }

    /// Values of K per unit.
    pub fn block(self) -> usize {
        match self {
            QFormat::Q4_0 | QFormat::Q8_0 => TILE,
            QFormat::Q4K | QFormat::Q6K => QK_K,
        }
    }

    /// Code bytes per unit.
    pub fn code_bytes(self) -> usize {
        match self {
            QFormat::Q4_0 => 512,
            QFormat::Q8_0 => 1024,
            QFormat::Q4K => 8 * 512,
            QFormat::Q6K => 8 * 1024,
        }
    }

    /// Scale bytes per unit.
    pub fn scale_bytes(self) -> usize {
        match self {
            QFormat::Q4_0 | QFormat::Q8_0 => 64,
            QFormat::Q4K => 640,
            QFormat::Q6K => 576,
        }
    }
}

/// Units of a packed `n x k` matrix: `(NT, KB)`; an error unless `n > 0` and `k` is a positive
/// multiple of the format's block.
pub(crate) fn units(fmt: QFormat, n: usize, k: usize) -> Result<(usize, usize)> {
    if n == 0 {
        return Err(Error::Shape {
            op: "weight rows",
            what: "a matrix needs at least one row".into(),
        });
    }
    fmt.ggml().row_bytes(k)?;
    Ok((n.div_ceil(TILE), k / fmt.block()))
}

/// Bytes of a packed `n x k` matrix.
pub fn packed_len(fmt: QFormat, n: usize, k: usize) -> Result<usize> {
    let (nt, kb) = units(fmt, n, k)?;
    mul(
        "packed weights",
        mul("packed weights", nt, kb)?,
        fmt.code_bytes() + fmt.scale_bytes(),
    )
}

/// Repack ggml row-major blocks (`n` rows of `k` values of `fmt.ggml()`) into `dst`
/// ([`packed_len`] bytes, every byte written).
pub fn pack_into(fmt: QFormat, dst: &mut [u8], src: &[u8], n: usize, k: usize) -> Result<()> {
    let (nt_n, kb_n) = units(fmt, n, k)?;
    let ty = fmt.ggml();
    let row_bytes = ty.row_bytes(k)?;
    check_len("ggml weight bytes", src.len(), ty.matrix_bytes(n, k)?)?;
    check_len("packed weight buffer", dst.len(), packed_len(fmt, n, k)?)?;
    let (cb, sb) = (fmt.code_bytes(), fmt.scale_bytes());
    let (codes, scales) = dst.split_at_mut(nt_n * kb_n * cb);
    // Each 32-row tile owns a contiguous run of codes and of scales: the tiles are packed in
    // parallel on the current rayon pool (a load packs gigabytes; every byte lands where the
    // serial loop would put it).
    let tile = |(nt, (codes, scales)): (usize, (&mut [u8], &mut [u8]))| {
        for kb in 0..kb_n {
            let c = &mut codes[kb * cb..(kb + 1) * cb];
            let s = &mut scales[kb * sb..(kb + 1) * sb];
            for r in 0..TILE {
                let row = nt * TILE + r;
                let blk = (row < n).then(|| {
                    let at = row * row_bytes + kb * ty.block_bytes();
                    &src[at..at + ty.block_bytes()]
                });
                pack_row(fmt, c, s, r, blk);
            }
        }
    };
    use rayon::prelude::*;
    codes
        .par_chunks_mut(kb_n * cb)
        .zip(scales.par_chunks_mut(kb_n * sb))
        .enumerate()
        .with_min_len(8)
        .for_each(tile);
    Ok(())
}

/// Write row `r` of one unit from its ggml block (`None`: padding).
fn pack_row(fmt: QFormat, c: &mut [u8], s: &mut [u8], r: usize, blk: Option<&[u8]>) {
    match fmt {
        QFormat::Q4_0 => {
            let mut codes = [8u8; 32];
            let mut d = [0u8; 2];
            if let Some(b) = blk {
                d = [b[0], b[1]];
                for j in 0..16 {
                    codes[j] = b[2 + j] & 0x0f;
                    codes[j + 16] = b[2 + j] >> 4;
                }
            }
            s[2 * r..2 * r + 2].copy_from_slice(&d);
            put_nibbles(c, r, &codes);
        }
        QFormat::Q8_0 => {
            let (mut d, mut w) = ([0u8; 2], [0u8; 32]);
            if let Some(b) = blk {
                d = [b[0], b[1]];
                w.copy_from_slice(&b[2..34]);
            }
            s[2 * r..2 * r + 2].copy_from_slice(&d);
            put_bytes(c, r, &w);
        }
        QFormat::Q4K => {
            let mut codes = [0u8; 256];
            let (mut d, mut dmin) = ([0u8; 2], [0u8; 2]);
            let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
            if let Some(b) = blk {
                d = [b[0], b[1]];
                dmin = [b[2], b[3]];
                for j in 0..8 {
                    (sc[j], mn[j]) = q4k_scale_min(j, &b[4..16]);
                }
                for (v, code) in codes.iter_mut().enumerate() {
                    *code = q4k_code(&b[16..144], v);
                }
            }
            for j in 0..8 {
                put_nibbles(
                    &mut c[j * 512..(j + 1) * 512],
                    r,
                    &codes[32 * j..32 * j + 32],
                );
                s[128 + j * 32 + r] = sc[j];
                s[384 + j * 32 + r] = mn[j];
            }
            s[2 * r..2 * r + 2].copy_from_slice(&d);
            s[64 + 2 * r..64 + 2 * r + 2].copy_from_slice(&dmin);
        }
        QFormat::Q6K => {
            let mut codes = [0u8; 256];
            let (mut d, mut sc) = ([0u8; 2], [0u8; 16]);
            if let Some(b) = blk {
                for (v, code) in codes.iter_mut().enumerate() {
                    *code = q6k_code(&b[0..128], &b[128..192], v);
                }
                sc.copy_from_slice(&b[192..208]);
                d = [b[208], b[209]];
            }
            for j in 0..8 {
                put_bytes(
                    &mut c[j * 1024..(j + 1) * 1024],
                    r,
                    &codes[32 * j..32 * j + 32],
                );
            }
            for (j, &v) in sc.iter().enumerate() {
                s[64 + j * 32 + r] = v;
            }
            s[2 * r..2 * r + 2].copy_from_slice(&d);
        }
    }
}

/// Row `r`'s 32 four-bit codes into a 512-byte nibble tile.
fn put_nibbles(tile: &mut [u8], r: usize, codes: &[u8]) {
    for p in 0..4 {
        for i in 0..4 {
            tile[p * 128 + r * 4 + i] = codes[8 * p + i] | (codes[8 * p + 4 + i] << 4);
        }
    }
}

/// Row `r`'s 32 byte codes into a 1024-byte tile.
fn put_bytes(tile: &mut [u8], r: usize, codes: &[u8]) {
    for q in 0..8 {
        tile[q * 128 + r * 4..q * 128 + r * 4 + 4].copy_from_slice(&codes[4 * q..4 * q + 4]);
    }
}

/// Dequantize row `row` of a packed matrix into `out` (`k` values): the embedding gather and
/// the tests' check that packing loses nothing.
pub fn dequantize_packed_row(
    fmt: QFormat,
    packed: &[u8],
    n: usize,
    k: usize,
    row: usize,
    out: &mut [f32],
) -> Result<()> {
    let (nt_n, kb_n) = units(fmt, n, k)?;
    check_len("packed weights", packed.len(), packed_len(fmt, n, k)?)?;
    check_len("row output", out.len(), k)?;
    if row >= n {
        return Err(Error::Shape {
            op: "row index",
            what: format!("{row} is outside the {n} rows"),
        });
    }
    let (cb, sb) = (fmt.code_bytes(), fmt.scale_bytes());
    let (nt, r) = (row / TILE, row % TILE);
    for kb in 0..kb_n {
        let u = nt * kb_n + kb;
        let c = &packed[u * cb..(u + 1) * cb];
        let s = &packed[nt_n * kb_n * cb + u * sb..][..sb];
        let o = &mut out[kb * fmt.block()..(kb + 1) * fmt.block()];
        match fmt {
            QFormat::Q4_0 => {
                let d = f16_at(s, 2 * r);
                for (v, x) in o.iter_mut().enumerate() {
                    *x = (nibble(c, r, v) as f32 - 8.0) * d;
                }
            }
            QFormat::Q8_0 => {
                let d = f16_at(s, 2 * r);
                for (v, x) in o.iter_mut().enumerate() {
                    *x = byte(c, r, v) as i8 as f32 * d;
                }
            }
            QFormat::Q4K => {
                let (d, dmin) = (f16_at(s, 2 * r), f16_at(s, 64 + 2 * r));
                for (v, x) in o.iter_mut().enumerate() {
                    let j = v / 32;
                    let (sc, m) = (s[128 + j * 32 + r], s[384 + j * 32 + r]);
                    let code = nibble(&c[j * 512..], r, v % 32);
                    *x = d * sc as f32 * code as f32 - dmin * m as f32;
                }
            }
            QFormat::Q6K => {
                let d = f16_at(s, 2 * r);
                for (v, x) in o.iter_mut().enumerate() {
                    let sc = s[64 + (v / 16) * 32 + r] as i8;
                    let code = byte(&c[(v / 32) * 1024..], r, v % 32);
                    *x = d * sc as f32 * (code as i32 - 32) as f32;
                }
            }
        }
    }
    Ok(())
}

fn nibble(tile: &[u8], r: usize, v: usize) -> u8 {
    let (p, w) = (v / 8, v % 8);
    let b = tile[p * 128 + r * 4 + w % 4];
    if w < 4 {
        b & 0x0f
    } else {
        b >> 4
    }
}

fn byte(tile: &[u8], r: usize, v: usize) -> u8 {
    tile[(v / 4) * 128 + r * 4 + v % 4]
}
