//! Malformed descriptors under AddressSanitizer + UndefinedBehaviorSanitizer.
//!
//! Builds the C sources a second time, with `-fsanitize=address,undefined
//! -fno-sanitize-recover=all`, into a standalone fuzz driver (`tests/c/fuzz_driver.c`): valid
//! ops of every op code on exactly sized buffers must return OK, and thousands of mutated and
//! random descriptors (bad dims, strides, offsets, buffer ids, dtypes, overlapping outputs, ...)
//! must come back with a status -- no crash, no out-of-bounds access, no UB report. A ThreadSanitizer
//! build of the same workload checks the pthreads worker pool and the kernels' work splits.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: &[&str] = &[
    "dispatch.c",
    "tensor.c",
    "worker_pool.c",
    "matmul_f16_ops.c",
    "matmul_q4_ops.c",
    "flash_attn_ops.c",
    "norm_ops.c",
    "elementwise_ops.c",
    "quant_ops.c",
    "layout_ops.c",
    "rows_ops.c",
];

/// Compiles the fuzz driver + kernels with `sanitize` (e.g. "address,undefined") using the first
/// compiler that can; returns (binary, compiler).
fn build(root: &Path, out: &Path, sanitize: &str) -> Result<(PathBuf, String), String> {
    let bin = out.join(format!("kdsp_fuzz_{}", sanitize.replace(',', "_")));
    let mut errors = String::new();
    for cc in ["clang-19", "clang", "cc"] {
        let mut cmd = Command::new(cc);
        cmd.args([
            "-std=c11",
            "-O1",
            "-g",
            &format!("-fsanitize={sanitize}"),
            "-fno-sanitize-recover=all",
        ])
        .args([
            "-fno-omit-frame-pointer",
            "-ffp-contract=off",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-I{}", root.join("src").display()));
        for s in SOURCES {
            cmd.arg(root.join("src").join(s));
        }
        cmd.arg(root.join("tests/c/fuzz_driver.c"))
            .arg("-o")
            .arg(&bin);
        match cmd.output() {
            Ok(o) if o.status.success() => return Ok((bin, cc.to_owned())),
            Ok(o) => errors.push_str(&format!("{cc}: {}\n", String::from_utf8_lossy(&o.stderr))),
            Err(e) => errors.push_str(&format!("{cc}: {e}\n")),
        }
    }
    Err(errors)
}

fn out_dir() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kernels-dsp-sanitizers");
    std::fs::create_dir_all(&out).unwrap();
    out
}

#[test]
fn malformed_descriptors_are_rejected_under_asan_and_ubsan() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (bin, cc) = match build(&root, &out_dir(), "address,undefined") {
        Ok(b) => b,
        Err(e) => {
            common::skip_or_fail(
                "malformed_descriptors_are_rejected_under_asan_and_ubsan",
                &format!("no C compiler with ASan/UBSan runtimes ({})", e.trim()),
                "apt-get install -y clang-19",
            );
            return;
        }
    };
    for (seed, rounds) in [(1u64, 300u32), (2, 300), (3, 300)] {
        let run = Command::new(&bin)
            .args([seed.to_string(), rounds.to_string()])
            .env(
                "ASAN_OPTIONS",
                "detect_leaks=1:abort_on_error=0:halt_on_error=1",
            )
            .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
            .output()
            .expect("run the sanitizer build");
        let stdout = String::from_utf8_lossy(&run.stdout);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            run.status.success()
                && !stderr.contains("Sanitizer")
                && !stderr.contains("runtime error"),
            "sanitizer build ({cc}) failed on seed {seed}: {:?}\n{stdout}\n{stderr}",
            run.status
        );
        let summary = stdout
            .lines()
            .find(|l| l.starts_with("fuzz:"))
            .expect("summary line");
        assert!(
            summary.contains("errors=0") && summary.contains("INVALID="),
            "{summary}"
        );
        common::announce(&format!("asan+ubsan ({cc}), seed {seed}: {summary}"));
    }
}

#[test]
fn worker_pool_and_kernels_are_race_free_under_tsan() {
    // The same fuzz workload on a 3-worker pthreads pool under ThreadSanitizer: the pool's
    // hand-off and every kernel's split of its output must be free of data races.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (bin, cc) = match build(&root, &out_dir(), "thread") {
        Ok(b) => b,
        Err(e) => {
            common::skip_or_fail(
                "worker_pool_and_kernels_are_race_free_under_tsan",
                &format!("no C compiler with the TSan runtime ({})", e.trim()),
                "apt-get install -y clang-19",
            );
            return;
        }
    };
    let run = Command::new(&bin)
        .args(["11", "60"])
        .env("TSAN_OPTIONS", "halt_on_error=1")
        .output()
        .expect("run the TSan build");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    if stderr.contains("unexpected memory mapping") {
        // TSan cannot start on some kernels (high mmap ASLR entropy): an environment limit.
        common::skip_or_fail(
            "worker_pool_and_kernels_are_race_free_under_tsan",
            "TSan cannot map its shadow memory here",
            "sysctl vm.mmap_rnd_bits=28",
        );
        return;
    }
    assert!(
        run.status.success() && !stderr.contains("ThreadSanitizer"),
        "TSan build ({cc}) failed: {:?}\n{stdout}\n{stderr}",
        run.status
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("fuzz:"))
        .expect("summary line");
    common::announce(&format!("tsan ({cc}): {summary}"));
}
