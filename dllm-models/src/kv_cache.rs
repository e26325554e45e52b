//! Per-layer K/V storage for canvas positions `[0, len)`.
//!
//! Each layer keeps one contiguous `(batch, capacity, kv_heads, head_dim)` buffer for keys and one
//! for values, written in place (`slice_set`) so committing a block or merging a sparse refresh costs
//! only the rows written. Keys are stored with RoPE applied, so attention never needs positions.

use candle_core::{Device, Tensor};

use crate::{Error, Result};

#[derive(Debug, Clone)]
struct LayerKv {
    k: Tensor,
    v: Tensor,
}

/// The cache of one model instance.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    len: usize,
    batch: usize,
}

impl KvCache {
    /// An empty cache for `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
            len: 0,
            batch: 0,
        }
    }

    /// Cached positions `[0, len)`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Batch size of the cached entries (meaningful when non-empty).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Forget positions `>= len`.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::InvalidArgument(format!(
                "cannot roll the KV cache forward from {} to {len} positions",
                self.len
            )));
        }
        self.len = len;
        Ok(())
    }

    /// Check a batch size against the cached one.
    pub fn check_batch(&self, batch: usize) -> Result<()> {
        if self.len > 0 && self.batch != batch {
            return Err(Error::InvalidArgument(format!(
                "canvas batch {batch} does not match the cached batch {}",
                self.batch
            )));
        }
        Ok(())
    }

    /// Keys/values for a window `[ws, we)` whose fresh entries are `k`/`v` `(b, we - ws, h, d)`:
    /// cached `[0, ws)`, the window, then cached `[we, len)` (attention is order-free).
    pub fn around(
        &self,
        layer: usize,
        ws: usize,
        we: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let Some(c) = self.layers[layer].as_ref().filter(|_| self.len > 0) else {
            return Ok((k.clone(), v.clone()));
        };
        let mut ks = Vec::with_capacity(3);
        let mut vs = Vec::with_capacity(3);
        let before = ws.min(self.len);
        if before > 0 {
            ks.push(c.k.narrow(1, 0, before)?);
            vs.push(c.v.narrow(1, 0, before)?);
        }
        ks.push(k.clone());
        vs.push(v.clone());
        if we < self.len {
            ks.push(c.k.narrow(1, we, self.len - we)?);
            vs.push(c.v.narrow(1, we, self.len - we)?);
        }
        if ks.len() == 1 {
            return Ok((k.clone(), v.clone()));
        }
        Ok((Tensor::cat(&ks, 1)?, Tensor::cat(&vs, 1)?))
    }

    /// The cached positions not in `positions` (sorted, unique, `< len`), as an index tensor for
    /// [`Self::with_rows_replaced`]; `None` when every cached position is replaced. Build it once
    /// per refresh: it is the same for every layer.
    pub fn kept_rows(&self, positions: &[usize], device: &Device) -> Result<Option<Tensor>> {
        let keep: Vec<u32> = {
            let mut it = positions.iter().peekable();
            (0..self.len)
                .filter(|p| {
                    if it.peek() == Some(&p) {
                        it.next();
                        false
                    } else {
                        true
                    }
                })
                .map(|p| p as u32)
                .collect()
        };
        Ok(if keep.is_empty() {
            None
        } else {
            Some(Tensor::new(keep, device)?)
        })
    }

    /// Keys/values of the cached rows `kept` (from [`Self::kept_rows`]) followed by the replaced
    /// rows `k`/`v` `(b, positions.len(), h, d)`.
    pub fn with_rows_replaced(
        &self,
        layer: usize,
        kept: Option<&Tensor>,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let c = self.layers[layer]
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("the KV cache is empty".into()))?;
        let Some(idx) = kept else {
            return Ok((k.clone(), v.clone()));
        };
        let kk = c.k.narrow(1, 0, self.len)?.index_select(idx, 1)?;
        let vv = c.v.narrow(1, 0, self.len)?.index_select(idx, 1)?;
        Ok((Tensor::cat(&[&kk, k], 1)?, Tensor::cat(&[&vv, v], 1)?))
    }

    /// Write `k`/`v` `(b, n, h, d)` at positions `[offset, offset + n)`, growing the buffers as needed.
    /// Does not change `len`.
    pub fn write(&mut self, layer: usize, offset: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let (b, n, h, d) = k.dims4()?;
        let need = offset + n;
        let slot = &mut self.layers[layer];
        let grow = match slot {
            None => true,
            Some(c) => c.k.dim(1)? < need || c.k.dim(0)? != b,
        };
        if grow {
            let cap = need.next_power_of_two().max(64);
            let nk = Tensor::zeros((b, cap, h, d), k.dtype(), k.device())?;
            let nv = Tensor::zeros((b, cap, h, d), v.dtype(), v.device())?;
            if let Some(c) = slot.as_ref() {
                if c.k.dim(0)? == b && self.len > 0 {
                    nk.slice_set(&c.k.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                    nv.slice_set(&c.v.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                }
            }
            *slot = Some(LayerKv { k: nk, v: nv });
        }
        let c = slot.as_ref().expect("allocated above");
        c.k.slice_set(&k.contiguous()?, 1, offset)?;
        c.v.slice_set(&v.contiguous()?, 1, offset)?;
        Ok(())
    }

    /// Extend or keep the valid range after writes: `len = max(len, end)`.
    pub fn set_valid(&mut self, end: usize, batch: usize) {
        self.len = self.len.max(end);
        self.batch = batch;
    }

    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|c| 2 * c.k.elem_count() * c.k.dtype().size_in_bytes())
            .sum()
    }
}
