//! Per-layer K/V storage of one sequence, read without copies.
//!
//! Each layer holds one key and one value buffer laid out **position-major**, `(capacity, batch,
//! kv_heads, head_dim)`, in the model's compute dtype. Rows `[0, len)` are the cache; rows from
//! `len` on are free, and a forward writes its window's fresh K/V there (the *pending* rows, see
//! [`Pending`]). Because the cached rows are a prefix of every buffer, a forward can append into the
//! free rows while a sparse refresh on another thread reads the cached rows: [`KvCache::split`]
//! hands out exactly those two disjoint borrows. Attention then reads the cache and the pending rows
//! in place as two segments (`kernels_cpu::attention`), never concatenating them.
//!
//! Committing a pending window whose start equals the cached length costs nothing (its rows are
//! already where they belong); committing elsewhere (dual cache: the window lies inside the cache)
//! moves only the committed rows. Merging a refresh writes only the refreshed rows. Capacity grows
//! geometrically, so appends allocate rarely; nothing per step is proportional to the cache.

use std::ops::Range;

use candle_core::{DType, Device, Tensor, WithDType};
use half::{bf16, f16};
use kernels_cpu::attention::Element;

use crate::{CanvasDefect, Error, KvCacheDefect, PositionDefect, Result, WindowDefect};

/// Element types the cache stores: the compute dtypes.
pub trait KvElem: Element + WithDType {
    #[doc(hidden)]
    fn layers(store: &mut Store) -> Option<&mut Vec<LayerBuf<Self>>>;
    #[doc(hidden)]
    fn layers_ref(store: &Store) -> Option<&Vec<LayerBuf<Self>>>;
    #[doc(hidden)]
    fn wrap(layers: Vec<LayerBuf<Self>>) -> Store;
}

/// One layer's key and value buffers.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct LayerBuf<T> {
    k: Vec<T>,
    v: Vec<T>,
}

/// The buffers of every layer, in one of the compute dtypes.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub enum Store {
    /// Nothing allocated yet.
    #[default]
    Empty,
    /// f32 buffers.
    F32(Vec<LayerBuf<f32>>),
    /// f16 buffers.
    F16(Vec<LayerBuf<f16>>),
    /// bf16 buffers.
    BF16(Vec<LayerBuf<bf16>>),
}

macro_rules! kv_elem {
    ($t:ty, $v:ident) => {
        impl KvElem for $t {
            fn layers(store: &mut Store) -> Option<&mut Vec<LayerBuf<Self>>> {
                match store {
                    Store::$v(l) => Some(l),
                    _ => None,
                }
            }
            fn layers_ref(store: &Store) -> Option<&Vec<LayerBuf<Self>>> {
                match store {
                    Store::$v(l) => Some(l),
                    _ => None,
                }
            }
            fn wrap(layers: Vec<LayerBuf<Self>>) -> Store {
                Store::$v(layers)
            }
        }
    };
}
kv_elem!(f32, F32);
kv_elem!(f16, F16);
kv_elem!(bf16, BF16);

/// The cached rows `[0, len)` of one layer, read-only (shared by a forward and a refresh).
#[derive(Debug, Clone, Copy)]
pub struct CachedRows<'a, T> {
    /// Keys, `(len, batch, kv_heads, head_dim)`.
    pub k: &'a [T],
    /// Values, same layout.
    pub v: &'a [T],
}

/// The free rows `[len, capacity)` of one layer, where a forward writes its window.
#[derive(Debug)]
pub struct FreeRows<'a, T> {
    /// Keys, `(capacity - len, batch, kv_heads, head_dim)`.
    pub k: &'a mut [T],
    /// Values, same layout.
    pub v: &'a mut [T],
}

/// Per-layer K/V rows the window protocol ([`commit_window`], [`truncate_rows`]) runs over: the
/// host [`KvCache`] here and, with the `hexagon` feature, candle-hexagon's device rows
/// (`DeviceKv`). The protocol (pending windows, commits, overwritten pending rows, roll-backs)
/// is written once, here; a row store only stores rows.
pub trait KvRows {
    /// Cached rows `[0, len)`.
    fn len(&self) -> usize;
    /// Whether no row is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Rows the buffers hold.
    fn capacity(&self) -> usize;
    /// Sequences of the buffers.
    fn batch(&self) -> usize;
    /// Copy rows `[src, src + n)` to `[dst, dst + n)` of every layer's keys and values (the
    /// ranges may overlap); the cached length is unchanged.
    fn move_rows(&mut self, src: usize, dst: usize, n: usize) -> Result<()>;
    /// Make rows `[0, len)` the cache (rows written by a forward or a move after the cached ones
    /// may join it).
    fn set_len(&mut self, len: usize) -> Result<()>;
}

/// Make the pending K/V of positions `range` of the window `p` (the last forward's) cached rows
/// of `rows`: `range` must lie inside the window and start at or before the cache end. No row
/// moves when the window's rows already sit at their positions (a window starting at the cache
/// end); otherwise only the committed rows move. Returns whether the move overwrote pending rows
/// of other positions (the window can then not be committed again).
pub fn commit_window(rows: &mut dyn KvRows, p: &Pending, range: Range<usize>) -> Result<bool> {
    if range.start > range.end || range.start < p.start || range.end > p.end {
        return Err(WindowDefect::CommitOutsideWindow {
            range,
            window: p.start..p.end,
        }
        .into());
    }
    if range.start > rows.len() {
        return Err(WindowDefect::CommitLeavesHole {
            range,
            cache_len: rows.len(),
        }
        .into());
    }
    if range.is_empty() {
        return Ok(false);
    }
    let n = p.end - p.start;
    if p.at + n > rows.capacity() || p.batch != rows.batch() {
        return Err(WindowDefect::PendingLost {
            window: p.start..p.end,
        }
        .into());
    }
    let src = p.at + (range.start - p.start);
    let (dst, cnt) = (range.start, range.len());
    let mut clobbered = false;
    if src != dst {
        // Rows move left (src > dst: the window starts at or before the cache end). Pending rows
        // of other positions that the destination covers are lost.
        let pend = p.at..p.at + n;
        let own = src..src + cnt;
        clobbered = (dst..dst + cnt).any(|r| pend.contains(&r) && !own.contains(&r));
        rows.move_rows(src, dst, cnt)?;
    }
    rows.set_len(rows.len().max(range.end))?;
    Ok(clobbered)
}

/// Roll `rows` back to the cached rows `[0, len)` (`len` at most the cache length).
pub fn truncate_rows(rows: &mut dyn KvRows, len: usize) -> Result<()> {
    if len > rows.len() {
        return Err(WindowDefect::RollForward {
            from: rows.len(),
            to: len,
        }
        .into());
    }
    rows.set_len(len)
}

impl KvRows for KvCache {
    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn batch(&self) -> usize {
        self.batch
    }

    fn move_rows(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        self.move_rows_t(src, dst, n)
    }

    fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity {
            return Err(KvCacheDefect::RowOutsideBuffer {
                row: len - 1,
                rows: self.capacity,
            }
            .into());
        }
        self.len = len;
        Ok(())
    }
}

/// Where the last forward's K/V wait to be committed: canvas positions `[start, end)` stored in
/// buffer rows `[at, at + (end - start))` (the free rows after the cache as it was then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// First canvas position of the window.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Buffer row holding position `start`.
    pub at: usize,
    /// Batch of the forward.
    pub batch: usize,
}

/// The cached rows and the free rows of every layer (see [`KvCache::split`]).
pub type SplitRows<'a, T> = (Vec<CachedRows<'a, T>>, Vec<FreeRows<'a, T>>);

/// The K/V cache of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    num_layers: usize,
    kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    batch: usize,
    capacity: usize,
    len: usize,
    store: Store,
}

/// Rows are allocated in multiples of this.
const ROW_QUANTUM: usize = 64;

impl KvCache {
    /// An empty cache for `num_layers` layers of `kv_heads x head_dim` in `dtype` (f32, f16, bf16).
    pub fn new(num_layers: usize, kv_heads: usize, head_dim: usize, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::UnsupportedDtype {
                what: "the KV cache",
                dtype,
            });
        }
        Ok(Self {
            num_layers,
            kv_heads,
            head_dim,
            dtype,
            batch: 0,
            capacity: 0,
            len: 0,
            store: Store::Empty,
        })
    }

    /// Cached positions `[0, len)`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Storage dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Batch size of the buffers (meaningful once something was written).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Rows allocated per layer.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Elements of one position (all batch items).
    fn row(&self) -> usize {
        self.batch * self.kv_heads * self.head_dim
    }

    /// Forget positions `>= len`.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        truncate_rows(self, len)
    }

    /// Check a batch size against the cached one.
    pub fn check_batch(&self, batch: usize) -> Result<()> {
        if self.len > 0 && self.batch != batch {
            return Err(CanvasDefect::BatchMismatch {
                batch,
                cached: self.batch,
            }
            .into());
        }
        Ok(())
    }

    /// Make room for `rows` rows of `batch` items, keeping the cached rows. Allocation is
    /// geometric, so a sequence that grows position by position reallocates O(log n) times.
    pub fn reserve(&mut self, batch: usize, rows: usize) -> Result<()> {
        self.check_batch(batch)?;
        if batch == self.batch && rows <= self.capacity {
            return Ok(());
        }
        let cap = if batch == self.batch {
            rows.max(self.capacity.saturating_mul(2))
        } else {
            rows
        };
        let cap = cap
            .checked_next_multiple_of(ROW_QUANTUM)
            .ok_or(KvCacheDefect::Overflow {
                rows,
                row_elems: self.row(),
            })?;
        match self.dtype {
            DType::F32 => self.realloc::<f32>(batch, cap),
            DType::F16 => self.realloc::<f16>(batch, cap),
            _ => self.realloc::<bf16>(batch, cap),
        }
    }

    fn realloc<T: KvElem>(&mut self, batch: usize, cap: usize) -> Result<()> {
        let row = batch * self.kv_heads * self.head_dim;
        let elems = cap.checked_mul(row).ok_or(KvCacheDefect::Overflow {
            rows: cap,
            row_elems: row,
        })?;
        let keep = if batch == self.batch {
            self.len * row
        } else {
            0
        };
        let old = std::mem::take(&mut self.store);
        let old = T::layers_ref(&old);
        let mut layers = Vec::with_capacity(self.num_layers);
        for l in 0..self.num_layers {
            let mut k = vec![T::ZERO; elems];
            let mut v = vec![T::ZERO; elems];
            if let Some(o) = old.and_then(|o| o.get(l)) {
                k[..keep].copy_from_slice(&o.k[..keep]);
                v[..keep].copy_from_slice(&o.v[..keep]);
            }
            layers.push(LayerBuf { k, v });
        }
        self.store = T::wrap(layers);
        self.batch = batch;
        self.capacity = cap;
        Ok(())
    }

    /// The cached rows of every layer and the free rows after them, as disjoint borrows (a forward
    /// writes the free rows while a refresh reads the cached ones). `None` when the buffers hold
    /// another dtype than `T` or are not allocated.
    pub fn split<T: KvElem>(&mut self) -> Option<SplitRows<'_, T>> {
        let cut = self.len * self.row();
        let layers = T::layers(&mut self.store)?;
        let mut cached = Vec::with_capacity(layers.len());
        let mut free = Vec::with_capacity(layers.len());
        for LayerBuf { k, v } in layers.iter_mut() {
            let (kc, kf) = k.split_at_mut(cut);
            let (vc, vf) = v.split_at_mut(cut);
            cached.push(CachedRows { k: &*kc, v: &*vc });
            free.push(FreeRows { k: kf, v: vf });
        }
        Some((cached, free))
    }

    /// The cached rows of every layer (read-only).
    pub fn cached<T: KvElem>(&self) -> Option<Vec<CachedRows<'_, T>>> {
        let cut = self.len * self.row();
        let layers = T::layers_ref(&self.store)?;
        Some(
            layers
                .iter()
                .map(|l| CachedRows {
                    k: &l.k[..cut],
                    v: &l.v[..cut],
                })
                .collect(),
        )
    }

    /// Copy rows `[src, src + n)` to `[dst, dst + n)` of every layer's keys and values (the
    /// ranges may overlap; both inside the buffers).
    fn move_rows_t(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        if src.max(dst).saturating_add(n) > self.capacity {
            return Err(KvCacheDefect::RowOutsideBuffer {
                row: src.max(dst).saturating_add(n).saturating_sub(1),
                rows: self.capacity,
            }
            .into());
        }
        fn mv<T: KvElem>(s: &mut Store, a: usize, b: usize, to: usize) {
            if let Some(layers) = T::layers(s) {
                for l in layers.iter_mut() {
                    l.k.copy_within(a..b, to);
                    l.v.copy_within(a..b, to);
                }
            }
        }
        let row = self.row();
        let (a, b, to) = (src * row, (src + n) * row, dst * row);
        match self.dtype {
            DType::F32 => mv::<f32>(&mut self.store, a, b, to),
            DType::F16 => mv::<f16>(&mut self.store, a, b, to),
            _ => mv::<bf16>(&mut self.store, a, b, to),
        }
        Ok(())
    }

    /// Overwrite cached rows: `k`/`v` `(batch, positions.len(), kv_heads, head_dim)` for the sorted
    /// cached `positions`.
    pub fn write_rows(
        &mut self,
        layer: usize,
        positions: &[usize],
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        if let Some(&bad) = positions.iter().find(|&&p| p >= self.len) {
            return Err(PositionDefect::NotCached {
                what: "write",
                position: bad,
                cache_len: self.len,
            }
            .into());
        }
        match self.dtype {
            DType::F32 => self.write_rows_t::<f32>(layer, positions, k, v),
            DType::F16 => self.write_rows_t::<f16>(layer, positions, k, v),
            _ => self.write_rows_t::<bf16>(layer, positions, k, v),
        }
    }

    fn write_rows_t<T: KvElem>(
        &mut self,
        layer: usize,
        positions: &[usize],
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let (batch, heads, hd) = (self.batch, self.kv_heads, self.head_dim);
        let (stored, allocated) = (self.dtype, self.capacity);
        let layers = T::layers(&mut self.store).ok_or(KvCacheDefect::NoBuffers {
            dtype: T::DTYPE,
            stored,
            allocated,
        })?;
        let n_layers = layers.len();
        let l = layers.get_mut(layer).ok_or(KvCacheDefect::NoLayer {
            layer,
            layers: n_layers,
        })?;
        scatter_rows(k, &mut l.k, positions.iter().copied(), batch, heads, hd)?;
        scatter_rows(v, &mut l.v, positions.iter().copied(), batch, heads, hd)
    }

    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        2 * self.num_layers * self.capacity * self.row() * self.dtype.size_in_bytes()
    }

    /// The cached rows of `layer` as `(batch, len, kv_heads, head_dim)` tensors (a copy: for the
    /// per-op NPU path, whose kernel takes one key tensor).
    pub fn layer_tensors(&self, layer: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        fn get<T: KvElem>(c: &KvCache, layer: usize, device: &Device) -> Result<(Tensor, Tensor)> {
            let rows = c.cached::<T>().ok_or(KvCacheDefect::NoBuffers {
                dtype: T::DTYPE,
                stored: c.dtype,
                allocated: c.capacity,
            })?;
            let l = *rows.get(layer).ok_or(KvCacheDefect::NoLayer {
                layer,
                layers: rows.len(),
            })?;
            let shape = (c.len, c.batch, c.kv_heads, c.head_dim);
            let k = Tensor::from_slice(l.k, shape, device)?.transpose(0, 1)?;
            let v = Tensor::from_slice(l.v, shape, device)?.transpose(0, 1)?;
            Ok((k, v))
        }
        match self.dtype {
            DType::F32 => get::<f32>(self, layer, device),
            DType::F16 => get::<f16>(self, layer, device),
            _ => get::<bf16>(self, layer, device),
        }
    }
}

/// Run `f` on the elements of a CPU tensor of element type `E`, read in place (a copy only when
/// the tensor is not contiguous); an error naming the device for a tensor that is not on the CPU.
pub(crate) fn with_cpu_slice<E: candle_core::WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[E]) -> Result<R>,
) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(KvCacheDefect::NotOnCpu {
            device: format!("{:?}", t.device().location()),
        }
        .into());
    };
    let (a, b) = layout
        .contiguous_offsets()
        .expect("a contiguous tensor has contiguous offsets");
    f(&cpu.as_slice::<E>()?[a..b])
}

/// Copy a `(batch, n, heads, hd)` tensor into position-major rows `dst_rows` of `dst`
/// (`(rows, batch, heads, hd)`). An f32 tensor is narrowed row by row straight into the cache
/// (rounding to nearest even, as candle's conversion; no converted copy of the whole tensor).
pub(crate) fn scatter_rows<T: KvElem>(
    t: &Tensor,
    dst: &mut [T],
    dst_rows: impl Iterator<Item = usize>,
    batch: usize,
    heads: usize,
    hd: usize,
) -> Result<()> {
    let (b, n, h, d) = t.dims4()?;
    if b != batch || h != heads || d != hd {
        return Err(Error::Shape {
            what: "K/V for the cache (batch, positions, kv_heads, head_dim)".into(),
            expected: vec![batch, n, heads, hd],
            got: t.dims().to_vec(),
        });
    }
    let row = h * d;
    let buffer_rows = dst.len() / (b * row).max(1);
    fn put<S: Copy, T>(
        src: &[S],
        dst: &mut [T],
        dst_rows: impl Iterator<Item = usize>,
        (b, n, row, buffer_rows): (usize, usize, usize, usize),
        copy: impl Fn(&[S], &mut [T]),
    ) -> Result<()> {
        for (i, r) in dst_rows.enumerate().take(n) {
            for bi in 0..b {
                let s = &src[(bi * n + i) * row..][..row];
                let o = (r * b + bi) * row;
                copy(
                    s,
                    dst.get_mut(o..o + row)
                        .ok_or(KvCacheDefect::RowOutsideBuffer {
                            row: r,
                            rows: buffer_rows,
                        })?,
                );
            }
        }
        Ok(())
    }
    let geom = (b, n, row, buffer_rows);
    if t.dtype() == DType::F32 {
        with_cpu_slice::<f32, _>(t, |src| put(src, dst, dst_rows, geom, T::from_f32_slice))
    } else {
        let t = t.to_dtype(T::DTYPE)?;
        with_cpu_slice::<T, _>(&t, |src| {
            put(src, dst, dst_rows, geom, |s, o| o.copy_from_slice(s))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row store that records what the protocol asks of it.
    struct Log {
        len: usize,
        capacity: usize,
        moves: Vec<(usize, usize, usize)>,
    }

    impl KvRows for Log {
        fn len(&self) -> usize {
            self.len
        }
        fn capacity(&self) -> usize {
            self.capacity
        }
        fn batch(&self) -> usize {
            1
        }
        fn move_rows(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
            self.moves.push((src, dst, n));
            Ok(())
        }
        fn set_len(&mut self, len: usize) -> Result<()> {
            self.len = len;
            Ok(())
        }
    }

    #[test]
    fn the_protocol_moves_only_rows_not_in_place_and_names_lost_pending_rows() {
        let mut rows = Log {
            len: 20,
            capacity: 64,
            moves: Vec::new(),
        };
        // Positions 10..40 forwarded into rows [20, 50).
        let p = Pending {
            start: 10,
            end: 40,
            at: 20,
            batch: 1,
        };
        // 15..25 comes from rows [25, 35) and lands on [15, 25): the pending rows of 10..15
        // (rows [20, 25)) are overwritten.
        assert!(commit_window(&mut rows, &p, 15..25).unwrap());
        assert_eq!((rows.moves.as_slice(), rows.len), (&[(25, 15, 10)][..], 25));
        // A window at the cache end commits in place: no move.
        let p = Pending {
            start: 25,
            end: 30,
            at: 25,
            batch: 1,
        };
        assert!(!commit_window(&mut rows, &p, 25..30).unwrap());
        assert_eq!((rows.moves.len(), rows.len), (1, 30));
        // Outside the window, past the cache, or rolled forward: errors, nothing touched.
        let e = commit_window(&mut rows, &p, 20..26).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidWindow(WindowDefect::CommitOutsideWindow { .. })
        ));
        let e = truncate_rows(&mut rows, 31).unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidWindow(WindowDefect::RollForward { from: 30, to: 31 })
        ));
        truncate_rows(&mut rows, 12).unwrap();
        assert_eq!((rows.moves.len(), rows.len), (1, 12));
    }
}
