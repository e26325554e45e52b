//! Where parameters come from: a checkpoint-independent [`Role`] per tensor, and sources that map
//! roles to checkpoint names (HF safetensors per architecture, GGUF, or a training `VarMap`).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;

use crate::config::TransformerConfig;
use crate::linear::{CpuLinear, Param};
use crate::lm::Arch;
use crate::safetensors_header::TensorMeta;
use crate::{Error, Result};

pub use crate::role::Role;

/// A provider of parameters by role.
pub trait WeightSource {
    /// The parameter for `role`, checked against `shape`, in the compute dtype (dense) or quantized.
    fn get(&self, role: Role, shape: &[usize]) -> Result<Param>;

    /// The matrix for `role`, checked against `shape`, streamed from the checkpoint straight into
    /// kernels-cpu's packed tiles (inference on the CPU): the matrix is never held whole in
    /// another layout on the way, so a load's peak memory is the packed weights plus a few rows.
    /// `None` when the source has no such path for this tensor (the caller packs what
    /// [`WeightSource::get`] returns). Default: `None`.
    fn get_packed(&self, role: Role, shape: &[usize]) -> Result<Option<CpuLinear>> {
        let _ = (role, shape);
        Ok(None)
    }

    /// The ggml type the matrix of `role` keeps once read ([`WeightSource::get`] hands it over as
    /// `Param::Quant`), known without reading it; `None` when it comes out dense (compute dtype
    /// or half). The NPU's placement is decided from this before anything is read. Default: dense.
    fn matrix_type(&self, role: Role) -> Result<Option<candle_core::quantized::GgmlDType>> {
        let _ = role;
        Ok(None)
    }

    /// The quantized matrix of `role` as ggml blocks in place (a mapped file), checked against
    /// `shape`; `None` when the source has no such path for this tensor (the caller reads it with
    /// [`WeightSource::get`]). Default: `None`.
    fn raw_matrix(
        &self,
        role: Role,
        shape: &[usize],
    ) -> Result<Option<crate::gguf_raw::RawMatrix<'_>>> {
        let _ = (role, shape);
        Ok(None)
    }

    /// Compute dtype of dense parameters.
    fn dtype(&self) -> DType;

    /// Device parameters are placed on.
    fn device(&self) -> &Device;

    /// Check the source's tensor list against `cfg` (layer count, every expected tensor and its
    /// shape, nothing the config has no place for) before any tensor is read. Default: nothing to
    /// check (sources that create their parameters, such as a training variable map).
    fn check_layout(&self, cfg: &TransformerConfig) -> Result<()> {
        let _ = cfg;
        Ok(())
    }

    /// Bytes the parameters will occupy once built, for the memory check made before building.
    /// Default: every parameter in the compute dtype.
    fn resident_bytes(&self, cfg: &TransformerConfig) -> u64 {
        cfg.param_count()
            .unwrap_or(u64::MAX)
            .saturating_mul(self.dtype().size_in_bytes() as u64)
    }
}

/// What a checkpoint declares about one tensor.
#[derive(Debug, Clone)]
struct Stored {
    shape: Vec<usize>,
    /// The stored dtype when it is half precision.
    half: Option<DType>,
    /// The stored dtype is a float type parameters may have.
    float: bool,
}

/// HF-layout parameters through a candle [`VarBuilder`]: memory-mapped safetensors (single file or
/// shards) or a training `VarMap`.
pub struct HfWeights {
    vb: VarBuilder<'static>,
    arch: Arch,
    desc: String,
    /// Tensors present (None for a VarMap, where every get creates the variable).
    tensors: Option<HashMap<String, Stored>>,
    /// Hand matrices stored as f16/bf16 over in that dtype (inference: the layers pack them
    /// half) instead of converting them to the compute dtype.
    keep_half: bool,
}

fn stored(meta: &TensorMeta) -> Stored {
    Stored {
        shape: meta.shape.clone(),
        half: half_dtype(&meta.dtype),
        float: matches!(meta.dtype.as_str(), "F16" | "BF16" | "F32" | "F64"),
    }
}

impl HfWeights {
    /// Memory-map safetensors files (after validating their headers) for `arch`.
    pub fn from_safetensors(
        files: &[PathBuf],
        arch: Arch,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let first = files
            .first()
            .ok_or(Error::NoWeightFiles { purpose: "to load" })?;
        let mut tensors = HashMap::new();
        let mut owner: HashMap<String, &PathBuf> = HashMap::new();
        for f in files {
            for meta in crate::safetensors_header::read_file(f)? {
                if let Some(other) = owner.insert(meta.name.clone(), f) {
                    return Err(Error::file(
                        f,
                        format!(
                            "tensor `{}` is also in {}: a checkpoint holds each tensor once",
                            meta.name,
                            other.display()
                        ),
                    ));
                }
                tensors.insert(meta.name.clone(), stored(&meta));
            }
        }
        // SAFETY: the files are memory-mapped read-only; modifying them while the model is loaded is
        // undefined behaviour, as for every mmap-based loader (candle, llama.cpp).
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(files, dtype, device) }
            .map_err(|e| Error::file(first.clone(), e))?;
        Ok(Self {
            vb,
            arch,
            desc: files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            tensors: Some(tensors),
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
        let tensors = crate::safetensors_header::read_bytes(bytes)
            .map_err(bad)?
            .into_iter()
            .map(|m| (m.name.clone(), stored(&m)))
            .collect();
        let vb = VarBuilder::from_slice_safetensors(bytes, dtype, device)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            vb,
            arch,
            desc: name.into(),
            tensors: Some(tensors),
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
        let stored = tensors
            .iter()
            .map(|(n, t)| {
                let dt = t.dtype();
                let half = matches!(dt, DType::F16 | DType::BF16).then_some(dt);
                let float = dt.is_float();
                (
                    n.clone(),
                    Stored {
                        shape: t.dims().to_vec(),
                        half,
                        float,
                    },
                )
            })
            .collect();
        Self {
            vb: VarBuilder::from_tensors(tensors, dtype, device),
            arch,
            desc: "in-memory tensors".into(),
            tensors: Some(stored),
            keep_half: false,
        }
    }

    /// Parameters from a builder (e.g. `VarBuilder::from_varmap` for training).
    pub fn from_var_builder(vb: VarBuilder<'static>, arch: Arch) -> Self {
        Self {
            vb,
            arch,
            desc: "a variable map".into(),
            tensors: None,
            keep_half: false,
        }
    }

    /// Name the source in errors (`desc`, e.g. "the VarBuilder").
    pub(crate) fn described(mut self, desc: &str) -> Self {
        self.desc = desc.into();
        self
    }

    /// The config field that ties the LM head, per architecture.
    fn tie_field(&self) -> &'static str {
        match self.arch {
            Arch::Llada => "weight_tying",
            Arch::Dream => "tie_word_embeddings",
        }
    }
}

impl WeightSource for HfWeights {
    fn get(&self, role: Role, shape: &[usize]) -> Result<Param> {
        let name = role.hf_name(self.arch);
        if let Some(tensors) = &self.tensors {
            let Some(st) = tensors.get(&name) else {
                return Err(Error::MissingTensor {
                    name,
                    source_desc: self.desc.clone(),
                });
            };
            if !st.float {
                return Err(Error::TensorDtype {
                    name,
                    dtype: "an integer or boolean type (parameters are F32, F16, BF16 or F64)"
                        .into(),
                });
            }
            if st.shape != shape {
                return Err(Error::TensorShape {
                    name,
                    expected: shape.to_vec(),
                    got: st.shape.clone(),
                });
            }
            let dtype = match st.half {
                Some(dt) if self.keep_half && role.is_matrix() => dt,
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
            if let Some((i, v)) = crate::limits::first_non_finite(&got)? {
                return Err(Error::NonFinite {
                    what: format!("tensor `{name}` of {}", self.desc),
                    detail: format!("element {i} is {v}"),
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
        let t = self.vb.get_with_hints(shape, &name, init);
        Ok(Param::Dense(
            t.map_err(|e| var_builder_error(e, &name, &self.desc))?,
        ))
    }

    fn dtype(&self) -> DType {
        self.vb.dtype()
    }

    fn device(&self) -> &Device {
        self.vb.device()
    }

    fn check_layout(&self, cfg: &TransformerConfig) -> Result<()> {
        let Some(tensors) = &self.tensors else {
            return Ok(());
        };
        let shapes: HashMap<String, Vec<usize>> = tensors
            .iter()
            .map(|(n, s)| (n.clone(), s.shape.clone()))
            .collect();
        let arch = self.arch;
        let name = move |r: Role| r.hf_name(arch);
        let (prefix, layers) = match arch {
            Arch::Llada => ("model.transformer.blocks.", "n_layers"),
            Arch::Dream => ("model.layers.", "num_hidden_layers"),
        };
        crate::layout::check(
            cfg,
            &shapes,
            &crate::layout::Spelling {
                name: &name,
                block_prefix: prefix,
                layers_field: layers,
                tie_field: Some(self.tie_field()),
            },
            &self.desc,
        )
    }

    fn resident_bytes(&self, cfg: &TransformerConfig) -> u64 {
        let Some(tensors) = &self.tensors else {
            return cfg
                .param_count()
                .unwrap_or(u64::MAX)
                .saturating_mul(self.dtype().size_in_bytes() as u64);
        };
        let compute = self.dtype().size_in_bytes() as u64;
        tensors
            .values()
            .map(|t| {
                let elems = t.shape.iter().map(|&d| d as u64).product::<u64>();
                let per = match t.half {
                    Some(_) if self.keep_half && t.shape.len() == 2 => 2,
                    _ => compute,
                };
                elems.saturating_mul(per)
            })
            .fold(0u64, u64::saturating_add)
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

/// Names in a safetensors file, validating the header (every tensor's dtype, shape and byte range)
/// and that every tensor lies inside the file (a truncated download is reported here, naming the
/// file, instead of failing later).
pub fn safetensors_names(path: &Path) -> Result<Vec<String>> {
    Ok(crate::safetensors_header::read_file(path)?
        .into_iter()
        .map(|m| m.name)
        .collect())
}

/// A candle error from a `VarBuilder` asked for `name`, as this crate's error naming the tensor
/// (candle's own messages for a missing tensor or a shape mismatch do not say which config
/// implied what).
pub(crate) fn var_builder_error(e: candle_core::Error, name: &str, source_desc: &str) -> Error {
    let mut inner = &e;
    while let candle_core::Error::WithBacktrace { inner: i, .. }
    | candle_core::Error::Context { inner: i, .. } = inner
    {
        inner = i;
    }
    match inner {
        candle_core::Error::CannotFindTensor { .. } => Error::MissingTensor {
            name: name.into(),
            source_desc: source_desc.into(),
        },
        candle_core::Error::UnexpectedShape { expected, got, .. } => Error::TensorShape {
            name: name.into(),
            expected: expected.dims().to_vec(),
            got: got.dims().to_vec(),
        },
        _ => Error::Candle(e),
    }
}
