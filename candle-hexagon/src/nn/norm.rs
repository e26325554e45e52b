//! [`RmsNorm`]: candle-nn's RMSNorm with the NPU's `RMS_NORM` kernel.

use candle_core::{Module, Tensor};

use crate::device::HexagonDevice;
use crate::error::{Error, InputProblem, Result};

/// `x * rsqrt(mean(x^2) + eps) * weight` over the last dimension, in f32: on the NPU when routed,
/// else candle-nn's fused CPU `rms_norm`. The weight stays a host tensor (it is staged per call,
/// `hidden * 4` bytes).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
    dev: HexagonDevice,
}

impl RmsNorm {
    /// candle-nn's `RmsNorm::new(weight, eps)` with the device; `weight` must be 1-D and `eps`
    /// finite and `>= 0`.
    pub fn new(dev: &HexagonDevice, weight: Tensor, eps: f64) -> Result<Self> {
        if weight.rank() != 1 {
            return Err(Error::input(
                "RmsNorm",
                InputProblem::Rank {
                    what: "weight",
                    expected: "1-D",
                    found: weight.dims().to_vec(),
                },
            ));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(Error::input("RmsNorm", InputProblem::Eps { value: eps }));
        }
        Ok(RmsNorm {
            weight,
            eps,
            dev: dev.clone(),
        })
    }

    /// The scale weight.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon added to `mean(x^2)`.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Ok(crate::ops::rms_norm(
            &self.dev,
            x,
            &self.weight,
            self.eps as f32,
        )?)
    }
}

/// candle-nn's `rms_norm(size, eps, vb)` on `dev`: reads `weight (size)` from `vb` (initialised to
/// ones when `vb` is backed by a `VarMap`).
pub fn rms_norm(
    size: usize,
    eps: f64,
    vb: candle_nn::VarBuilder,
    dev: &HexagonDevice,
) -> Result<RmsNorm> {
    let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.0))?;
    RmsNorm::new(dev, weight, eps)
}
