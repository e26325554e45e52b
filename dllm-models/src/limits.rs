//! What the machine can do, checked before a size taken from a file or a flag is used: memory a
//! model or a canvas would need against what the machine has, the longest context accepted, and a
//! scan for non-finite values in weights and logits.
//!
//! Memory is compared against `MemAvailable + SwapFree` from `/proc/meminfo` (memory the kernel can
//! hand out without killing anything). Where that file does not exist the check passes: the
//! structural checks (every size consistent with the checkpoint on disk) still apply.

use candle_core::{DType, Tensor};

use crate::{Error, Result};

/// Longest canvas a config may declare (`max_sequence_length`, `max_position_embeddings`,
/// `context_length`): 2^24 positions, beyond every released model (Qwen2.5-1M has ~2^20).
pub const MAX_SEQ_LEN: usize = 1 << 24;

/// Bytes the kernel can hand out now: `MemAvailable + SwapFree` from `/proc/meminfo`, or `None`
/// where that file does not exist or cannot be parsed.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

/// `MemAvailable + SwapFree` (in bytes) of a `/proc/meminfo` text.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    let avail = field("MemAvailable:")?;
    Some(avail.saturating_add(field("SwapFree:").unwrap_or(0)))
}

/// Error unless `need` bytes for `what` fit in the memory available now.
pub fn check_memory(what: &str, need: u64) -> Result<()> {
    match available_memory() {
        Some(available) => check_memory_against(what, need, available),
        None => Ok(()),
    }
}

/// Error unless `need <= available` (the testable core of [`check_memory`]).
pub fn check_memory_against(what: &str, need: u64, available: u64) -> Result<()> {
    if need > available {
        return Err(Error::TooLarge {
            what: what.to_string(),
            need,
            available,
        });
    }
    Ok(())
}

/// A human-readable byte count (`1.5 GiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Whether every value of a raw little-endian buffer of `dtype` is finite (no NaN or infinity).
/// Types without a float encoding (integers) are always finite.
pub fn raw_is_finite(bytes: &[u8], dtype: DType) -> bool {
    match dtype {
        // An IEEE value is NaN or infinite exactly when its exponent bits are all ones.
        DType::F32 => bytes
            .chunks_exact(4)
            .all(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7F80_0000 != 0x7F80_0000),
        DType::F16 => bytes
            .chunks_exact(2)
            .all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7C00 != 0x7C00),
        DType::BF16 => bytes
            .chunks_exact(2)
            .all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7F80 != 0x7F80),
        DType::F64 => bytes.chunks_exact(8).all(|c| {
            u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                & 0x7FF0_0000_0000_0000
                != 0x7FF0_0000_0000_0000
        }),
        _ => true,
    }
}

/// The first non-finite value of a CPU tensor, as `(flat index, value)`; `None` when all are
/// finite. Reads the storage in place when the tensor is contiguous (no copy).
pub fn first_non_finite(t: &Tensor) -> Result<Option<(usize, f64)>> {
    use candle_core::{CpuStorage, Storage};
    fn scan<T: Copy + Into<f64>>(v: &[T]) -> Option<(usize, f64)> {
        v.iter()
            .map(|&x| x.into())
            .enumerate()
            .find(|(_, x): &(usize, f64)| !x.is_finite())
    }
    let (storage, layout) = t.storage_and_layout();
    if let (Storage::Cpu(cpu), Some((a, b))) = (&*storage, layout.contiguous_offsets()) {
        return Ok(match cpu {
            CpuStorage::F32(v) => scan(&v[a..b]),
            CpuStorage::F64(v) => scan(&v[a..b]),
            CpuStorage::F16(v) => scan(&v[a..b]),
            CpuStorage::BF16(v) => scan(&v[a..b]),
            _ => None,
        });
    }
    drop(storage);
    let v: Vec<f64> = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
    Ok(scan(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_the_memory_check() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2000000 kB\nSwapFree:  48 kB\n";
        assert_eq!(parse_meminfo(text), Some((2_000_000 + 48) * 1024));
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
        let e = check_memory_against("the model's parameters", 3 << 30, 2 << 30).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("the model's parameters") && msg.contains("3.0 GiB"),
            "{msg}"
        );
        check_memory_against("x", 5, 5).unwrap();
    }

    #[test]
    fn finite_scans() {
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert!(raw_is_finite(
            &f(&[0.0, -1.5, f32::MAX, f32::MIN_POSITIVE]),
            DType::F32
        ));
        assert!(!raw_is_finite(&f(&[0.0, f32::NAN]), DType::F32));
        assert!(!raw_is_finite(&f(&[f32::NEG_INFINITY]), DType::F32));
        let h = |v: f32| half::f16::from_f32(v).to_le_bytes().to_vec();
        assert!(raw_is_finite(&h(65504.0), DType::F16));
        assert!(!raw_is_finite(&h(f32::INFINITY), DType::F16));
        let b = |v: f32| half::bf16::from_f32(v).to_le_bytes().to_vec();
        assert!(raw_is_finite(&b(3e38), DType::BF16));
        assert!(!raw_is_finite(&b(f32::NAN), DType::BF16));
        let t = Tensor::new(&[1f32, 2.0, f32::NAN], &candle_core::Device::Cpu).unwrap();
        assert_eq!(first_non_finite(&t).unwrap().map(|p| p.0), Some(2));
        let t = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &candle_core::Device::Cpu).unwrap();
        assert_eq!(first_non_finite(&t.t().unwrap()).unwrap(), None);
    }
}
