//! Reading HF checkpoints without `dllm-models`: `config.json` through `serde_json`, tensors through
//! the `safetensors` crate, every value widened to `f64` (bf16/f16/f32 on disk).
//!
//! Sharded checkpoints are followed through `model.safetensors.index.json`'s `weight_map`, exactly
//! as `transformers` does.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// A dense row-major tensor in `f64`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor64 {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f64>,
}

impl Tensor64 {
    /// Row `r` of a 2-D tensor.
    pub fn row(&self, r: usize) -> &[f64] {
        let cols = self.shape[1];
        &self.data[r * cols..(r + 1) * cols]
    }
}

/// Every tensor of a checkpoint directory, by its name in the files.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Tensors by checkpoint name.
    pub tensors: HashMap<String, Tensor64>,
}

impl Checkpoint {
    /// Read `model.safetensors`, or every shard named by `model.safetensors.index.json`.
    pub fn read_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<String> = if index.is_file() {
            let v = read_json(&index)?;
            let map = v
                .get("weight_map")
                .and_then(Value::as_object)
                .context("index has no weight_map")?;
            let mut f: Vec<String> = map
                .values()
                .map(|v| v.as_str().map(String::from).context("weight_map value"))
                .collect::<Result<_>>()?;
            f.sort();
            f.dedup();
            f
        } else {
            vec!["model.safetensors".to_string()]
        };
        let mut tensors = HashMap::new();
        for f in files {
            tensors.extend(read_safetensors(&dir.join(f))?);
        }
        Ok(Self { tensors })
    }

    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Result<&Tensor64> {
        self.tensors
            .get(name)
            .with_context(|| format!("checkpoint has no tensor `{name}`"))
    }
}

/// Parse a JSON file.
pub fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
}

/// All tensors of one safetensors file, widened to `f64`.
pub fn read_safetensors(path: &Path) -> Result<HashMap<String, Tensor64>> {
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("{}", path.display()))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let raw = view.data();
        let data: Vec<f64> = match view.dtype() {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            other => bail!("{}: tensor `{name}` has dtype {other:?}", path.display()),
        };
        let shape = view.shape().to_vec();
        if data.len() != shape.iter().product::<usize>() {
            bail!("{}: tensor `{name}` size mismatch", path.display());
        }
        out.insert(name, Tensor64 { shape, data });
    }
    Ok(out)
}
