//! Where the fused inference ops run: the [`Backend`] every layer is built for.

#[cfg(not(feature = "hexagon"))]
pub use crate::hexagon_off::HexagonDevice;
#[cfg(feature = "hexagon")]
pub use candle_hexagon::HexagonDevice;

/// Where the fused inference ops run.
#[derive(Debug, Clone, Default)]
pub enum Backend {
    /// The CPU: the linear layers are `kernels-cpu` GEMMs over weights packed once at load
    /// ([`CpuLinear`]; candle's matmul instead under [`CpuLinears::Candle`], and candle's
    /// `QMatMul` for GGUF types without a kernel), attention over the KV cache is `kernels-cpu`'s,
    /// and so are SwiGLU, the residual add and RoPE (f32); RMSNorm is candle-nn's fused CPU op.
    #[default]
    Cpu,
    /// The Hexagon NPU (emulated DSP or FastRPC), with CPU fallback per op.
    Hexagon(HexagonDevice),
}

impl Backend {
    /// The Hexagon device, when that is the backend.
    pub fn hexagon(&self) -> Option<&HexagonDevice> {
        match self {
            Backend::Cpu => None,
            Backend::Hexagon(d) => Some(d),
        }
    }
}
