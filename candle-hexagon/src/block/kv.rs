//! `DeviceKv`: per-layer K/V rows resident in NPU memory as fp16.
//!
//! Per layer one shared buffer holds K then V, each `(batch, capacity, kv_heads, head_dim)`;
//! rows `[0, len)` are positions `[0, len)`, keys stored with RoPE applied. A forward of the
//! positions `[ws, ws + n)` writes their K/V at rows `[len, len + n)`, after the cached rows,
//! and leaves `len` alone; attention reads rows `[0, len + n)` and skips the stale cached rows
//! of the window's own positions. The rows `[0, filled)` hold data: the cached rows and what
//! the last forward (or a move) wrote after them. Which of those rows become cached ones is the
//! caller's business, with plain row operations: [`DeviceKv::move_rows`] (a `memmove` inside
//! each buffer), [`DeviceKv::set_len`] and [`DeviceKv::truncate`]. Growing the capacity maps new
//! buffers and copies the filled rows (counted in [`KvStats`]).
//!
//! The host side (reads of cached rows for a CPU refresh, writes of refreshed rows, row copies)
//! goes through the buffers' checked access: it proceeds beside a forward in flight when the
//! rows do not conflict (reading `[0, len)` while the NPU appends at `len`) and fails with
//! [`Error::Busy`] otherwise.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use half::f16;
use kernels_dsp::*;

use crate::device::HexagonDevice;
use crate::error::{CacheProblem, Error, InputProblem, Result};
use crate::memory::{align_tensor, DeviceBuffer};
use crate::ops::{typed, typed_mut, Wire};

/// Growth and copy counters of a [`DeviceKv`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Times the capacity grew (each a new mapping per layer plus a copy).
    pub grows: u64,
    /// Bytes copied by growth.
    pub grow_bytes: u64,
    /// Bytes moved inside the buffers by [`DeviceKv::move_rows`] (and row copies).
    pub moved_bytes: u64,
}

/// K/V rows resident in NPU memory (fp16), for one [`super::HexTransformer`] and one batch of
/// sequences. See the module docs.
pub struct DeviceKv {
    dev: HexagonDevice,
    layers: usize,
    batch: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    len: usize,
    filled: usize,
    bufs: Vec<DeviceBuffer>,
    stats: KvStats,
}

impl std::fmt::Debug for DeviceKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceKv")
            .field("layers", &self.layers)
            .field("batch", &self.batch)
            .field("kv_heads", &self.kv_heads)
            .field("head_dim", &self.head_dim)
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("filled", &self.filled)
            .finish()
    }
}

fn invalid(problem: impl Into<InputProblem>) -> Error {
    Error::input("DeviceKv", problem)
}

impl DeviceKv {
    /// An empty cache of `layers` layers for `batch` sequences with room for `capacity` rows.
    pub fn new(
        dev: &HexagonDevice,
        layers: usize,
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<Self> {
        if layers == 0 || batch == 0 || kv_heads == 0 || head_dim == 0 || capacity == 0 {
            return Err(invalid(CacheProblem::Sizes {
                layers,
                batch,
                kv_heads,
                head_dim,
                capacity,
            }));
        }
        let mut kv = DeviceKv {
            dev: dev.clone(),
            layers,
            batch,
            kv_heads,
            head_dim,
            capacity: 0,
            len: 0,
            filled: 0,
            bufs: Vec::new(),
            stats: KvStats::default(),
        };
        kv.bufs = kv.map_buffers(capacity)?;
        kv.capacity = capacity;
        Ok(kv)
    }

    /// Bytes of one row (one position of one sequence) of K or V.
    fn row_bytes(&self) -> usize {
        self.kv_heads * self.head_dim * 2
    }

    /// Offset of V in a layer buffer of `capacity` rows.
    fn v_base(&self, capacity: usize) -> usize {
        align_tensor(self.batch * capacity * self.row_bytes())
    }

    fn map_buffers(&self, capacity: usize) -> Result<Vec<DeviceBuffer>> {
        let bytes = capacity
            .checked_mul(self.batch * self.row_bytes())
            .and_then(|b| align_tensor(b).checked_mul(2))
            .filter(|&b| b <= crate::device::MAX_VA_WINDOW_BYTES as usize)
            .ok_or_else(|| invalid(CacheProblem::Capacity { rows: capacity }))?;
        (0..self.layers)
            .map(|_| self.dev.map_buffer(bytes))
            .collect()
    }

    /// Cached rows `[0, len)`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows the buffers hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Layers.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Element type of the stored K/V.
    pub fn dtype(&self) -> DType {
        DType::F16
    }

    /// Rows `[0, filled)` hold K/V: the cached rows, then what the last forward (or a move)
    /// wrote after them.
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// Growth and copy counters.
    pub fn stats(&self) -> KvStats {
        self.stats
    }

    pub(crate) fn check_geometry(
        &self,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        batch: usize,
    ) -> Result<()> {
        if (layers, kv_heads, head_dim) != (self.layers, self.kv_heads, self.head_dim) {
            return Err(invalid(CacheProblem::Geometry {
                cache: [self.layers, self.kv_heads, self.head_dim],
                model: [layers, kv_heads, head_dim],
            }));
        }
        if batch != self.batch {
            return Err(invalid(CacheProblem::Batch {
                cache: self.batch,
                found: batch,
            }));
        }
        Ok(())
    }

    /// Before a forward of `[ws, ws + n)`: the window may not start past the cache, and the
    /// buffers must hold `len + n` rows (grown if needed). Returns the row the window goes to.
    pub(crate) fn prepare(&mut self, ws: usize, n: usize) -> Result<usize> {
        if ws > self.len {
            return Err(invalid(CacheProblem::WindowPastCache {
                start: ws,
                cached: self.len,
            }));
        }
        self.reserve(self.len + n)?;
        Ok(self.len)
    }

    /// A forward wrote rows `[len, len + n)`.
    pub(crate) fn forward_wrote(&mut self, n: usize) {
        self.filled = self.len + n;
    }

    /// Make sure the buffers hold at least `rows` rows: new mappings of
    /// `max(rows, 2 * capacity)` rows and a copy of the filled rows.
    pub fn reserve(&mut self, rows: usize) -> Result<()> {
        if rows <= self.capacity {
            return Ok(());
        }
        let cap = rows.max(2 * self.capacity);
        let fresh = self.map_buffers(cap)?;
        let keep = self.filled;
        let rb = self.row_bytes();
        let mut copied = 0u64;
        for (old, new) in self.bufs.iter().zip(&fresh) {
            for bi in 0..self.batch {
                for (ob, nb) in [(0, 0), (self.v_base(self.capacity), self.v_base(cap))] {
                    let bytes = old.read(ob + bi * self.capacity * rb, keep * rb)?;
                    new.write(nb + bi * cap * rb, &bytes)?;
                    copied += bytes.len() as u64;
                }
            }
        }
        self.bufs = fresh;
        self.capacity = cap;
        self.stats.grows += 1;
        self.stats.grow_bytes += copied;
        Ok(())
    }

    /// Copy rows `[src, src + n)` to `[dst, dst + n)` in K and V of every layer and sequence
    /// (the ranges may overlap): the source inside the filled rows, the destination starting at
    /// or before their end (the buffers grow if needed; the filled rows extend to `dst + n`).
    /// `len` is unchanged. Fails with [`Error::Busy`] while a forward in flight touches the rows.
    pub fn move_rows(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        if src.checked_add(n).is_none_or(|e| e > self.filled) || dst > self.filled {
            return Err(invalid(CacheProblem::Move {
                src: src..src.saturating_add(n),
                dst,
                filled: self.filled,
            }));
        }
        if n == 0 || src == dst {
            return Ok(());
        }
        self.reserve(dst + n)?;
        self.copy_within(src, dst, n)?;
        self.stats.moved_bytes += (2 * self.layers * self.batch * n * self.row_bytes()) as u64;
        self.filled = self.filled.max(dst + n);
        Ok(())
    }

    /// Make rows `[0, len)` the cached ones: `len` at most the filled rows. Shrinking forgets
    /// the rows after `len` (the filled rows end there too).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.filled {
            return Err(invalid(CacheProblem::Unfilled {
                len,
                filled: self.filled,
            }));
        }
        if len < self.len {
            self.filled = len;
        }
        self.len = len;
        Ok(())
    }

    /// `memmove` of rows inside each buffer (checked by the caller).
    fn copy_within(&self, src: usize, dst: usize, n: usize) -> Result<()> {
        let rb = self.row_bytes();
        for buf in &self.bufs {
            for bi in 0..self.batch {
                for base in [0, self.v_base(self.capacity)] {
                    let row = |r: usize| base + (bi * self.capacity + r) * rb;
                    buf.copy_within(row(src), row(dst), n * rb)?;
                }
            }
        }
        Ok(())
    }

    /// Forget rows `>= len` (cached or filled after the cache).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(invalid(CacheProblem::RollForward {
                from: self.len,
                to: len,
            }));
        }
        self.len = len;
        self.filled = len;
        Ok(())
    }

    /// Copy rows `src` to `[dst, dst + src.len())` in every layer (both inside `[0, len)` for
    /// the source, `dst <= len` for the destination; extends `len` to the copy's end).
    pub fn copy_rows(&mut self, src: Range<usize>, dst: usize) -> Result<()> {
        if src.start > src.end || src.end > self.len || dst > self.len {
            return Err(invalid(CacheProblem::Copy {
                src,
                dst,
                cached: self.len,
            }));
        }
        self.move_rows(src.start, dst, src.len())?;
        self.len = self.len.max(dst + src.len());
        Ok(())
    }

    /// K and V of cached rows `rows` of `layer`, each `(batch, rows.len(), kv_heads, head_dim)`
    /// f16 (keys with RoPE applied). Allowed while a forward is in flight: it only appends.
    pub fn read_rows(&self, layer: usize, rows: Range<usize>) -> Result<(Tensor, Tensor)> {
        self.check_layer(layer)?;
        if rows.start > rows.end || rows.end > self.len {
            return Err(invalid(CacheProblem::RowsNotCached {
                rows,
                cached: self.len,
            }));
        }
        self.gather(layer, &[rows])
    }

    /// K and V of cached `positions` (any order) of `layer`, `(batch, positions.len(), kv_heads,
    /// head_dim)` f16.
    pub fn read_positions(&self, layer: usize, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        self.check_layer(layer)?;
        if let Some(&bad) = positions.iter().find(|&&p| p >= self.len) {
            return Err(invalid(CacheProblem::NotCached {
                position: bad,
                cached: self.len,
            }));
        }
        self.gather(layer, &runs(positions))
    }

    /// Run `f` on the cached rows `[0, len)` of every layer, read in place: per layer `(k, v)`,
    /// each `(len, kv_heads, head_dim)` f16 (keys with RoPE applied) — no copy. A batch of one
    /// sequence only (the rows of several sequences are not contiguous: use [`Self::read_rows`]).
    /// Allowed while a forward is in flight (it appends after `len`); each layer's buffer is
    /// locked for host access during `f`, so a batch cannot be registered on it meanwhile (a
    /// forward submits all its batches before returning its handle, so the one in flight is not
    /// held up), and host writes to the cache wait.
    pub fn with_cached_rows<R>(&self, f: impl FnOnce(&[(&[f16], &[f16])]) -> R) -> Result<R> {
        if self.batch != 1 {
            return Err(invalid(CacheProblem::InPlaceBatch { batch: self.batch }));
        }
        let n = self.len * self.row_bytes();
        let ranges = [(0, n), (self.v_base(self.capacity), n)];
        let mut layers: Vec<(&[f16], &[f16])> = Vec::with_capacity(self.layers);
        self.nest(&ranges, &mut layers, f)
    }

    /// Hold layer `layers.len()`'s buffer for reading and recurse; at the last layer, run `f`.
    fn nest<'a, R>(
        &'a self,
        ranges: &[(usize, usize)],
        layers: &mut Vec<(&'a [f16], &'a [f16])>,
        f: impl FnOnce(&[(&[f16], &[f16])]) -> R,
    ) -> Result<R> {
        let li = layers.len();
        if li == self.layers {
            return Ok(f(layers));
        }
        self.bufs[li].read_in_place(ranges, |views| {
            let (k, v) = (typed::<f16>(views[0])?, typed::<f16>(views[1])?);
            // SAFETY: the views are valid while this closure runs, and every use of them below
            // (the recursion and `f`) returns before it does; they are dropped from `layers`
            // before the lock that guards them is released.
            let (k, v): (&'a [f16], &'a [f16]) = unsafe {
                (
                    std::slice::from_raw_parts(k.as_ptr(), k.len()),
                    std::slice::from_raw_parts(v.as_ptr(), v.len()),
                )
            };
            layers.push((k, v));
            let out = self.nest(ranges, layers, f);
            layers.pop();
            out
        })?
    }

    fn gather(&self, layer: usize, runs: &[Range<usize>]) -> Result<(Tensor, Tensor)> {
        let rb = self.row_bytes();
        let m: usize = runs.iter().map(|r| r.len()).sum();
        let elems = self.batch * m * rb / 2;
        let mut out: [Vec<f16>; 2] = [Vec::with_capacity(elems), Vec::with_capacity(elems)];
        let buf = &self.bufs[layer];
        for (half, base) in [0, self.v_base(self.capacity)].into_iter().enumerate() {
            for bi in 0..self.batch {
                for r in runs {
                    let off = base + (bi * self.capacity + r.start) * rb;
                    buf.with_host_view(off, r.len() * rb, |b| {
                        typed::<f16>(b).map(|v| out[half].extend_from_slice(v))
                    })??;
                }
            }
        }
        self.dev.mem().count_staged(0, 2 * self.batch * m * rb);
        let shape = (self.batch, m, self.kv_heads, self.head_dim);
        let [k, v] = out;
        Ok((
            Tensor::from_vec(k, shape, &Device::Cpu)?,
            Tensor::from_vec(v, shape, &Device::Cpu)?,
        ))
    }

    /// Write `k`, `v` (`(batch, m, kv_heads, head_dim)`, any float dtype, stored as f16) at rows
    /// `[start, start + m)` of `layer` (growing the buffers if needed) and extend `len` to
    /// `start + m`. `start <= len` (no holes). Fails with [`Error::Busy`] while a forward in
    /// flight reads or writes those rows.
    pub fn write_rows(&mut self, layer: usize, start: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.check_layer(layer)?;
        let m = self.check_rows(k, v)?;
        if start > self.len {
            return Err(invalid(CacheProblem::Hole {
                rows: start..start + m,
                cached: self.len,
            }));
        }
        self.reserve(start + m)?;
        self.scatter(layer, &[(start, 0, m)], k, v)?;
        self.len = self.len.max(start + m);
        self.filled = self.filled.max(self.len);
        Ok(())
    }

    /// Write `k`, `v` (`(batch, positions.len(), ..)`) at cached `positions` of `layer` (a sparse
    /// refresh merged at a step boundary).
    pub fn write_positions(
        &mut self,
        layer: usize,
        positions: &[usize],
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        self.check_layer(layer)?;
        let m = self.check_rows(k, v)?;
        if m != positions.len() {
            return Err(invalid(CacheProblem::PositionsForRows {
                positions: positions.len(),
                rows: m,
            }));
        }
        if let Some(&bad) = positions.iter().find(|&&p| p >= self.len) {
            return Err(invalid(CacheProblem::NotCached {
                position: bad,
                cached: self.len,
            }));
        }
        // (cache row, source row, count) for runs of consecutive positions
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        for (i, &p) in positions.iter().enumerate() {
            match spans.last_mut() {
                Some((s, j, c)) if *s + *c == p && *j + *c == i => *c += 1,
                _ => spans.push((p, i, 1)),
            }
        }
        self.scatter(layer, &spans, k, v)
    }

    fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.layers {
            return Err(invalid(CacheProblem::Layer {
                layer,
                layers: self.layers,
            }));
        }
        Ok(())
    }

    fn check_rows(&self, k: &Tensor, v: &Tensor) -> Result<usize> {
        let (b, m, h, d) = k.dims4().map_err(|_| {
            invalid(InputProblem::Rank {
                what: "k",
                expected: "(batch, rows, kv_heads, head_dim)",
                found: k.dims().to_vec(),
            })
        })?;
        if v.dims() != k.dims() || (b, h, d) != (self.batch, self.kv_heads, self.head_dim) {
            return Err(invalid(CacheProblem::Rows {
                k: k.dims().to_vec(),
                v: v.dims().to_vec(),
                batch: self.batch,
                kv_heads: self.kv_heads,
                head_dim: self.head_dim,
            }));
        }
        Ok(m)
    }

    fn scatter(
        &self,
        layer: usize,
        spans: &[(usize, usize, usize)],
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let rb = self.row_bytes();
        let m = k.dim(1)?;
        let row_elems = rb / 2;
        let buf = &self.bufs[layer];
        let mut staged = 0;
        for (t, base) in [(k, 0), (v, self.v_base(self.capacity))] {
            let vals: Vec<f16> = t.to_dtype(DType::F16)?.flatten_all()?.to_vec1()?;
            for bi in 0..self.batch {
                for &(row, src, cnt) in spans {
                    let from = (bi * m + src) * row_elems;
                    let off = base + (bi * self.capacity + row) * rb;
                    buf.with_host_bytes(off, cnt * rb, |b| {
                        typed_mut::<f16>(b)
                            .map(|d| d.copy_from_slice(&vals[from..from + cnt * row_elems]))
                    })??;
                    staged += cnt * rb;
                }
            }
        }
        self.dev.mem().count_staged(staged, 0);
        Ok(())
    }

    // ---- descriptors for the block batches ----

    /// `(buffer id, bytes)` of each layer's buffer.
    pub(crate) fn buffer_ids(&self) -> Vec<(u32, usize)> {
        self.bufs.iter().map(|b| (b.id(), b.len())).collect()
    }

    /// Bytes of all layer buffers.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }

    /// K of rows `[row0, row0 + count)` of item `bi`: `{head_dim, kv_heads, count}` f16.
    pub(crate) fn k_rows(&self, layer: usize, bi: usize, row0: usize, count: usize) -> kdsp_tensor {
        self.rows_at(layer, 0, bi, row0, count)
    }

    /// V of rows `[0, keys)` of item `bi`, like [`Self::k_rows`].
    pub(crate) fn v_keys(&self, layer: usize, bi: usize, keys: usize) -> kdsp_tensor {
        self.rows_at(layer, self.v_base(self.capacity), bi, 0, keys)
    }

    fn rows_at(
        &self,
        layer: usize,
        base: usize,
        bi: usize,
        row0: usize,
        count: usize,
    ) -> kdsp_tensor {
        let (hd, rb) = (self.head_dim, self.row_bytes());
        crate::ops::rows(
            self.bufs[layer].id(),
            base + (bi * self.capacity + row0) * rb,
            Wire::F16,
            &[hd, self.kv_heads, count],
        )
    }

    /// V rows `[row0, row0 + n)` of every item: `{kv_heads * head_dim, n, batch}` f16.
    pub(crate) fn v_rows(&self, layer: usize, row0: usize, n: usize) -> kdsp_tensor {
        let rb = self.row_bytes();
        kdsp_tensor {
            buffer_id: self.bufs[layer].id(),
            dtype: KDSP_DTYPE_F16,
            layout: KDSP_LAYOUT_ROW_MAJOR,
            offset: (self.v_base(self.capacity) + row0 * rb) as u64,
            ne: [(rb / 2) as u32, n as u32, self.batch as u32, 1],
            nb: [
                2,
                rb as u64,
                (self.capacity * rb) as u64,
                (self.batch * self.capacity * rb) as u64,
            ],
            ..Default::default()
        }
    }
}

/// Runs of consecutive values, in the given order.
fn runs(positions: &[usize]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for &p in positions {
        match out.last_mut() {
            Some(r) if r.end == p => r.end += 1,
            _ => out.push(p..p + 1),
        }
    }
    out
}
