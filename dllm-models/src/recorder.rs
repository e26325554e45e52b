//! A [`DiffusionLm`] that delegates to another model and records every forward: the positions
//! whose logits were asked for and the batch-0 logits returned. Comparing two backends forward by
//! forward (the emulated NPU against the CPU in tests and in `bench-swap`) needs exactly this.

use std::ops::Range;

use candle_core::{Device, Tensor};

use crate::lm::{DiffusionLm, ModelInfo, Refresh, Rows, SequenceToken};
use crate::Result;

/// One recorded forward: the requested positions and their batch-0 logits, row by row.
pub type RecordedForward = (Vec<usize>, Vec<Vec<f32>>);

/// Delegates to `inner` and records every forward.
pub struct LogitsRecorder<'a> {
    inner: &'a mut dyn DiffusionLm,
    /// Every forward so far, in order.
    pub calls: Vec<RecordedForward>,
}

impl<'a> LogitsRecorder<'a> {
    /// Record the forwards of `inner`.
    pub fn new(inner: &'a mut dyn DiffusionLm) -> Self {
        Self {
            inner,
            calls: Vec::new(),
        }
    }
}

impl DiffusionLm for LogitsRecorder<'_> {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }
    fn device(&self) -> &Device {
        self.inner.device()
    }
    fn forward(&mut self, c: &Tensor, window: Range<usize>, rows: Rows<'_>) -> Result<Tensor> {
        let pos = match rows {
            Rows::All => window.clone().collect(),
            Rows::Positions(p) => p.to_vec(),
            Rows::None => vec![],
        };
        let out = self.inner.forward(c, window, rows)?;
        let v: Vec<Vec<f32>> = out.narrow(0, 0, 1)?.squeeze(0)?.to_vec2()?;
        self.calls.push((pos, v));
        Ok(out)
    }
    fn commit(&mut self, r: Range<usize>) -> Result<()> {
        self.inner.commit(r)
    }
    fn cache_len(&self) -> usize {
        self.inner.cache_len()
    }
    fn truncate_cache(&mut self, len: usize) -> Result<()> {
        self.inner.truncate_cache(len)
    }
    fn compute_refresh(&self, c: &Tensor, p: &[usize], l: Option<&[usize]>) -> Result<Refresh> {
        self.inner.compute_refresh(c, p, l)
    }
    fn apply_refresh(&mut self, r: &Refresh) -> Result<()> {
        self.inner.apply_refresh(r)
    }
    fn token(&self) -> SequenceToken {
        self.inner.token()
    }
    fn epoch(&self) -> u64 {
        self.inner.epoch()
    }
}
