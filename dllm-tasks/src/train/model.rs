//! The trainable model: config for the suite's vocabulary, seeded initialisation into a
//! `candle_nn::VarMap`, and the inference copy used for evaluation during training.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use dllm_models::lm::{Arch, SpecialTokens};
use dllm_models::weights::HfWeights;
use dllm_models::{dream, llada, DiffusionTransformer, OpMode, TransformerConfig};

use crate::rng::Rng;
use crate::tokenizer::{BOS_ID, EOS_ID, MASK_ID, PAD_ID};
use crate::{Error, Result};

/// Shape of a suite model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// LLaDA or Dream layout.
    pub arch: Arch,
    /// Hidden size.
    pub hidden: usize,
    /// Blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// MLP hidden size.
    pub ffn: usize,
}

/// Longest canvas a suite model accepts (prompt <= 24 tokens plus generous generation lengths).
pub const SUITE_MAX_SEQ_LEN: usize = 256;

/// The full config of a suite model with `vocab` tokens and the suite's special ids.
pub fn suite_config(shape: ModelShape, vocab: usize) -> Result<TransformerConfig> {
    let dream = shape.arch == Arch::Dream;
    let cfg = TransformerConfig {
        arch: shape.arch,
        hidden_size: shape.hidden,
        num_layers: shape.layers,
        num_heads: shape.heads,
        num_kv_heads: shape.kv_heads,
        intermediate_size: shape.ffn,
        vocab_size: vocab,
        rms_norm_eps: if dream { 1e-6 } else { 1e-5 },
        rope_theta: 10_000.0,
        qkv_bias: dream,
        tie_word_embeddings: false,
        shift_logits: dream,
        max_seq_len: SUITE_MAX_SEQ_LEN,
        special: SpecialTokens {
            mask: MASK_ID,
            eos: EOS_ID,
            eot: None,
            bos: Some(BOS_ID),
            pad: Some(PAD_ID),
        },
    };
    cfg.validate(if dream { &dream::NAMES } else { &llada::NAMES })?;
    Ok(cfg)
}

fn is_output_projection(name: &str) -> bool {
    name.contains("attn_out")
        || name.contains("o_proj")
        || name.contains("down_proj")
        || (name.contains(".blocks.") && name.ends_with("ff_out.weight"))
}

fn is_vocab_matrix(name: &str) -> bool {
    name.contains("wte")
        || name.contains("embed_tokens")
        || name == "model.transformer.ff_out.weight"
        || name == "lm_head.weight"
}

/// Seeded initialisation (candle's CPU RNG cannot be seeded): embedding and LM head N(0, 0.02),
/// other matrices N(0, 1/fan_in), the residual outputs (attention out, MLP down) further scaled by
/// 1/sqrt(2 layers); norms 1, biases 0. Inserts every parameter into `varmap` under its HF name.
pub fn init_varmap(varmap: &VarMap, cfg: &TransformerConfig, seed: u64) -> Result<()> {
    let shapes: std::collections::HashMap<String, Vec<usize>> = cfg
        .param_shapes()
        .into_iter()
        .map(|(role, dims)| (role.hf_name(cfg.arch), dims))
        .collect();
    let mut rng = Rng::new(seed);
    let mut names: Vec<&String> = shapes.keys().collect();
    names.sort();
    let mut data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Train("variable map lock poisoned".into()))?;
    for name in names {
        let dims = shapes[name].clone();
        let n: usize = dims.iter().product();
        let values: Vec<f32> = if name.ends_with("norm.weight") || name.ends_with("ln_f.weight") {
            vec![1.0; n]
        } else if dims.len() == 1 {
            vec![0.0; n]
        } else {
            let std = if is_vocab_matrix(name) {
                0.02
            } else {
                let base = 1.0 / (dims[1] as f64).sqrt();
                if is_output_projection(name) {
                    base / (2.0 * cfg.num_layers as f64).sqrt()
                } else {
                    base
                }
            };
            (0..n).map(|_| (rng.normal() * std) as f32).collect()
        };
        let t = Tensor::from_vec(values, dims, &Device::Cpu)?;
        data.insert(name.clone(), Var::from_tensor(&t)?);
    }
    Ok(())
}

/// The model over the variables of `varmap`, with differentiable ops.
pub fn trainable(varmap: &VarMap, cfg: &TransformerConfig) -> Result<DiffusionTransformer> {
    let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
    Ok(DiffusionTransformer::new(
        cfg.clone(),
        &HfWeights::from_var_builder(vb, cfg.arch),
        OpMode::Differentiable,
    )?)
}

/// A fused-op inference copy of the current weights (for evaluation during training).
pub fn inference_copy(varmap: &VarMap, cfg: &TransformerConfig) -> Result<DiffusionTransformer> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Train("variable map lock poisoned".into()))?;
    let map = data
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
        .collect();
    let w = HfWeights::from_tensors(map, cfg.arch, DType::F32, &Device::Cpu);
    Ok(DiffusionTransformer::new(cfg.clone(), &w, OpMode::Fused)?)
}

/// `(name, variable)` pairs of `varmap`, sorted by name.
pub fn named_vars(varmap: &VarMap) -> Result<Vec<(String, Var)>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Train("variable map lock poisoned".into()))?;
    let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

/// What [`init_from`] copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmStart {
    /// Parameters copied whole.
    pub copied: usize,
    /// Vocabulary-sized matrices (embedding, LM head) copied row by row, each token's row taken
    /// from the source row of the same token string; the rows of new tokens keep their fresh
    /// initialisation.
    pub extended: usize,
    /// The source model's vocabulary size.
    pub old_vocab: usize,
    /// Tokens whose id differs between the two tokenizers (their rows moved).
    pub moved: usize,
}

/// Warm start: overwrite the variables of `varmap` (a freshly initialised model for `vocab`
/// tokens) with the weights of the HF checkpoint `dir` of the same architecture and shape. Every
/// source token must exist in the new tokenizer `new_tok` (checked); embedding and LM-head rows
/// are matched by token string, so they keep their meaning even when ids moved (the long suite's
/// tokenizer appends its words in corpus order, which shifts when a generator changes); rows of
/// new tokens keep their initialisation. Any other mismatch is an error naming the tensor.
pub fn init_from(
    varmap: &VarMap,
    dir: &std::path::Path,
    new_tok: &tokenizers::Tokenizer,
) -> Result<WarmStart> {
    let old_tok = crate::tokenizer::load(dir.join("tokenizer.json"))?;
    let old_vocab = old_tok.get_vocab_size(true);
    let new_vocab = new_tok.get_vocab_size(true);
    // new id -> source id, for the tokens both vocabularies have.
    let mut row_source: Vec<Option<u32>> = vec![None; new_vocab];
    let mut moved = 0;
    for (token, id) in old_tok.get_vocab(true) {
        match new_tok.token_to_id(&token) {
            Some(new_id) if (new_id as usize) < new_vocab => {
                row_source[new_id as usize] = Some(id);
                moved += usize::from(new_id != id);
            }
            _ => {
                return Err(Error::Train(format!(
                    "{}: token {token:?} (id {id} there) is not in the new tokenizer; the new vocabulary must extend the old one",
                    dir.display(),
                )))
            }
        }
    }
    let mut source = std::collections::HashMap::new();
    for file in dllm_models::source::weight_files(dir)? {
        let t = candle_core::safetensors::load(&file, &Device::Cpu)
            .map_err(|e| Error::Train(format!("{}: {e}", file.display())))?;
        source.extend(t);
    }
    let data = varmap
        .data()
        .lock()
        .map_err(|_| Error::Train("variable map lock poisoned".into()))?;
    let mut report = WarmStart {
        copied: 0,
        extended: 0,
        old_vocab,
        moved,
    };
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in names {
        let var = &data[name];
        let src = source.get(name).ok_or_else(|| {
            Error::Train(format!(
                "{}: no tensor `{name}` to start from",
                dir.display()
            ))
        })?;
        let src = src.to_dtype(DType::F32)?;
        let (want, got) = (var.dims().to_vec(), src.dims().to_vec());
        let vocab_rows = is_vocab_matrix(name)
            && want.len() == 2
            && got.len() == 2
            && want[1] == got[1]
            && got[0] == old_vocab
            && want[0] == new_vocab;
        if vocab_rows && (moved > 0 || want[0] != got[0]) {
            let fresh = var.as_tensor();
            let rows = row_source
                .iter()
                .enumerate()
                .map(|(i, src_row)| match src_row {
                    Some(j) => src.narrow(0, *j as usize, 1),
                    None => fresh.narrow(0, i, 1),
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            var.set(&Tensor::cat(&rows, 0)?)?;
            report.extended += 1;
        } else if want == got {
            var.set(&src)?;
            report.copied += 1;
        } else {
            return Err(Error::Train(format!(
                "{}: tensor `{name}` has shape {got:?}, the model being trained needs {want:?}",
                dir.display()
            )));
        }
    }
    if source.len() != data.len() {
        return Err(Error::Train(format!(
            "{}: {} tensors, the model being trained has {}",
            dir.display(),
            source.len(),
            data.len()
        )));
    }
    Ok(report)
}
