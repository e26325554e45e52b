//! Builds the host FastRPC shim (`libkdsp_fastrpc_shim.so`, feature `fastrpc`): `dsp/fastrpc_shim.c`
//! (the libcdsprpc.so C ABI) + `dsp/kdsp_skel.c` (the DSP side of the kdsp interface) + the
//! kernels-dsp C sources, linked as one shared library with only the FastRPC API exported. The
//! path is baked into the crate as `CANDLE_HEXAGON_SHIM` (see `shim_library_path()`), so tests
//! find it with no manual step.
//!
//! The kernels are compiled again here rather than linked from kernels-dsp's static archive,
//! because cargo does not expose that archive's location to dependents; kernels-dsp exposes its
//! header directory (`DEP_KERNELS_DSP_INCLUDE`, `links = "kernels_dsp"`) and the sources sit
//! beside it. The flags are the ones kernels-dsp uses (`-ffp-contract=off`), so the shim computes
//! bit-identical results to the in-process emulated DSP.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=dsp");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(candle_hexagon_shim)");
    let fastrpc = std::env::var_os("CARGO_FEATURE_FASTRPC").is_some();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    let target = std::env::var("TARGET").unwrap_or_default();
    // The shim stands in for the phone's library on a Linux development host only.
    if !fastrpc || os != "linux" || host != target {
        return;
    }
    let include = PathBuf::from(
        std::env::var("DEP_KERNELS_DSP_INCLUDE")
            .expect("kernels-dsp (links = \"kernels_dsp\") exports its include directory"),
    );
    let kernels_src = include
        .parent()
        .expect("kernels-dsp/include has a parent")
        .join("src");
    println!("cargo:rerun-if-changed={}", kernels_src.display());
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut files: Vec<PathBuf> = std::fs::read_dir(&kernels_src)
        .expect("kernels-dsp/src is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    files.sort();
    files.push(PathBuf::from("dsp/kdsp_skel.c"));
    files.push(PathBuf::from("dsp/fastrpc_shim.c"));

    let mut build = cc::Build::new();
    build
        .include(&include)
        .include(&kernels_src)
        .include("dsp")
        .opt_level(2)
        .std("c11")
        .pic(true)
        .warnings(true)
        .flag("-ffp-contract=off")
        .flag("-fno-trapping-math")
        .flag("-fvisibility=hidden")
        .files(&files);
    let objects = build.compile_intermediates();

    let lib = out.join("libkdsp_fastrpc_shim.so");
    let compiler = build.get_compiler();
    let mut cmd = compiler.to_command();
    cmd.arg("-shared")
        .arg("-fPIC")
        .arg("-Wl,-Bsymbolic")
        .arg("-o")
        .arg(&lib)
        .args(&objects)
        .arg("-lpthread");
    let status = cmd.status().expect("run the C compiler to link the shim");
    assert!(status.success(), "linking {} failed", lib.display());
    println!("cargo:rustc-env=CANDLE_HEXAGON_SHIM={}", lib.display());
    println!("cargo:rustc-cfg=candle_hexagon_shim");
}
