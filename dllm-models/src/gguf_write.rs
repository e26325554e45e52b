//! Writing llama.cpp GGUF files from HF-named tensors, in the layout `convert_hf_to_gguf.py`
//! produces (metadata keys, tensor names, LLaDA's q/k row permutation, norms and biases in F32).
//! Used by the benchmarks to run llama.cpp on the same weights, and usable as a converter.
//!
//! [`tokenizer_metadata`] turns a byte-level BPE `tokenizers::Tokenizer` into the
//! `tokenizer.ggml.*` keys llama.cpp's vocabulary loader reads (model `gpt2`, a named
//! pre-tokeniser, tokens, token types, merges), so the file carries its tokenizer.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;
use tokenizers::Tokenizer;

use crate::config::TransformerConfig;
use crate::gguf::permute_rows;
use crate::lm::Arch;
use crate::role::Role;
use crate::synthetic::RandomValues;
use crate::{Error, Result};
use std::io::Write as _;

fn roles(cfg: &TransformerConfig) -> Vec<Role> {
    cfg.param_shapes()
        .into_iter()
        .map(|(role, _)| role)
        .collect()
}

/// The metadata [`write_gguf`] writes for `cfg`, with `extra` appended.
fn metadata(cfg: &TransformerConfig, extra: &[(String, Value)]) -> Vec<(String, Value)> {
    let arch = cfg.arch.to_string();
    let k = |s: &str| format!("{arch}.{s}");
    let u32v = |x: usize| Value::U32(x as u32);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.clone())),
        (
            "general.name".into(),
            Value::String(format!("llada-rs {arch}")),
        ),
        (k("block_count"), u32v(cfg.num_layers)),
        (k("context_length"), u32v(cfg.max_seq_len)),
        (k("embedding_length"), u32v(cfg.hidden_size)),
        (k("feed_forward_length"), u32v(cfg.intermediate_size)),
        (k("attention.head_count"), u32v(cfg.num_heads)),
        (k("attention.head_count_kv"), u32v(cfg.num_kv_heads)),
        (k("rope.freq_base"), Value::F32(cfg.rope_theta as f32)),
        (k("rope.dimension_count"), u32v(cfg.head_dim())),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        (k("vocab_size"), u32v(cfg.vocab_size)),
        (k("attention.causal"), Value::Bool(false)),
        (
            "diffusion.shift_logits".into(),
            Value::Bool(cfg.shift_logits),
        ),
        (
            "tokenizer.ggml.mask_token_id".into(),
            Value::U32(cfg.special.mask),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            Value::U32(cfg.special.eos),
        ),
    ];
    if let Some(b) = cfg.special.bos {
        md.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(b)));
    }
    if let Some(p) = cfg.special.pad {
        md.push(("tokenizer.ggml.padding_token_id".into(), Value::U32(p)));
    }
    md.extend(extra.iter().cloned());
    md
}

/// Write `tensors` (HF names of `cfg.arch`) as a GGUF with 2-D weights in `dtype` and `extra`
/// metadata appended (e.g. a vocabulary).
pub fn write_gguf(
    path: &Path,
    cfg: &TransformerConfig,
    tensors: &HashMap<String, Tensor>,
    dtype: GgmlDType,
    extra: &[(String, Value)],
) -> Result<()> {
    let md = metadata(cfg, extra);
    let mut qs: Vec<(String, QTensor)> = Vec::new();
    for role in roles(cfg) {
        let hf = role.hf_name(cfg.arch);
        let t = tensors
            .get(&hf)
            .ok_or_else(|| Error::MissingTensor {
                name: hf.clone(),
                source_desc: "the tensors to convert".into(),
            })?
            .to_dtype(candle_core::DType::F32)?;
        let q = if t.rank() == 1 {
            QTensor::quantize(&t, GgmlDType::F32)?
        } else {
            let q = QTensor::quantize(&t, dtype)?;
            match (cfg.arch, role) {
                (Arch::Llada, Role::Q(_)) => permute_rows(&q, cfg.num_heads)?,
                (Arch::Llada, Role::K(_)) => permute_rows(&q, cfg.num_kv_heads)?,
                _ => q,
            }
        };
        qs.push((role.gguf_name(), q));
    }
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| Error::file(path, e))?);
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut f, &md_refs, &t_refs).map_err(|e| Error::file(path, e))?;
    Ok(())
}

/// How [`write_random_gguf`] writes a random checkpoint.
#[derive(Debug, Clone)]
pub struct RandomGguf {
    /// Type of the 2-D weights (F32, F16, BF16, Q8_0 or Q4_0; vectors are F32).
    pub dtype: GgmlDType,
    /// Seed of the values ([`crate::synthetic::random_weights`]'s).
    pub seed: u64,
    /// Metadata appended after the model's (e.g. [`placeholder_vocab`]).
    pub extra: Vec<(String, Value)>,
    /// Values generated and quantized at a time (whole rows; default 2^22: 16 MiB of f32).
    pub chunk_values: usize,
}

impl RandomGguf {
    /// `dtype` weights from `seed`, no extra metadata, chunks of 2^22 values.
    pub fn new(dtype: GgmlDType, seed: u64) -> Self {
        RandomGguf {
            dtype,
            seed,
            extra: Vec::new(),
            chunk_values: 1 << 22,
        }
    }
}

/// GGUF's code of a tensor type (the types [`write_random_gguf`] writes).
fn ggml_code(dt: GgmlDType) -> Option<u32> {
    Some(match dt {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q8_0 => 8,
        GgmlDType::BF16 => 30,
        _ => return None,
    })
}

/// Counts what it writes (the tensor data's alignment is relative to the file's start).
struct Out<W> {
    w: W,
    at: u64,
}

impl<W: std::io::Write> Out<W> {
    fn bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.at += b.len() as u64;
        self.w.write_all(b)
    }
    fn u32(&mut self, v: u32) -> std::io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> std::io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn string(&mut self, s: &str) -> std::io::Result<()> {
        self.u64(s.len() as u64)?;
        self.bytes(s.as_bytes())
    }
    /// Zeros up to the next multiple of 32 bytes (GGUF's default alignment).
    fn pad(&mut self) -> std::io::Result<()> {
        let n = (32 - self.at % 32) % 32;
        self.bytes(&[0u8; 32][..n as usize])
    }
    /// A metadata value, as candle's GGUF writer encodes it.
    fn value(&mut self, v: &Value) -> std::io::Result<()> {
        match v {
            Value::U8(x) => self.bytes(&[*x]),
            Value::I8(x) => self.bytes(&x.to_le_bytes()),
            Value::U16(x) => self.bytes(&x.to_le_bytes()),
            Value::I16(x) => self.bytes(&x.to_le_bytes()),
            Value::U32(x) => self.u32(*x),
            Value::I32(x) => self.bytes(&x.to_le_bytes()),
            Value::U64(x) => self.u64(*x),
            Value::I64(x) => self.bytes(&x.to_le_bytes()),
            Value::F32(x) => self.bytes(&x.to_le_bytes()),
            Value::F64(x) => self.bytes(&x.to_le_bytes()),
            Value::Bool(x) => self.bytes(&[u8::from(*x)]),
            Value::String(x) => self.string(x),
            Value::Array(xs) => {
                self.u32(xs.first().map_or(4, value_code))?;
                self.u64(xs.len() as u64)?;
                xs.iter().try_for_each(|x| self.value(x))
            }
        }
    }
}

/// GGUF's code of a metadata value's type.
fn value_code(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// `(name, shape, type, bytes)` of every tensor [`write_random_gguf`] writes, in file order.
type TensorPlan = Vec<(Role, Vec<usize>, GgmlDType, u64)>;

fn tensor_plan(cfg: &TransformerConfig, dtype: GgmlDType) -> Result<TensorPlan> {
    let mut out = Vec::new();
    for (role, shape) in cfg.param_shapes() {
        let dt = if shape.len() == 1 {
            GgmlDType::F32
        } else {
            dtype
        };
        let cols = *shape.last().expect("a tensor has dims");
        if !cols.is_multiple_of(dt.block_size()) {
            return Err(Error::TensorShape {
                name: role.gguf_name(),
                expected: vec![dt.block_size()],
                got: shape,
            });
        }
        let n: usize = shape.iter().product();
        let bytes = (n / dt.block_size() * dt.type_size()) as u64;
        out.push((role, shape, dt, bytes));
    }
    Ok(out)
}

/// Write a random checkpoint of `cfg` as a GGUF, tensor by tensor and rows at a time: the values
/// of [`crate::synthetic::random_weights`]`(cfg, how.seed)`, byte for byte the file
/// [`write_gguf`] writes from them, without ever holding a whole tensor of f32 values (except a
/// LLaDA q/k matrix, whose rows llama.cpp's converter permutes). The memory it needs is one
/// chunk of values and its quantized bytes, whatever the model's size. Returns the file's size.
pub fn write_random_gguf(path: &Path, cfg: &TransformerConfig, how: &RandomGguf) -> Result<u64> {
    let code = ggml_code(how.dtype).ok_or_else(|| Error::TensorDtype {
        name: "the 2-D weights of a random GGUF".into(),
        dtype: format!("{:?} (write F32, F16, BF16, Q8_0 or Q4_0)", how.dtype),
    })?;
    let plan = tensor_plan(cfg, how.dtype)?;
    let md = metadata(cfg, &how.extra);
    let io = |e: std::io::Error| Error::file(path, e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut o = Out {
        w: std::io::BufWriter::with_capacity(1 << 20, file),
        at: 0,
    };
    o.u32(0x4655_4747).map_err(io)?;
    o.u32(2).map_err(io)?;
    o.u64(plan.len() as u64).map_err(io)?;
    o.u64(md.len() as u64).map_err(io)?;
    for (k, v) in &md {
        o.string(k).map_err(io)?;
        o.u32(value_code(v)).map_err(io)?;
        o.value(v).map_err(io)?;
    }
    let mut offset = 0u64;
    for (role, shape, dt, bytes) in &plan {
        o.string(&role.gguf_name()).map_err(io)?;
        o.u32(shape.len() as u32).map_err(io)?;
        for &d in shape.iter().rev() {
            o.u64(d as u64).map_err(io)?;
        }
        o.u32(if *dt == GgmlDType::F32 { 0 } else { code })
            .map_err(io)?;
        o.u64(offset).map_err(io)?;
        offset += bytes.div_ceil(32) * 32;
    }
    o.pad().map_err(io)?;
    let mut rng = RandomValues::new(how.seed);
    for (role, shape, dt, _) in &plan {
        write_tensor(
            &mut o,
            cfg,
            &mut rng,
            *role,
            shape,
            *dt,
            how.chunk_values,
            path,
        )?;
        o.pad().map_err(io)?;
    }
    o.w.flush().map_err(io)?;
    Ok(o.at)
}

/// One tensor's data: rows generated and quantized a chunk at a time.
#[allow(clippy::too_many_arguments)]
fn write_tensor<W: std::io::Write>(
    o: &mut Out<W>,
    cfg: &TransformerConfig,
    rng: &mut RandomValues,
    role: Role,
    shape: &[usize],
    dt: GgmlDType,
    chunk_values: usize,
    path: &Path,
) -> Result<()> {
    let io = |e: std::io::Error| Error::file(path, e);
    let cols = *shape.last().expect("a tensor has dims");
    let rows: usize = shape.iter().product::<usize>() / cols;
    let heads = match (cfg.arch, role) {
        (Arch::Llada, Role::Q(_)) => Some(cfg.num_heads),
        (Arch::Llada, Role::K(_)) => Some(cfg.num_kv_heads),
        _ => None,
    };
    // The permuted q/k rows come from all over the matrix: those are quantized whole.
    let per = if heads.is_some() || shape.len() == 1 {
        rows
    } else {
        (chunk_values / cols).clamp(1, rows)
    };
    let mut vals = vec![0f32; per * cols];
    let mut r = 0;
    while r < rows {
        let n = per.min(rows - r);
        let v = &mut vals[..n * cols];
        rng.fill(role, shape, v);
        let dims: Vec<usize> = if shape.len() == 1 {
            vec![cols]
        } else {
            vec![n, cols]
        };
        let t = Tensor::from_slice(v, dims, &candle_core::Device::Cpu)?;
        let mut q = QTensor::quantize(&t, dt)?;
        if let Some(h) = heads {
            q = permute_rows(&q, h)?;
        }
        o.bytes(&q.data()?).map_err(io)?;
        r += n;
    }
    Ok(())
}

/// A SentencePiece-style placeholder vocabulary of `n` tokens (`<unk>`, `<s>`, `</s>`, then
/// `tok3`...), so llama.cpp can load a checkpoint that has none.
pub fn placeholder_vocab(n: usize) -> Vec<(String, Value)> {
    let tokens = (0..n)
        .map(|i| {
            Value::String(match i {
                0 => "<unk>".into(),
                1 => "<s>".into(),
                2 => "</s>".into(),
                _ => format!("tok{i}"),
            })
        })
        .collect();
    let types = (0..n)
        .map(|i| {
            Value::I32(match i {
                0 => 2,
                1 | 2 => 3,
                _ => 1,
            })
        })
        .collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array((0..n).map(|_| Value::F32(0.0)).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
    ]
}

/// llama.cpp's token type of an ordinary token (`LLAMA_TOKEN_TYPE_NORMAL`).
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// llama.cpp's token type of a special token (`LLAMA_TOKEN_TYPE_CONTROL`): matched whole in
/// text when special tokens are parsed, never produced by BPE merges.
pub const TOKEN_TYPE_CONTROL: i32 = 3;

/// The `tokenizer.ggml.*` metadata of a byte-level BPE tokenizer, for [`write_gguf`]'s `extra`.
///
/// `pre` names llama.cpp's pre-tokeniser (`tokenizer.ggml.pre`) whose split rules equal the
/// tokenizer's own: llama.cpp has no way to express an arbitrary `tokenizer.json` pipeline, so
/// the caller vouches for the match (e.g. `starcoder`: single digits, then GPT-2's regex).
/// Normalisers have no GGUF equivalent either; a prompt fed to llama.cpp must already be in
/// normalised form. Added tokens marked special become control tokens; `add_bos` sets
/// `tokenizer.ggml.add_bos_token` (EOS is never appended).
///
/// Errors name what is unusable: a model other than BPE, ids that do not cover `0..n`, a merge
/// that is not a pair.
pub fn tokenizer_metadata(
    tok: &Tokenizer,
    pre: &str,
    add_bos: bool,
) -> Result<Vec<(String, Value)>> {
    let err = |m: String| Error::Tokenizer(format!("GGUF tokenizer metadata: {m}"));
    let json: serde_json::Value = serde_json::from_str(
        &tok.to_string(false)
            .map_err(|e| err(format!("cannot serialise the tokenizer: {e}")))?,
    )
    .map_err(|e| err(format!("tokenizer JSON: {e}")))?;
    let model = &json["model"];
    if model["type"] != "BPE" {
        return Err(err(format!("model type {} is not BPE", model["type"])));
    }
    let vocab = tok.get_vocab(true);
    let mut tokens: Vec<Option<String>> = vec![None; vocab.len()];
    for (text, &id) in &vocab {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            err(format!(
                "token id {id} ({text:?}) is outside 0..{}",
                vocab.len()
            ))
        })?;
        *slot = Some(text.clone());
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| err(format!("no token has id {i}"))))
        .collect::<Result<_>>()?;
    let added = tok.get_added_tokens_decoder();
    let types: Vec<Value> = (0..tokens.len() as u32)
        .map(|id| {
            Value::I32(match added.get(&id) {
                Some(t) if t.special => TOKEN_TYPE_CONTROL,
                _ => TOKEN_TYPE_NORMAL,
            })
        })
        .collect();
    let merges: Vec<Value> = model["merges"]
        .as_array()
        .ok_or_else(|| err("the BPE model has no merges list".into()))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) if s.split(' ').count() == 2 => Ok(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                _ => Err(err(format!("merge {m} is not a pair of strings"))),
            },
            _ => Err(err(format!("merge {m} is not a pair"))),
        })
        .map(|r| r.map(Value::String))
        .collect::<Result<_>>()?;
    Ok(vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
        ("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)),
    ])
}
