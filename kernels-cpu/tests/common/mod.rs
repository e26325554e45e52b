//! Test helpers: a PRNG, random ggml blocks, and scalar references written from the ggml
//! format descriptions (independent of the crate's own decoding).

#![allow(dead_code)]

use half::f16;

/// xorshift64*: deterministic test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn byte(&mut self) -> u8 {
        (self.u64() >> 56) as u8
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

fn f16_of(b: &[u8]) -> f64 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64()
}

/// Random blocks of a ggml type (`n` rows of `k`): random codes, small random scales.
pub fn random_blocks(ty: &str, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let (bl, bb) = block_shape(ty);
    let mut out = Vec::with_capacity(n * k / bl * bb);
    for _ in 0..n * k / bl {
        let mut b: Vec<u8> = (0..bb).map(|_| rng.byte()).collect();
        match ty {
            "q4_0" | "q8_0" => b[0..2].copy_from_slice(&f16_bytes(rng.f32() * 0.05)),
            "q4_k" => {
                b[0..2].copy_from_slice(&f16_bytes(rng.f32().abs() * 0.01));
                b[2..4].copy_from_slice(&f16_bytes(rng.f32().abs() * 0.01));
            }
            "q6_k" => b[208..210].copy_from_slice(&f16_bytes(rng.f32() * 0.005)),
            _ => unreachable!(),
        }
        out.extend(b);
    }
    out
}

pub fn block_shape(ty: &str) -> (usize, usize) {
    match ty {
        "q4_0" => (32, 18),
        "q8_0" => (32, 34),
        "q4_k" => (256, 144),
        "q6_k" => (256, 210),
        _ => unreachable!(),
    }
}

/// Dequantize `n x k` blocks, written from the ggml block descriptions.
pub fn dequant(ty: &str, blocks: &[u8], n: usize, k: usize) -> Vec<f64> {
    let (bl, bb) = block_shape(ty);
    let mut w = vec![0f64; n * k];
    for (bi, b) in blocks.chunks(bb).enumerate() {
        let o = &mut w[bi * bl..(bi + 1) * bl];
        match ty {
            "q4_0" => {
                let d = f16_of(&b[0..2]);
                for j in 0..16 {
                    o[j] = ((b[2 + j] & 15) as f64 - 8.0) * d;
                    o[j + 16] = ((b[2 + j] >> 4) as f64 - 8.0) * d;
                }
            }
            "q8_0" => {
                let d = f16_of(&b[0..2]);
                for j in 0..32 {
                    o[j] = b[2 + j] as i8 as f64 * d;
                }
            }
            "q4_k" => {
                let (d, dmin) = (f16_of(&b[0..2]), f16_of(&b[2..4]));
                let s = &b[4..16];
                let q = &b[16..144];
                for j in 0..8 {
                    // 6-bit scale and min of sub-block j (ggml get_scale_min_k4).
                    let (sc, m) = if j < 4 {
                        (s[j] & 63, s[j + 4] & 63)
                    } else {
                        (
                            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
                            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                        )
                    };
                    // Sub-block j: nibbles of bytes 32*(j/2).., low for even j, high for odd.
                    for l in 0..32 {
                        let byte = q[32 * (j / 2) + l];
                        let c = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                        o[32 * j + l] = d * sc as f64 * c as f64 - dmin * m as f64;
                    }
                }
            }
            "q6_k" => {
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_of(&b[208..210]);
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    for l in 0..32 {
                        let q = [
                            (ql[l] & 15) | ((qh[l] & 3) << 4),
                            (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                            (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                        ];
                        for (t, &qv) in q.iter().enumerate() {
                            let v = 128 * half + 32 * t + l;
                            o[v] = d * (sc[v / 16] as i8) as f64 * (qv as i32 - 32) as f64;
                        }
                    }
                }
            }
            _ => unreachable!(),
        }
    }
    w
}

/// What the kernels' activations are after quantization: ggml Q8_0 (per 32, f16 scale) or
/// Q8_K (per 256), dequantized.
pub fn quantized_acts(ty: &str, x: &[f32]) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    if ty == "q4_k" || ty == "q6_k" {
        for b in x.chunks(256) {
            let mut max = 0f32;
            for &v in b {
                if v.abs() > max.abs() {
                    max = v;
                }
            }
            if max == 0.0 {
                out.extend(b.iter().map(|_| 0.0));
                continue;
            }
            let iscale = -127.0 / max;
            let d = 1.0 / iscale;
            for &v in b {
                let q = ((iscale * v).round_ties_even() as i32).min(127);
                out.push(q as f64 * d as f64);
            }
        }
    } else {
        for b in x.chunks(32) {
            let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let dh = f16::from_f32(d).to_f64();
            for &v in b {
                out.push((v * id).round() as f64 * dh);
            }
        }
    }
    out
}

/// `y[m][n] = sum_k a[m][k] w[n][k]` in f64, and the matching `sum |a w|` (error scale).
pub fn matmul_ref(a: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut g) = (0f64, 0f64);
            for t in 0..k {
                let p = a[i * k + t] * w[j * k + t];
                s += p;
                g += p.abs();
            }
            y[i * n + j] = s;
            mag[i * n + j] = g;
        }
    }
    (y, mag)
}

/// Assert `got` matches `want` within `rel` of the magnitude scale.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], mag: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(mag).enumerate() {
        let tol = rel * s + 1e-30;
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w} (tolerance {tol})"
        );
    }
}

pub mod fingerprint;

/// Prints a line to the real stderr, bypassing the test harness's capture, so reports show up
/// in `cargo test` output even without `--nocapture`.
pub fn announce(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}
