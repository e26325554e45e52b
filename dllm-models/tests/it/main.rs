//! dllm-models' integration tests as one test binary (one link instead of one per file): each
//! module is one of the former `tests/*.rs` files.

mod candle_style;
mod cpu_options;
mod dual_path;
mod fused_ops;
mod gguf_py;
mod gguf_roundtrip;
mod gguf_tokenizer;
mod refresh_token;
mod typed_errors;
mod window_cache;
