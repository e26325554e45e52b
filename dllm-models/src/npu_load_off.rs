//! Placing a model's blocks on the NPU, in a build without the `hexagon` feature (unreachable: no
//! [`HexagonDevice`] or [`HexTransformer`] exists; see `npu_load.rs`).

use candle_core::Tensor;

use crate::block::{GateUp, Qkv};
use crate::config::TransformerConfig;
use crate::hexagon_off::{HexTransformer, HexagonDevice};
use crate::layer_params::LayerParams;
use crate::layers::Linear;
use crate::linear::CpuLinears;
use crate::weights::WeightSource;
use crate::Result;

/// The NPU stack being packed (none exists in this build).
pub(crate) enum NpuStack {}

pub(crate) fn shared_block(
    hex: &HexTransformer,
    _: usize,
    _: &TransformerConfig,
    _: Option<&Tensor>,
) -> Result<(Qkv, Linear, GateUp, Linear)> {
    match *hex {}
}

pub(crate) fn begin(
    dev: &HexagonDevice,
    _: &TransformerConfig,
    _: &dyn WeightSource,
) -> Result<Option<NpuStack>> {
    match *dev {}
}

impl NpuStack {
    pub(crate) fn push_layer(
        &mut self,
        _: &TransformerConfig,
        _: &dyn WeightSource,
        _: usize,
        _: &LayerParams,
    ) -> Result<()> {
        match *self {}
    }

    pub(crate) fn finish(
        self,
        _: &TransformerConfig,
        _: &dyn WeightSource,
        _: &Tensor,
        _: CpuLinears,
    ) -> Result<(HexTransformer, Option<Linear>)> {
        match self {}
    }
}
