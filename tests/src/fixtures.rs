//! Small shared helpers: temporary directories, tiny checkpoints on disk, model logits as plain
//! vectors, and the error metric every comparison uses.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use candle_hexagon::{HexagonConfig, HexagonDevice};
use dllm_models::synthetic::{random_weights, write_hf};
use dllm_models::{
    Backend, DiffusionLm, LoadOptions, LoadedModel, ModelSource, Rows, TransformerConfig,
};

/// A directory under `std::env::temp_dir()` removed on drop; the name is unique per process, call
/// and time, so parallel tests never share one.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Create `llada-tests-{tag}-{pid}-{n}-{nanos}`.
    pub fn new(tag: &str) -> Result<Self> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "llada-tests-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `path/name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Write `cfg` with `random_weights(cfg, seed)` into `dir` (stored as `dtype`, in `shards` files),
/// plus a `generation_config.json` carrying BOS (which LLaDA's `config.json` does not).
pub fn write_model(
    dir: &Path,
    cfg: &TransformerConfig,
    seed: u64,
    dtype: DType,
    shards: usize,
) -> Result<()> {
    let w = random_weights(cfg, seed)?;
    write_hf(dir, cfg, &w, dtype, shards)?;
    if let Some(bos) = cfg.special.bos {
        let gen = serde_json::json!({ "bos_token_id": bos, "eos_token_id": cfg.special.eos });
        std::fs::write(
            dir.join("generation_config.json"),
            serde_json::to_string(&gen)?,
        )?;
    }
    Ok(())
}

/// A fresh temporary directory holding a tiny checkpoint (f32, one file).
pub fn tiny_dir(tag: &str, cfg: &TransformerConfig, seed: u64) -> Result<TempDir> {
    let d = TempDir::new(tag)?;
    write_model(d.path(), cfg, seed, DType::F32, 1)?;
    Ok(d)
}

/// Load any path through the public entry point, `ModelSource::parse` + `dllm_models::load`.
pub fn load_path(path: &Path, opts: &LoadOptions) -> dllm_models::Result<LoadedModel> {
    let spec = path.to_str().expect("temp paths are UTF-8");
    dllm_models::load(&ModelSource::parse(spec)?, opts)
}

/// Load with default options (f32 on CPU).
pub fn load_default(path: &Path) -> dllm_models::Result<LoadedModel> {
    load_path(path, &LoadOptions::default())
}

/// One of the repository's shipped models (`models/<name>`) on `backend`; panics naming it when
/// it is missing.
pub fn shipped(name: &str, backend: Backend) -> LoadedModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(name);
    load_path(
        &dir,
        &LoadOptions {
            backend,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{name} must be in the repository: {e}"))
}

/// The emulated Hexagon device with an address window of `window_bytes`.
pub fn hexagon(window_bytes: u64) -> Backend {
    Backend::Hexagon(
        HexagonDevice::open(HexagonConfig {
            va_window_bytes: window_bytes,
            ..Default::default()
        })
        .expect("the emulated Hexagon device opens"),
    )
}

/// A `(1, len)` canvas tensor.
pub fn canvas(ids: &[u32]) -> Tensor {
    Tensor::from_vec(ids.to_vec(), (1, ids.len()), &Device::Cpu).expect("canvas")
}

/// Deterministic token ids in `[0, vocab)`, with a few `mask` ids sprinkled in (every fifth
/// position), as a decoding canvas has.
pub fn ids(len: usize, vocab: u32, mask: u32, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            if i % 5 == 4 {
                mask
            } else {
                (i.wrapping_mul(73).wrapping_add(salt * 31 + 5)) % vocab
            }
        })
        .collect()
}

/// `(1, rows, vocab)` logits as rows of `f64`.
pub fn rows_of(t: &Tensor) -> Result<Vec<Vec<f64>>> {
    let v: Vec<Vec<f32>> = t.squeeze(0)?.to_dtype(DType::F32)?.to_vec2()?;
    Ok(v.into_iter()
        .map(|r| r.into_iter().map(f64::from).collect())
        .collect())
}

/// Full-canvas logits of a loaded model.
pub fn full_logits(model: &mut dyn DiffusionLm, ids: &[u32]) -> Result<Vec<Vec<f64>>> {
    rows_of(&model.forward_full(&canvas(ids), Rows::All)?)
}

/// The comparison metric: `max |a - b| / max |b|` over all entries (`b` is the expected side).
pub fn rel_err(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len(), "row counts differ");
    let mut num = 0f64;
    let mut den = 0f64;
    for (ra, rb) in a.iter().zip(b) {
        assert_eq!(ra.len(), rb.len(), "row widths differ");
        for (x, y) in ra.iter().zip(rb) {
            num = num.max((x - y).abs());
            den = den.max(y.abs());
        }
    }
    num / den
}

/// Fraction of rows whose argmax agrees.
pub fn argmax_agreement(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    let same = a
        .iter()
        .zip(b)
        .filter(|(x, y)| crate::generate::argmax(x) == crate::generate::argmax(y))
        .count();
    same as f64 / a.len() as f64
}
