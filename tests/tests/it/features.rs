//! `dllm-models` and `dllm-decode` without their default features (`hub`, `hexagon`): they build,
//! and their dependency tree has no Hexagon backend (no C kernels, no memfd) and no hub client
//! (no TLS stack) — what a CPU-only app on macOS or Windows links.
//!
//! The build is a compile-only check (`cargo check`) in the target directory and profile of this
//! test binary, so it shares every artifact the suite's own build already made with the same
//! features (build-script outputs, proc-macros) and a second run is incremental. Cargo holds no
//! lock on the build directory while tests run; should an older cargo hold one, the check falls
//! back to a directory of its own (`<target>/no-default-features`) instead of waiting.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The target directory and profile this test binary was built into
/// (`<target>/<profile dir>/deps/it-<hash>`).
fn own_target() -> Option<(PathBuf, String)> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let target = profile_dir.parent()?.to_path_buf();
    let profile = match profile_dir.file_name()?.to_str()? {
        "debug" => "dev".to_string(),
        p => p.to_string(),
    };
    Some((target, profile))
}

fn cargo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("running cargo")
}

/// `cargo check` of `sel` in `target` with `profile`; `None` if cargo reported waiting for a lock
/// on the build directory (the check was stopped).
fn check_in(target: &Path, profile: &str, sel: &[&str]) -> Option<std::process::Output> {
    let mut child = Command::new(env!("CARGO"))
        .args(["check", "--offline", "--profile", profile])
        .args(sel)
        .current_dir(root())
        .env("CARGO_TARGET_DIR", target)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running cargo");
    let stderr = child.stderr.take().expect("piped");
    let mut text = String::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("cargo's stderr");
        if line.contains("Blocking waiting for file lock on build directory") {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        text.push_str(&line);
        text.push('\n');
    }
    let mut out = child.wait_with_output().expect("cargo finished");
    out.stderr = text.into_bytes();
    Some(out)
}

#[test]
fn models_and_decode_build_without_hub_and_hexagon() {
    let sel = [
        "-p",
        "dllm-models",
        "-p",
        "dllm-decode",
        "--no-default-features",
    ];
    let tree = cargo(
        &[
            &["tree", "--offline", "-e", "normal", "--prefix", "none"][..],
            &sel,
        ]
        .concat(),
    );
    let text = String::from_utf8_lossy(&tree.stdout);
    assert!(
        tree.status.success(),
        "{}",
        String::from_utf8_lossy(&tree.stderr)
    );
    assert!(
        text.contains("dllm-models") && text.contains("candle-core"),
        "{text}"
    );
    for banned in ["candle-hexagon", "kernels-dsp", "hf-hub", "ureq", "memfd"] {
        assert!(
            !text.lines().any(|l| l.starts_with(&format!("{banned} "))),
            "{banned} is in the no-default-features tree:\n{text}"
        );
    }
    let (target, profile) = own_target().unwrap_or_else(|| (root().join("target"), "dev".into()));
    let _cargo = crate::cargo_lock();
    let check = check_in(&target, &profile, &sel)
        .or_else(|| check_in(&target.join("no-default-features"), &profile, &sel))
        .expect("a target directory of its own is never locked");
    let log = String::from_utf8_lossy(&check.stderr);
    assert!(
        check.status.success(),
        "cargo check --no-default-features failed:\n{log}"
    );
    // A path dependency's warnings are shown to its users (cargo replays them from its cache).
    assert!(
        !log.contains("warning"),
        "dllm-models / dllm-decode warn without their default features:\n{log}"
    );
}
