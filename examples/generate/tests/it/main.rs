//! generate's integration tests as one test binary (one link instead of one per file): each module
//! is one of the former `tests/*.rs` files.

mod aarch64_qemu;
mod cli;
mod gguf_tokenizer;
