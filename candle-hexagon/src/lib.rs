//! # candle-hexagon
//!
//! A Qualcomm Hexagon NPU backend for [candle] without forking it. candle's `Device`/`Storage`
//! enums are closed, so tensors stay in host memory (on a phone the NPU shares it) and the backend
//! is reached through candle's two public seams, the way candle itself integrates quantized
//! weights (`impl CustomOp1 for QTensor`):
//!
//! - a block-level module that *is* the op where the hardware wants it: [`HexTransformer`] runs a
//!   stack of transformer blocks one DSP batch per block over resident weights, a resident fp16
//!   KV cache ([`DeviceKv`]) and planned activations, returning a [`ForwardHandle`] with the
//!   fences ([`HexTransformer`]);
//! - weight-owning modules that *are* the op: [`HexLinear`] owns weights packed at load time
//!   (fp16 HMX tiles or Q4_0 tiles) in NPU-mapped shared memory;
//! - fused custom ops: [`ops::flash_attn`] (with a mask and a causal flag:
//!   [`ops::flash_attn_with`]), [`ops::rms_norm`], [`ops::swiglu`], [`ops::rope`], each beside its
//!   CPU fallback and a named slow reference;
//! - drop-in layers mirroring candle-nn for an ordinary candle model ([`nn`]): `linear`,
//!   `linear_no_bias`, a `Linear` that keeps candle-nn's CPU layer when the weight stays on the
//!   CPU, `RmsNorm`, attention helpers for `(b, s, h, d)` and `(b, h, s, d)` layouts.
//!
//! On the NPU path f32 activations of linear layers (and attention's K/V) are rounded to fp16,
//! with f32 accumulation: outputs differ from the f32 CPU path by about 2-3e-4 relative (measured
//! in `tests/it/fp16_error.rs`, table in the README; details in [`nn`]).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use candle_hexagon::{ops, HexLinear, HexagonConfig, HexagonDevice, Placed};
//! let dev = HexagonDevice::open(HexagonConfig::default())?; // emulated DSP
//! let w = candle_core::Tensor::randn(0f32, 1.0, (64, 96), &candle_core::Device::Cpu)?;
//! let x = candle_core::Tensor::randn(0f32, 1.0, (3, 96), &candle_core::Device::Cpu)?;
//! if let Placed::Npu(lin) = HexLinear::from_dense(&dev, &w, None)? {
//!     let y = lin.forward_hex(&x)?; // (3, 64), computed by the DSP kernels
//! }
//! println!("{}", dev.routing_report());
//! # Ok(()) }
//! ```
//!
//! Public modules: [`device`] (session, config, routing entry point, counters), [`transport`]
//! (emulated DSP thread; FastRPC via `dlopen`; batches and fences), [`layout`] (weight packings),
//! [`ops`] (candle ops), [`nn`] (candle-nn-style layers); the rest is re-exported at the root:
//! [`HexTransformer`] (layer-level execution of a [`Program`]), the memory runtime's
//! [`MemoryPolicy`] / [`MemoryPlan`] (graph capture, placement under the VA budget, lifetime
//! packing, double-buffered staging; policies `naive`, `paging`, `somr`), routing decisions and
//! [`Error`]. Internals (shared buffers, the bounded NPU address window, leases, the buffer pool,
//! the runtime's planners) are private to the crate.
//!
//! Targets: Linux and Android (memfd shared memory). On other Unix targets the crate builds as a
//! stub whose [`HexagonDevice::open`] returns [`Error::Unsupported`].
//!
//! This crate knows nothing of tokens, diffusion or models.
//!
//! [candle]: https://github.com/huggingface/candle
#![warn(missing_docs)]

// The public surface is what the root re-exports and these modules: `device` (session,
// config, defaults), `ops` (candle ops), `nn` (candle-nn-style layers), `layout` (the NPU's weight
// packings, shared with kernels-cpu), `transport` (batches, fences, the FastRPC shim). The rest
// is the crate's internals.
mod block;
mod config;
pub mod device;
mod error;
mod kinds;
pub mod layout;
mod memory;
pub mod nn;
pub mod ops;
mod routing;
mod runtime;
pub mod transport;

/// The host <-> DSP ABI (`kdsp_ops.h` bindings): op descriptors for [`transport::Batch`].
pub use kernels_dsp as abi;

pub use block::KvStats;
pub use block::{
    Cols, DeviceKv, ForwardHandle, ForwardOutput, HexTransformer, HexTransformerBuilder,
    HexTransformerConfig, LayerWeights, Matrix, MatrixShape, Node, PackedWeight, Part, Program,
    StackShape, TransformerWeights, WeightRef,
};
pub use device::{DeviceCounters, HexagonConfig, HexagonDevice, TransportConfig};
pub use error::{
    fmt_bytes, CacheProblem, ConfigProblem, Error, InputProblem, LibraryProblem, ProgramProblem,
    ProgramSite, Result, TransportFault, Unit,
};
pub use memory::{page_size, SHARED_MEMORY_SUPPORTED};
pub use memory::{DeviceBuffer, MemoryStats};
pub use ops::linear::{PackedFormat, Placed};
pub use ops::HexLinear;
pub use routing::RoutingStats;
pub use routing::{Decision, OpDesc, OpKind, Reason, RoutingReport, Support, Tier, WeightFormat};
pub use runtime::PlanRow;
pub use runtime::SwapStats;
pub use runtime::{MemoryPlan, MemoryPolicy, SwapSnapshot};

/// Path of the host FastRPC shim library built with this crate (feature `fastrpc`, Linux host
/// builds), which exports libcdsprpc.so's C ABI and serves it with the emulated DSP. `None` when
/// it was not built.
pub fn shim_library_path() -> Option<std::path::PathBuf> {
    #[cfg(candle_hexagon_shim)]
    {
        Some(std::path::PathBuf::from(env!("CANDLE_HEXAGON_SHIM")))
    }
    #[cfg(not(candle_hexagon_shim))]
    {
        None
    }
}
