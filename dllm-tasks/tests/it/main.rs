//! dllm-tasks' integration tests as one test binary (one link instead of one per file): each module
//! is one of the former `tests/*.rs` files.

mod export;
mod gguf_tokenizer;
mod long_suite;
mod probe;
mod tasks;
mod tokenizer;
mod train;
