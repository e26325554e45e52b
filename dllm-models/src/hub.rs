//! Hugging Face model ids through `hf-hub`'s cache (`$HF_HOME/hub/models--{owner}--{name}`).
//!
//! Files already in the cache are used without any network access; others are downloaded unless
//! `HF_HUB_OFFLINE=1`. A file that is neither cached nor downloadable is an error naming it.

use std::path::PathBuf;

use hf_hub::{Cache, Repo, RepoType};

use crate::{Error, Result};

/// A model repository on the Hub (or in its local cache).
#[derive(Debug, Clone)]
pub struct HubRepo {
    id: String,
    revision: String,
    cache: Cache,
    offline: bool,
}

fn env_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        .unwrap_or(false)
}

impl HubRepo {
    /// `id` is `owner/name`; the cache comes from `HF_HOME` (or `~/.cache/huggingface`).
    pub fn new(id: &str, revision: Option<&str>) -> Self {
        Self {
            id: id.to_string(),
            revision: revision.unwrap_or("main").to_string(),
            cache: Cache::from_env(),
            offline: env_offline(),
        }
    }

    /// Use an explicit cache directory (the `hub` folder) and offline mode.
    pub fn with_cache(mut self, cache_dir: PathBuf, offline: bool) -> Self {
        self.cache = Cache::new(cache_dir);
        self.offline = offline;
        self
    }

    /// The repo id.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn repo(&self) -> Repo {
        Repo::with_revision(self.id.clone(), RepoType::Model, self.revision.clone())
    }

    /// Path of `file`, from the cache or downloaded.
    pub fn get(&self, file: &str) -> Result<PathBuf> {
        if let Some(p) = self.cache.repo(self.repo()).get(file) {
            return Ok(p);
        }
        // A download pinned to a commit writes `snapshots/<sha>/` but no `refs/` entry.
        if self.revision.len() == 40 && self.revision.chars().all(|c| c.is_ascii_hexdigit()) {
            let p = self
                .cache
                .path()
                .join(Repo::model(self.id.clone()).folder_name())
                .join("snapshots")
                .join(&self.revision)
                .join(file);
            if p.exists() {
                return Ok(p);
            }
        }
        let where_ = format!("the Hugging Face cache at {}", self.cache.path().display());
        if self.offline {
            return Err(Error::Source {
                source_desc: self.id.clone(),
                reason: format!("`{file}` is not in {where_} and offline mode is on (HF_HUB_OFFLINE or an offline cache)"),
            });
        }
        let api = hf_hub::api::sync::ApiBuilder::from_cache(self.cache.clone())
            .with_progress(true)
            .build()
            .map_err(|e| Error::Source {
                source_desc: self.id.clone(),
                reason: format!("cannot start the hub client: {e}"),
            })?;
        api.repo(self.repo()).get(file).map_err(|e| Error::Source {
            source_desc: self.id.clone(),
            reason: format!("`{file}` is not in {where_} and downloading it failed: {e}"),
        })
    }

    /// Like [`get`](Self::get), but `Ok(None)` when the file cannot be had (for optional files).
    pub fn get_optional(&self, file: &str) -> Option<PathBuf> {
        self.get(file).ok()
    }
}
