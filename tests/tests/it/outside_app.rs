//! The root README's library snippets, as an app uses them: `tests/outside-app` (path
//! dependencies on the library crates, default features) compiles them unchanged, with no warning
//! from the library crates, and they run on the shipped models.
//!
//! The app is built by the workspace (`cargo build -p outside-app`, a member no other member
//! uses) into this build's target directory, so nothing the suite's build made is built again,
//! the five library crates included: only the app itself is compiled. An app with a workspace of
//! its own compiled the library crates again, whatever it pinned: cargo identifies a path package
//! by its path relative to the root of the workspace that builds it and applies
//! `[profile.release.package."*"]` to every package that is not a member. `-p outside-app`
//! resolves features for the app alone, as a user's build does; they must be the workspace's for
//! every crate (checked here, so a drift fails with the fix instead of silently rebuilding the
//! world).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// This test's target directory and profile, from its own path (`<target>/<profile>/deps/..`).
fn target_and_profile() -> (PathBuf, String) {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps");
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("profile directory name")
        .to_string();
    let target = profile_dir
        .parent()
        .expect("target directory")
        .to_path_buf();
    (target, profile)
}

/// `name version -> {features}` of every package in `cargo tree`'s output for `args` (host and
/// target nodes alike; a path package's path left out of its name).
fn resolved_features(args: &[&str]) -> BTreeMap<String, Vec<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "--prefix",
            "none",
            "-f",
            "{p}|{f}",
        ])
        .args(args)
        .current_dir(root())
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).expect("utf-8").lines() {
        let line = line.trim_end_matches(" (*)");
        let Some((package, features)) = line.split_once('|') else {
            continue;
        };
        // `name vX (/path)`: a path package, one of the library crates the app must not rebuild.
        let package = package.split(" (/").next().unwrap_or(package);
        if package.contains(" (") {
            continue;
        }
        let sets = map.entry(package.to_string()).or_default();
        if !sets.iter().any(|s| s == features) {
            sets.push(features.to_string());
        }
    }
    map
}

#[test]
fn the_outside_app_resolves_the_workspace_features() {
    // A registry crate the app resolves with other features than the workspace's build gets a new
    // artifact, and so does everything above it: `syn` without `full` meant serde, candle,
    // tokenizers and gemm built twice (the suite's slowest test, 3.2 minutes).
    let ws = resolved_features(&["--workspace"]);
    let app = resolved_features(&["-p", "outside-app"]);
    assert!(app.contains_key("candle-core v0.11.1"), "{app:?}");
    assert!(app.contains_key("dllm-decode v0.1.0"), "{app:?}");
    let mut drifted = Vec::new();
    for (package, sets) in &app {
        let theirs = ws.get(package).cloned().unwrap_or_default();
        for s in sets.iter().filter(|s| !theirs.contains(s)) {
            drifted.push(format!(
                "{package}: the app resolves [{s}], the workspace {theirs:?}"
            ));
        }
    }
    assert!(
        drifted.is_empty(),
        "the app would build these (and everything above them) a second time; add the \
         workspace's features to tests/outside-app/Cargo.toml's alignment table:\n{}",
        drifted.join("\n")
    );
}

#[test]
fn the_readme_snippets_compile_unchanged_and_run_on_the_shipped_models() {
    let (target, profile) = target_and_profile();
    let mut build = Command::new(env!("CARGO"));
    build
        // --locked: Cargo.lock is part of the source tree, never rewritten by a test.
        .args(["build", "--offline", "--locked", "-p", "outside-app"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root());
    if profile == "release" {
        build.arg("--release");
    }
    // The variables cargo sets for this test process are not the user's environment: build
    // scripts that watch one (ring's watches CARGO_MANIFEST_DIR) would run again and rebuild
    // everything above them, here and in the next workspace build.
    for (key, _) in std::env::vars_os() {
        let Some(k) = key.to_str() else { continue };
        let set_by_cargo = k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_BIN_EXE_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&k);
        if set_by_cargo {
            build.env_remove(k);
        }
    }
    let out = {
        let _cargo = crate::cargo_lock();
        build.output().expect("running cargo")
    };
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "building tests/outside-app:\n{log}");
    // Warnings from a path dependency are shown to its users: there must be none.
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("warning")).collect();
    assert!(
        warnings.is_empty(),
        "the library crates warn a user's build:\n{log}"
    );

    let run = |bin: &str, args: &[&str]| -> String {
        let exe = target.join(&profile).join(bin);
        let out = Command::new(&exe)
            .args(args)
            .current_dir(root())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
        assert!(
            out.status.success(),
            "{bin} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    };
    // The short-suite models answer the README's question; the long-answer model runs too (its
    // answers are worked lines, checked by its own tests).
    assert_eq!(run("outside-app-library", &[]), "23 + 5 = 28. Answer: 28\n");
    assert_eq!(
        run("outside-app-library", &["models/tiny-dream"]),
        "23 + 5 = 28. Answer: 28\n"
    );
    assert!(!run("outside-app-library", &["models/tiny-llada-long"])
        .trim()
        .is_empty());
    let candle = run("outside-app-candle-style", &[]);
    let vocab = 913; // tiny-llada's embedding rows
    let lines: Vec<&str> = candle.lines().collect();
    assert_eq!(lines.len(), 2, "{candle}");
    assert!(
        lines[0].starts_with("4 layers, logits [1, ") && lines[0].ends_with(&format!(", {vocab}]")),
        "{candle}"
    );
    assert_eq!(lines[1], "23 + 5 = 28. Answer: 28");
}
