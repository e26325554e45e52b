//! The header of a safetensors file, validated before anything maps or reads the data: every
//! tensor's dtype, shape and byte range, named in each error.
//!
//! The `safetensors` crate checks the same invariants (offsets contiguous from 0, each range as
//! long as its shape and dtype need, the data section exactly covered) but reports them without
//! the tensor's name or the numbers; these checks run first so a malformed file is reported as
//! "tensor `x`: shape [64, 64] of F32 needs 16384 bytes, data_offsets span 100".

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// Largest header accepted (the `safetensors` crate's own limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    /// Name in the file.
    pub name: String,
    /// The dtype as spelled in the header (`F32`, `BF16`, ...).
    pub dtype: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Byte range in the data section.
    pub begin: u64,
    /// One past the last byte.
    pub end: u64,
}

impl TensorMeta {
    /// Elements (the shape's product; checked when the header was parsed).
    pub fn elems(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// Bytes per element of a safetensors dtype name (`None`: sub-byte or unknown types, which no
/// LLaDA/Dream parameter uses).
pub fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" | "C64" => 8,
        _ => return None,
    })
}

/// Read and validate the header of the safetensors file at `path`.
pub fn read_file(path: &Path) -> Result<Vec<TensorMeta>> {
    let (mut f, file_len) = crate::files::open_regular(path, "safetensors")?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| {
        Error::file(
            path,
            "not a safetensors file (shorter than its 8-byte header length)",
        )
    })?;
    let header_len =
        header_len(u64::from_le_bytes(n), file_len).map_err(|r| Error::file(path, r))?;
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header)
        .map_err(|e| Error::file(path, e))?;
    parse(&header, file_len - 8 - header_len).map_err(|r| Error::file(path, r))
}

/// Validate a whole safetensors file held in memory; the error text names no file.
pub fn read_bytes(bytes: &[u8]) -> std::result::Result<Vec<TensorMeta>, String> {
    let n: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or("not a safetensors file (shorter than its 8-byte header length)")?;
    let len = bytes.len() as u64;
    let header_len = header_len(u64::from_le_bytes(n), len)?;
    parse(&bytes[8..8 + header_len as usize], len - 8 - header_len)
}

fn header_len(n: u64, file_len: u64) -> std::result::Result<u64, String> {
    if n > MAX_HEADER_BYTES || n > file_len.saturating_sub(8) {
        return Err(format!(
            "not a safetensors file or truncated (header length {n}, file {file_len} bytes)"
        ));
    }
    Ok(n)
}

/// Validate a header (the JSON bytes) over a data section of `data_len` bytes.
pub fn parse(header: &[u8], data_len: u64) -> std::result::Result<Vec<TensorMeta>, String> {
    let text = std::str::from_utf8(header)
        .map_err(|e| format!("invalid safetensors header: not UTF-8 ({e})"))?;
    let map: serde_json::Map<String, Value> =
        serde_json::from_str(text).map_err(|e| format!("invalid safetensors header: {e}"))?;
    let mut out = Vec::with_capacity(map.len());
    for (name, info) in map {
        if name == "__metadata__" {
            let ok = info
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string));
            if !ok {
                return Err("`__metadata__` must be an object of strings".into());
            }
            continue;
        }
        out.push(tensor(&name, &info, data_len)?);
    }
    // The data section must be covered exactly, tensor after tensor.
    out.sort_by_key(|t| (t.begin, t.end));
    let mut at = 0u64;
    for t in &out {
        if t.begin != at {
            return Err(if t.begin < at {
                format!(
                    "tensor `{}`: data_offsets [{}, {}) overlap the tensor before it (ending at {at})",
                    t.name, t.begin, t.end
                )
            } else {
                format!(
                    "tensor `{}`: data_offsets [{}, {}) leave bytes [{at}, {}) of the data section unused",
                    t.name, t.begin, t.end, t.begin
                )
            });
        }
        at = t.end;
    }
    if at != data_len {
        return Err(format!(
            "the tensors cover {at} bytes of the data section, which has {data_len} (trailing bytes)"
        ));
    }
    Ok(out)
}

fn tensor(name: &str, info: &Value, data_len: u64) -> std::result::Result<TensorMeta, String> {
    let dtype = info
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("tensor `{name}` has no dtype"))?;
    let size = dtype_size(dtype)
        .ok_or_else(|| format!("tensor `{name}` has unsupported dtype `{dtype}`"))?;
    let shape: Vec<usize> = info
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect()
        })
        .ok_or_else(|| format!("tensor `{name}` has no shape (a list of non-negative integers)"))?;
    let offsets = info
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|o| o.len() == 2)
        .and_then(|o| Some((o[0].as_u64()?, o[1].as_u64()?)))
        .ok_or_else(|| format!("tensor `{name}` has no data_offsets [begin, end]"))?;
    let (begin, end) = offsets;
    if begin > end {
        return Err(format!(
            "tensor `{name}`: data_offsets [{begin}, {end}) end before they begin"
        ));
    }
    if end > data_len {
        return Err(format!(
            "truncated: tensor `{name}` ends at byte {end} of the data section, which has only {data_len} bytes"
        ));
    }
    let need = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .and_then(|e| e.checked_mul(size));
    match need {
        Some(n) if n == end - begin => {}
        Some(n) => {
            return Err(format!(
            "tensor `{name}`: shape {shape:?} of {dtype} needs {n} bytes, its data_offsets span {}",
            end - begin
        ))
        }
        None => return Err(format!("tensor `{name}`: shape {shape:?} is too large")),
    }
    Ok(TensorMeta {
        name: name.to_string(),
        dtype: dtype.to_string(),
        shape,
        begin,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(v: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn header_errors_name_the_tensor() {
        let ok = serde_json::json!({
            "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]},
            "__metadata__": {"format": "pt"}
        });
        let t = parse(&hdr(ok), 24).unwrap();
        assert_eq!(
            t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let cases = [
            (
                serde_json::json!({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}),
                12,
                "needs 16 bytes",
            ),
            (
                serde_json::json!({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}),
                6,
                "overlap",
            ),
            (
                serde_json::json!({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}),
                8,
                "unused",
            ),
            (
                serde_json::json!({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}),
                9,
                "trailing",
            ),
            (
                serde_json::json!({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}),
                4,
                "Q9",
            ),
            (
                serde_json::json!({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}),
                4,
                "shape",
            ),
            (
                serde_json::json!({"a": {"dtype": "F32", "shape": [4294967296u64, 4294967296u64, 4], "data_offsets": [0, 4]}}),
                4,
                "too large",
            ),
            (
                serde_json::json!({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}),
                8,
                "end before",
            ),
            (
                serde_json::json!({"__metadata__": {"x": 1}}),
                0,
                "__metadata__",
            ),
        ];
        for (h, len, want) in cases {
            let e = parse(&hdr(h.clone()), len).unwrap_err();
            assert!(e.contains(want), "{h}: {e}");
            if want != "__metadata__" {
                assert!(e.contains('a') || e.contains("trailing"), "{e}");
            }
        }
        assert!(read_bytes(&[1, 0, 0]).is_err());
        assert!(read_bytes(&[255; 16]).is_err());
    }
}
