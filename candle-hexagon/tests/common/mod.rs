//! Shared test helpers: deterministic inputs, error metrics, device constructors.
#![allow(dead_code)]

pub mod block_ref;
pub mod llama_program;

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use candle_hexagon::{DeviceKv, HexagonConfig, HexagonDevice};

/// Make the K/V of positions `range` cached rows, as a model crate's cache protocol does after a
/// forward of the window starting at position `ws` whose rows went to `[base, ..)` (the cache
/// length then): a move of the rows when they are not already in place, then the new length.
pub fn commit_rows(
    kv: &mut DeviceKv,
    (ws, base): (usize, usize),
    range: Range<usize>,
) -> candle_hexagon::Result<()> {
    kv.move_rows(base + (range.start - ws), range.start, range.len())?;
    kv.set_len(kv.len().max(range.end))
}

/// Uniform values in [-1, 1) from a fixed SplitMix64 stream (hermetic, version independent).
pub fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A tensor of `shape` with values `scale * uniform` in `dtype`.
pub fn tensor(shape: &[usize], seed: u64, scale: f32, dtype: DType) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f32> = uniform(n, seed).into_iter().map(|x| x * scale).collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// The values of a tensor as f64.
pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Normalised mean squared error `sum (a - b)^2 / sum b^2`.
pub fn nmse(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let (a, b) = (values(a), values(b));
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// Largest absolute difference.
pub fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (values(a), values(b));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// True when both tensors hold the same bits (compared as f64 values of the same dtype).
pub fn identical(a: &Tensor, b: &Tensor) -> bool {
    a.dims() == b.dims() && a.dtype() == b.dtype() && values(a) == values(b)
}

/// An emulated device with small defaults (2 workers, 256 MiB window) so tests stay light.
pub fn emulated() -> HexagonDevice {
    HexagonDevice::open(HexagonConfig {
        va_window_bytes: 256 << 20,
        weight_chunk_bytes: 4 << 20,
        ..Default::default()
    })
    .unwrap()
}
