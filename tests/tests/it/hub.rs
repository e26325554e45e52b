//! Hugging Face model ids resolved offline from a hand-built hub cache.
//!
//! The cache is laid out as `huggingface_hub` leaves it: `models--{owner}--{name}/refs/{branch}`
//! holding the commit hash (no trailing newline), `blobs/{etag}` with the bytes, and
//! `snapshots/{commit}/{file}` symlinks into the blobs. Everything runs with offline mode on, so
//! no test can reach the network.

use std::path::{Path, PathBuf};

use candle_core::DType;
use dllm_models::hub::HubRepo;
use dllm_models::source::load_hub;
use dllm_models::synthetic::{tiny_dream, tiny_llada};
use dllm_models::{LoadOptions, ModelSource};
use llada_tests::fixtures::{full_logits, ids, load_default, write_model, TempDir};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Copy every file of `model_dir` into a hub cache under `cache/models--{owner}--{name}` at
/// `COMMIT`, with `refs/{branch}` pointing at it (no ref when `branch` is `None`).
fn fake_cache(cache: &Path, id: &str, model_dir: &Path, branch: Option<&str>) -> PathBuf {
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    for (i, entry) in std::fs::read_dir(model_dir).unwrap().enumerate() {
        let entry = entry.unwrap();
        let blob = repo.join("blobs").join(format!("blob{i:04}"));
        std::fs::copy(entry.path(), &blob).unwrap();
        let link = snap.join(entry.file_name());
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(blob.file_name().unwrap()),
            &link,
        )
        .unwrap();
    }
    if let Some(b) = branch {
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs").join(b), COMMIT).unwrap();
    }
    snap
}

fn offline(id: &str, rev: Option<&str>, cache: &Path) -> HubRepo {
    HubRepo::new(id, rev).with_cache(cache.to_path_buf(), true)
}

#[test]
fn hub_ids_parse() {
    assert_eq!(
        ModelSource::parse("owner/name").unwrap(),
        ModelSource::Hub {
            id: "owner/name".into(),
            revision: None
        }
    );
    assert_eq!(
        ModelSource::parse("GSAI-ML/LLaDA-8B-Instruct@v1.0").unwrap(),
        ModelSource::Hub {
            id: "GSAI-ML/LLaDA-8B-Instruct".into(),
            revision: Some("v1.0".into())
        }
    );
    for bad in ["owner/", "/name", "a/b/c", "owner name/x"] {
        assert!(
            ModelSource::parse(bad).is_err(),
            "`{bad}` parsed as a source"
        );
    }
}

#[test]
fn offline_cache_loads_like_the_directory() {
    for (cfg, shards) in [(tiny_llada(), 1), (tiny_dream(), 3)] {
        let model = TempDir::new("hub-model").unwrap();
        write_model(model.path(), &cfg, 9, DType::F32, shards).unwrap();
        let cache = TempDir::new("hub-cache").unwrap();
        fake_cache(cache.path(), "owner/tiny", model.path(), Some("main"));

        let repo = offline("owner/tiny", None, cache.path());
        let loaded = load_hub(&repo, &LoadOptions::default()).unwrap();
        assert_eq!(loaded.source, "owner/tiny");
        let mut hub_model = loaded.model;
        let mut dir_model = load_default(model.path()).unwrap().model;
        let x = ids(24, 250, cfg.special.mask, 8);
        assert_eq!(
            full_logits(&mut hub_model, &x).unwrap(),
            full_logits(&mut dir_model, &x).unwrap(),
            "{:?}: hub-cache load differs from the directory load",
            cfg.arch
        );
    }
}

#[test]
fn offline_cache_with_a_named_revision() {
    let model = TempDir::new("hub-rev").unwrap();
    write_model(model.path(), &tiny_llada(), 9, DType::F32, 1).unwrap();
    let cache = TempDir::new("hub-rev-cache").unwrap();
    fake_cache(cache.path(), "owner/tiny", model.path(), Some("v2"));
    assert!(load_hub(
        &offline("owner/tiny", Some("v2"), cache.path()),
        &LoadOptions::default()
    )
    .is_ok());
    // `main` has no ref in this cache: offline, that is an error naming config.json.
    let err = load_hub(
        &offline("owner/tiny", None, cache.path()),
        &LoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("config.json") && err.contains("owner/tiny"),
        "{err}"
    );
}

#[test]
fn offline_cache_with_a_commit_revision() {
    // `huggingface_hub` writes no `refs/` entry when a download was pinned to a commit hash; the
    // snapshot folder is found by the hash itself (`try_to_load_from_cache` does exactly this).
    let model = TempDir::new("hub-commit").unwrap();
    write_model(model.path(), &tiny_llada(), 9, DType::F32, 1).unwrap();
    let cache = TempDir::new("hub-commit-cache").unwrap();
    fake_cache(cache.path(), "owner/tiny", model.path(), None);
    let r = load_hub(
        &offline("owner/tiny", Some(COMMIT), cache.path()),
        &LoadOptions::default(),
    );
    assert!(
        r.is_ok(),
        "owner/tiny@{COMMIT} is in the cache but did not load offline: {}",
        r.err().map(|e| e.to_string()).unwrap_or_default()
    );
}

#[test]
fn offline_cache_missing_files_are_named() {
    let cache = TempDir::new("hub-empty").unwrap();
    let err = load_hub(
        &offline("owner/absent", None, cache.path()),
        &LoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("config.json") && err.contains("owner/absent"),
        "{err}"
    );

    // config.json cached, weights not.
    let model = TempDir::new("hub-noweights").unwrap();
    write_model(model.path(), &tiny_dream(), 9, DType::F32, 1).unwrap();
    std::fs::remove_file(model.join("model.safetensors")).unwrap();
    let cache = TempDir::new("hub-noweights-cache").unwrap();
    fake_cache(cache.path(), "owner/tiny", model.path(), Some("main"));
    let err = load_hub(
        &offline("owner/tiny", None, cache.path()),
        &LoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("model.safetensors"), "{err}");

    // Sharded: the index is cached, one shard is not.
    let model = TempDir::new("hub-noshard").unwrap();
    write_model(model.path(), &tiny_llada(), 9, DType::F32, 3).unwrap();
    std::fs::remove_file(model.join("model-00003-of-00003.safetensors")).unwrap();
    let cache = TempDir::new("hub-noshard-cache").unwrap();
    fake_cache(cache.path(), "owner/tiny", model.path(), Some("main"));
    let err = load_hub(
        &offline("owner/tiny", None, cache.path()),
        &LoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("model-00003-of-00003.safetensors"), "{err}");
}

#[test]
fn hub_id_through_the_public_entry_point() {
    // `load(&ModelSource::parse("owner/name"))` reads HF_HOME and HF_HUB_OFFLINE from the
    // environment; set them for a child process instead of mutating this test process's
    // environment under the other, parallel tests.
    let model = TempDir::new("hub-env").unwrap();
    write_model(model.path(), &tiny_dream(), 9, DType::F32, 1).unwrap();
    let home = TempDir::new("hub-home").unwrap();
    fake_cache(&home.join("hub"), "owner/tiny", model.path(), Some("main"));
    let x = ids(12, 250, 255, 9);
    let args: Vec<String> = x.iter().map(|v| v.to_string()).collect();
    let run = |spec: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_llada-tests-logits"))
            .arg(spec)
            .args(&args)
            .env("HF_HOME", home.path())
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap()
    };
    let hub = run("owner/tiny");
    assert!(
        hub.status.success(),
        "{}",
        String::from_utf8_lossy(&hub.stderr)
    );
    let dir = run(model.path().to_str().unwrap());
    assert!(
        dir.status.success(),
        "{}",
        String::from_utf8_lossy(&dir.stderr)
    );
    assert_eq!(
        hub.stdout, dir.stdout,
        "hub id and directory give different logits"
    );
    assert_eq!(
        String::from_utf8_lossy(&hub.stdout).lines().count(),
        x.len()
    );

    let missing = run("owner/not-cached");
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("config.json") && err.contains("owner/not-cached"),
        "{err}"
    );
}
