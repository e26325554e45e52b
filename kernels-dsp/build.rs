//! Compiles the C kernels into `libkernels_dsp.a` for the host (or any target `cc` can build for,
//! e.g. an Android CPU for the emulated DSP): optimised, warnings as errors, and with
//! `-ffp-contract=off` so float results do not depend on whether the compiler fuses multiply-adds
//! (the Hexagon build uses the same flags; see `hexagon/build.sh`).

use std::path::PathBuf;

/// The C sources of the library, in `src/`.
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

fn main() {
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let include = root.join("include");
    let src = root.join("src");

    let mut build = cc::Build::new();
    build
        .include(&include)
        .include(&src)
        .opt_level(3)
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .flag("-ffp-contract=off")
        // FP exceptions are never observed, so selects on float values may be if-converted and
        // vectorised (e.g. the f16 -> f32 conversion); results are unchanged.
        .flag("-fno-trapping-math")
        .flag_if_supported("-Wpedantic")
        .flag_if_supported("-Wshadow")
        .flag_if_supported("-Wstrict-prototypes");
    for file in SOURCES {
        build.file(src.join(file));
    }
    build.compile("kernels_dsp");

    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-link-lib=pthread");
    }
    // Dependents (`links = "kernels_dsp"`) find the ABI header through DEP_KERNELS_DSP_INCLUDE.
    println!("cargo:include={}", include.display());
    println!("cargo:rerun-if-changed={}", include.display());
    println!("cargo:rerun-if-changed={}", src.display());
}
