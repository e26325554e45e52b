//! # llada-tests
//!
//! Workspace integration tests for `dllm-models` (and later `dllm-decode`), built so that they do
//! not trust the code they check:
//!
//! * [`checkpoint`] reads safetensors checkpoints (single file or sharded) with the `safetensors`
//!   crate straight into `f64`, under tensor names written out here from the model cards.
//! * [`reference`](mod@reference) is a plain-loop `f64` forward of LLaDA and Dream from those tensors and the
//!   checkpoint's own `config.json` (no candle ops).
//! * [`generate`] is LLaDA's official `generate` (temperature 0, low-confidence remasking) on top
//!   of any logits function — the oracle decoders are compared against.
//! * [`dream`] is Dream's `diffusion_generate` (all four algorithms, top-p / top-k, sampling from a
//!   supplied uniform stream) on top of any logits function.
//! * [`fast_dllm`] is Fast-dLLM's prefix- and dual-cache block loops (schedule or threshold) over
//!   the reference with an explicit KV cache.
//! * [`gguf_fixture`] writes a GGUF the way llama.cpp's `convert_hf_to_gguf.py` lays out LLaDA and
//!   Dream (metadata keys, tensor names, LLaDA's q/k row permutation), from the HF tensors.
//! * [`fixtures`] holds the small shared helpers: temporary directories, tiny checkpoints on disk,
//!   the shipped models, the emulated Hexagon device, logits extraction and the error metric.
//!
//! The only things taken from `dllm-models` to build fixtures are its synthetic configs and random
//! weights (`synthetic::{tiny_llada, tiny_dream, random_weights, write_hf}`): they produce *inputs*,
//! and every expected value is computed here from what ends up on disk.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod dream;
pub mod fast_dllm;
pub mod fixtures;
pub mod generate;
pub mod gguf_fixture;
pub mod reference;
