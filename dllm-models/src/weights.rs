//! Where parameters come from: a checkpoint-independent [`Role`] per tensor, and sources that map
//! roles to checkpoint names (HF safetensors per architecture, GGUF, or a training `VarMap`).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;

use crate::layers::Param;
use crate::lm::Arch;
use crate::{Error, Result};

/// The role of a parameter in the shared transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Token embedding `(vocab, hidden)`.
    Embed,
    /// Final norm `(hidden)`.
    FinalNorm,
    /// LM head `(vocab, hidden)`.
    Head,
    /// Layer `i`'s pre-attention norm.
    AttnNorm(usize),
    /// Layer `i`'s query projection.
    Q(usize),
    /// Layer `i`'s key projection.
    K(usize),
    /// Layer `i`'s value projection.
    V(usize),
    /// Layer `i`'s query bias (Dream).
    QBias(usize),
    /// Layer `i`'s key bias (Dream).
    KBias(usize),
    /// Layer `i`'s value bias (Dream).
    VBias(usize),
    /// Layer `i`'s attention output projection.
    O(usize),
    /// Layer `i`'s pre-MLP norm.
    FfnNorm(usize),
    /// Layer `i`'s gate projection (SiLU applied).
    Gate(usize),
    /// Layer `i`'s up projection.
    Up(usize),
    /// Layer `i`'s down projection.
    Down(usize),
}

impl Role {
    /// The tensor name in the architecture's Hugging Face checkpoint.
    pub fn hf_name(self, arch: Arch) -> String {
        match arch {
            Arch::Llada => {
                let b = |i: usize, s: &str| format!("model.transformer.blocks.{i}.{s}");
                match self {
                    Role::Embed => "model.transformer.wte.weight".into(),
                    Role::FinalNorm => "model.transformer.ln_f.weight".into(),
                    Role::Head => "model.transformer.ff_out.weight".into(),
                    Role::AttnNorm(i) => b(i, "attn_norm.weight"),
                    Role::Q(i) => b(i, "q_proj.weight"),
                    Role::K(i) => b(i, "k_proj.weight"),
                    Role::V(i) => b(i, "v_proj.weight"),
                    Role::QBias(i) => b(i, "q_proj.bias"),
                    Role::KBias(i) => b(i, "k_proj.bias"),
                    Role::VBias(i) => b(i, "v_proj.bias"),
                    Role::O(i) => b(i, "attn_out.weight"),
                    Role::FfnNorm(i) => b(i, "ff_norm.weight"),
                    Role::Gate(i) => b(i, "ff_proj.weight"),
                    Role::Up(i) => b(i, "up_proj.weight"),
                    Role::Down(i) => b(i, "ff_out.weight"),
                }
            }
            Arch::Dream => {
                let b = |i: usize, s: &str| format!("model.layers.{i}.{s}");
                match self {
                    Role::Embed => "model.embed_tokens.weight".into(),
                    Role::FinalNorm => "model.norm.weight".into(),
                    Role::Head => "lm_head.weight".into(),
                    Role::AttnNorm(i) => b(i, "input_layernorm.weight"),
                    Role::Q(i) => b(i, "self_attn.q_proj.weight"),
                    Role::K(i) => b(i, "self_attn.k_proj.weight"),
                    Role::V(i) => b(i, "self_attn.v_proj.weight"),
                    Role::QBias(i) => b(i, "self_attn.q_proj.bias"),
                    Role::KBias(i) => b(i, "self_attn.k_proj.bias"),
                    Role::VBias(i) => b(i, "self_attn.v_proj.bias"),
                    Role::O(i) => b(i, "self_attn.o_proj.weight"),
                    Role::FfnNorm(i) => b(i, "post_attention_layernorm.weight"),
                    Role::Gate(i) => b(i, "mlp.gate_proj.weight"),
                    Role::Up(i) => b(i, "mlp.up_proj.weight"),
                    Role::Down(i) => b(i, "mlp.down_proj.weight"),
                }
            }
        }
    }

    /// The tensor name in a llama.cpp GGUF file.
    pub fn gguf_name(self) -> String {
        let b = |i: usize, s: &str| format!("blk.{i}.{s}");
        match self {
            Role::Embed => "token_embd.weight".into(),
            Role::FinalNorm => "output_norm.weight".into(),
            Role::Head => "output.weight".into(),
            Role::AttnNorm(i) => b(i, "attn_norm.weight"),
            Role::Q(i) => b(i, "attn_q.weight"),
            Role::K(i) => b(i, "attn_k.weight"),
            Role::V(i) => b(i, "attn_v.weight"),
            Role::QBias(i) => b(i, "attn_q.bias"),
            Role::KBias(i) => b(i, "attn_k.bias"),
            Role::VBias(i) => b(i, "attn_v.bias"),
            Role::O(i) => b(i, "attn_output.weight"),
            Role::FfnNorm(i) => b(i, "ffn_norm.weight"),
            Role::Gate(i) => b(i, "ffn_gate.weight"),
            Role::Up(i) => b(i, "ffn_up.weight"),
            Role::Down(i) => b(i, "ffn_down.weight"),
        }
    }

    /// Whether the parameter is a matrix that a linear layer (or embedding) consumes.
    pub fn is_matrix(self) -> bool {
        !matches!(
            self,
            Role::FinalNorm
                | Role::AttnNorm(_)
                | Role::FfnNorm(_)
                | Role::QBias(_)
                | Role::KBias(_)
                | Role::VBias(_)
        )
    }
}

/// A provider of parameters by role.
pub trait WeightSource {
    /// The parameter for `role`, checked against `shape`, in the compute dtype (dense) or quantized.
    fn get(&self, role: Role, shape: &[usize]) -> Result<Param>;

    /// Compute dtype of dense parameters.
    fn dtype(&self) -> DType;

    /// Device parameters are placed on.
    fn device(&self) -> &Device;
}

/// HF-layout parameters through a candle [`VarBuilder`]: memory-mapped safetensors (single file or
/// shards) or a training `VarMap`.
pub struct HfWeights {
    vb: VarBuilder<'static>,
    arch: Arch,
    desc: String,
    /// Tensor names present (None for a VarMap, where every get creates the variable).
    names: Option<std::collections::HashSet<String>>,
    /// Tensors the source stores as f16/bf16, with that dtype.
    half: HashMap<String, DType>,
    /// Hand matrices stored as f16/bf16 over in that dtype (inference: the layers pack them
    /// half) instead of converting them to the compute dtype.
    keep_half: bool,
}

impl HfWeights {
    /// Memory-map safetensors files (after validating their headers) for `arch`.
    pub fn from_safetensors(
        files: &[PathBuf],
        arch: Arch,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut names = std::collections::HashSet::new();
        let mut half = HashMap::new();
        for f in files {
            for (name, dtype) in safetensors_index(f)? {
                if let Some(dt) = half_dtype(&dtype) {
                    half.insert(name.clone(), dt);
                }
                names.insert(name);
            }
        }
        // SAFETY: the files are memory-mapped read-only; modifying them while the model is loaded is
        // undefined behaviour, as for every mmap-based loader (candle, llama.cpp).
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(files, dtype, device) }
            .map_err(|e| Error::file(files[0].clone(), e))?;
        Ok(Self {
            vb,
            arch,
            desc: files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            names: Some(names),
            half,
            keep_half: false,
        })
    }

    /// One safetensors file held in memory (e.g. embedded in a binary), validated like a file.
    pub fn from_safetensors_bytes(
        bytes: &'static [u8],
        name: &str,
        arch: Arch,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let bad = |e: String| Error::Source {
            source_desc: name.into(),
            reason: format!("embedded weights: {e}"),
        };
        let (_, meta) =
            safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
        let mut names = std::collections::HashSet::new();
        let mut half = HashMap::new();
        for (n, info) in meta.tensors() {
            if let Some(dt) = half_dtype(&format!("{:?}", info.dtype)) {
                half.insert(n.clone(), dt);
            }
            names.insert(n);
        }
        let vb = VarBuilder::from_slice_safetensors(bytes, dtype, device)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            vb,
            arch,
            desc: name.into(),
            names: Some(names),
            half,
            keep_half: false,
        })
    }

    /// Hand matrices the source stores as f16/bf16 over in that dtype, to be packed half by
    /// [`crate::linear::Linear::for_inference`] (inference only: training needs them as
    /// variables in the compute dtype).
    pub fn keep_half_matrices(mut self, keep: bool) -> Self {
        self.keep_half = keep;
        self
    }

    /// Parameters from in-memory tensors keyed by HF name (converted to `dtype`).
    pub fn from_tensors(
        tensors: HashMap<String, Tensor>,
        arch: Arch,
        dtype: DType,
        device: &Device,
    ) -> Self {
        let names = tensors.keys().cloned().collect();
        let half = tensors
            .iter()
            .filter(|(_, t)| matches!(t.dtype(), DType::F16 | DType::BF16))
            .map(|(n, t)| (n.clone(), t.dtype()))
            .collect();
        Self {
            vb: VarBuilder::from_tensors(tensors, dtype, device),
            arch,
            desc: "in-memory tensors".into(),
            names: Some(names),
            half,
            keep_half: false,
        }
    }

    /// Parameters from a builder (e.g. `VarBuilder::from_varmap` for training).
    pub fn from_var_builder(vb: VarBuilder<'static>, arch: Arch) -> Self {
        Self {
            vb,
            arch,
            desc: "a variable map".into(),
            names: None,
            half: HashMap::new(),
            keep_half: false,
        }
    }
}

impl WeightSource for HfWeights {
    fn get(&self, role: Role, shape: &[usize]) -> Result<Param> {
        let name = role.hf_name(self.arch);
        if let Some(names) = &self.names {
            if !names.contains(&name) {
                return Err(Error::MissingTensor {
                    name,
                    source_desc: self.desc.clone(),
                });
            }
            let dtype = match self.half.get(&name) {
                Some(&dt) if self.keep_half && role.is_matrix() => dt,
                _ => self.vb.dtype(),
            };
            let got = self
                .vb
                .get_unchecked_dtype(&name, dtype)
                .map_err(|e| Error::file(&self.desc, format!("tensor `{name}`: {e}")))?;
            if got.dims() != shape {
                return Err(Error::TensorShape {
                    name,
                    expected: shape.to_vec(),
                    got: got.dims().to_vec(),
                });
            }
            return Ok(Param::Dense(got));
        }
        let init = if role.is_matrix() {
            candle_nn::Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            }
        } else if matches!(role, Role::QBias(_) | Role::KBias(_) | Role::VBias(_)) {
            candle_nn::Init::Const(0.0)
        } else {
            candle_nn::Init::Const(1.0)
        };
        Ok(Param::Dense(self.vb.get_with_hints(shape, &name, init)?))
    }

    fn dtype(&self) -> DType {
        self.vb.dtype()
    }

    fn device(&self) -> &Device {
        self.vb.device()
    }
}

/// The half-precision dtype of a safetensors dtype name, if it is one.
fn half_dtype(name: &str) -> Option<DType> {
    match name {
        "F16" => Some(DType::F16),
        "BF16" => Some(DType::BF16),
        _ => None,
    }
}

/// Names in a safetensors file, validating the header and that every tensor lies inside the file
/// (a truncated download is reported here, naming the file, instead of failing later).
pub fn safetensors_names(path: &Path) -> Result<Vec<String>> {
    Ok(safetensors_index(path)?
        .into_iter()
        .map(|(n, _)| n)
        .collect())
}

/// `(name, dtype)` of every tensor of a safetensors file, validated as [`safetensors_names`].
fn safetensors_index(path: &Path) -> Result<Vec<(String, String)>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| Error::file(path, e))?;
    let file_len = f.metadata().map_err(|e| Error::file(path, e))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| {
        Error::file(
            path,
            "not a safetensors file (shorter than its 8-byte header length)",
        )
    })?;
    let header_len = u64::from_le_bytes(n);
    if header_len > 100_000_000 || 8 + header_len > file_len {
        return Err(Error::file(
            path,
            format!("not a safetensors file or truncated (header length {header_len}, file {file_len} bytes)"),
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header)
        .map_err(|e| Error::file(path, e))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| Error::file(path, format!("invalid safetensors header: {e}")))?;
    let data_len = file_len - 8 - header_len;
    let mut names = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let end = info
            .get("data_offsets")
            .and_then(|o| o.get(1))
            .and_then(|e| e.as_u64())
            .ok_or_else(|| Error::file(path, format!("tensor `{name}` has no data_offsets")))?;
        if end > data_len {
            return Err(Error::file(
                path,
                format!("truncated: tensor `{name}` ends at byte {end} of the data section, which has only {data_len} bytes"),
            ));
        }
        let dtype = info
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| Error::file(path, format!("tensor `{name}` has no dtype")))?
            .to_string();
        names.push((name, dtype));
    }
    Ok(names)
}
