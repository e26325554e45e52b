//! The op graph of [`HexTransformer`]'s forward: activation regions and their offsets per
//! shape, and the batch of kernel ops of each block (weights named by virtual buffer ids until
//! the memory runtime places them; matmuls unsplit until their weights have a place).
//!
//! Per shape bucket, the forward's batches are built once against a virtual activation buffer
//! with one region per activation, and captured as a [`Graph`]; under the `somr` policy the
//! regions then share offsets by live range ([`pack_by_lifetime`]), under the others each keeps
//! its own. A bucket is a window's rows (and selected rows) rounded up to whole 32-row tiles: the
//! regions are sized for the bucket and a forward of any row count in it uses them as they are
//! (its ops carry their real row counts), so a decoder whose window changes size every step
//! plans once per bucket, not once per size. The plans are kept in a bounded cache
//! ([`PlanCache`]).

use kernels_dsp::*;

use super::kv::DeviceKv;
use super::packed::PackedLinear;
use super::{HexTransformer, PackedBlock};
use crate::memory::{WeightSlot, TENSOR_ALIGN};
use crate::ops::{rows, StagePlan, Wire};
use crate::runtime::graph::{Graph, TensorClass, TensorDecl};
use crate::runtime::packing::pack_by_lifetime;
use crate::runtime::{virtual_id, VIRTUAL_ACT};
use crate::transport::Batch;

/// `(b, n, selected rows per item or None for all)`.
pub(crate) type ShapeKey = (usize, usize, Option<usize>);

/// Rows of a shape bucket: one HMX tile.
pub(crate) const ROW_BUCKET: usize = 32;

/// The bucket of a shape: rows and selected rows rounded up to whole [`ROW_BUCKET`]s.
pub(crate) fn bucket_of((b, n, r): ShapeKey) -> ShapeKey {
    let up = |v: usize| v.div_ceil(ROW_BUCKET) * ROW_BUCKET;
    (b, up(n), r.map(up))
}

/// Shape plans kept at most (least recently used evicted). A LLaDA-8B context of 4096
/// positions has 128 row buckets; a decoder uses a handful.
pub(crate) const MAX_SHAPE_PLANS: usize = 64;

/// The shape plans of one module, keyed by bucket, bounded by [`MAX_SHAPE_PLANS`].
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    plans: std::collections::HashMap<ShapeKey, (std::sync::Arc<ShapePlan>, u64)>,
    tick: u64,
}

impl PlanCache {
    /// The plan of `bucket`, marked as just used.
    pub(crate) fn get(&mut self, bucket: ShapeKey) -> Option<std::sync::Arc<ShapePlan>> {
        self.tick += 1;
        let tick = self.tick;
        self.plans.get_mut(&bucket).map(|(p, used)| {
            *used = tick;
            p.clone()
        })
    }

    /// Keep `plan` for `bucket`; returns how many plans were evicted to make room (0 or 1).
    pub(crate) fn insert(&mut self, bucket: ShapeKey, plan: std::sync::Arc<ShapePlan>) -> u64 {
        self.tick += 1;
        let mut evicted = 0;
        if !self.plans.contains_key(&bucket) && self.plans.len() >= MAX_SHAPE_PLANS {
            if let Some(&old) = self
                .plans
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k)
            {
                self.plans.remove(&old);
                evicted = 1;
            }
        }
        self.plans.insert(bucket, (plan, self.tick));
        evicted
    }

    /// Plans held.
    pub(crate) fn len(&self) -> usize {
        self.plans.len()
    }
}

/// The activation regions, in this order.
pub(crate) const REGIONS: [&str; 11] = [
    "x", "h", "qkv", "att", "gu", "act", "pos", "idx", "xs", "qs", "out",
];
const X: usize = 0;
const H: usize = 1;
const QKV: usize = 2;
const ATT: usize = 3;
const GU: usize = 4;
const ACT: usize = 5;
const POS: usize = 6;
const IDX: usize = 7;
const XS: usize = 8;
const QS: usize = 9;
const OUT: usize = 10;

const MM_QKV: u8 = 0;
const MM_O: u8 = 1;
const MM_GATE_UP: u8 = 2;
const MM_DOWN: u8 = 3;
const MM_HEAD: u8 = 4;

/// Offsets (bytes) of a forward's activations in its buffer; all f32 except `pos`/`idx` (i32).
/// Row counts: `m = b * n` window rows, `mq = b * r` rows after the last block's selection.
#[derive(Debug, Clone)]
pub(crate) struct ActPlan {
    pub(crate) off: [usize; 11],
    pub(crate) size: [usize; 11],
    pub(crate) total: usize,
    pub(crate) width: usize,
}

impl ActPlan {
    /// One region per activation, back to back.
    fn separate(t: &HexTransformer, b: usize, n: usize, r: Option<usize>) -> Self {
        let c = &t.inner.cfg;
        let (h, q, kv, f) = (
            c.hidden,
            c.heads * c.head_dim,
            c.kv_heads * c.head_dim,
            c.ffn,
        );
        let m = b * n;
        let mq = b * r.unwrap_or(n);
        let width = if t.inner.head.is_some() { c.vocab } else { h };
        let sel = |rows: usize| if r.is_some() { rows } else { 0 };
        let size = [
            m * h * 4,
            m * h * 4,
            m * (q + 2 * kv) * 4,
            m * q * 4,
            m * 2 * f * 4,
            m * f * 4,
            m * 4,
            sel(r.unwrap_or(0)) * 4,
            sel(mq * h * 4),
            sel(mq * q * 4),
            mq * width * 4,
        ];
        let mut p = StagePlan::default();
        let off = size.map(|s| p.push(s));
        ActPlan {
            off,
            size,
            total: p.total(),
            width,
        }
    }

    pub(crate) fn x(&self) -> usize {
        self.off[X]
    }
    pub(crate) fn pos(&self) -> usize {
        self.off[POS]
    }
    pub(crate) fn idx(&self) -> usize {
        self.off[IDX]
    }
    pub(crate) fn out(&self) -> usize {
        self.off[OUT]
    }
}

/// Both activation layouts of one shape bucket.
#[derive(Debug)]
pub(crate) struct ShapePlan {
    /// One region per activation (policies without a plan).
    pub(crate) separate: ActPlan,
    /// Regions sharing offsets by live range (`somr`).
    pub(crate) packed: ActPlan,
}

impl ShapePlan {
    /// Capture the graph of a forward of shape `bucket` (host-side only: nothing is submitted)
    /// and pack its activations by the live ranges the graph shows. The live ranges are those of
    /// the block's op sequence, the same at every row count (a matmul split into row chunks keeps
    /// its place in it), so the packing holds for every forward of the bucket.
    pub(crate) fn new(t: &HexTransformer, bucket: ShapeKey, kv: &DeviceKv, len: usize) -> Self {
        let (b, n, r) = bucket;
        let separate = ActPlan::separate(t, b, n, r);
        let fwd = Fwd {
            t,
            plan: &separate,
            act: VIRTUAL_ACT,
            kv,
            b,
            n,
            r,
            len,
            skip: (0, 0),
        };
        let blocks = t.num_blocks();
        let batches: Vec<Batch> = (0..blocks)
            .map(|li| fwd.block(li, &t.inner.blocks[li], li + 1 == blocks))
            .collect();
        let mut decls: Vec<TensorDecl> = REGIONS
            .iter()
            .enumerate()
            .map(|(i, name)| TensorDecl {
                name: (*name).into(),
                class: TensorClass::Activation,
                buffer: VIRTUAL_ACT,
                start: separate.off[i] as u64,
                end: (separate.off[i] + separate.size[i]) as u64,
            })
            .collect();
        for (w, hw) in t.inner.runtime.weights.iter().enumerate() {
            decls.push(TensorDecl {
                name: hw.name.clone(),
                class: TensorClass::Weight,
                buffer: virtual_id(w),
                start: 0,
                end: hw.bytes.len() as u64,
            });
        }
        for (layer, id) in kv.buffer_ids().into_iter().enumerate() {
            decls.push(TensorDecl {
                name: format!("kv layer {layer}"),
                class: TensorClass::Kv,
                buffer: id.0,
                start: 0,
                end: id.1 as u64,
            });
        }
        let graph = Graph::capture(decls, &batches, &[X, POS, IDX], &[OUT]);
        let items: Vec<(u64, &[(usize, usize)])> = (0..REGIONS.len())
            .map(|i| (separate.size[i] as u64, graph.tensors[i].live.as_slice()))
            .collect();
        let (offs, total) = pack_by_lifetime(&items, TENSOR_ALIGN as u64);
        let packed = ActPlan {
            off: std::array::from_fn(|i| offs[i] as usize),
            size: separate.size,
            total: (total as usize).max(1),
            width: separate.width,
        };
        ShapePlan { separate, packed }
    }
}

/// A contiguous f32 matrix `{cols, rows}` at `off` of buffer `id`.
fn mat(id: u32, off: usize, cols: usize, rows_: usize) -> kdsp_tensor {
    rows(id, off, Wire::F32, &[cols, rows_])
}

/// A row-major f32 view with explicit dims and byte strides.
fn view(id: u32, off: usize, ne: [usize; 4], nb: [usize; 4]) -> kdsp_tensor {
    kdsp_tensor {
        buffer_id: id,
        dtype: KDSP_DTYPE_F32,
        layout: KDSP_LAYOUT_ROW_MAJOR,
        offset: off as u64,
        ne: ne.map(|v| v as u32),
        nb: nb.map(|v| v as u64),
        ..Default::default()
    }
}

fn slot_vec(s: &WeightSlot, n: usize) -> kdsp_tensor {
    rows(s.buf.id(), s.offset, Wire::F32, &[n])
}

/// Everything one forward's batches need.
pub(crate) struct Fwd<'a> {
    pub(crate) t: &'a HexTransformer,
    pub(crate) plan: &'a ActPlan,
    pub(crate) act: u32,
    pub(crate) kv: &'a DeviceKv,
    pub(crate) b: usize,
    pub(crate) n: usize,
    /// Selected rows per item in the last block (None: all `n`).
    pub(crate) r: Option<usize>,
    pub(crate) len: usize,
    pub(crate) skip: (u32, u32),
}

impl Fwd<'_> {
    /// `y (m, n_out) = a (m, k) W^T (+ bias)`, one op (split by rows once the weight has a
    /// place, see `forward::split_rows`).
    fn matmul(
        &self,
        batch: &mut Batch,
        kind: u8,
        lin: &PackedLinear,
        a: usize,
        y: usize,
        m: usize,
    ) {
        let op = kdsp_op::new(
            lin.opcode(),
            mat(self.act, y, lin.n, m),
            &[lin.tensor(), mat(self.act, a, lin.k, m)],
        );
        batch.push(label(kind), op);
        if let Some(bias) = lin.bias {
            let yt = mat(self.act, y, lin.n, m);
            batch.push(
                "bias",
                kdsp_op::new(
                    KDSP_OP_ADD,
                    yt,
                    &[yt, slot_vec(&self.t.inner.pinned[bias], lin.n)],
                ),
            );
        }
    }

    fn norm(&self, batch: &mut Batch, w: usize, x: usize, y: usize, m: usize) {
        let h = self.t.inner.cfg.hidden;
        let w = &self.t.inner.pinned[w];
        let mut op = kdsp_op::new(
            KDSP_OP_RMS_NORM,
            mat(self.act, y, h, m),
            &[mat(self.act, x, h, m), slot_vec(w, h)],
        );
        op.params.norm.eps = self.t.inner.cfg.rms_eps;
        batch.push("rms_norm", op);
    }

    fn add(&self, batch: &mut Batch, x: usize, y: usize, m: usize) {
        let h = self.t.inner.cfg.hidden;
        let xt = mat(self.act, x, h, m);
        batch.push(
            "residual",
            kdsp_op::new(KDSP_OP_ADD, xt, &[xt, mat(self.act, y, h, m)]),
        );
    }

    pub(crate) fn block(&self, li: usize, blk: &PackedBlock, last: bool) -> Batch {
        let i = &self.t.inner;
        let c = &i.cfg;
        let p = self.plan;
        let (b, n, act) = (self.b, self.n, self.act);
        let (h, hd, hq, hkv, f) = (c.hidden, c.head_dim, c.heads, c.kv_heads, c.ffn);
        let (q, kvw) = (hq * hd, hkv * hd);
        let nqkv = q + 2 * kvw;
        let m = b * n;
        let row = nqkv * 4; // bytes of one fused QKV output row
        let (cos, sin) = (&i.pinned[i.cos], &i.pinned[i.sin]);
        let pos_tables = cos.len / 4;
        let tables = |s: &WeightSlot| {
            rows(
                s.buf.id(),
                s.offset,
                Wire::F32,
                &[hd / 2, pos_tables / (hd / 2)],
            )
        };
        let mut batch = Batch::new();

        self.norm(&mut batch, blk.attn_norm, p.off[X], p.off[H], m);
        self.matmul(&mut batch, MM_QKV, &blk.qkv, p.off[H], p.off[QKV], m);
        // RoPE on q, in place over all window rows (row t of item i has position ws + t).
        let qv = view(act, p.off[QKV], [hd, hq, m, 1], [4, hd * 4, row, row * m]);
        batch.push(
            "rope q",
            kdsp_op::new(
                KDSP_OP_ROPE_NEOX,
                qv,
                &[
                    qv,
                    rows(act, p.off[POS], Wire::I32, &[m]),
                    tables(cos),
                    tables(sin),
                ],
            ),
        );
        // RoPE on k, written as f16 straight into the cache rows [len, len + n) of each item.
        for bi in 0..b {
            let kin = view(
                act,
                p.off[QKV] + bi * n * row + q * 4,
                [hd, hkv, n, 1],
                [4, hd * 4, row, row * n],
            );
            batch.push(
                "rope k -> kv cache",
                kdsp_op::new(
                    KDSP_OP_ROPE_NEOX,
                    self.kv.k_rows(li, bi, self.len, n),
                    &[
                        kin,
                        rows(act, p.off[POS], Wire::I32, &[n]),
                        tables(cos),
                        tables(sin),
                    ],
                ),
            );
        }
        // V as f16 into the same rows.
        let vin = view(
            act,
            p.off[QKV] + (q + kvw) * 4,
            [kvw, n, b, 1],
            [4, row, row * n, row * m],
        );
        batch.push(
            "v -> kv cache",
            kdsp_op::new(KDSP_OP_CPY, self.kv.v_rows(li, self.len, n), &[vin]),
        );

        // The last block only carries the requested rows past this point.
        let (tq, qsrc, qstride, xr) = match (last, self.r) {
            (true, Some(r)) => {
                if r > 0 {
                    let idx = rows(act, p.off[IDX], Wire::I32, &[r]);
                    let qall = view(act, p.off[QKV], [q, n, b, 1], [4, row, row * n, row * m]);
                    batch.push(
                        "select q rows",
                        kdsp_op::new(
                            KDSP_OP_GET_ROWS,
                            rows(act, p.off[QS], Wire::F32, &[q, r, b]),
                            &[qall, idx],
                        ),
                    );
                    batch.push(
                        "select x rows",
                        kdsp_op::new(
                            KDSP_OP_GET_ROWS,
                            rows(act, p.off[XS], Wire::F32, &[h, r, b]),
                            &[rows(act, p.off[X], Wire::F32, &[h, n, b]), idx],
                        ),
                    );
                }
                (r, p.off[QS], q * 4, p.off[XS])
            }
            _ => (n, p.off[QKV], row, p.off[X]),
        };
        let mq = b * tq;
        if mq == 0 {
            return batch; // no row asked for: K/V appended, nothing else to compute
        }
        let keys = self.len + n;
        for bi in 0..b {
            let qt = view(
                act,
                qsrc + bi * tq * qstride,
                [hd, hq, tq, 1],
                [4, hd * 4, qstride, qstride * tq],
            );
            let ot = view(
                act,
                p.off[ATT] + bi * tq * q * 4,
                [hd, hq, tq, 1],
                [4, hd * 4, q * 4, q * 4 * tq],
            );
            let mut op = kdsp_op::new(
                KDSP_OP_FLASH_ATTN,
                ot,
                &[
                    qt,
                    self.kv.k_rows(li, bi, 0, keys),
                    self.kv.v_keys(li, bi, keys),
                ],
            );
            op.params.attn.scale = 1.0 / (hd as f32).sqrt();
            op.params.attn.kv_skip_begin = self.skip.0;
            op.params.attn.kv_skip_end = self.skip.1;
            batch.push("flash_attn", op);
        }
        self.matmul(&mut batch, MM_O, &blk.o, p.off[ATT], p.off[H], mq);
        self.add(&mut batch, xr, p.off[H], mq);
        self.norm(&mut batch, blk.ffn_norm, xr, p.off[H], mq);
        self.matmul(
            &mut batch,
            MM_GATE_UP,
            &blk.gate_up,
            p.off[H],
            p.off[GU],
            mq,
        );
        // silu(gate) * up over the two halves of each fused row (strided views, no copy).
        let gate = view(
            act,
            p.off[GU],
            [f, mq, 1, 1],
            [4, 2 * f * 4, 2 * f * 4 * mq, 2 * f * 4 * mq],
        );
        let up = view(
            act,
            p.off[GU] + f * 4,
            [f, mq, 1, 1],
            [4, 2 * f * 4, 2 * f * 4 * mq, 2 * f * 4 * mq],
        );
        batch.push(
            "swiglu",
            kdsp_op::new(KDSP_OP_SWIGLU, mat(act, p.off[ACT], f, mq), &[gate, up]),
        );
        self.matmul(&mut batch, MM_DOWN, &blk.down, p.off[ACT], p.off[H], mq);
        self.add(&mut batch, xr, p.off[H], mq);
        if last {
            match &i.head {
                Some(head) => {
                    self.norm(&mut batch, i.final_norm, xr, p.off[H], mq);
                    self.matmul(&mut batch, MM_HEAD, head, p.off[H], p.off[OUT], mq);
                }
                None => self.norm(&mut batch, i.final_norm, xr, p.off[OUT], mq),
            }
        }
        batch
    }
}

fn label(kind: u8) -> &'static str {
    match kind {
        MM_QKV => "qkv matmul",
        MM_O => "o matmul",
        MM_GATE_UP => "gate/up matmul",
        MM_DOWN => "down matmul",
        _ => "lm head matmul",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn plan(total: usize) -> Arc<ShapePlan> {
        let a = ActPlan {
            off: [0; 11],
            size: [0; 11],
            total,
            width: 1,
        };
        Arc::new(ShapePlan {
            separate: a.clone(),
            packed: a,
        })
    }

    #[test]
    fn buckets_round_rows_up_to_whole_tiles() {
        assert_eq!(bucket_of((1, 1, None)), (1, 32, None));
        assert_eq!(bucket_of((2, 32, Some(0))), (2, 32, Some(0)));
        assert_eq!(bucket_of((1, 33, Some(5))), (1, 64, Some(32)));
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_the_least_recently_used() {
        let mut c = PlanCache::default();
        let key = |i: usize| (1, 32 * (i + 1), None);
        for i in 0..MAX_SHAPE_PLANS {
            assert_eq!(c.insert(key(i), plan(i)), 0);
        }
        assert!(c.get(key(0)).is_some()); // key 0 used again: key 1 is now the oldest
        assert_eq!(c.insert(key(MAX_SHAPE_PLANS), plan(0)), 1);
        assert_eq!(c.len(), MAX_SHAPE_PLANS);
        assert!(c.get(key(1)).is_none(), "the least recently used plan went");
        assert_eq!(c.get(key(0)).map(|p| p.packed.total), Some(0));
        assert_eq!(
            c.insert(key(0), plan(7)),
            0,
            "replacing a key evicts nothing"
        );
        assert_eq!(c.get(key(0)).map(|p| p.packed.total), Some(7));
    }
}
