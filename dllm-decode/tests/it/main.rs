//! dllm-decode's integration tests as one test binary (one link instead of one per file): each
//! module is one of the former `tests/*.rs` files.

mod drafts;
mod guesses;
mod mbsd;
mod scripted;
mod strategies;
mod trim;
mod verify;
mod window_contract;
