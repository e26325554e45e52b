//! llama.cpp GGUF checkpoints of LLaDA (`general.architecture = "llada"`) and Dream (`"dream"`).
//!
//! Matrices keep their GGUF type (quantized blocks, and F16/BF16 half in memory) and are packed
//! once for the kernels-cpu GEMMs by [`crate::linear`] (types it has no kernel for go through
//! candle's `QMatMul`; embeddings are gathered row by row); the 1-D norms and biases become dense
//! tensors in the compute dtype. For inference on the CPU, dense matrices (F32 of an f32 model,
//! F16/BF16) are streamed from the file into their packed tiles a megabyte of rows at a time
//! ([`WeightSource::get_packed`]), so a load's peak memory is the packed weights plus one read
//! buffer; quantized ones are read whole, one at a time, and repacked.
//! llama.cpp's converter permutes LLaDA's q/k rows for its interleaved RoPE; the loader undoes that
//! permutation on the raw rows so the same rotate-half code serves both sources.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device};
use memmap2::Mmap;

use crate::config::{ConfigNames, TransformerConfig};
use crate::gguf_raw::RawMatrix;
use crate::layers::{CpuLinear, Param};
use crate::lm::{Arch, SpecialTokens};
use crate::role::Role;
use crate::weights::WeightSource;
use crate::{Error, Result};
use kernels_cpu::{DenseMatrix, DenseType};

/// Bytes read at a time when a matrix is streamed from the file into packed tiles.
const STREAM_CHUNK_BYTES: usize = 1 << 20;

/// LLaDA-8B's `[MASK]` id, used only when a GGUF of that exact vocabulary lacks the metadata key.
pub const LLADA_8B_MASK_ID: u32 = 126336;
/// Dream-7B's `[MASK]` id, used only when a GGUF of that exact vocabulary lacks the metadata key.
pub const DREAM_7B_MASK_ID: u32 = 151666;

/// An open GGUF file.
pub struct GgufWeights {
    path: PathBuf,
    content: Content,
    reader: Mutex<BufReader<File>>,
    /// The file mapped read-only: quantized matrices are packed from it in place.
    map: Mmap,
    arch: Arch,
    num_heads: usize,
    num_kv_heads: usize,
    dtype: DType,
    device: Device,
    /// Hand F16/BF16 matrices over half (as `Param::Quant`) instead of converting them.
    keep_half: bool,
}

fn meta_int(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(*x as u64),
        Value::U16(x) => Some(*x as u64),
        Value::U32(x) => Some(*x as u64),
        Value::U64(x) => Some(*x),
        Value::I8(x) if *x >= 0 => Some(*x as u64),
        Value::I16(x) if *x >= 0 => Some(*x as u64),
        Value::I32(x) if *x >= 0 => Some(*x as u64),
        Value::I64(x) if *x >= 0 => Some(*x as u64),
        _ => None,
    }
}

fn meta_float(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        v => meta_int(v).map(|x| x as f64),
    }
}

struct Meta<'a> {
    md: &'a HashMap<String, Value>,
}

impl Meta<'_> {
    fn int(&self, key: &str) -> Result<Option<u64>> {
        match self.md.get(key) {
            None => Ok(None),
            Some(v) => meta_int(v).map(Some).ok_or_else(|| {
                Error::invalid(key, format!("expected a non-negative integer, found {v:?}"))
            }),
        }
    }
    fn req_usize(&self, key: &str) -> Result<usize> {
        self.int(key)?
            .map(|v| v as usize)
            .ok_or_else(|| Error::MissingField { field: key.into() })
    }
    fn float(&self, key: &str) -> Result<f64> {
        match self.md.get(key) {
            None => Err(Error::MissingField { field: key.into() }),
            Some(v) => meta_float(v)
                .ok_or_else(|| Error::invalid(key, format!("expected a number, found {v:?}"))),
        }
    }
    fn token(&self, key: &str) -> Result<Option<u32>> {
        self.int(key)?
            .map(|v| {
                u32::try_from(v)
                    .map_err(|_| Error::invalid(key, format!("{v} does not fit a 32-bit token id")))
            })
            .transpose()
    }
}

impl GgufWeights {
    /// Open `path`, validate its header ([`crate::gguf_check`]), read its metadata into a config,
    /// and keep the file for tensor reads.
    pub fn open(path: &Path, dtype: DType, device: &Device) -> Result<(TransformerConfig, Self)> {
        let (reader, content) = read_content(path)?;
        let cfg = config_from_metadata(&content).map_err(|e| match e {
            e @ (Error::MissingField { .. } | Error::InvalidField { .. }) => Error::file(path, e),
            e => e,
        })?;
        let map = crate::gguf_raw::map_file(reader.get_ref(), path)?;
        let w = Self {
            map,
            path: path.to_path_buf(),
            arch: cfg.arch,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            content,
            reader: Mutex::new(reader),
            dtype,
            device: device.clone(),
            keep_half: true,
        };
        Ok((cfg, w))
    }

    /// Whether F16/BF16 matrices stay half in memory (the default, for the packed CPU kernels)
    /// or are converted to the compute dtype (training, and candle's CPU path).
    pub fn keep_half_matrices(mut self, keep: bool) -> Self {
        self.keep_half = keep;
        self
    }

    /// The file's metadata (key-value pairs), e.g. for
    /// [`crate::gguf_tokenizer::tokenizer_from_metadata`].
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// The matrix of `role` in place (see [`crate::gguf_raw`]), checked against `shape`, with
    /// LLaDA's q/k rows put back in order.
    fn raw(&self, role: Role, shape: &[usize]) -> Result<RawMatrix<'_>> {
        let name = role.gguf_name();
        let info = self
            .content
            .tensor_infos
            .get(&name)
            .ok_or_else(|| Error::MissingTensor {
                name: name.clone(),
                source_desc: self.path.display().to_string(),
            })?;
        if info.shape.dims() != shape || shape.len() != 2 {
            return Err(Error::TensorShape {
                name,
                expected: shape.to_vec(),
                got: info.shape.dims().to_vec(),
            });
        }
        let dt = info.ggml_dtype;
        let len = shape[0] * shape[1] / dt.block_size() * dt.type_size();
        // In range: `gguf_check::walk` checked every tensor's range against the file at open.
        let at = self.content.tensor_data_offset as usize + info.offset as usize;
        let heads = match (self.arch, role) {
            (Arch::Llada, Role::Q(_)) => Some(self.num_heads),
            (Arch::Llada, Role::K(_)) => Some(self.num_kv_heads),
            _ => None,
        };
        let hd = heads.map(|h| check_head_split(shape[0], h)).transpose()?;
        let order = hd.map(|hd| move |r: usize| gguf_row_of(r, hd));
        let m = RawMatrix::new(
            &self.map,
            at..at + len,
            dt,
            (shape[0], shape[1]),
            order.as_ref().map(|f| f as &dyn Fn(usize) -> usize),
        );
        if let Some(bad) = m.non_finite() {
            return Err(Error::NonFinite {
                what: format!("tensor `{name}` of {}", self.path.display()),
                detail: bad,
            });
        }
        Ok(m)
    }

    fn read(&self, name: &str) -> Result<QTensor> {
        let mut r = self
            .reader
            .lock()
            .map_err(|_| Error::file(&self.path, "an earlier read of this file panicked"))?;
        self.content
            .tensor(&mut *r, name, &Device::Cpu)
            .map_err(|e| Error::file(&self.path, format!("tensor `{name}`: {e}")))
    }
}

/// Open `path` as a GGUF file: a regular file whose header [`crate::gguf_check`] validates
/// (every size checked before candle's reader parses it, and the tensor ranges against the
/// file), then its metadata and tensor table as candle reads them, and the reader.
pub(crate) fn read_content(path: &Path) -> Result<(BufReader<File>, Content)> {
    let (file, _) = crate::files::open_regular(path, "GGUF")?;
    let header = crate::gguf_check::walk(&file)
        .map_err(|e| Error::file(path, format!("not a valid GGUF file: {e}")))?;
    let mut reader = BufReader::new(file);
    reader
        .seek(std::io::SeekFrom::Start(0))
        .map_err(|e| Error::file(path, e))?;
    let content = Content::read(&mut reader)
        .map_err(|e| Error::file(path, format!("not a readable GGUF file: {e}")))?;
    if content.tensor_data_offset != header.data_offset {
        return Err(Error::file(
            path,
            format!(
                "the tensor data starts at byte {} by the GGUF rules, the reader found {}",
                header.data_offset, content.tensor_data_offset
            ),
        ));
    }
    Ok((reader, content))
}

/// Build a config from GGUF metadata (`{arch}.*` keys as written by llama.cpp's converter).
pub fn config_from_metadata(content: &Content) -> Result<TransformerConfig> {
    let m = Meta {
        md: &content.metadata,
    };
    let (arch, arch_name) = architecture(content)?;
    let k = |s: &str| format!("{arch_name}.{s}");
    let heads = m.req_usize(&k("attention.head_count"))?;
    let embd_rows = content
        .tensor_infos
        .get("token_embd.weight")
        .map(|t| t.shape.dims()[0])
        .ok_or_else(|| Error::MissingTensor {
            name: "token_embd.weight".into(),
            source_desc: "the GGUF file".into(),
        })?;
    let vocab = m
        .int(&k("vocab_size"))?
        .map(|v| v as usize)
        .unwrap_or(embd_rows);
    let cfg = TransformerConfig {
        arch,
        hidden_size: m.req_usize(&k("embedding_length"))?,
        num_layers: m.req_usize(&k("block_count"))?,
        num_heads: heads,
        num_kv_heads: m
            .int(&k("attention.head_count_kv"))?
            .map(|v| v as usize)
            .unwrap_or(heads),
        intermediate_size: m.req_usize(&k("feed_forward_length"))?,
        vocab_size: vocab,
        rms_norm_eps: m.float(&k("attention.layer_norm_rms_epsilon"))?,
        rope_theta: m.float(&k("rope.freq_base"))?,
        qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        shift_logits: shift_logits(content, arch, &arch_name)?,
        max_seq_len: m.req_usize(&k("context_length"))?,
        special: special_tokens(&m, arch, vocab)?,
    };
    check_rope(&m, content, &k, &cfg)?;
    cfg.validate(&config_names(arch))?;
    Ok(cfg)
}

/// `general.architecture`: the model family and its key prefix.
fn architecture(content: &Content) -> Result<(Arch, String)> {
    let arch_name = match content.metadata.get("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            return Err(Error::invalid(
                "general.architecture",
                format!("expected a string, found {v:?}"),
            ))
        }
        None => {
            return Err(Error::MissingField {
                field: "general.architecture".into(),
            })
        }
    };
    let arch = match arch_name.as_str() {
        "llada" => Arch::Llada,
        "dream" => Arch::Dream,
        other => {
            return Err(Error::invalid(
                "general.architecture",
                format!("`{other}` is not a supported diffusion model (expected llada or dream)"),
            ))
        }
    };
    Ok((arch, arch_name))
}

/// `diffusion.shift_logits`, which must agree with the architecture (absent: the architecture's).
fn shift_logits(content: &Content, arch: Arch, arch_name: &str) -> Result<bool> {
    let shift = match content.metadata.get("diffusion.shift_logits") {
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(Error::invalid(
                "diffusion.shift_logits",
                format!("expected a bool, found {v:?}"),
            ))
        }
        None => arch == Arch::Dream,
    };
    if shift != (arch == Arch::Dream) {
        return Err(Error::invalid(
            "diffusion.shift_logits",
            format!("{shift} contradicts architecture {arch_name} (Dream shifts, LLaDA does not)"),
        ));
    }
    Ok(shift)
}

/// The special token ids (`tokenizer.ggml.*_token_id`); the mask id of the 8B/7B checkpoints when
/// a converter left it out.
fn special_tokens(m: &Meta<'_>, arch: Arch, vocab: usize) -> Result<SpecialTokens> {
    let mask = match m.token("tokenizer.ggml.mask_token_id")? {
        Some(id) => id,
        None => match (arch, vocab) {
            (Arch::Llada, 126464) => LLADA_8B_MASK_ID,
            (Arch::Dream, 152064) => DREAM_7B_MASK_ID,
            _ => {
                return Err(Error::MissingField {
                    field: "tokenizer.ggml.mask_token_id".into(),
                })
            }
        },
    };
    let eos = m
        .token("tokenizer.ggml.eos_token_id")?
        .ok_or_else(|| Error::MissingField {
            field: "tokenizer.ggml.eos_token_id".into(),
        })?;
    Ok(SpecialTokens {
        mask,
        eos,
        eot: m.token("tokenizer.ggml.eot_token_id")?,
        bos: m.token("tokenizer.ggml.bos_token_id")?,
        pad: m.token("tokenizer.ggml.padding_token_id")?,
    })
}

/// Both models rotate the whole head (NeoX RoPE over head_dim): a partial rotary dimension or a
/// scaled RoPE would be computed differently, so they are errors, as `rope_scaling` is in
/// config.json.
fn check_rope(
    m: &Meta<'_>,
    content: &Content,
    k: &dyn Fn(&str) -> String,
    cfg: &TransformerConfig,
) -> Result<()> {
    if let Some(d) = m.int(&k("rope.dimension_count"))? {
        // A zero head count is reported by `validate` below; the head dimension needs one.
        let head_dim = cfg.hidden_size.checked_div(cfg.num_heads).unwrap_or(0) as u64;
        if cfg.num_heads > 0 && d != head_dim {
            return Err(Error::invalid(
                &k("rope.dimension_count"),
                format!(
                    "{d}: only RoPE over the whole head ({head_dim} = embedding_length / head_count) is supported"
                ),
            ));
        }
    }
    match content.metadata.get(&k("rope.scaling.type")) {
        None => {}
        Some(Value::String(s)) if s == "none" => {}
        Some(v) => {
            return Err(Error::invalid(
                &k("rope.scaling.type"),
                format!("{v:?} is not supported (only none)"),
            ))
        }
    }
    Ok(())
}

/// The GGUF keys a config's fields come from, for error messages.
fn config_names(arch: Arch) -> ConfigNames {
    match arch {
        Arch::Llada => ConfigNames {
            hidden: "llada.embedding_length",
            layers: "llada.block_count",
            heads: "llada.attention.head_count",
            kv_heads: "llada.attention.head_count_kv",
            ffn: "llada.feed_forward_length",
            vocab: "llada.vocab_size",
            max_len: "llada.context_length",
        },
        Arch::Dream => ConfigNames {
            hidden: "dream.embedding_length",
            layers: "dream.block_count",
            heads: "dream.attention.head_count",
            kv_heads: "dream.attention.head_count_kv",
            ffn: "dream.feed_forward_length",
            vocab: "dream.vocab_size",
            max_len: "dream.context_length",
        },
    }
}

/// Undo llama.cpp's LLaDA q/k permutation on whole rows of a `(rows, cols)` tensor of any GGML type:
/// the converter stored row `h*hd + 2j + t` from original row `h*hd + t*(hd/2) + j`.
pub fn unpermute_rows(q: &QTensor, heads: usize) -> Result<QTensor> {
    permute_rows_impl(q, heads, false)
}

/// Apply llama.cpp's LLaDA q/k permutation (what `convert_hf_to_gguf.py` does), for writing test
/// fixtures in the converter's layout.
pub fn permute_rows(q: &QTensor, heads: usize) -> Result<QTensor> {
    permute_rows_impl(q, heads, true)
}

/// The original (Hugging Face) row of GGUF row `gguf_row` of a q/k weight permuted by llama.cpp's
/// LLaDA converter, with heads of `hd` rows (even): GGUF row `h*hd + 2j + t` is original row
/// `h*hd + t*(hd/2) + j`.
fn hf_row(gguf_row: usize, hd: usize) -> usize {
    let (h, r) = (gguf_row / hd, gguf_row % hd);
    h * hd + (r % 2) * (hd / 2) + r / 2
}

/// The GGUF row holding original (Hugging Face) row `hf_row` of a q/k weight permuted by
/// llama.cpp's LLaDA converter (the inverse of [`hf_row`]).
fn gguf_row_of(hf_row: usize, hd: usize) -> usize {
    let (h, r) = (hf_row / hd, hf_row % hd);
    let (t, j) = (r / (hd / 2), r % (hd / 2));
    h * hd + 2 * j + t
}

/// Whether `rows` split into `heads` heads of an even size (what the permutation needs).
fn check_head_split(rows: usize, heads: usize) -> Result<usize> {
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(Error::HeadSplit { rows, heads });
    }
    Ok(rows / heads)
}

fn permute_rows_impl(q: &QTensor, heads: usize, forward: bool) -> Result<QTensor> {
    let (rows, cols) = q.shape().dims2()?;
    let hd = check_head_split(rows, heads)?;
    let dt = q.dtype();
    let row_bytes = cols / dt.block_size() * dt.type_size();
    let data = q.data()?;
    let mut out = vec![0u8; data.len()];
    for gguf_row in 0..rows {
        let hf_row = hf_row(gguf_row, hd);
        let (src, dst) = if forward {
            (hf_row, gguf_row)
        } else {
            (gguf_row, hf_row)
        };
        out[dst * row_bytes..(dst + 1) * row_bytes]
            .copy_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
    }
    let storage = QStorage::from_data(std::borrow::Cow::Owned(out), &Device::Cpu, dt)?;
    Ok(QTensor::new(storage, (rows, cols))?)
}

impl WeightSource for GgufWeights {
    fn get(&self, role: Role, shape: &[usize]) -> Result<Param> {
        let name = role.gguf_name();
        if !self.content.tensor_infos.contains_key(&name) {
            return Err(Error::MissingTensor {
                name,
                source_desc: self.path.display().to_string(),
            });
        }
        let mut q = self.read(&name)?;
        if q.shape().dims() != shape {
            return Err(Error::TensorShape {
                name,
                expected: shape.to_vec(),
                got: q.shape().dims().to_vec(),
            });
        }
        if self.arch == Arch::Llada {
            match role {
                Role::Q(_) | Role::QBias(_) if shape.len() == 2 => {
                    q = unpermute_rows(&q, self.num_heads)?
                }
                Role::K(_) | Role::KBias(_) if shape.len() == 2 => {
                    q = unpermute_rows(&q, self.num_kv_heads)?
                }
                Role::QBias(_) | Role::KBias(_) => {
                    return Err(Error::TensorDtype {
                        name,
                        dtype: "1-D permuted bias (unsupported for llada)".into(),
                    })
                }
                _ => {}
            }
        }
        if let Some(bad) = non_finite(&q)? {
            return Err(Error::NonFinite {
                what: format!("tensor `{name}` of {}", self.path.display()),
                detail: bad,
            });
        }
        match q.dtype() {
            _ if !role.is_matrix() => Ok(Param::Dense(
                q.dequantize(&self.device)?.to_dtype(self.dtype)?,
            )),
            GgmlDType::F32 => Ok(Param::Dense(
                q.dequantize(&self.device)?.to_dtype(self.dtype)?,
            )),
            GgmlDType::F16 | GgmlDType::BF16 if !self.keep_half => Ok(Param::Dense(
                q.dequantize(&self.device)?.to_dtype(self.dtype)?,
            )),
            // Matrices keep their file type: quantized blocks, and F16/BF16 stay half in memory.
            _ => Ok(Param::Quant(Arc::new(q))),
        }
    }

    fn get_packed(&self, role: Role, shape: &[usize]) -> Result<Option<CpuLinear>> {
        let name = role.gguf_name();
        let Some(info) = self.content.tensor_infos.get(&name) else {
            return Err(Error::MissingTensor {
                name,
                source_desc: self.path.display().to_string(),
            });
        };
        // The tiles keep what `get` would hand the packer: F32 matrices of an f32 model, and
        // F16/BF16 ones kept half.
        let (ty, dtype) = match info.ggml_dtype {
            GgmlDType::F32 if self.dtype == DType::F32 => (DenseType::F32, DType::F32),
            GgmlDType::F16 if self.keep_half => (DenseType::F16, DType::F16),
            GgmlDType::BF16 if self.keep_half => (DenseType::BF16, DType::BF16),
            // Quantized matrices are packed from the mapped file in place.
            dt if dt.block_size() > 1 && role.is_matrix() && shape.len() == 2 => {
                let raw = self.raw(role, shape)?;
                return CpuLinear::from_ggml_blocks(dt, shape[0], shape[1], &raw.bytes);
            }
            _ => return Ok(None),
        };
        if !role.is_matrix() || shape.len() != 2 {
            return Ok(None);
        }
        if info.shape.dims() != shape {
            return Err(Error::TensorShape {
                name,
                expected: shape.to_vec(),
                got: info.shape.dims().to_vec(),
            });
        }
        let rows = shape[0];
        let heads = match (self.arch, role) {
            (Arch::Llada, Role::Q(_)) => Some(self.num_heads),
            (Arch::Llada, Role::K(_)) => Some(self.num_kv_heads),
            _ => None,
        };
        let hd = heads.map(|h| check_head_split(rows, h)).transpose()?;
        let mut tiles = DenseMatrix::zeroed(ty, rows, shape[1])?;
        let row_bytes = tiles.row_bytes();
        let chunk = (STREAM_CHUNK_BYTES / row_bytes).clamp(1, rows);
        let mut buf = vec![0u8; chunk * row_bytes];
        let mut r = self
            .reader
            .lock()
            .map_err(|_| Error::file(&self.path, "an earlier read of this file panicked"))?;
        let at = self.content.tensor_data_offset.saturating_add(info.offset);
        r.seek(SeekFrom::Start(at))
            .map_err(|e| Error::file(&self.path, format!("tensor `{name}`: {e}")))?;
        let mut row = 0;
        while row < rows {
            let n = chunk.min(rows - row);
            let raw = &mut buf[..n * row_bytes];
            r.read_exact(raw).map_err(|e| {
                Error::file(
                    &self.path,
                    format!("tensor `{name}`, rows {row}..{}: {e}", row + n),
                )
            })?;
            if !crate::limits::raw_is_finite(raw, dtype) {
                return Err(Error::NonFinite {
                    what: format!("tensor `{name}` of {}", self.path.display()),
                    detail: "a NaN or infinite value".into(),
                });
            }
            match hd {
                None => tiles.set_rows(row, raw)?,
                Some(hd) => {
                    for (i, one) in raw.chunks_exact(row_bytes).enumerate() {
                        tiles.set_rows(hf_row(row + i, hd), one)?;
                    }
                }
            }
            row += n;
        }
        Ok(Some(CpuLinear::from_packed(tiles)))
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn matrix_type(&self, role: Role) -> Result<Option<GgmlDType>> {
        let name = role.gguf_name();
        let info = self
            .content
            .tensor_infos
            .get(&name)
            .ok_or_else(|| Error::MissingTensor {
                name,
                source_desc: self.path.display().to_string(),
            })?;
        // What `get` hands over: F32 (and half, unless kept) converted to the compute dtype.
        Ok(match info.ggml_dtype {
            GgmlDType::F32 => None,
            GgmlDType::F16 | GgmlDType::BF16 if !self.keep_half => None,
            dt => Some(dt),
        })
    }

    fn raw_matrix(&self, role: Role, shape: &[usize]) -> Result<Option<RawMatrix<'_>>> {
        match self.matrix_type(role)? {
            Some(dt) if dt.block_size() > 1 && role.is_matrix() => self.raw(role, shape).map(Some),
            _ => Ok(None),
        }
    }

    fn check_layout(&self, cfg: &TransformerConfig) -> Result<()> {
        let shapes: HashMap<String, Vec<usize>> = self
            .content
            .tensor_infos
            .iter()
            .map(|(n, t)| (n.clone(), t.shape.dims().to_vec()))
            .collect();
        let name = |r: Role| r.gguf_name();
        crate::layout::check(
            cfg,
            &shapes,
            &crate::layout::Spelling {
                name: &name,
                block_prefix: "blk.",
                layers_field: &format!("{}.block_count", self.arch),
                tie_field: None,
            },
            &self.path.display().to_string(),
        )
    }

    fn resident_bytes(&self, _cfg: &TransformerConfig) -> u64 {
        let compute = self.dtype.size_in_bytes() as u64;
        self.content
            .tensor_infos
            .values()
            .map(|t| {
                let elems = t.shape.elem_count() as u64;
                let stored =
                    elems / t.ggml_dtype.block_size() as u64 * t.ggml_dtype.type_size() as u64;
                match t.ggml_dtype {
                    _ if t.shape.rank() != 2 => elems.saturating_mul(compute),
                    GgmlDType::F32 => elems.saturating_mul(compute),
                    GgmlDType::F16 | GgmlDType::BF16 if !self.keep_half => {
                        elems.saturating_mul(compute)
                    }
                    _ => stored,
                }
            })
            .fold(0u64, u64::saturating_add)
    }
}

/// The first non-finite value of a GGUF tensor (plain floats, or a quantized type's f16 block
/// scales), described; `None` when all are finite.
fn non_finite(q: &QTensor) -> Result<Option<String>> {
    Ok(crate::gguf_raw::non_finite_blocks(q.dtype(), &q.data()?))
}
