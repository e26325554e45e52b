//! Writing the model so that an interrupted or failed run never leaves the output directory
//! unloadable: nothing of the model is written before training ends; then every file
//! (`config.json`, `generation_config.json`, `tokenizer.json`, `model.safetensors`,
//! `train_args.json`) is written in full to a temporary name beside its final one and synced, and
//! only then renamed into place, weights first. Each rename is atomic; the renames of one save
//! follow each other within microseconds. An existing model is replaced only with `--overwrite`
//! (or continued with `--resume`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The files that make a loadable model (what `--overwrite` guards).
pub const MODEL_FILES: [&str; 4] = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "generation_config.json",
];

/// Error unless `out` may receive a model: empty or absent, or holding one that `--overwrite`
/// replaces or `--resume` continues.
pub fn check_out(out: &Path, overwrite: bool, resume: bool) -> Result<()> {
    if out.exists() && !out.is_dir() {
        bail!("--out {}: exists and is not a directory", out.display());
    }
    let existing: Vec<&str> = MODEL_FILES
        .iter()
        .copied()
        .filter(|f| out.join(f).exists())
        .collect();
    if !existing.is_empty() && !overwrite && !resume {
        bail!(
            "--out {} already holds a model ({}): pass --overwrite to replace it, or --resume to continue its training",
            out.display(),
            existing.join(", ")
        );
    }
    if resume && !out.join("checkpoint").join("state.json").is_file() {
        bail!(
            "--resume: {} has no training state to resume from",
            out.join("checkpoint").join("state.json").display()
        );
    }
    Ok(())
}

/// Files staged under temporary names, renamed into place by [`Staged::commit`]; dropped
/// uncommitted, they are removed.
pub struct Staged {
    files: Vec<(PathBuf, PathBuf)>,
}

impl Staged {
    /// Nothing staged yet.
    pub fn new() -> Self {
        Self { files: Vec::new() }
    }

    fn tmp(path: &Path) -> PathBuf {
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".partial-{}", std::process::id()));
        path.with_file_name(name)
    }

    /// Stage `bytes` for `path`.
    pub fn bytes(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        let tmp = Self::tmp(path);
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        self.push(path, tmp)
    }

    /// Stage a file written by `write` (given the temporary path) for `path`.
    pub fn with(&mut self, path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        let tmp = Self::tmp(path);
        write(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        self.push(path, tmp)
    }

    fn push(&mut self, path: &Path, tmp: PathBuf) -> Result<()> {
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", tmp.display()))?;
        self.files.push((tmp, path.to_path_buf()));
        Ok(())
    }

    /// Rename everything into place, in staging order.
    pub fn commit(mut self) -> Result<()> {
        for (tmp, path) in std::mem::take(&mut self.files) {
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (tmp, _) in &self.files {
            let _ = std::fs::remove_file(tmp);
        }
    }
}
