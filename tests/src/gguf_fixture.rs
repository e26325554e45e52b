//! GGUF files laid out the way llama.cpp's `convert_hf_to_gguf.py` writes `LLaDAModelLM` and Dream,
//! made from an HF checkpoint directory read by [`crate::checkpoint`].
//!
//! * metadata: `general.architecture` (`llada` / `dream`) and the `{arch}.*` hyper-parameters,
//!   `{arch}.attention.causal = false`, `diffusion.shift_logits` (false for LLaDA, true for Dream),
//!   `tokenizer.ggml.{mask,eos,bos}_token_id`;
//! * tensors: `token_embd`, `output_norm`, `output`, `blk.N.{attn_norm, attn_q, attn_k, attn_v,
//!   attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}` (+ `attn_{q,k,v}.bias` for Dream);
//! * LLaDA's q and k rows are permuted for llama.cpp's interleaved RoPE, literally as the
//!   converter's `LlamaModel.permute` does:
//!   `w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)`;
//! * 2-D weights are stored in the requested GGML type, 1-D norms and biases as F32.
//!
//! Nothing here calls `dllm_models::gguf`; only candle's GGUF writer and quantizer are used.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::checkpoint::{Checkpoint, Tensor64};
use crate::reference::{Family, Names, RefConfig};

/// `LlamaModel.permute` on a row-major `(rows, cols)` matrix: output row `h*hd + 2j + t` is input
/// row `h*hd + t*(hd/2) + j` (the numpy reshape/swapaxes written out as index arithmetic).
pub fn llama_permute(w: &[f32], rows: usize, cols: usize, n_head: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols);
    let half = rows / n_head / 2;
    let mut out = vec![0f32; rows * cols];
    // numpy view: w[h][t][j][c] with shape (n_head, 2, half, cols); swapaxes(1, 2) gives
    // out[h][j][t][c] = w[h][t][j][c].
    for h in 0..n_head {
        for t in 0..2 {
            for j in 0..half {
                let src = ((h * 2 + t) * half + j) * cols;
                let dst = ((h * half + j) * 2 + t) * cols;
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

/// What a GGUF fixture holds, besides the file.
pub struct GgufFixture {
    /// For every HF tensor name, the values the GGUF really stores after dequantization, in HF row
    /// order (quantization is per row, so it commutes with the q/k row permutation). A reference
    /// forward on these isolates the error of the quantized *activations*.
    pub effective: HashMap<String, Tensor64>,
}

fn meta_u32(v: usize) -> Value {
    Value::U32(v as u32)
}

/// Write `out` from the checkpoint in `hf_dir`, 2-D weights as `dtype`.
pub fn write_gguf(hf_dir: &Path, out: &Path, dtype: GgmlDType) -> Result<GgufFixture> {
    let cfg = RefConfig::read(hf_dir)?;
    let ck = Checkpoint::read_dir(hf_dir)?;
    write_gguf_with(&cfg, &ck, out, dtype, |_, _| {})
}

/// Metadata entries of a fixture, in file order.
pub type Metadata = Vec<(String, Value)>;
/// Tensors of a fixture, in file order.
pub type Tensors = Vec<(String, QTensor)>;

/// Like [`write_gguf`], letting `edit` change the metadata and tensors just before they are
/// written (to make broken files: a foreign architecture, a missing key or tensor, ...).
pub fn write_gguf_with(
    cfg: &RefConfig,
    ck: &Checkpoint,
    out: &Path,
    dtype: GgmlDType,
    edit: impl FnOnce(&mut Metadata, &mut Tensors),
) -> Result<GgufFixture> {
    let f = cfg.family;
    let arch = match f {
        Family::Llada => "llada",
        Family::Dream => "dream",
    };
    let k = |s: &str| format!("{arch}.{s}");
    let mut meta: Metadata = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(format!("tiny-{arch}"))),
        (k("block_count"), meta_u32(cfg.layers)),
        (k("context_length"), meta_u32(cfg.max_len)),
        (k("embedding_length"), meta_u32(cfg.hidden)),
        (k("feed_forward_length"), meta_u32(cfg.ffn)),
        (k("attention.head_count"), meta_u32(cfg.heads)),
        (k("attention.head_count_kv"), meta_u32(cfg.kv_heads)),
        (k("rope.freq_base"), Value::F32(cfg.theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.eps as f32),
        ),
        (k("vocab_size"), meta_u32(cfg.vocab)),
        (k("rope.dimension_count"), meta_u32(cfg.head_dim())),
        (k("attention.causal"), Value::Bool(false)),
        (
            "diffusion.shift_logits".into(),
            Value::Bool(f == Family::Dream),
        ),
        (
            "tokenizer.ggml.mask_token_id".into(),
            Value::U32(cfg.mask_id),
        ),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(cfg.eos_id)),
    ];
    if let Some(bos) = cfg.bos_id {
        meta.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(bos)));
    }

    // (gguf name, hf name, permute with this many heads)
    let mut plan: Vec<(String, String, Option<usize>)> = vec![
        ("token_embd.weight".into(), Names::embed(f), None),
        ("output_norm.weight".into(), Names::final_norm(f), None),
    ];
    if !cfg.tied {
        plan.push(("output.weight".into(), Names::head(f), None));
    }
    let permute = |heads: usize| (f == Family::Llada).then_some(heads);
    for i in 0..cfg.layers {
        let b = |s: &str| format!("blk.{i}.{s}");
        let l = |p: &str| Names::layer(f, i, p);
        plan.extend([
            (b("attn_norm.weight"), l("attn_norm"), None),
            (b("attn_q.weight"), l("q"), permute(cfg.heads)),
            (b("attn_k.weight"), l("k"), permute(cfg.kv_heads)),
            (b("attn_v.weight"), l("v"), None),
            (b("attn_output.weight"), l("o"), None),
            (b("ffn_norm.weight"), l("ffn_norm"), None),
            (b("ffn_gate.weight"), l("gate"), None),
            (b("ffn_up.weight"), l("up"), None),
            (b("ffn_down.weight"), l("down"), None),
        ]);
        if f == Family::Dream {
            plan.extend([
                (b("attn_q.bias"), l("q_bias"), None),
                (b("attn_k.bias"), l("k_bias"), None),
                (b("attn_v.bias"), l("v_bias"), None),
            ]);
        }
    }

    let dev = Device::Cpu;
    let mut tensors: Tensors = Vec::new();
    let mut effective = HashMap::new();
    for (gguf_name, hf_name, perm) in plan {
        let t = ck.get(&hf_name)?;
        let data: Vec<f32> = t.data.iter().map(|&v| v as f32).collect();
        let ty = if t.shape.len() == 2 {
            dtype
        } else {
            GgmlDType::F32
        };
        // The values the file will hold, in HF order.
        let hf_q = QTensor::quantize(&Tensor::from_vec(data.clone(), t.shape.clone(), &dev)?, ty)?;
        let deq: Vec<f32> = hf_q.dequantize(&dev)?.flatten_all()?.to_vec1()?;
        effective.insert(
            hf_name.clone(),
            Tensor64 {
                shape: t.shape.clone(),
                data: deq.iter().map(|&v| v as f64).collect(),
            },
        );
        let stored = match perm {
            Some(heads) => {
                let (rows, cols) = (t.shape[0], t.shape[1]);
                let p = llama_permute(&data, rows, cols, heads);
                QTensor::quantize(&Tensor::from_vec(p, (rows, cols), &dev)?, ty)?
            }
            None => hf_q,
        };
        tensors.push((gguf_name, stored));
    }
    edit(&mut meta, &mut tensors);
    let mut file = std::fs::File::create(out).with_context(|| format!("{}", out.display()))?;
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
    Ok(GgufFixture { effective })
}
