//! An independent `f64` forward of LLaDA and Dream in plain loops (no candle).
//!
//! Written from the model cards and the reference implementations (GSAI-ML/LLaDA `modeling_llada.py`,
//! Dream's Qwen2-derived `modeling_dream.py`), not from `dllm-models`:
//!
//! ```text
//! x = embed[ids]
//! per layer:  h = RMSNorm(x) ; q,k,v = h W^T (+ b, Dream) ; NeoX RoPE on q,k
//!             x = x + o_proj(softmax(q k^T / sqrt(head_dim)) v)      (bidirectional, GQA)
//!             n = RMSNorm(x) ; x = x + down(silu(gate(n)) * up(n))
//! logits = RMSNorm_f(x) head^T        (head = embedding when tied)
//! ```
//!
//! RMSNorm is `x / sqrt(mean(x^2) + eps) * w`; RoPE uses `inv_freq_i = theta^(-2i/d_head)` with the
//! angles duplicated over both halves of the head (`rotate_half`). Dream's predictions are
//! shifted: the distribution for position `i` is the raw output at `i - 1`, position 0 keeps its
//! own ([`Reference::forward`] applies it, [`Reference::forward_raw`] does not).

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::checkpoint::{read_json, Checkpoint, Tensor64};

/// The two supported model families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// LLaDA: OLMo-style names, unshifted logits.
    Llada,
    /// Dream: Qwen2 names, q/k/v biases, shifted logits.
    Dream,
}

/// Hyper-parameters read from `config.json` by this crate.
#[derive(Debug, Clone, PartialEq)]
pub struct RefConfig {
    /// Model family (from `model_type`).
    pub family: Family,
    /// Hidden size.
    pub hidden: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// MLP hidden size.
    pub ffn: usize,
    /// Rows of the embedding table / LM head.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE base.
    pub theta: f64,
    /// LM head tied to the embedding.
    pub tied: bool,
    /// Context length (`max_sequence_length` / `max_position_embeddings`).
    pub max_len: usize,
    /// `[MASK]` id.
    pub mask_id: u32,
    /// End of sequence id.
    pub eos_id: u32,
    /// Beginning of sequence id (config.json, else generation_config.json), when given.
    pub bos_id: Option<u32>,
}

fn req_u64(v: &Value, key: &str) -> Result<u64> {
    v.get(key)
        .and_then(Value::as_u64)
        .with_context(|| format!("config.json: `{key}` missing or not an integer"))
}

fn req_f64(v: &Value, key: &str) -> Result<f64> {
    v.get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("config.json: `{key}` missing or not a number"))
}

impl RefConfig {
    /// Read `dir/config.json` (and `generation_config.json` for a missing BOS).
    pub fn read(dir: &Path) -> Result<Self> {
        let v = read_json(&dir.join("config.json"))?;
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .context("config.json: no model_type")?
            .to_ascii_lowercase();
        let u = |k: &str| req_u64(&v, k).map(|x| x as usize);
        let opt_bool = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
        let mut cfg = match model_type.as_str() {
            "llada" => {
                let heads = u("n_heads")?;
                let vocab = match v.get("embedding_size").and_then(Value::as_u64) {
                    Some(e) => e as usize,
                    None => u("vocab_size")?,
                };
                Self {
                    family: Family::Llada,
                    hidden: u("d_model")?,
                    layers: u("n_layers")?,
                    heads,
                    kv_heads: v
                        .get("n_kv_heads")
                        .and_then(Value::as_u64)
                        .map_or(heads, |x| x as usize),
                    ffn: u("mlp_hidden_size")?,
                    vocab,
                    eps: req_f64(&v, "rms_norm_eps")?,
                    theta: req_f64(&v, "rope_theta")?,
                    tied: opt_bool("weight_tying"),
                    max_len: u("max_sequence_length")?,
                    mask_id: u("mask_token_id")? as u32,
                    eos_id: u("eos_token_id")? as u32,
                    bos_id: None,
                }
            }
            "dream" => {
                let heads = u("num_attention_heads")?;
                Self {
                    family: Family::Dream,
                    hidden: u("hidden_size")?,
                    layers: u("num_hidden_layers")?,
                    heads,
                    kv_heads: v
                        .get("num_key_value_heads")
                        .and_then(Value::as_u64)
                        .map_or(heads, |x| x as usize),
                    ffn: u("intermediate_size")?,
                    vocab: u("vocab_size")?,
                    eps: req_f64(&v, "rms_norm_eps")?,
                    theta: req_f64(&v, "rope_theta")?,
                    tied: opt_bool("tie_word_embeddings"),
                    max_len: u("max_position_embeddings")?,
                    mask_id: u("mask_token_id")? as u32,
                    eos_id: u("eos_token_id")? as u32,
                    bos_id: None,
                }
            }
            other => bail!("config.json: model_type `{other}` is neither llada nor dream"),
        };
        cfg.bos_id = v
            .get("bos_token_id")
            .and_then(Value::as_u64)
            .map(|x| x as u32);
        let gen = dir.join("generation_config.json");
        if cfg.bos_id.is_none() && gen.is_file() {
            cfg.bos_id = read_json(&gen)?
                .get("bos_token_id")
                .and_then(Value::as_u64)
                .map(|x| x as u32);
        }
        Ok(cfg)
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// Checkpoint tensor names of one family, spelled out from the model cards (REFERENCE §1/§2).
pub struct Names;

impl Names {
    /// Token embedding.
    pub fn embed(f: Family) -> String {
        match f {
            Family::Llada => "model.transformer.wte.weight".into(),
            Family::Dream => "model.embed_tokens.weight".into(),
        }
    }
    /// Final norm.
    pub fn final_norm(f: Family) -> String {
        match f {
            Family::Llada => "model.transformer.ln_f.weight".into(),
            Family::Dream => "model.norm.weight".into(),
        }
    }
    /// LM head.
    pub fn head(f: Family) -> String {
        match f {
            Family::Llada => "model.transformer.ff_out.weight".into(),
            Family::Dream => "lm_head.weight".into(),
        }
    }
    /// Layer `i`'s tensor with generic role `part`, one of `attn_norm q k v q_bias k_bias v_bias o
    /// ffn_norm gate up down`.
    pub fn layer(f: Family, i: usize, part: &str) -> String {
        let s = match (f, part) {
            (Family::Llada, "attn_norm") => "attn_norm.weight",
            (Family::Llada, "q") => "q_proj.weight",
            (Family::Llada, "k") => "k_proj.weight",
            (Family::Llada, "v") => "v_proj.weight",
            (Family::Llada, "o") => "attn_out.weight",
            (Family::Llada, "ffn_norm") => "ff_norm.weight",
            (Family::Llada, "gate") => "ff_proj.weight",
            (Family::Llada, "up") => "up_proj.weight",
            (Family::Llada, "down") => "ff_out.weight",
            (Family::Dream, "attn_norm") => "input_layernorm.weight",
            (Family::Dream, "q") => "self_attn.q_proj.weight",
            (Family::Dream, "k") => "self_attn.k_proj.weight",
            (Family::Dream, "v") => "self_attn.v_proj.weight",
            (Family::Dream, "q_bias") => "self_attn.q_proj.bias",
            (Family::Dream, "k_bias") => "self_attn.k_proj.bias",
            (Family::Dream, "v_bias") => "self_attn.v_proj.bias",
            (Family::Dream, "o") => "self_attn.o_proj.weight",
            (Family::Dream, "ffn_norm") => "post_attention_layernorm.weight",
            (Family::Dream, "gate") => "mlp.gate_proj.weight",
            (Family::Dream, "up") => "mlp.up_proj.weight",
            (Family::Dream, "down") => "mlp.down_proj.weight",
            (f, p) => panic!("no tensor `{p}` in {f:?}"),
        };
        match f {
            Family::Llada => format!("model.transformer.blocks.{i}.{s}"),
            Family::Dream => format!("model.layers.{i}.{s}"),
        }
    }
    /// Every tensor name a checkpoint of `cfg` holds.
    pub fn all(cfg: &RefConfig) -> Vec<String> {
        let f = cfg.family;
        let mut v = vec![Self::embed(f), Self::final_norm(f)];
        if !cfg.tied {
            v.push(Self::head(f));
        }
        let mut parts = vec![
            "attn_norm",
            "q",
            "k",
            "v",
            "o",
            "ffn_norm",
            "gate",
            "up",
            "down",
        ];
        if f == Family::Dream {
            parts.extend(["q_bias", "k_bias", "v_bias"]);
        }
        for i in 0..cfg.layers {
            v.extend(parts.iter().map(|p| Self::layer(f, i, p)));
        }
        v
    }
}

struct Layer {
    attn_norm: Tensor64,
    q: Tensor64,
    k: Tensor64,
    v: Tensor64,
    bias: Option<[Tensor64; 3]>,
    o: Tensor64,
    ffn_norm: Tensor64,
    gate: Tensor64,
    up: Tensor64,
    down: Tensor64,
}

/// Keys (after RoPE) and values of a forward: `k[layer][position]`, `kv_heads * head_dim` each.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// Keys.
    pub k: Vec<Vec<Vec<f64>>>,
    /// Values.
    pub v: Vec<Vec<Vec<f64>>>,
}

/// The reference model: config plus `f64` weights.
pub struct Reference {
    cfg: RefConfig,
    embed: Tensor64,
    final_norm: Tensor64,
    head: Tensor64,
    layers: Vec<Layer>,
}

fn take(t: &mut HashMap<String, Tensor64>, name: &str, shape: &[usize]) -> Result<Tensor64> {
    let x = t
        .get(name)
        .cloned()
        .with_context(|| format!("reference: tensor `{name}` missing"))?;
    if x.shape != shape {
        bail!(
            "reference: tensor `{name}` has shape {:?}, expected {shape:?}",
            x.shape
        );
    }
    Ok(x)
}

impl Reference {
    /// Load a checkpoint directory (`config.json` + safetensors).
    pub fn load(dir: &Path) -> Result<Self> {
        let cfg = RefConfig::read(dir)?;
        let ck = Checkpoint::read_dir(dir)?;
        Self::new(cfg, ck.tensors)
    }

    /// Build from a config and tensors keyed by HF name.
    pub fn new(cfg: RefConfig, mut t: HashMap<String, Tensor64>) -> Result<Self> {
        let f = cfg.family;
        let (h, hd, ff, v) = (cfg.hidden, cfg.head_dim(), cfg.ffn, cfg.vocab);
        let (nq, nkv) = (cfg.heads * hd, cfg.kv_heads * hd);
        let embed = take(&mut t, &Names::embed(f), &[v, h])?;
        let head = if cfg.tied {
            embed.clone()
        } else {
            take(&mut t, &Names::head(f), &[v, h])?
        };
        let final_norm = take(&mut t, &Names::final_norm(f), &[h])?;
        let mut layers = Vec::new();
        for i in 0..cfg.layers {
            let mut g = |p: &str, s: &[usize]| take(&mut t, &Names::layer(f, i, p), s);
            let bias = if f == Family::Dream {
                Some([
                    g("q_bias", &[nq])?,
                    g("k_bias", &[nkv])?,
                    g("v_bias", &[nkv])?,
                ])
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: g("attn_norm", &[h])?,
                q: g("q", &[nq, h])?,
                k: g("k", &[nkv, h])?,
                v: g("v", &[nkv, h])?,
                bias,
                o: g("o", &[h, nq])?,
                ffn_norm: g("ffn_norm", &[h])?,
                gate: g("gate", &[ff, h])?,
                up: g("up", &[ff, h])?,
                down: g("down", &[h, ff])?,
            });
        }
        Ok(Self {
            cfg,
            embed,
            final_norm,
            head,
            layers,
        })
    }

    /// The config.
    pub fn config(&self) -> &RefConfig {
        &self.cfg
    }

    /// Raw outputs (before any shift): `ids.len()` rows of `vocab` logits.
    pub fn forward_raw(&self, ids: &[u32]) -> Result<Vec<Vec<f64>>> {
        Ok(self.forward_core(ids, 0..ids.len(), None)?.0)
    }

    /// Raw outputs of the whole canvas and every layer's keys (after RoPE) and values: what a
    /// KV-cached model keeps from a full forward.
    pub fn forward_with_cache(&self, ids: &[u32]) -> Result<(Vec<Vec<f64>>, KvCache)> {
        self.forward_core(ids, 0..ids.len(), None)
    }

    /// Raw outputs of the positions in `window` of the canvas `ids`, whose queries attend to the
    /// window's own fresh keys and values plus those `cache` holds for the positions in `cached`
    /// (a KV-cached forward: Fast-dLLM's prefix cache has `cached = [0..window.start]`, its dual
    /// cache also the suffix after the window).
    pub fn forward_window(
        &self,
        ids: &[u32],
        window: Range<usize>,
        cache: &KvCache,
        cached: &[Range<usize>],
    ) -> Result<Vec<Vec<f64>>> {
        Ok(self.forward_core(ids, window, Some((cache, cached)))?.0)
    }

    fn forward_core(
        &self,
        ids: &[u32],
        window: Range<usize>,
        ext: Option<(&KvCache, &[Range<usize>])>,
    ) -> Result<(Vec<Vec<f64>>, KvCache)> {
        let c = &self.cfg;
        let hd = c.head_dim();
        let n = window.len();
        let mut x: Vec<Vec<f64>> = Vec::with_capacity(n);
        for &id in &ids[window.clone()] {
            if id as usize >= c.vocab {
                bail!(
                    "reference: token id {id} outside the vocabulary {}",
                    c.vocab
                );
            }
            x.push(self.embed.row(id as usize).to_vec());
        }
        let rep = c.heads / c.kv_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut record = KvCache::default();
        for (li, l) in self.layers.iter().enumerate() {
            let h: Vec<Vec<f64>> = x
                .iter()
                .map(|r| rms_norm(r, &l.attn_norm.data, c.eps))
                .collect();
            let mut q: Vec<Vec<f64>> = h.iter().map(|r| linear(&l.q, r)).collect();
            let mut k: Vec<Vec<f64>> = h.iter().map(|r| linear(&l.k, r)).collect();
            let mut v: Vec<Vec<f64>> = h.iter().map(|r| linear(&l.v, r)).collect();
            if let Some([bq, bk, bv]) = &l.bias {
                for t in 0..n {
                    add(&mut q[t], &bq.data);
                    add(&mut k[t], &bk.data);
                    add(&mut v[t], &bv.data);
                }
            }
            for t in 0..n {
                rope(&mut q[t], window.start + t, hd, c.theta);
                rope(&mut k[t], window.start + t, hd, c.theta);
            }
            // Keys and values attended to: the cached positions', then the window's own.
            let mut keys: Vec<(&[f64], &[f64])> = Vec::new();
            if let Some((cache, ranges)) = ext {
                for r in ranges {
                    for p in r.clone() {
                        keys.push((&cache.k[li][p], &cache.v[li][p]));
                    }
                }
            }
            keys.extend(k.iter().zip(&v).map(|(k, v)| (k.as_slice(), v.as_slice())));
            let mut attn = vec![vec![0.0; c.heads * hd]; n];
            for head in 0..c.heads {
                let kvh = head / rep; // Qwen2's repeat_kv: kv head j serves query heads j*rep..
                let qs = head * hd..(head + 1) * hd;
                let ks = kvh * hd..(kvh + 1) * hd;
                for t in 0..n {
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|(kk, _)| dot(&q[t][qs.clone()], &kk[ks.clone()]) * scale)
                        .collect();
                    let p = softmax(&scores);
                    for (ps, (_, vv)) in p.iter().zip(&keys) {
                        for (d, o) in attn[t][qs.clone()].iter_mut().enumerate() {
                            *o += ps * vv[kvh * hd + d];
                        }
                    }
                }
            }
            record.k.push(k.clone());
            record.v.push(v.clone());
            for t in 0..n {
                let o = linear(&l.o, &attn[t]);
                add(&mut x[t], &o);
                let m = rms_norm(&x[t], &l.ffn_norm.data, c.eps);
                let g = linear(&l.gate, &m);
                let u = linear(&l.up, &m);
                let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
                let d = linear(&l.down, &a);
                add(&mut x[t], &d);
            }
        }
        let rows = x
            .iter()
            .map(|r| linear(&self.head, &rms_norm(r, &self.final_norm.data, c.eps)))
            .collect();
        Ok((rows, record))
    }

    /// Predictions per position: raw outputs, shifted by one for Dream (position 0 keeps its own).
    pub fn forward(&self, ids: &[u32]) -> Result<Vec<Vec<f64>>> {
        let raw = self.forward_raw(ids)?;
        Ok(match self.cfg.family {
            Family::Llada => raw,
            Family::Dream => (0..raw.len())
                .map(|i| raw[i.saturating_sub(1)].clone())
                .collect(),
        })
    }
}

/// `x / sqrt(mean(x^2) + eps) * w`.
pub fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * w).collect()
}

/// `W x` for `W` of shape `(out, in)`.
pub fn linear(w: &Tensor64, x: &[f64]) -> Vec<f64> {
    (0..w.shape[0]).map(|o| dot(w.row(o), x)).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

fn add(a: &mut [f64], b: &[f64]) {
    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Numerically stable softmax.
pub fn softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// NeoX rotate-half RoPE on every head of `x` (concatenated heads of `hd`) at position `pos`.
fn rope(x: &mut [f64], pos: usize, hd: usize, theta: f64) {
    let half = hd / 2;
    for head in x.chunks_exact_mut(hd) {
        for i in 0..half {
            let a = pos as f64 * theta.powf(-(2.0 * i as f64) / hd as f64);
            let (c, s) = (a.cos(), a.sin());
            let (x1, x2) = (head[i], head[i + half]);
            head[i] = x1 * c - x2 * s;
            head[i + half] = x2 * c + x1 * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_each_element_with_its_partner_half_a_head_away() {
        // head_dim 4: element 0 pairs with element 2 (NeoX), not with element 1 (interleaved).
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope(&mut x, 1, 4, 10_000.0);
        let (c, s) = (1f64.cos(), 1f64.sin());
        let want = [c, 0.0, s, 0.0];
        assert!(
            x.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-15),
            "{x:?}"
        );
        // Second frequency: theta^(-2/4) = 0.01 rad per position.
        let mut y = vec![0.0, 1.0, 0.0, 0.0];
        rope(&mut y, 3, 4, 10_000.0);
        let want = [0.0, 0.03f64.cos(), 0.0, 0.03f64.sin()];
        assert!(
            y.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-15),
            "{y:?}"
        );
    }

    #[test]
    fn rope_scores_depend_only_on_relative_position() {
        let q: Vec<f64> = (0..16).map(|i| (i as f64 * 0.37).sin()).collect();
        let k: Vec<f64> = (0..16).map(|i| (i as f64 * 0.91).cos()).collect();
        let score = |m: usize, n: usize| {
            let (mut a, mut b) = (q.clone(), k.clone());
            rope(&mut a, m, 8, 500_000.0);
            rope(&mut b, n, 8, 500_000.0);
            dot(&a, &b)
        };
        assert!((score(7, 2) - score(12, 7)).abs() < 1e-12);
        assert!(
            (score(7, 2) - score(2, 7)).abs() > 1e-6,
            "test vectors too symmetric"
        );
    }

    #[test]
    fn norm_and_softmax() {
        let y = rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0);
        let r = (12.5f64).sqrt();
        assert!((y[0] - 3.0 / r).abs() < 1e-15 && (y[1] - 8.0 / r).abs() < 1e-15);
        let p = softmax(&[1000.0, 1000.0, f64::NEG_INFINITY]);
        assert_eq!(p, vec![0.5, 0.5, 0.0]);
    }
}
