//! llada-tests' integration tests as one test binary (one link instead of one per file): each
//! module is one of the former `tests/*.rs` files. `tests/gguf_load_memory.rs` stays a binary of
//! its own: it measures the heap with a global allocator, which would count the other tests'
//! allocations too. The two tests that run cargo on this build's target directory (`features`,
//! `outside_app`) take turns through `CARGO_LOCK`.

mod bad_inputs;
mod cpu_kernels;
mod decode_fingerprint;
mod decode_oracle;
mod determinism;
mod dream_oracle;
mod fast_dllm_oracle;
mod features;
mod forward_many;
mod generate;
mod gguf;
mod hexagon;
mod hostile_inputs;
mod hub;
mod mbsd_sweep;
mod npu_refresh;
mod outside_app;
mod reference;
mod shipped_model;
mod swap_runtime;
mod tokenizer;

/// Held while a test runs cargo on this build's target directory: cargo locks the build directory
/// for the whole command, so two at once would wait for each other (and `features` would fall back
/// to a directory of its own, building everything there).
pub static CARGO_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Take [`CARGO_LOCK`] (a test that failed while holding it does not block the others).
pub fn cargo_lock() -> std::sync::MutexGuard<'static, ()> {
    CARGO_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
