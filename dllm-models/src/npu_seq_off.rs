//! The NPU sequence paths of [`crate::DiffusionTransformer`] in a build without the `hexagon`
//! feature (unreachable: no [`HexTransformer`] or [`DeviceKv`] exists; see `npu_seq.rs`).

use std::ops::Range;

use candle_core::Tensor;

use crate::hexagon_off::{DeviceKv, HexTransformer};
use crate::lm::{Refresh, RefreshRequest, Rows};
use crate::weights_model::TransformerWeights;
use crate::Result;

pub(crate) fn ensure_kv<'a>(
    hex: &HexTransformer,
    _: &'a mut Option<DeviceKv>,
    _: usize,
    _: usize,
) -> Result<&'a mut DeviceKv> {
    match *hex {}
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    _: &TransformerWeights,
    hex: &HexTransformer,
    _: &mut DeviceKv,
    _: crate::lm::SequenceToken,
    _: &Tensor,
    _: Range<usize>,
    _: Rows<'_>,
    _: Option<RefreshRequest<'_>>,
) -> Result<(Tensor, Option<Refresh>)> {
    match *hex {}
}

pub(crate) fn refresh_on_cpu(
    _: &TransformerWeights,
    kv: &DeviceKv,
    _: crate::lm::SequenceToken,
    _: &Tensor,
    _: &[usize],
    _: Option<&[usize]>,
) -> Result<Refresh> {
    match *kv {}
}

pub(crate) fn rescore_on_cpu(
    _: &TransformerWeights,
    kv: &DeviceKv,
    _: &Tensor,
    _: &[usize],
) -> Result<Tensor> {
    match *kv {}
}

pub(crate) fn apply(kv: &mut DeviceKv, _: &Refresh) -> Result<()> {
    match *kv {}
}
