//! A GGUF header walked and validated before candle's reader parses it.
//!
//! candle's `gguf_file::Content::read` bounds strings and arrays by the file size, but divides by
//! `general.alignment` unchecked (0 panics), silently falls back to 32 for an alignment of another
//! integer type, keeps the last of two tensors of one name, and neither checks tensor offsets
//! (alignment, overlap, overflow) nor bounds the memory its `Value`s take. This walker reads the
//! same bytes without allocating from any size in the file and rejects, naming the key or tensor:
//!
//! * a bad magic or version, counts or lengths that cannot fit in the rest of the file, values
//!   nested deeper than [`MAX_DEPTH`], more than [`MAX_VALUES`] metadata values in all, a bool
//!   that is neither 0 nor 1, an unknown value type, duplicate keys;
//! * `general.alignment` that is not a `u32`, or 0, or not a power of two (as llama.cpp requires);
//! * tensors with more than 4 dimensions, an unknown type, an element count that overflows or is
//!   not a whole number of blocks, an offset that is not a multiple of the alignment, a byte range
//!   that overflows, ends past the file or overlaps another tensor, a duplicate name.

use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::GgmlDType;

/// Deepest array nesting accepted (llama.cpp writes flat arrays).
pub const MAX_DEPTH: usize = 4;
/// Most metadata values (array elements included) a file may hold: 2^24, over 20 times the
/// vocabulary and merges arrays of the largest tokenizers shipped in GGUF files.
pub const MAX_VALUES: u64 = 1 << 24;
/// Longest key or string value (candle's own limit).
pub const MAX_STRING: u64 = 1 << 30;
/// Default alignment of the tensor data (GGUF spec).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A tensor as declared in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDecl {
    /// Name.
    pub name: String,
    /// Dimensions, innermost first (as stored).
    pub dims: Vec<u64>,
    /// GGML type.
    pub dtype: GgmlDType,
    /// Offset from the start of the tensor data.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: u64,
}

/// What the walk established.
#[derive(Debug, Clone)]
pub struct Header {
    /// Absolute file offset of the tensor data.
    pub data_offset: u64,
    /// The alignment in force.
    pub alignment: u64,
    /// Tensors in file order.
    pub tensors: Vec<TensorDecl>,
}

struct Walker<R> {
    r: R,
    pos: u64,
    len: u64,
    wide: bool,
    values: u64,
}

type Res<T> = std::result::Result<T, String>;

impl<R: Read> Walker<R> {
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Res<[u8; N]> {
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|_| format!("truncated in {what} at byte {}", self.pos))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Res<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Res<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn len_prefix(&mut self, what: &str) -> Res<u64> {
        if self.wide {
            self.u64(what)
        } else {
            Ok(self.u32(what)? as u64)
        }
    }

    fn skip(&mut self, n: u64, what: &str) -> Res<()> {
        if n > self.left() {
            return Err(format!(
                "{what} needs {n} bytes at byte {}, the file has {} left",
                self.pos,
                self.left()
            ));
        }
        let copied = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())
            .map_err(|e| format!("{what}: {e}"))?;
        if copied != n {
            return Err(format!("truncated in {what} at byte {}", self.pos));
        }
        self.pos += n;
        Ok(())
    }

    fn string(&mut self, what: &str) -> Res<String> {
        let n = self.len_prefix(what)?;
        if n > MAX_STRING || n > self.left() {
            return Err(format!(
                "{what}: string of {n} bytes at byte {}, the file has {} left",
                self.pos,
                self.left()
            ));
        }
        let mut v = vec![0u8; n as usize];
        self.r
            .read_exact(&mut v)
            .map_err(|_| format!("truncated in {what} at byte {}", self.pos))?;
        self.pos += n;
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    fn count_value(&mut self, key: &str) -> Res<()> {
        self.values += 1;
        if self.values > MAX_VALUES {
            return Err(format!(
                "metadata `{key}`: more than {MAX_VALUES} metadata values in the file"
            ));
        }
        Ok(())
    }

    /// Walk one value of type `t`; returns it when it is an unsigned integer (for
    /// `general.alignment`).
    fn value(&mut self, key: &str, t: u32, depth: usize) -> Res<Option<(u32, u64)>> {
        self.count_value(key)?;
        let what = format!("metadata `{key}`");
        let fixed = |t: u32| -> Option<u64> {
            Some(match t {
                0 | 1 | 7 => 1,
                2 | 3 => 2,
                4..=6 => 4,
                10..=12 => 8,
                _ => return None,
            })
        };
        match t {
            7 => {
                let [b] = self.bytes::<1>(&what)?;
                if b > 1 {
                    return Err(format!("{what}: bool value {b} is neither 0 nor 1"));
                }
                Ok(None)
            }
            0 => Ok(Some((t, self.bytes::<1>(&what)?[0] as u64))),
            2 => Ok(Some((t, u16::from_le_bytes(self.bytes(&what)?) as u64))),
            4 => Ok(Some((t, self.u32(&what)? as u64))),
            10 => Ok(Some((t, self.u64(&what)?))),
            8 => {
                let n = self.len_prefix(&what)?;
                if n > MAX_STRING {
                    return Err(format!("{what}: string of {n} bytes"));
                }
                self.skip(n, &what)?;
                Ok(None)
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(format!(
                        "{what}: arrays nested deeper than {MAX_DEPTH} levels"
                    ));
                }
                let et = self.u32(&what)?;
                let n = self.len_prefix(&what)?;
                let min = match et {
                    8 => {
                        if self.wide {
                            8
                        } else {
                            4
                        }
                    }
                    9 => 4 + if self.wide { 8 } else { 4 },
                    t => {
                        fixed(t).ok_or_else(|| format!("{what}: unknown array element type {t}"))?
                    }
                };
                if n.saturating_mul(min) > self.left() {
                    return Err(format!(
                        "{what}: array of {n} elements needs at least {} bytes, the file has {} left",
                        n.saturating_mul(min),
                        self.left()
                    ));
                }
                if self.values.saturating_add(n) > MAX_VALUES {
                    return Err(format!(
                        "{what}: array of {n} elements: more than {MAX_VALUES} metadata values in the file"
                    ));
                }
                match fixed(et) {
                    // Fixed-size elements other than bool are skipped in one go.
                    Some(size) if et != 7 => {
                        self.values += n;
                        self.skip(n * size, &what)?;
                    }
                    _ => {
                        for _ in 0..n {
                            self.value(key, et, depth + 1)?;
                        }
                    }
                }
                Ok(None)
            }
            t => match fixed(t) {
                Some(size) => {
                    self.skip(size, &what)?;
                    Ok(None)
                }
                None => Err(format!("{what}: unknown value type {t}")),
            },
        }
    }
}

fn ggml_type(t: u32) -> Option<GgmlDType> {
    Some(match t {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// Walk and validate the header of a GGUF stream of `len` bytes (the reader at its start).
pub fn walk<R: Read + Seek>(mut r: R) -> Res<Header> {
    let len = r.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut w = Walker {
        r: std::io::BufReader::new(r),
        pos: 0,
        len,
        wide: true,
        values: 0,
    };
    let (n_tensors, n_kv) = w.preamble()?;
    let alignment = w.metadata(n_kv)?;
    let tensors = (0..n_tensors)
        .map(|_| w.tensor_decl(alignment))
        .collect::<Res<Vec<_>>>()?;
    let mut names = std::collections::HashSet::new();
    if let Some(t) = tensors.iter().find(|t| !names.insert(t.name.as_str())) {
        return Err(format!("tensor `{}` appears twice", t.name));
    }
    let data_offset = w
        .pos
        .checked_next_multiple_of(alignment)
        .ok_or("the tensor data offset overflows")?;
    check_ranges(&tensors, data_offset, len)?;
    Ok(Header {
        data_offset,
        alignment,
        tensors,
    })
}

/// Every tensor's bytes lie inside the file and no two overlap.
fn check_ranges(tensors: &[TensorDecl], data_offset: u64, len: u64) -> Res<()> {
    let mut ranges: Vec<(u64, u64, &str)> = Vec::with_capacity(tensors.len());
    for t in tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.bytes))
            .filter(|&e| e <= len)
            .ok_or_else(|| {
                format!(
                    "truncated: tensor `{}` ({} bytes at data offset {}) ends past the file's {len} bytes",
                    t.name, t.bytes, t.offset
                )
            })?;
        ranges.push((data_offset + t.offset, end, &t.name));
    }
    ranges.sort();
    for pair in ranges.windows(2) {
        let ((_, end_a, a), (start_b, _, b)) = (pair[0], pair[1]);
        if start_b < end_a {
            return Err(format!("tensor `{b}` overlaps tensor `{a}`"));
        }
    }
    Ok(())
}

impl<R: Read> Walker<R> {
    /// The magic, the version and the two counts, checked against the bytes left.
    fn preamble(&mut self) -> Res<(u64, u64)> {
        let magic = self.bytes::<4>("the magic")?;
        if &magic != b"GGUF" {
            return Err(format!("not a GGUF file (magic {magic:02x?})"));
        }
        let version = self.u32("the version")?;
        self.wide = match version {
            1 => false,
            2 | 3 => true,
            v => return Err(format!("unsupported GGUF version {v} (expected 1, 2 or 3)")),
        };
        let n_tensors = self.len_prefix("the tensor count")?;
        let n_kv = self.len_prefix("the metadata count")?;
        let prefix = if self.wide { 8 } else { 4 };
        let need = n_kv
            .saturating_mul(prefix + 4 + 1)
            .saturating_add(n_tensors.saturating_mul(prefix + 4 + 4 + 8));
        if need > self.left() {
            return Err(format!(
                "the header declares {n_tensors} tensors and {n_kv} metadata entries, which need at least {need} bytes; the file has {} left",
                self.left()
            ));
        }
        Ok((n_tensors, n_kv))
    }

    /// Every metadata entry (unique keys); returns the alignment, a power of two.
    fn metadata(&mut self, n_kv: u64) -> Res<u64> {
        let mut keys = std::collections::HashSet::new();
        let mut alignment = None;
        for _ in 0..n_kv {
            let key = self.string("a metadata key")?;
            let t = self.u32(&format!("the type of metadata `{key}`"))?;
            let v = self.value(&key, t, 0)?;
            if key == "general.alignment" {
                alignment = Some(match v {
                    Some((4, a)) => a,
                    _ => {
                        return Err(format!(
                        "metadata `general.alignment`: type {t} is not u32 (type 4), as GGUF requires"
                    ))
                    }
                });
            }
            if !keys.insert(key.clone()) {
                return Err(format!("metadata `{key}` appears twice"));
            }
        }
        let alignment = alignment.unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(format!(
                "metadata `general.alignment`: {alignment} is not a power of two"
            ));
        }
        Ok(alignment)
    }

    /// One tensor declaration: its dimensions, type, size and aligned offset.
    fn tensor_decl(&mut self, alignment: u64) -> Res<TensorDecl> {
        let name = self.string("a tensor name")?;
        let what = format!("tensor `{name}`");
        let n_dims = self.u32(&what)?;
        if n_dims == 0 || n_dims > 4 {
            return Err(format!("{what}: {n_dims} dimensions (1 to 4 are valid)"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(if self.wide {
                self.u64(&what)?
            } else {
                self.u32(&what)? as u64
            });
        }
        let t = self.u32(&what)?;
        let dtype = ggml_type(t).ok_or_else(|| format!("{what}: unknown GGML type {t}"))?;
        let offset = self.u64(&what)?;
        let elems = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&e| usize::try_from(e).is_ok())
            .ok_or_else(|| format!("{what}: dimensions {dims:?} overflow"))?;
        let block = dtype.block_size() as u64;
        if !dims[0].is_multiple_of(block) {
            return Err(format!(
                "{what}: its rows of {} elements are not a whole number of {dtype:?} blocks of {block}",
                dims[0]
            ));
        }
        let bytes = (elems / block)
            .checked_mul(dtype.type_size() as u64)
            .ok_or_else(|| format!("{what}: dimensions {dims:?} overflow"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(format!(
                "{what}: offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        Ok(TensorDecl {
            name,
            dims,
            dtype,
            offset,
            bytes,
        })
    }
}
