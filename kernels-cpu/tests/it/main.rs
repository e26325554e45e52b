//! kernels-cpu's integration tests as one test binary (one link instead of one per file): each
//! module is one of the former `tests/*.rs` files. `tests/alloc.rs` stays a binary of its own: it
//! counts every allocation with a global allocator, which would count the other tests' allocations
//! too.

// The shared helpers (`tests/common/`), reached as `crate::common`.
#[path = "../common/mod.rs"]
mod common;

mod attention;
mod dense;
mod paths;
mod quant;
