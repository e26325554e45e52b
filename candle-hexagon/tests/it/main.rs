//! candle-hexagon's integration tests as one test binary (one link instead of one per file): each
//! module is one of the former `tests/*.rs` files.

// The shared helpers (`tests/common/`), reached as `crate::common`.
#[path = "../common/mod.rs"]
mod common;

mod block;
mod block_state;
mod conformance;
mod fastrpc;
mod fp16_error;
mod memory;
mod nn_layers;
mod swap;
mod transport;
mod weights_once;
