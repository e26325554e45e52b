//! Stand-ins for the Hexagon backend's types in a build without the `hexagon` feature.
//!
//! Each is an uninhabited enum: no value of it can exist, so [`crate::Backend::Hexagon`],
//! [`crate::linear::Linear::Hex`] and the NPU sequence paths still type-check but are statically
//! unreachable — and the crate compiles with no C code, no memfd shared buffers and no DSP threads.
//! The stand-ins of the NPU paths that take these types are in `npu_load_off.rs` (loading) and
//! `npu_seq_off.rs` (the sequence paths).

use std::ops::Range;

use candle_core::Tensor;

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
    pub(crate) fn read_rows(&self, _: usize, _: Range<usize>) -> Result<(Tensor, Tensor)> {
        match *self {}
    }
}

impl crate::kv_cache::KvRows for DeviceKv {
    fn len(&self) -> usize {
        match *self {}
    }
    fn capacity(&self) -> usize {
        match *self {}
    }
    fn batch(&self) -> usize {
        match *self {}
    }
    fn move_rows(&mut self, _: usize, _: usize, _: usize) -> Result<()> {
        match *self {}
    }
    fn set_len(&mut self, _: usize) -> Result<()> {
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
