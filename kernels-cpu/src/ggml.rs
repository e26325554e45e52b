//! The ggml weight formats as they sit in a GGUF file (row-major blocks), and their reference
//! dequantization.
//!
//! Block layouts (ggml `block_*`, little-endian):
//! - `Q4_0` = f16 d + 16 bytes: `x[j] = ((q[j] & 15) - 8) d`, `x[j + 16] = ((q[j] >> 4) - 8) d`;
//! - `Q8_0` = f16 d + 32 i8;
//! - `Q4_K` (256 values) = f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
//!   nibbles: `x = d sc_j q - dmin m_j`;
//! - `Q6_K` (256 values) = 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 i8 scales,
//!   f16 d: `x = d sc_j (q - 32)`, 16 values per scale.

use half::{bf16, f16};

use crate::error::{check_len, mul};
use crate::{Error, Result};

/// A weight element type of a GGUF tensor that the kernels understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// 32-value blocks of 4-bit codes and an f16 scale.
    Q4_0,
    /// 32-value blocks of int8 and an f16 scale.
    Q8_0,
    /// 256-value super-blocks of 4-bit codes, 8 sub-blocks with 6-bit scales and mins.
    Q4K,
    /// 256-value super-blocks of 6-bit codes, 16 sub-blocks with int8 scales.
    Q6K,
}

/// Values per K-quant super-block.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q8_0 => 32,
            GgmlType::Q4K | GgmlType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4K => 144,
            GgmlType::Q6K => 210,
        }
    }

    /// The ggml name (`f32`, `q4_0`, `q4_k`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4K => "q4_k",
            GgmlType::Q6K => "q6_k",
        }
    }

    /// Bytes of one row of `k` values; an error if `k` is not a whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Result<usize> {
        if k == 0 || !k.is_multiple_of(self.block_len()) {
            return Err(Error::Shape {
                op: "row length",
                what: format!(
                    "{k} values is not a positive multiple of the {}-value {} block",
                    self.block_len(),
                    self.name()
                ),
            });
        }
        mul("row", k / self.block_len(), self.block_bytes())
    }

    /// Bytes of an `n x k` matrix.
    pub fn matrix_bytes(self, n: usize, k: usize) -> Result<usize> {
        mul("matrix", self.row_bytes(k)?, n)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K block.
pub(crate) fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 4-bit code of value `v` (0..256) of a Q4_K block's nibbles (`qs`, 128 bytes).
pub(crate) fn q4k_code(qs: &[u8], v: usize) -> u8 {
    let (chunk, within) = (v / 64, v % 64);
    let b = qs[chunk * 32 + within % 32];
    if within < 32 {
        b & 0x0f
    } else {
        b >> 4
    }
}

/// The 6-bit code (0..64) of value `v` of a Q6_K block (`ql` 128 bytes, `qh` 64 bytes).
pub(crate) fn q6k_code(ql: &[u8], qh: &[u8], v: usize) -> u8 {
    let (half, w) = (v / 128, v % 128);
    let (t, l) = (w / 32, w % 32);
    let ql = &ql[64 * half..];
    let qh = qh[32 * half + l];
    let low = match t {
        0 => ql[l] & 0x0f,
        1 => ql[l + 32] & 0x0f,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    low | (((qh >> (2 * t)) & 3) << 4)
}

/// Dequantize one row: `bytes` holds `out.len()` values of type `ty`.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check_len("row bytes", bytes.len(), ty.row_bytes(out.len())?)?;
    let bl = ty.block_len();
    for (blk, o) in bytes
        .chunks_exact(ty.block_bytes())
        .zip(out.chunks_exact_mut(bl))
    {
        match ty {
            GgmlType::F32 => o[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            GgmlType::F16 => o[0] = f16_at(blk, 0),
            GgmlType::BF16 => o[0] = bf16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32(),
            GgmlType::Q4_0 => {
                let d = f16_at(blk, 0);
                for j in 0..16 {
                    o[j] = ((blk[2 + j] & 0x0f) as f32 - 8.0) * d;
                    o[j + 16] = ((blk[2 + j] >> 4) as f32 - 8.0) * d;
                }
            }
            GgmlType::Q8_0 => {
                let d = f16_at(blk, 0);
                for j in 0..32 {
                    o[j] = blk[2 + j] as i8 as f32 * d;
                }
            }
            GgmlType::Q4K => {
                let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                let (scales, qs) = (&blk[4..16], &blk[16..144]);
                for (v, x) in o.iter_mut().enumerate() {
                    let (sc, m) = q4k_scale_min(v / 32, scales);
                    *x = d * sc as f32 * q4k_code(qs, v) as f32 - dmin * m as f32;
                }
            }
            GgmlType::Q6K => {
                let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
                let d = f16_at(blk, 208);
                for (v, x) in o.iter_mut().enumerate() {
                    *x = d * (sc[v / 16] as i8) as f32 * (q6k_code(ql, qh, v) as i32 - 32) as f32;
                }
            }
        }
    }
    Ok(())
}
