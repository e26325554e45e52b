//! The root README's library snippets, as an app outside the workspace uses them: `tests/outside-app`
//! (its own workspace, path dependencies on the library crates) compiles them unchanged, with no
//! warning from the library crates, and they run on the shipped models.
//!
//! The app builds into this build's target directory, so the registry crates the workspace already
//! built (candle, tokenizers, gemm, ...) are not built again: its lockfile pins the workspace's
//! versions, its profiles repeat the workspace's and its dependencies resolve every registry
//! crate with the workspace's features (all three checked, so a drift fails here with the fix
//! instead of silently rebuilding the world). Only the library crates themselves are built again
//! (cargo keys a path dependency's artifacts by its path relative to the workspace root).

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

/// `name -> versions` of a Cargo.lock.
fn locked(path: &Path) -> BTreeMap<String, Vec<String>> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            out.entry(n)
                .or_default()
                .push(v.trim_matches('"').to_string());
        }
    }
    out
}

#[test]
fn the_outside_app_pins_the_workspace_versions_and_profiles() {
    let app = root().join("tests/outside-app");
    let ws = locked(&root().join("Cargo.lock"));
    let own = locked(&app.join("Cargo.lock"));
    assert!(own.contains_key("candle-core") && own.contains_key("dllm-decode"));
    for (name, versions) in &own {
        let w = ws.get(name).cloned().unwrap_or_default();
        // Packages the workspace does not lock are the app's own (`outside-app`, `serde_json` is
        // the workspace's too); every version the app pins must be one the workspace pins.
        if name == "outside-app" {
            continue;
        }
        assert!(
            versions.iter().all(|v| w.contains(v)),
            "tests/outside-app/Cargo.lock pins {name} {versions:?}, the workspace {w:?}: copy \
             Cargo.lock over tests/outside-app/Cargo.lock and build the app once"
        );
    }
    // The [profile.*] sections, comments and blank lines aside. A section for one package the
    // app does not build is left out of the app's file (cargo warns about a spec that matches
    // nothing, and a user's build must not warn); every other line must be the workspace's.
    let profile = |p: &Path, lock: &BTreeMap<String, Vec<String>>| {
        let text = std::fs::read_to_string(p).unwrap();
        let at = text.find("[profile.").expect("a [profile.*] section");
        let mut keep = true;
        let mut lines = Vec::new();
        for l in text[at..].lines().map(str::trim) {
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            if l.starts_with('[') {
                keep = match l
                    .trim_matches(|c| c == '[' || c == ']')
                    .split_once(".package.")
                {
                    Some((_, pkg)) if pkg != "\"*\"" => lock.contains_key(pkg.trim_matches('"')),
                    _ => true,
                };
            }
            if keep {
                lines.push(l.to_string());
            }
        }
        lines
    };
    assert_eq!(
        profile(&app.join("Cargo.toml"), &own),
        profile(&root().join("Cargo.toml"), &own),
        "tests/outside-app/Cargo.toml must end with the workspace's [profile.*] sections"
    );
}

/// `name version -> {features}` of every registry package in `cargo tree`'s output for `args`
/// (host and target nodes alike; path packages are left out: the app builds them again anyway).
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
        if package.contains(" (") {
            continue; // `name vX (/path)`: a path package
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
    let manifest = root().join("tests/outside-app/Cargo.toml");
    let app = resolved_features(&["--manifest-path", manifest.to_str().expect("utf-8 path")]);
    assert!(app.contains_key("candle-core v0.11.1"), "{app:?}");
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
        // --locked: the app's Cargo.lock is part of the source tree, never rewritten by a test.
        .args(["build", "--offline", "--locked", "--manifest-path"])
        .arg(root().join("tests/outside-app/Cargo.toml"))
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
    let out = build.output().expect("running cargo");
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
