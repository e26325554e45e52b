//! Stand-ins for the Hexagon backend's types in a build without the `hexagon` feature.
//!
//! Each is an uninhabited enum: no value of it can exist, so [`crate::Backend::Hexagon`],
//! [`crate::linear::Linear::Hex`] and the NPU sequence paths still type-check but are statically
//! unreachable — and the crate compiles with no C code, no memfd shared buffers and no DSP threads.

use std::ops::Range;

use candle_core::Tensor;

use crate::lm::{Refresh, RefreshRequest, Rows};
use crate::weights_model::TransformerWeights;
use crate::Result;

/// The Hexagon device. This build has no Hexagon backend (the `hexagon` feature is off), so no
/// value of this type exists.
#[derive(Debug, Clone)]
pub enum HexagonDevice {}

/// A KV cache in device memory (never exists without the `hexagon` feature).
#[derive(Debug)]
pub enum DeviceKv {}

/// The NPU's block-level module (never exists without the `hexagon` feature).
#[derive(Debug, Clone)]
pub enum HexTransformer {}

/// A linear layer packed in NPU memory (never exists without the `hexagon` feature).
#[derive(Debug, Clone)]
pub enum HexLinear {}

impl DeviceKv {
    pub(crate) fn len(&self) -> usize {
        match *self {}
    }
    pub(crate) fn is_empty(&self) -> bool {
        match *self {}
    }
    pub(crate) fn layers(&self) -> usize {
        match *self {}
    }
    pub(crate) fn capacity(&self) -> usize {
        match *self {}
    }
    pub(crate) fn batch(&self) -> usize {
        match *self {}
    }
    pub(crate) fn kv_heads(&self) -> usize {
        match *self {}
    }
    pub(crate) fn head_dim(&self) -> usize {
        match *self {}
    }
    pub(crate) fn commit(&mut self, _: Range<usize>) -> Result<()> {
        match *self {}
    }
    pub(crate) fn truncate(&mut self, _: usize) -> Result<()> {
        match *self {}
    }
    pub(crate) fn read_rows(&self, _: usize, _: Range<usize>) -> Result<(Tensor, Tensor)> {
        match *self {}
    }
}

impl HexLinear {
    pub(crate) fn dims(&self) -> (usize, usize) {
        match *self {}
    }
    pub(crate) fn forward_hex(&self, _: &Tensor) -> Result<Tensor> {
        match *self {}
    }
}

/// The NPU sequence paths of [`crate::DiffusionTransformer`] (unreachable: no [`HexTransformer`]).
pub(crate) mod npu_seq {
    use super::*;

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

    pub(crate) fn shared_block(
        hex: &HexTransformer,
        _: usize,
        _: &crate::config::TransformerConfig,
        _: Option<&Tensor>,
    ) -> Result<(
        crate::block::Qkv,
        crate::layers::Linear,
        crate::block::GateUp,
        crate::layers::Linear,
    )> {
        match *hex {}
    }

    pub(crate) fn shared_head(hex: &HexTransformer) -> Result<Option<crate::layers::Linear>> {
        match *hex {}
    }

    pub(crate) fn place_blocks(
        dev: &HexagonDevice,
        _: &crate::config::TransformerConfig,
        _: &dyn crate::weights::WeightSource,
    ) -> Result<Option<HexTransformer>> {
        match *dev {}
    }
}
