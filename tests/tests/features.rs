//! `dllm-models` and `dllm-decode` without their default features (`hub`, `hexagon`): they build,
//! and their dependency tree has no Hexagon backend (no C kernels, no memfd) and no hub client
//! (no TLS stack) — what a CPU-only app on macOS or Windows links.

use std::path::Path;
use std::process::Command;

fn cargo(args: &[&str]) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    Command::new(env!("CARGO"))
        .args(args)
        .current_dir(&root)
        // Its own target dir: the outer `cargo test` may hold the workspace's lock.
        .env("CARGO_TARGET_DIR", root.join("target/no-default-features"))
        .output()
        .expect("running cargo")
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
    let check = cargo(&[&["check", "--offline", "--quiet"][..], &sel].concat());
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
