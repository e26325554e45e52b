//! kernels-dsp's integration tests as one test binary (one link instead of one per file): each
//! module is one of the former `tests/*.rs` files. `kernels` is the former `tests/kernels/` binary.

// The shared helpers (`tests/common/`), reached as `crate::common`.
#[path = "../common/mod.rs"]
mod common;

mod abi;
mod dispatch;
mod hexagon_qemu;
mod kernels;
mod sanitizers;
