//! Straightforward reference implementations the kernels are compared against: the tile layouts
//! written from their definition (REFERENCE §5), ggml's Q4_0 format, the Q8_0 integer rounding
//! rule, and f64 math for the float ops.

use super::{ceil32, f16_bits, f16_val};

// ---------------------------------------------------------------- layouts

/// Activation tiles of row-major f16 A[m][k]: element (m, k) at byte (m/2)*128 + k*4 + (m%2)*2
/// of tile (m/32, k/32), tiles ordered row tile major, K tiles consecutive; zero padding.
pub fn act_tiles(a: &[u16], m: usize, k: usize) -> Vec<u8> {
    let (mt, kt) = (ceil32(m), ceil32(k));
    let mut out = vec![0u8; mt * kt * 2048];
    for i in 0..m {
        for j in 0..k {
            let t = (i / 32) * kt + j / 32;
            let (r, c) = (i % 32, j % 32);
            let byte = t * 2048 + (r / 2) * 128 + c * 4 + (r % 2) * 2;
            out[byte..byte + 2].copy_from_slice(&a[i * k + j].to_le_bytes());
        }
    }
    out
}

/// Weight tiles of row-major f16 W[n][k] (out x in): element (k, n) at byte
/// (k/2)*128 + n*4 + (k%2)*2 of tile (n/32, k/32), tile index (n/32)*KT + k/32; zero padding.
pub fn weight_tiles(w: &[u16], n: usize, k: usize) -> Vec<u8> {
    let (nt, kt) = (ceil32(n), ceil32(k));
    let mut out = vec![0u8; nt * kt * 2048];
    for i in 0..n {
        for j in 0..k {
            let t = (i / 32) * kt + j / 32;
            let (nn, kk) = (i % 32, j % 32);
            let byte = t * 2048 + (kk / 2) * 128 + nn * 4 + (kk % 2) * 2;
            out[byte..byte + 2].copy_from_slice(&w[i * k + j].to_le_bytes());
        }
    }
    out
}

/// Q4_0 tiles from codes c[n][k] (0..15) and one f16 scale per (row, 32-block): nibbles of all
/// tiles first, then the scales; byte p*128 + r*4 + i = c(r, 8p+i) | c(r, 8p+4+i) << 4.
/// Padding rows/columns get code 8 and scale 0.
pub fn q4_tiles(codes: &[u8], scales: &[u16], n: usize, k: usize) -> Vec<u8> {
    let (nt, kt) = (ceil32(n), ceil32(k));
    let tiles = nt * kt;
    let mut out = vec![0u8; tiles * 576];
    let code = |r: usize, c: usize| if r < n && c < k { codes[r * k + c] } else { 8 };
    for t_n in 0..nt {
        for t_k in 0..kt {
            let t = t_n * kt + t_k;
            for r in 0..32 {
                for p in 0..4 {
                    for i in 0..4 {
                        let (row, c0) = (t_n * 32 + r, t_k * 32);
                        let lo = code(row, c0 + 8 * p + i);
                        let hi = code(row, c0 + 8 * p + 4 + i);
                        out[t * 512 + p * 128 + r * 4 + i] = lo | (hi << 4);
                    }
                }
                let d = if t_n * 32 + r < n {
                    scales[(t_n * 32 + r) * kt + t_k]
                } else {
                    0
                };
                let at = tiles * 512 + t * 64 + 2 * r;
                out[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
    }
    out
}

/// ggml quantize_row_q4_0_ref: per block, d = max / -8 (max = the value of largest |x|),
/// q = min(15, trunc(x / d + 8.5)); block = f16 d + 16 bytes (j low, j+16 high).
pub fn ggml_q4_0(x: &[f32]) -> Vec<u8> {
    assert_eq!(x.len() % 32, 0);
    let mut out = Vec::with_capacity(x.len() / 32 * 18);
    for blk in x.chunks(32) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in blk {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16_bits(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as i32).min(15) as u8;
        for j in 0..16 {
            out.push(q(blk[j]) | (q(blk[j + 16]) << 4));
        }
    }
    out
}

/// Dequantizes ggml Q4_0 blocks: x[j] = ((qs[j] & 15) - 8) * d, x[j+16] = ((qs[j] >> 4) - 8) * d.
pub fn ggml_q4_0_dequant(blocks: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(blocks.len() / 18 * 32);
    for b in blocks.chunks(18) {
        let d = f16_val(u16::from_le_bytes([b[0], b[1]]));
        let mut v = [0.0f32; 32];
        for j in 0..16 {
            v[j] = ((b[2 + j] & 15) as i32 - 8) as f32 * d;
            v[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
        }
        out.extend_from_slice(&v);
    }
    out
}

// ---------------------------------------------------------------- Q8_0 rule

/// The Q8_0 integer rounding rule of quant_kernels.h, written independently.
pub fn q8_0_block(x: &[f32]) -> (u16, [i8; 32]) {
    let bits: Vec<u32> = (0..32)
        .map(|i| x.get(i).map_or(0, |v| v.to_bits()))
        .collect();
    let amax = bits.iter().map(|b| b & 0x7fff_ffff).max().unwrap();
    let mut q = [0i8; 32];
    if amax >= 0x7f80_0000 {
        return (0x7e00, q);
    }
    if amax < 0x0080_0000 {
        return (0, q);
    }
    let a16 = ((amax & 0x7f_ffff) | 0x80_0000) >> 8;
    let mult = ((127u32 << 23) + a16 / 2) / a16;
    let ea = (amax >> 23) as i32;
    for (i, b) in bits.iter().enumerate() {
        let a = b & 0x7fff_ffff;
        let e = (a >> 23) as i32;
        if e == 0 {
            continue;
        }
        let s = (ea - e).min(31) as u32;
        let fixed = ((a & 0x7f_ffff) | 0x80_0000) >> s;
        let mag = (((fixed >> 8) * mult + (1 << 22)) >> 23) as i32;
        q[i] = if b >> 31 == 1 { -mag } else { mag } as i8;
    }
    (f16_bits(f32::from_bits(amax) / 127.0), q)
}

/// Rows of f32 -> ggml block_q8_0 bytes (k % 32 == 0).
pub fn q8_0_rows(x: &[f32], rows: usize, k: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for r in 0..rows {
        for b in 0..k / 32 {
            let (d, q) = q8_0_block(&x[r * k + 32 * b..r * k + 32 * b + 32]);
            out.extend_from_slice(&d.to_le_bytes());
            out.extend(q.iter().map(|&v| v as u8));
        }
    }
    out
}

// ---------------------------------------------------------------- matmuls

/// out[m][n] = sum_k a[m][k] * w[n][k] in f64, plus sum_k |a w| (for error bounds).
pub fn matmul_f64(a: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut g) = (0.0f64, 0.0f64);
            for l in 0..k {
                let p = a[i * k + l] as f64 * w[j * k + l] as f64;
                s += p;
                g += p.abs();
            }
            out[i * n + j] = s;
            mag[i * n + j] = g;
        }
    }
    (out, mag)
}

/// What the Q4_0 kernel computes, in its exact order: per K block, sumi = sum (c - 8) * q_a,
/// acc += (sumi as f32) * (d_w * d_a). `qa` holds the activation int8 codes [m][KT*32] (zero
/// padded) and `da` the fp16 scales [m][KT].
pub fn q4_matmul_exact(
    codes: &[u8],
    scales: &[u16],
    qa: &[i8],
    da: &[u16],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let kt = ceil32(k);
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for b in 0..kt {
                let mut sumi = 0i32;
                for l in 0..32 {
                    let c = if 32 * b + l < k {
                        codes[j * k + 32 * b + l]
                    } else {
                        8
                    } as i32;
                    sumi += (c - 8) * qa[i * kt * 32 + 32 * b + l] as i32;
                }
                let dw = f16_val(scales[j * kt + b]);
                let d = f16_val(da[i * kt + b]);
                acc += sumi as f32 * (dw * d);
            }
            out[i * n + j] = acc;
        }
    }
    out
}

// ---------------------------------------------------------------- attention and friends

/// Naive softmax(scale * q k^T + mask) v in f64. q: [tq][hq][d], k/v: [tk][hkv][d],
/// mask: [mh][tq][tk] with mh in {1, hq}. Rows with no finite score give zeros.
#[allow(clippy::too_many_arguments)]
pub fn attention_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<(&[f32], usize)>,
    d: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    scale: f32,
) -> Vec<f64> {
    let g = hq / hkv;
    let mut out = vec![0.0f64; tq * hq * d];
    for t in 0..tq {
        for h in 0..hq {
            let kh = h / g;
            let mut s = vec![f64::NEG_INFINITY; tk];
            for (j, sj) in s.iter_mut().enumerate() {
                let mut dot = 0.0f64;
                for x in 0..d {
                    dot += q[(t * hq + h) * d + x] as f64 * k[(j * hkv + kh) * d + x] as f64;
                }
                let mut val = dot * scale as f64;
                if let Some((mk, mh)) = mask {
                    let hh = if mh == 1 { 0 } else { h };
                    val += mk[(hh * tq + t) * tk + j] as f64;
                }
                *sj = val;
            }
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let p: Vec<f64> = s.iter().map(|&x| (x - mx).exp()).collect();
            let l: f64 = p.iter().sum();
            for x in 0..d {
                let mut o = 0.0;
                for j in 0..tk {
                    o += p[j] * v[(j * hkv + kh) * d + x] as f64;
                }
                out[(t * hq + h) * d + x] = o / l;
            }
        }
    }
    out
}

/// x * rsqrt(mean(x^2) + eps) * w per row of n, in f64.
pub fn rms_norm_f64(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let r = 1.0 / (ms + eps as f64).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &wv)| v as f64 * r * wv as f64)
                .collect::<Vec<_>>()
        })
        .collect()
}

pub fn silu_f64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// NeoX RoPE with tables: x [t][h][d], cos/sin [p][d/2].
pub fn rope_f64(x: &[f32], pos: &[i32], cos: &[f32], sin: &[f32], d: usize, h: usize) -> Vec<f64> {
    let half = d / 2;
    let mut out = vec![0.0; x.len()];
    for (t, &p) in pos.iter().enumerate() {
        for hh in 0..h {
            let base = (t * h + hh) * d;
            for i in 0..half {
                let (c, s) = (
                    cos[p as usize * half + i] as f64,
                    sin[p as usize * half + i] as f64,
                );
                let (x0, x1) = (x[base + i] as f64, x[base + i + half] as f64);
                out[base + i] = x0 * c - x1 * s;
                out[base + i + half] = x1 * c + x0 * s;
            }
        }
    }
    out
}

/// Largest |got - want| / (atol + rtol * |want|); <= 1 means within tolerance.
pub fn worst_ratio(got: &[f32], want: &[f64], atol: f64, rtol: f64) -> (f64, usize) {
    assert_eq!(got.len(), want.len());
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let r = if g.is_nan() || w.is_nan() {
            if g.is_nan() && w.is_nan() {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (g as f64 - w).abs() / (atol + rtol * w.abs())
        };
        if r > worst.0 {
            worst = (r, i);
        }
    }
    worst
}
