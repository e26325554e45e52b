//! Weight layouts the NPU kernels consume, converted once at load time, and their exact inverses.
//!
//! - fp16 HMX weight tiles (`KDSP_LAYOUT_HMX_WEIGHT_TILES`), logical `W[N][K]`: 32x32 tiles of
//!   2048 B, tile `(nt, kt)` at `(nt * KT + kt) * 2048`; inside, element `(k, n)` at byte
//!   `(k/2)*128 + n*4 + (k%2)*2` (K pairs interleaved by halfword); padding +0.0.
//! - Q4_0 tiles (`KDSP_LAYOUT_Q4_0_TILES`): `T = NT*KT` nibble tiles of 512 B (byte
//!   `p*128 + r*4 + i` = `c(r, 8p+i) | c(r, 8p+4+i) << 4`), then `T` scale tiles of 32 fp16 `d`;
//!   padding code 8, scale +0.0. Same 576 B per 32x32 weights as ggml's `block_q4_0`.
//!
//! Packing is done here in Rust (so a model loads without a DSP round trip per tensor); the
//! kernels' own `PACK_WEIGHT_F16` / `PACK_Q4_0` ops produce byte-identical output (tested), and
//! `unpack_*` invert the packing exactly, which the CPU fallback of a packed layer relies on.

use half::f16;

use crate::error::{Error, InputProblem, Result};
use crate::kinds::WeightFormat;

const TILE: usize = 32;
/// Bytes of one fp16 tile.
pub const F16_TILE_BYTES: usize = 2048;
/// Bytes of a Q4_0 tile's nibbles.
pub const Q4_NIBBLE_BYTES: usize = 512;
/// Bytes of a Q4_0 tile's scales.
pub const Q4_SCALE_BYTES: usize = 64;
/// Bytes of one ggml `block_q4_0` (fp16 d + 16 bytes of nibbles).
pub const Q4_0_BLOCK_BYTES: usize = 18;

fn tiles(n: usize) -> usize {
    n.div_ceil(TILE)
}

/// Packed size of fp16 weight tiles for `W[n][k]`.
pub fn f16_tiles_len(n: usize, k: usize) -> usize {
    tiles(n) * tiles(k) * F16_TILE_BYTES
}

/// Packed size of Q4_0 tiles for `W[n][k]`.
pub fn q4_0_tiles_len(n: usize, k: usize) -> usize {
    tiles(n) * tiles(k) * (Q4_NIBBLE_BYTES + Q4_SCALE_BYTES)
}

/// Packed size of a weight in `format`.
pub fn packed_len(format: &WeightFormat, n: usize, k: usize) -> usize {
    match format {
        WeightFormat::Q4_0 => q4_0_tiles_len(n, k),
        _ => f16_tiles_len(n, k),
    }
}

#[inline]
fn wt_halfword(k: usize, n: usize) -> usize {
    (k / 2) * 64 + n * 2 + (k % 2)
}

/// Pack row-major `w` (`n` rows of `k`, already fp16) into `dst` (`f16_tiles_len` bytes, every
/// byte written, padding included).
pub fn pack_f16_tiles_into(dst: &mut [u8], w: &[f16], n: usize, k: usize) -> Result<()> {
    check_len("fp16 weights", w.len(), n * k)?;
    check_len("fp16 tile buffer", dst.len(), f16_tiles_len(n, k))?;
    let (nt_n, kt_n) = (tiles(n), tiles(k));
    for nt in 0..nt_n {
        for kt in 0..kt_n {
            let tile = &mut dst[(nt * kt_n + kt) * F16_TILE_BYTES..][..F16_TILE_BYTES];
            for nn in 0..TILE {
                let row = nt * TILE + nn;
                for kk in 0..TILE {
                    let col = kt * TILE + kk;
                    let h = if row < n && col < k {
                        w[row * k + col].to_bits()
                    } else {
                        0
                    };
                    let at = 2 * wt_halfword(kk, nn);
                    tile[at..at + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
    Ok(())
}

/// [`pack_f16_tiles_into`] into a new vector.
pub fn pack_f16_tiles(w: &[f16], n: usize, k: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; f16_tiles_len(n, k)];
    pack_f16_tiles_into(&mut v, w, n, k)?;
    Ok(v)
}

/// The exact inverse of [`pack_f16_tiles`]: row-major `n x k` fp16.
pub fn unpack_f16_tiles(t: &[u8], n: usize, k: usize) -> Result<Vec<f16>> {
    check_len("fp16 tile buffer", t.len(), f16_tiles_len(n, k))?;
    let kt_n = tiles(k);
    let mut w = vec![f16::ZERO; n * k];
    for row in 0..n {
        for col in 0..k {
            let tile = (row / TILE) * kt_n + col / TILE;
            let at = tile * F16_TILE_BYTES + 2 * wt_halfword(col % TILE, row % TILE);
            w[row * k + col] = f16::from_bits(u16::from_le_bytes([t[at], t[at + 1]]));
        }
    }
    Ok(w)
}

/// Repack ggml `block_q4_0` rows (`n` rows of `k / 32` blocks, `k % 32 == 0`) into Q4_0 tiles in
/// `dst` (`q4_0_tiles_len` bytes, every byte written).
pub fn pack_q4_0_tiles_into(dst: &mut [u8], blocks: &[u8], n: usize, k: usize) -> Result<()> {
    if !k.is_multiple_of(TILE) {
        return Err(Error::input("pack_q4_0", not_q4_0_blocks(k)));
    }
    let kb = k / TILE;
    check_len("Q4_0 blocks", blocks.len(), n * kb * Q4_0_BLOCK_BYTES)?;
    check_len("Q4_0 tile buffer", dst.len(), q4_0_tiles_len(n, k))?;
    let (nt_n, kt_n) = (tiles(n), kb);
    let t_count = nt_n * kt_n;
    let (nibbles, scales) = dst.split_at_mut(t_count * Q4_NIBBLE_BYTES);
    for nt in 0..nt_n {
        for kt in 0..kt_n {
            let t = nt * kt_n + kt;
            let nib = &mut nibbles[t * Q4_NIBBLE_BYTES..][..Q4_NIBBLE_BYTES];
            let sc = &mut scales[t * Q4_SCALE_BYTES..][..Q4_SCALE_BYTES];
            for r in 0..TILE {
                let row = nt * TILE + r;
                let mut codes = [8u8; TILE];
                let mut d = [0u8; 2];
                if row < n {
                    let blk = &blocks[(row * kb + kt) * Q4_0_BLOCK_BYTES..][..Q4_0_BLOCK_BYTES];
                    d = [blk[0], blk[1]];
                    for j in 0..16 {
                        codes[j] = blk[2 + j] & 0x0f;
                        codes[j + 16] = blk[2 + j] >> 4;
                    }
                }
                sc[2 * r..2 * r + 2].copy_from_slice(&d);
                for p in 0..4 {
                    for i in 0..4 {
                        nib[p * 128 + r * 4 + i] = codes[8 * p + i] | (codes[8 * p + 4 + i] << 4);
                    }
                }
            }
        }
    }
    Ok(())
}

/// [`pack_q4_0_tiles_into`] into a new vector.
pub fn pack_q4_0_tiles(blocks: &[u8], n: usize, k: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; q4_0_tiles_len(n, k)];
    pack_q4_0_tiles_into(&mut v, blocks, n, k)?;
    Ok(v)
}

/// The exact inverse of [`pack_q4_0_tiles`]: ggml `block_q4_0` rows, bit for bit.
pub fn unpack_q4_0_tiles(t: &[u8], n: usize, k: usize) -> Result<Vec<u8>> {
    if !k.is_multiple_of(TILE) {
        return Err(Error::input("unpack_q4_0", not_q4_0_blocks(k)));
    }
    check_len("Q4_0 tile buffer", t.len(), q4_0_tiles_len(n, k))?;
    let kb = k / TILE;
    let t_count = tiles(n) * kb;
    let mut out = vec![0u8; n * kb * Q4_0_BLOCK_BYTES];
    for row in 0..n {
        let (nt, r) = (row / TILE, row % TILE);
        for kt in 0..kb {
            let tile = nt * kb + kt;
            let nib = &t[tile * Q4_NIBBLE_BYTES..][..Q4_NIBBLE_BYTES];
            let sc = &t[t_count * Q4_NIBBLE_BYTES + tile * Q4_SCALE_BYTES..][..Q4_SCALE_BYTES];
            let mut codes = [0u8; TILE];
            for p in 0..4 {
                for i in 0..4 {
                    let b = nib[p * 128 + r * 4 + i];
                    codes[8 * p + i] = b & 0x0f;
                    codes[8 * p + 4 + i] = b >> 4;
                }
            }
            let blk = &mut out[(row * kb + kt) * Q4_0_BLOCK_BYTES..][..Q4_0_BLOCK_BYTES];
            blk[0..2].copy_from_slice(&sc[2 * r..2 * r + 2]);
            for j in 0..16 {
                blk[2 + j] = codes[j] | (codes[j + 16] << 4);
            }
        }
    }
    Ok(out)
}

fn not_q4_0_blocks(k: usize) -> InputProblem {
    InputProblem::NotMultiple {
        what: "k",
        value: k as u64,
        multiple: TILE as u64,
        unit: "value Q4_0 block",
    }
}

fn check_len(what: &'static str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::input(
            "layout",
            InputProblem::Len {
                what,
                expected: want,
                found: got,
            },
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn f16_tiles_round_trip_bit_exactly_and_follow_the_documented_layout() {
        let mut s = 1u64;
        for &(n, k) in &[(1, 1), (32, 32), (33, 31), (70, 100), (5, 64)] {
            // Random bit patterns, NaNs and negative zeros included: the layout moves bits.
            let w: Vec<f16> = (0..n * k)
                .map(|_| f16::from_bits(lcg(&mut s) as u16))
                .collect();
            let t = pack_f16_tiles(&w, n, k).unwrap();
            assert_eq!(t.len(), n.div_ceil(32) * k.div_ceil(32) * 2048);
            let back = unpack_f16_tiles(&t, n, k).unwrap();
            assert!(w.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
            // Spot-check the header formula: element (k=3, n=2) of tile 0 at (3/2)*128 + 2*4 + 2.
            if n > 2 && k > 3 {
                let at = 128 + 8 + 2;
                assert_eq!(
                    u16::from_le_bytes([t[at], t[at + 1]]),
                    w[2 * k + 3].to_bits()
                );
            }
            // Padding is +0.0.
            if k % 32 != 0 {
                let kk = k % 32; // first padded column of the last K tile
                let tile = k / 32;
                let at = tile * 2048 + 2 * wt_halfword(kk, 0);
                assert_eq!(u16::from_le_bytes([t[at], t[at + 1]]), 0);
            }
        }
    }

    #[test]
    fn q4_0_tiles_round_trip_bit_exactly() {
        let mut s = 7u64;
        for &(n, k) in &[(1, 32), (32, 32), (33, 64), (70, 96)] {
            let blocks: Vec<u8> = (0..n * k / 32 * 18).map(|_| lcg(&mut s) as u8).collect();
            let t = pack_q4_0_tiles(&blocks, n, k).unwrap();
            assert_eq!(t.len(), n.div_ceil(32) * (k / 32) * 576);
            assert_eq!(unpack_q4_0_tiles(&t, n, k).unwrap(), blocks);
            // Padding rows are code 8 (0x88) with scale +0.
            if n % 32 != 0 {
                let r = n % 32;
                let last = (n / 32) * (k / 32);
                assert_eq!(t[last * 512 + r * 4], 0x88);
                let t_count = n.div_ceil(32) * (k / 32);
                let at = t_count * 512 + last * 64 + 2 * r;
                assert_eq!(&t[at..at + 2], &[0, 0]);
            }
        }
        assert!(pack_q4_0_tiles(&[0; 18], 1, 31).is_err());
        assert!(pack_q4_0_tiles(&[0; 17], 1, 32).is_err());
    }
}
