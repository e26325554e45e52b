//! candle-style construction beside [`crate::load`], as candle-transformers' models are built: a
//! config with named fields per model ([`crate::llada::Config`], [`crate::dream::Config`], serde)
//! and `Model::new(&cfg, vb)` over a candle [`VarBuilder`] holding the checkpoint's tensors under
//! their Hugging Face names. The model's `forward(&input_ids)` is the plain full-canvas forward
//! (also as [`candle_nn::Module`]); the windowed, KV-cached forwards of [`DiffusionLm`] are there
//! too, and every decoder of `dllm-decode` takes the model.
//!
//! Parsing a config runs the same field checks as `load()` (errors name the field), and the model
//! gets the same special-token rules ([`crate::source`]'s completion: LLaDA-8B's EoT when the
//! vocabulary is LLaDA-8B's, the mask never doubling as another special token). Before any tensor
//! is read, the VarBuilder's blocks are counted against the config's layer count, and an LM head
//! under a tied config or biases under a config without them are errors, as with `load()`; a
//! missing tensor or one of the wrong shape is an error naming it. A candle `VarBuilder` does not
//! tell which file a tensor came from: build it with [`safetensors_var_builder`] and the errors
//! name the file too. What `load()` adds on top — a tokenizer's EoT, `generation_config.json`'s
//! BOS and decoding defaults — needs files a `VarBuilder` does not carry; set them with
//! [`DiffusionTransformer::set_special_tokens`] if you have them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use serde::de::Error as _;

use crate::config::TransformerConfig;
use crate::config_json::Fields;
use crate::layers::OpMode;
use crate::lm::{Arch, DiffusionLm, Rows};
use crate::role::Role;
use crate::transformer::DiffusionTransformer;
use crate::weights::HfWeights;
use crate::{Error, Result};

/// Deserialise any JSON value through the crate's field-by-field parser (`read`), then check the
/// result (`check`), so serde errors name the field as `load()`'s do.
pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>, C>(
    d: D,
    read: fn(&Fields) -> Result<C>,
    check: fn(&C) -> Result<TransformerConfig>,
) -> std::result::Result<C, D::Error> {
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    let f = Fields::from_value(v).map_err(D::Error::custom)?;
    let cfg = read(&f).map_err(D::Error::custom)?;
    check(&cfg).map_err(D::Error::custom)?;
    Ok(cfg)
}

/// What the errors call a `VarBuilder` whose files are unknown.
const VAR_BUILDER: &str = "the VarBuilder";

/// Build an inference model (CPU backend) from `vb` and complete its special tokens.
pub(crate) fn build(
    cfg: &TransformerConfig,
    vb: VarBuilder<'static>,
    arch: Arch,
) -> Result<DiffusionTransformer> {
    check_tensor_list(cfg, &vb, arch)?;
    let w = HfWeights::from_var_builder(vb, arch).described(VAR_BUILDER);
    let mut model = DiffusionTransformer::new(cfg.clone(), &w, OpMode::Fused)?;
    let special = crate::special::complete_special(model.info(), None, None)?;
    model.set_special_tokens(special)?;
    Ok(model)
}

/// What `load()`'s layout check finds from a tensor list, found by asking the `VarBuilder` for
/// names (it cannot list its tensors): the block count, an LM head under a tied config, biases
/// under a config without them.
fn check_tensor_list(cfg: &TransformerConfig, vb: &VarBuilder<'_>, arch: Arch) -> Result<()> {
    let has = |r: Role| vb.contains_tensor(&r.hf_name(arch));
    let block = |i: usize| has(Role::AttnNorm(i)) || has(Role::Q(i)) || has(Role::Down(i));
    let layers_field = match arch {
        Arch::Llada => "n_layers",
        Arch::Dream => "num_hidden_layers",
    };
    let n = cfg.num_layers;
    // A backend that answers yes to every name (candle's `VarBuilder::zeros`) stops the count.
    let cap = n.saturating_add(1 << 16);
    let last_ok = n == 0 || block(n - 1);
    if !last_ok || block(n) {
        let held = (0..cap).find(|&i| !block(i)).unwrap_or(cap);
        return Err(Error::LayerCount {
            field: layers_field.into(),
            config: n,
            checkpoint: held,
            source_desc: VAR_BUILDER.into(),
        });
    }
    let head = Role::Head.hf_name(arch);
    if cfg.tie_word_embeddings && vb.contains_tensor(&head) {
        let field = match arch {
            Arch::Llada => "weight_tying",
            Arch::Dream => "tie_word_embeddings",
        };
        return Err(Error::UnexpectedTensors {
            names: vec![head.clone()],
            count: 1,
            source_desc: VAR_BUILDER.into(),
            hint: format!(
                " (`{head}` is an untied LM head, but the config's `{field}` is true: set it to \
                 false, or drop the tensor)"
            ),
        });
    }
    if !cfg.qkv_bias && n > 0 && has(Role::QBias(0)) {
        return Err(Error::UnexpectedTensors {
            names: vec![Role::QBias(0).hf_name(arch)],
            count: 1,
            source_desc: VAR_BUILDER.into(),
            hint: " (biases: the config declares none)".into(),
        });
    }
    Ok(())
}

/// The full-canvas forward of a candle-style model: a fresh sequence over the same weights, so
/// the model's own KV cache is neither read nor changed.
pub(crate) fn full_forward(model: &DiffusionTransformer, input_ids: &Tensor) -> Result<Tensor> {
    model.new_sequence()?.forward_full(input_ids, Rows::All)
}

/// A `VarBuilder` over memory-mapped safetensors files, like candle's
/// [`VarBuilder::from_mmaped_safetensors`], whose errors name the file and the tensor (a tensor
/// of the wrong shape: "FILE: tensor \`NAME\` has shape [..], the model expects [..]"; a missing
/// one: "tensor \`NAME\` not found in FILES"). The headers are checked as
/// [`crate::load`] checks them (every tensor inside its file, each tensor in one file) before
/// anything is mapped for reading.
///
/// # Safety
///
/// The files are memory-mapped: modifying them while the `VarBuilder` or a tensor read from it
/// is alive is undefined behaviour, as with candle's `from_mmaped_safetensors`.
///
/// ```
/// use dllm_models::candle_core::{DType, Device};
/// use dllm_models::{llada, safetensors_var_builder};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada"));
/// let mut cfg: llada::Config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
/// cfg.mlp_hidden_size = 256; // not the checkpoint's 384
/// let files = [dir.join("model.safetensors")];
/// // SAFETY: the file is not modified while mapped.
/// let vb = unsafe { safetensors_var_builder(&files, DType::F32, &Device::Cpu)? };
/// let e = llada::Model::new(&cfg, vb).unwrap_err().to_string();
/// assert!(e.contains("model.safetensors") && e.contains("model.transformer.blocks.0.ff_proj.weight"), "{e}");
/// # Ok(())
/// # }
/// ```
pub unsafe fn safetensors_var_builder<P: AsRef<Path>>(
    files: &[P],
    dtype: DType,
    device: &Device,
) -> Result<VarBuilder<'static>> {
    if files.is_empty() {
        return Err(Error::NoWeightFiles {
            purpose: "for the VarBuilder",
        });
    }
    let mut owner: HashMap<String, (PathBuf, Vec<usize>)> = HashMap::new();
    for f in files {
        let f = f.as_ref();
        for meta in crate::safetensors_header::read_file(f)? {
            if let Some((other, _)) = owner.get(&meta.name) {
                return Err(Error::file(
                    f,
                    format!(
                        "tensor `{}` is also in {}: a checkpoint holds each tensor once",
                        meta.name,
                        other.display()
                    ),
                ));
            }
            owner.insert(meta.name.clone(), (f.to_path_buf(), meta.shape.clone()));
        }
    }
    // SAFETY: the caller keeps the files unmodified while mapped (this function's contract).
    let inner = unsafe { MmapedSafetensors::multi(files) }.map_err(|e| {
        Error::file(
            files[0].as_ref(),
            format!("cannot map the safetensors files: {e}"),
        )
    })?;
    let desc = files
        .iter()
        .map(|p| p.as_ref().display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let backend = NamedFiles { inner, owner, desc };
    Ok(VarBuilder::from_backend(
        Box::new(backend),
        dtype,
        device.clone(),
    ))
}

/// [`safetensors_var_builder`]'s backend: candle's mmaped safetensors plus which file holds
/// which tensor, for the messages.
struct NamedFiles {
    inner: MmapedSafetensors,
    owner: HashMap<String, (PathBuf, Vec<usize>)>,
    desc: String,
}

impl NamedFiles {
    fn find(&self, name: &str) -> candle_core::Result<&(PathBuf, Vec<usize>)> {
        self.owner.get(name).ok_or_else(|| {
            candle_core::Error::Msg(format!("tensor `{name}` not found in {}", self.desc))
        })
    }

    fn read(
        &self,
        name: &str,
        file: &Path,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        self.inner
            .load(name, dev)
            .and_then(|t| t.to_dtype(dtype))
            .map_err(|e| {
                candle_core::Error::Msg(format!("{}: tensor `{name}`: {e}", file.display()))
            })
    }
}

impl SimpleBackend for NamedFiles {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let (file, shape) = self.find(name)?;
        if shape.as_slice() != s.dims() {
            return Err(candle_core::Error::Msg(format!(
                "{}: tensor `{name}` has shape {shape:?}, the model expects {:?}",
                file.display(),
                s.dims()
            )));
        }
        self.read(name, file, dtype, dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let (file, _) = self.find(name)?;
        self.read(name, file, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.owner.contains_key(name)
    }
}

macro_rules! candle_model {
    ($arch:expr, $name:literal, $module:literal, $shipped:literal) => {
        #[doc = concat!(
            "The ", $name, " model, built the candle-transformers way: [`Model::new`]`(&cfg, vb)` \
             over a [`candle_nn::VarBuilder`] with the checkpoint's tensors under their Hugging \
             Face names, and [`Model::forward`]`(&input_ids)` (also [`candle_nn::Module`]) for the \
             plain full-canvas forward.\n\n\
             It is a [`DiffusionLm`](crate::DiffusionLm) (the windowed, KV-cached forwards every \
             decoder of `dllm-decode` takes) and dereferences to \
             [`DiffusionTransformer`](crate::DiffusionTransformer) for the rest (`config()`, \
             `weights()`, `set_special_tokens`, ...). In method-call syntax the inherent \
             `forward` takes precedence; the windowed forward is \
             `DiffusionLm::forward(&mut model, &canvas, window, rows)`.\n\n\
             ```\n\
             use dllm_models::candle_core::{DType, Device, Tensor};\n\
             use dllm_models::candle_nn::VarBuilder;\n\
             use dllm_models::", $module, ";\n\n\
             # fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
             # let dir = std::path::Path::new(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/../models/", $shipped, "\"));\n\
             let cfg: ", $module, "::Config = serde_json::from_str(&std::fs::read_to_string(dir.join(\"config.json\"))?)?;\n\
             let files = [dir.join(\"model.safetensors\")];\n\
             // SAFETY: the file is not modified while mapped.\n\
             let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu)? };\n\
             let model = ", $module, "::Model::new(&cfg, vb)?;\n\
             let input_ids = Tensor::new(&[[2u32, 10, 11, 5, 5]], &Device::Cpu)?; // 5 is [MASK]\n\
             let logits = model.forward(&input_ids)?;\n\
             assert_eq!(logits.dims(), &[1, 5, model.info().vocab_size]);\n\
             # Ok(())\n\
             # }\n\
             ```"
        )]
        #[derive(Debug)]
        pub struct Model {
            inner: crate::transformer::DiffusionTransformer,
        }

        impl Model {
            #[doc = concat!(
                "Build ", $name, " for inference (CPU backend) from a [`candle_nn::VarBuilder`] \
                 with the checkpoint's tensors under their Hugging Face names (e.g. \
                 `unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu) }`, \
                 or [`crate::safetensors_var_builder`] for errors naming the file). The config is \
                 checked again (errors name the field), the VarBuilder's tensors against it \
                 (errors name the tensor), and special tokens follow [`crate::load`]'s rules."
            )]
            pub fn new(cfg: &Config, vb: candle_nn::VarBuilder<'static>) -> crate::Result<Self> {
                let cfg = cfg.transformer_config()?;
                Ok(Self {
                    inner: crate::candle_style::build(&cfg, vb, $arch)?,
                })
            }

            /// The plain full-canvas forward: `input_ids` `(batch, len)` u32 (prompt, decided
            /// tokens and `[MASK]`s) to `(batch, len, vocab)` f32 logits, every position attending
            /// to every other. It runs on a fresh sequence over the same weights: this model's
            /// KV cache is neither read nor changed.
            pub fn forward(
                &self,
                input_ids: &candle_core::Tensor,
            ) -> crate::Result<candle_core::Tensor> {
                crate::candle_style::full_forward(&self.inner, input_ids)
            }

            /// Static facts about the model (as [`crate::DiffusionLm::info`], without the import).
            pub fn info(&self) -> &crate::ModelInfo {
                crate::DiffusionLm::info(&self.inner)
            }

            /// Another sequence over the same weights (no copy; its own empty KV cache), e.g.
            /// for another thread.
            pub fn new_sequence(&self) -> crate::Result<Self> {
                Ok(Self {
                    inner: self.inner.new_sequence()?,
                })
            }

            /// The model as the crate's [`crate::DiffusionTransformer`].
            pub fn into_inner(self) -> crate::transformer::DiffusionTransformer {
                self.inner
            }
        }

        impl candle_nn::Module for Model {
            fn forward(&self, xs: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
                Model::forward(self, xs).map_err(Into::into)
            }
        }

        impl std::ops::Deref for Model {
            type Target = crate::transformer::DiffusionTransformer;
            fn deref(&self) -> &Self::Target {
                &self.inner
            }
        }

        impl std::ops::DerefMut for Model {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.inner
            }
        }

        impl From<Model> for crate::transformer::DiffusionTransformer {
            fn from(m: Model) -> Self {
                m.inner
            }
        }

        // Every method forwards, the provided ones too: the inner model overrides some of them
        // (`forward_with_refresh` runs its two paths on two threads, `rescore` scores all
        // positions in one pass). A method added to `DiffusionLm` needs its line here.
        impl crate::DiffusionLm for Model {
            fn token(&self) -> crate::SequenceToken {
                crate::DiffusionLm::token(&self.inner)
            }
            fn epoch(&self) -> u64 {
                crate::DiffusionLm::epoch(&self.inner)
            }
            fn info(&self) -> &crate::ModelInfo {
                crate::DiffusionLm::info(&self.inner)
            }
            fn device(&self) -> &candle_core::Device {
                crate::DiffusionLm::device(&self.inner)
            }
            fn forward(
                &mut self,
                canvas: &candle_core::Tensor,
                window: std::ops::Range<usize>,
                rows: crate::Rows<'_>,
            ) -> crate::Result<candle_core::Tensor> {
                crate::DiffusionLm::forward(&mut self.inner, canvas, window, rows)
            }
            fn commit(&mut self, range: std::ops::Range<usize>) -> crate::Result<()> {
                crate::DiffusionLm::commit(&mut self.inner, range)
            }
            fn cache_len(&self) -> usize {
                crate::DiffusionLm::cache_len(&self.inner)
            }
            fn truncate_cache(&mut self, len: usize) -> crate::Result<()> {
                crate::DiffusionLm::truncate_cache(&mut self.inner, len)
            }
            fn compute_refresh(
                &self,
                canvas: &candle_core::Tensor,
                positions: &[usize],
                logits: Option<&[usize]>,
            ) -> crate::Result<crate::Refresh> {
                crate::DiffusionLm::compute_refresh(&self.inner, canvas, positions, logits)
            }
            fn apply_refresh(&mut self, refresh: &crate::Refresh) -> crate::Result<()> {
                crate::DiffusionLm::apply_refresh(&mut self.inner, refresh)
            }
            fn rescore(
                &self,
                canvas: &candle_core::Tensor,
                positions: &[usize],
            ) -> crate::Result<candle_core::Tensor> {
                crate::DiffusionLm::rescore(&self.inner, canvas, positions)
            }
            fn forward_with_refresh(
                &mut self,
                canvas: &candle_core::Tensor,
                window: std::ops::Range<usize>,
                rows: crate::Rows<'_>,
                refresh: crate::RefreshRequest<'_>,
            ) -> crate::Result<(candle_core::Tensor, crate::Refresh)> {
                crate::DiffusionLm::forward_with_refresh(&mut self.inner, canvas, window, rows, refresh)
            }
            fn forward_full(
                &mut self,
                canvas: &candle_core::Tensor,
                rows: crate::Rows<'_>,
            ) -> crate::Result<candle_core::Tensor> {
                crate::DiffusionLm::forward_full(&mut self.inner, canvas, rows)
            }
            fn answer(&mut self, ask: &crate::Ask) -> crate::Result<crate::Answer> {
                crate::DiffusionLm::answer(&mut self.inner, ask)
            }
            fn clear_cache(&mut self) -> crate::Result<()> {
                crate::DiffusionLm::clear_cache(&mut self.inner)
            }
            fn refresh(
                &mut self,
                canvas: &candle_core::Tensor,
                positions: &[usize],
                logits: Option<&[usize]>,
            ) -> crate::Result<Option<candle_core::Tensor>> {
                crate::DiffusionLm::refresh(&mut self.inner, canvas, positions, logits)
            }
        }
    };
}
pub(crate) use candle_model;
