//! # llada-fuzz
//!
//! A fuzz harness on the stable toolchain (no `cargo fuzz`, no nightly): seeded mutation of every
//! file the loaders read — `config.json`, `generation_config.json`, `tokenizer.json`,
//! safetensors (single file and sharded with `model.safetensors.index.json`) and GGUF — driven
//! through the public loader (`dllm_models::load`) and, when a mutant loads, one short decode
//! with `dllm_decode::generate` and a tokenizer round trip.
//!
//! Every input runs in-process under `catch_unwind` (a panic is a failure); a watchdog thread
//! ends the process with a report when one input runs longer than the per-input bound (a hang);
//! an abort ends the process by itself; and with [`alloc::CountingAlloc`] installed the bytes
//! still allocated after the run are compared with those after a warm-up (a leak). The run is a
//! pure function of its seed: a failure report names the input's index and mutation, and
//! `LLADA_FUZZ_SEED`/`LLADA_FUZZ_INPUTS` reproduce it.

#![warn(missing_docs)]

pub mod alloc;
pub mod corpus;
pub mod mutate;
mod run;

pub use run::{run, Config, Report};
