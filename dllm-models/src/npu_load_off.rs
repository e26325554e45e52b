//! Placing a model's blocks on the NPU, in a build without the `hexagon` feature (unreachable: no
//! [`HexagonDevice`] or [`HexTransformer`] exists; see `npu_load.rs`).

use candle_core::Tensor;

use crate::block::{GateUp, Qkv};
use crate::config::TransformerConfig;
use crate::hexagon_off::{HexTransformer, HexagonDevice};
use crate::layers::Linear;
use crate::weights::WeightSource;
use crate::Result;

pub(crate) fn shared_block(
    hex: &HexTransformer,
    _: usize,
    _: &TransformerConfig,
    _: Option<&Tensor>,
) -> Result<(Qkv, Linear, GateUp, Linear)> {
    match *hex {}
}

pub(crate) fn shared_head(hex: &HexTransformer, _: &TransformerConfig) -> Result<Option<Linear>> {
    match *hex {}
}

pub(crate) fn place_blocks(
    dev: &HexagonDevice,
    _: &TransformerConfig,
    _: &dyn WeightSource,
) -> Result<Option<HexTransformer>> {
    match *dev {}
}
