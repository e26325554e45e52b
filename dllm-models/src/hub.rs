//! Hugging Face model ids through `hf-hub`'s cache (`$HF_HOME/hub/models--{owner}--{name}`).
//!
//! Files already in the cache are used without any network access; others are downloaded (from
//! `HF_ENDPOINT`, default `https://huggingface.co`) unless `HF_HUB_OFFLINE=1`. A required file
//! that is neither cached nor downloadable is an error naming it; an optional one is absent only
//! when that is known (see [`HubRepo::get_optional`]).

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
    /// `HF_ENDPOINT`, or an explicit endpoint.
    endpoint: Option<String>,
}

/// Why a download did not produce a file.
enum Download {
    /// The Hub answered 404.
    NotFound,
    /// Anything else (network, authorisation, I/O).
    Failed(String),
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
            endpoint: std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()),
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
        self.download(file).map_err(|e| Error::Source {
            source_desc: self.id.clone(),
            reason: match e {
                Download::NotFound => {
                    format!("`{file}` is not in {where_} nor in the repository (404)")
                }
                Download::Failed(r) => format!("`{file}` is not in {where_} and {r}"),
            },
        })
    }

    /// Download from another endpoint than `https://huggingface.co` (a mirror, or a test server).
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Like [`get`](Self::get), for files a repository may lack (`tokenizer.json`,
    /// `generation_config.json`, a shard index): `Ok(None)` when the file is known to be absent,
    /// an error for anything else.
    ///
    /// "Absent" means: the Hub answered 404 for it, or the cache has a `.no_exist` marker for it
    /// (written by `huggingface_hub`), or — offline — it is not in the cache (the cache cannot
    /// tell "not in the repository" from "never downloaded"). A network failure, a refused or
    /// unauthorised request, or a cache entry whose blob is missing is an error naming the file.
    pub fn get_optional(&self, file: &str) -> Result<Option<PathBuf>> {
        if let Some(p) = self.cache.repo(self.repo()).get(file) {
            return Ok(Some(p));
        }
        if let Some(broken) = self.dangling_entry(file) {
            return Err(Error::Source {
                source_desc: self.id.clone(),
                reason: format!(
                    "`{file}` is in the cache snapshot ({}) but the file it points to is missing: the cache is damaged",
                    broken.display()
                ),
            });
        }
        if self.marked_absent(file) || self.offline {
            return Ok(None);
        }
        match self.download(file) {
            Ok(p) => Ok(Some(p)),
            Err(Download::NotFound) => Ok(None),
            Err(Download::Failed(reason)) => Err(Error::Source {
                source_desc: self.id.clone(),
                reason: format!("`{file}`: {reason}"),
            }),
        }
    }

    /// The commit the revision resolves to in the cache (the revision itself when it is a
    /// commit hash).
    fn cached_commit(&self) -> Option<String> {
        if self.revision.len() == 40 && self.revision.chars().all(|c| c.is_ascii_hexdigit()) {
            return Some(self.revision.clone());
        }
        let refs = self.repo_dir().join("refs").join(&self.revision);
        std::fs::read_to_string(refs)
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn repo_dir(&self) -> PathBuf {
        self.cache
            .path()
            .join(Repo::model(self.id.clone()).folder_name())
    }

    /// A snapshot entry for `file` that exists as a link but points nowhere.
    fn dangling_entry(&self, file: &str) -> Option<PathBuf> {
        let p = self
            .repo_dir()
            .join("snapshots")
            .join(self.cached_commit()?)
            .join(file);
        (p.symlink_metadata().is_ok() && !p.exists()).then_some(p)
    }

    /// `huggingface_hub` records files it found absent as `.no_exist/{commit}/{file}`.
    fn marked_absent(&self, file: &str) -> bool {
        self.cached_commit().is_some_and(|c| {
            self.repo_dir()
                .join(".no_exist")
                .join(c)
                .join(file)
                .symlink_metadata()
                .is_ok()
        })
    }

    fn download(&self, file: &str) -> std::result::Result<PathBuf, Download> {
        let mut builder =
            hf_hub::api::sync::ApiBuilder::from_cache(self.cache.clone()).with_progress(true);
        if let Some(e) = &self.endpoint {
            builder = builder.with_endpoint(e.clone());
        }
        let api = builder
            .build()
            .map_err(|e| Download::Failed(format!("cannot start the hub client: {e}")))?;
        api.repo(self.repo()).get(file).map_err(|e| match &e {
            hf_hub::api::sync::ApiError::RequestError(r)
                if matches!(**r, ureq::Error::Status(404, _)) =>
            {
                Download::NotFound
            }
            _ => Download::Failed(format!("downloading it failed: {e}")),
        })
    }
}
