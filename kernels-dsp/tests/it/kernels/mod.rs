//! Every kernel against a straightforward reference (tests/common/reference.rs) on random shapes,
//! including dims that are not multiples of 32, through the real dispatcher. Each test states its
//! tolerance next to the assertion.

mod attention;
mod layouts;
mod matmul;
mod pointwise;
mod quant;
mod rows;
