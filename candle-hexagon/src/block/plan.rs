//! The layout of [`HexTransformer`]'s forward: activation regions and their offsets per shape,
//! and the batch of kernel ops of each layer (the program's nodes, `program.rs`; weights named
//! by virtual buffer ids until the memory runtime places them; matmuls unsplit until their
//! weights have a place).
//!
//! Per shape bucket, the forward's batches are built once against a virtual activation buffer
//! with one region per activation, and captured as a [`Graph`]; under the `somr` policy the
//! regions then share offsets by live range ([`pack_by_lifetime`]), under the others each keeps
//! its own. A bucket is a window's rows (and selected rows) rounded up to whole 32-row tiles: the
//! regions are sized for the bucket and a forward of any row count in it uses them as they are
//! (its ops carry their real row counts), so a decoder whose window changes size every step
//! plans once per bucket, not once per size. The plans are kept in a bounded cache
//! ([`PlanCache`]).

use super::emit::{Emit, LayerRefs, Loc};
use super::kv::DeviceKv;
use super::program::{Kind, Node};
use super::HexTransformer;
use crate::memory::TENSOR_ALIGN;
use crate::ops::StagePlan;
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

/// Shape plans kept at most (least recently used evicted). A context of 4096
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

/// Offsets (bytes) of a forward's activations in its buffer: the program's activations (all
/// f32), then the positions and the row selection (i32).
#[derive(Debug, Clone)]
pub(crate) struct ActPlan {
    pub(crate) off: Vec<usize>,
    pub(crate) size: Vec<usize>,
    pub(crate) total: usize,
    /// Columns of the result.
    pub(crate) width: usize,
    /// Offset of the result.
    pub(crate) out: usize,
}

/// Region names: the program's activations, then these two.
const POS: &str = "pos";
const IDX: &str = "idx";

impl ActPlan {
    /// One region per activation, back to back. `r` is `Some` when rows are selected.
    fn separate(t: &HexTransformer, b: usize, n: usize, r: Option<usize>) -> Self {
        let c = &t.inner.program;
        let acts = &c.program.acts;
        let size: Vec<usize> = acts
            .iter()
            .zip(&c.kinds)
            .map(|((_, cols), kind)| {
                let rows = match kind {
                    Kind::Layer => n.max(r.unwrap_or(0)),
                    Kind::Tail => r.unwrap_or(n),
                    Kind::Selected => r.unwrap_or(0),
                };
                b * rows * cols * 4
            })
            .chain([b * n * 4, r.unwrap_or(0) * 4])
            .collect();
        let mut p = StagePlan::default();
        let off: Vec<usize> = size.iter().map(|&s| p.push(s)).collect();
        let mut a = ActPlan {
            off,
            size,
            total: p.total(),
            width: 0,
            out: 0,
        };
        a.set_output(t, r.is_some());
        a
    }

    fn set_output(&mut self, t: &HexTransformer, selecting: bool) {
        let (cols, _) = t.inner.result_cols();
        let locs = self.locs(t, selecting);
        self.width = cols.len;
        self.out = locs[cols.act].off + cols.start * 4;
    }

    /// Each activation's place, `SelectRows` outputs aliased unless selecting.
    pub(crate) fn locs(&self, t: &HexTransformer, selecting: bool) -> Vec<Loc> {
        let p = &t.inner.program.program;
        let mut loc: Vec<Loc> = p
            .acts
            .iter()
            .enumerate()
            .map(|(i, (_, cols))| Loc {
                off: self.off[i],
                row: cols * 4,
            })
            .collect();
        if !selecting {
            for node in &p.layer {
                if let Node::SelectRows { x, out } = node {
                    let src = loc[x.act];
                    loc[out.act] = Loc {
                        off: src.off + x.start * 4,
                        row: src.row,
                    };
                }
            }
        }
        loc
    }

    pub(crate) fn x(&self, t: &HexTransformer) -> usize {
        self.off[t.inner.program.program.input]
    }
    pub(crate) fn pos(&self) -> usize {
        self.off[self.off.len() - 2]
    }
    pub(crate) fn idx(&self) -> usize {
        self.off[self.off.len() - 1]
    }
    pub(crate) fn out(&self) -> usize {
        self.out
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
    /// the program's op sequence, the same at every row count (a matmul split into row chunks
    /// keeps its place in it), so the packing holds for every forward of the bucket.
    pub(crate) fn new(t: &HexTransformer, bucket: ShapeKey, kv: &DeviceKv, len: usize) -> Self {
        let (b, n, r) = bucket;
        let separate = ActPlan::separate(t, b, n, r);
        let batches = layer_batches(t, &separate, VIRTUAL_ACT, kv, (b, n, r), len, (0, 0));
        let p = &t.inner.program.program;
        let names = p
            .acts
            .iter()
            .map(|a| a.0.clone())
            .chain([POS.into(), IDX.into()]);
        let mut decls: Vec<TensorDecl> = names
            .enumerate()
            .map(|(i, name)| TensorDecl {
                name,
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
        let regions = p.acts.len() + 2;
        // The result's bytes: without a selection a `SelectRows` output is its input's.
        let (out_cols, _) = t.inner.result_cols();
        let mut out_act = out_cols.act;
        while r.is_none() {
            match p.layer.iter().find_map(|n| match n {
                Node::SelectRows { x, out } if out.act == out_act => Some(x.act),
                _ => None,
            }) {
                Some(src) => out_act = src,
                None => break,
            }
        }
        let graph = Graph::capture(
            decls,
            &batches,
            &[p.input, regions - 2, regions - 1],
            &[out_act],
        );
        let items: Vec<(u64, &[(usize, usize)])> = (0..regions)
            .map(|i| (separate.size[i] as u64, graph.tensors[i].live.as_slice()))
            .collect();
        let (offs, total) = pack_by_lifetime(&items, TENSOR_ALIGN as u64);
        let mut packed = ActPlan {
            off: offs.iter().map(|&o| o as usize).collect(),
            size: separate.size.clone(),
            total: (total as usize).max(1),
            width: 0,
            out: 0,
        };
        packed.set_output(t, r.is_some());
        ShapePlan { separate, packed }
    }
}

/// The batches of one forward: one per layer, the tail in the last.
pub(crate) fn layer_batches(
    t: &HexTransformer,
    plan: &ActPlan,
    act: u32,
    kv: &DeviceKv,
    (b, n, r): ShapeKey,
    len: usize,
    skip: (u32, u32),
) -> Vec<Batch> {
    let i = &t.inner;
    let c = &i.program;
    let selecting = r.is_some();
    let emit = Emit {
        act,
        pos: plan.pos(),
        idx: plan.idx(),
        pinned: &i.pinned,
        cos: &i.pinned[i.cos],
        sin: &i.pinned[i.sin],
        kv,
        g: i.heads(),
        b,
        n,
        r,
        len,
        skip,
    };
    let layers = i.layers.len();
    let tail_nodes = &c.program.tail[..i.tail_len()];
    (0..layers)
        .map(|li| {
            let last = li + 1 == layers;
            let sel = last && selecting;
            let loc = plan.locs(t, sel);
            let mut batch = Batch::new();
            let l = &i.layers[li];
            let refs = LayerRefs {
                vectors: &l.vectors,
                matrices: &l.matrices,
            };
            emit.nodes(
                &mut batch,
                &c.program.layer,
                &refs,
                &loc,
                &c.layer_sel,
                li,
                sel,
            );
            if last {
                let refs = LayerRefs {
                    vectors: &i.tail.vectors,
                    matrices: &i.tail.matrices,
                };
                emit.nodes(&mut batch, tail_nodes, &refs, &loc, &c.tail_sel, li, sel);
            }
            batch
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn plan(total: usize) -> Arc<ShapePlan> {
        let a = ActPlan {
            off: vec![0; 2],
            size: vec![0; 2],
            total,
            width: 1,
            out: 0,
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
