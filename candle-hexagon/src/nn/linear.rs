//! [`Linear`]: candle-nn's linear layer with its weight packed on the NPU, or kept on the CPU as
//! the candle-nn layer itself when the device does not take it.

use candle_core::{Module, Tensor};

use crate::device::HexagonDevice;
use crate::error::Result;
use crate::ops::linear::{HexLinear, Placed};
use crate::routing::Reason;

/// Where a [`Linear`] runs.
#[derive(Debug, Clone)]
enum Place {
    Npu(HexLinear),
    Cpu {
        layer: candle_nn::Linear,
        reason: Reason,
    },
}

/// `y = x W^T (+ b)` with `W (out, in)`: on the NPU (fp16 HMX tiles) when the device takes the
/// weight at load time, else the candle-nn layer on the CPU (the reason is kept and counted).
#[derive(Debug, Clone)]
pub struct Linear {
    place: Place,
}

impl Linear {
    /// candle-nn's `Linear::new(weight, bias)` with the device: packs `weight (out, in)` (any
    /// float dtype) and the optional `bias (out)` on `dev`, or keeps them on the CPU.
    pub fn new(dev: &HexagonDevice, weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let place = match HexLinear::from_dense(dev, &weight, bias.as_ref())? {
            Placed::Npu(lin) => Place::Npu(lin),
            Placed::Cpu(reason) => Place::Cpu {
                layer: candle_nn::Linear::new(weight, bias),
                reason,
            },
        };
        Ok(Linear { place })
    }

    /// The same layer as an existing candle-nn one.
    pub fn from_candle(dev: &HexagonDevice, layer: &candle_nn::Linear) -> Result<Self> {
        Self::new(dev, layer.weight().clone(), layer.bias().cloned())
    }

    /// The NPU layer, when the weight was placed there.
    pub fn npu(&self) -> Option<&HexLinear> {
        match &self.place {
            Place::Npu(l) => Some(l),
            Place::Cpu { .. } => None,
        }
    }

    /// The candle-nn layer and why it stayed on the CPU, when it did.
    pub fn cpu(&self) -> Option<(&candle_nn::Linear, &Reason)> {
        match &self.place {
            Place::Npu(_) => None,
            Place::Cpu { layer, reason } => Some((layer, reason)),
        }
    }

    /// True when the weight lives on the NPU.
    pub fn is_on_npu(&self) -> bool {
        matches!(self.place, Place::Npu(_))
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.place {
            Place::Npu(l) => Ok(l.forward_hex(x)?),
            Place::Cpu { layer, .. } => layer.forward(x),
        }
    }
}

/// candle-nn's `linear(in_dim, out_dim, vb)` on `dev`: reads `weight (out, in)` and `bias (out)`
/// from `vb` (with candle-nn's initialisers when `vb` is backed by a `VarMap`).
pub fn linear(
    in_dim: usize,
    out_dim: usize,
    vb: candle_nn::VarBuilder,
    dev: &HexagonDevice,
) -> Result<Linear> {
    Linear::from_candle(dev, &candle_nn::linear(in_dim, out_dim, vb)?)
}

/// candle-nn's `linear_no_bias(in_dim, out_dim, vb)` on `dev`.
pub fn linear_no_bias(
    in_dim: usize,
    out_dim: usize,
    vb: candle_nn::VarBuilder,
    dev: &HexagonDevice,
) -> Result<Linear> {
    Linear::from_candle(dev, &candle_nn::linear_no_bias(in_dim, out_dim, vb)?)
}

/// candle-nn's `linear_b(in_dim, out_dim, bias, vb)` on `dev`.
pub fn linear_b(
    in_dim: usize,
    out_dim: usize,
    bias: bool,
    vb: candle_nn::VarBuilder,
    dev: &HexagonDevice,
) -> Result<Linear> {
    Linear::from_candle(dev, &candle_nn::linear_b(in_dim, out_dim, bias, vb)?)
}
