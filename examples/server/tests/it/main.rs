//! llada-server's integration tests as one test binary (one link instead of one per file): each
//! module is one of the former `tests/*.rs` files.

// The shared helpers (`tests/common/`), reached as `crate::common`.
#[path = "../common/mod.rs"]
mod common;

mod api;
mod engine;
mod fuzz;
mod hardening;
mod load;
mod openai_client;
mod page;
