//! The emitter: one forward's DSP ops for a node list of a [`Program`](super::program::Program),
//! over the forward's buffer layout ([`Loc`]), weights ([`LayerRefs`]) and geometry ([`Emit`]).
//! The program's checks (`program.rs`) ran before: every operand, row set and weight use here is
//! known to be in bounds.

use kernels_dsp::*;

use super::program::{Cols, Heads, Node};
use crate::memory::WeightSlot;
use crate::ops::{rows, Wire};

/// Where one activation is in a forward's buffer: byte offset of its first column and the bytes
/// of one row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loc {
    pub(crate) off: usize,
    pub(crate) row: usize,
}

/// The vectors and matrices one run of a node list reads.
pub(crate) struct LayerRefs<'a> {
    pub(crate) vectors: &'a [usize],
    pub(crate) matrices: &'a [Option<super::packed::PackedLinear>],
}

/// A contiguous f32 matrix view: `cols` values per row at `row` bytes apart.
fn strided(id: u32, off: usize, ne: [usize; 4], nb: [usize; 4]) -> kdsp_tensor {
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

/// The emitter of one forward: the buffer layout and the geometry of this call.
pub(crate) struct Emit<'a> {
    pub(crate) act: u32,
    pub(crate) pos: usize,
    pub(crate) idx: usize,
    pub(crate) pinned: &'a [WeightSlot],
    pub(crate) cos: &'a WeightSlot,
    pub(crate) sin: &'a WeightSlot,
    pub(crate) kv: &'a super::kv::DeviceKv,
    pub(crate) g: Heads,
    pub(crate) b: usize,
    pub(crate) n: usize,
    /// Requested rows per item (None: all `n`).
    pub(crate) r: Option<usize>,
    pub(crate) len: usize,
    pub(crate) skip: (u32, u32),
}

impl Emit<'_> {
    /// Append `nodes` to `batch`. `li` is the layer (for the cache), `selecting` whether this
    /// run selects rows, `sel` whether each node's operands hold the selected rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn nodes(
        &self,
        batch: &mut crate::transport::Batch,
        nodes: &[Node],
        refs: &LayerRefs<'_>,
        loc: &[Loc],
        sel: &[bool],
        li: usize,
        selecting: bool,
    ) {
        for (node, &on_selected) in nodes.iter().zip(sel) {
            // Rows per item of this node's operands.
            let t = if on_selected && selecting {
                self.r.unwrap_or(self.n)
            } else {
                self.n
            };
            if self.b * t == 0 {
                continue;
            }
            let cx = NodeCx {
                e: self,
                loc,
                li,
                t,
                m: self.b * t,
            };
            let label = node.label();
            let mut push = |label: &'static str, op: kdsp_op| batch.push(label, op);
            match *node {
                Node::RmsNorm {
                    x,
                    weight,
                    eps,
                    out,
                } => push(
                    label,
                    cx.rms_norm(&x, &self.pinned[refs.vectors[weight]], eps, &out),
                ),
                // No matrix: a tail cut (the caller never asks for this node).
                Node::MatMul { x, weight, out } => {
                    if let Some(lin) = &refs.matrices[weight] {
                        let (mm, bias) = cx.matmul(lin, &x, &out);
                        push(label, mm);
                        bias.into_iter().for_each(|op| push("bias", op));
                    }
                }
                Node::Add { acc, x } => push(label, cx.add(&acc, &x)),
                Node::SwiGlu { gate, up, out } => push(label, cx.swiglu(&gate, &up, &out)),
                Node::Rope { x } => push(label, cx.rope_in_place(&x)),
                Node::CacheKeysRoped { x } => {
                    (0..self.b).for_each(|bi| push(label, cx.cache_keys(&x, bi)))
                }
                Node::CacheValues { x } => push(label, cx.cache_values(&x)),
                // Without selection `out` is `x` (`ActPlan::locs` aliases it).
                Node::SelectRows { x, out } => {
                    if let Some(r) = self.r.filter(|&r| selecting && r > 0) {
                        push(label, cx.select_rows(&x, &out, r));
                    }
                }
                Node::Attention { q, out, scale } => {
                    (0..self.b).for_each(|bi| push(label, cx.attention(&q, &out, scale, bi)))
                }
            }
        }
    }
}

/// One node's emission: the forward's emitter, the buffer layout, the layer, and the rows per
/// item (`t`) and in all (`m`) of the node's operands.
struct NodeCx<'a, 'e> {
    e: &'a Emit<'e>,
    loc: &'a [Loc],
    li: usize,
    t: usize,
    m: usize,
}

impl NodeCx<'_, '_> {
    /// Byte offset of a column range's first value.
    fn at(&self, c: &Cols) -> usize {
        self.loc[c.act].off + c.start * 4
    }

    /// Bytes of one row of the activation `c` lives in.
    fn row(&self, c: &Cols) -> usize {
        self.loc[c.act].row
    }

    /// `c` over `m` rows as a matrix.
    fn mat(&self, c: &Cols, m: usize) -> kdsp_tensor {
        let row = self.row(c);
        strided(
            self.e.act,
            self.at(c),
            [c.len, m, 1, 1],
            [4, row, row * m, row * m],
        )
    }

    /// `c` as `[cols, n, b]` over every item's `n` rows.
    fn items(&self, c: &Cols) -> kdsp_tensor {
        let (n, b, row) = (self.e.n, self.e.b, self.row(c));
        strided(
            self.e.act,
            self.at(c),
            [c.len, n, b, 1],
            [4, row, row * n, row * b * n],
        )
    }

    /// `c` as heads of `count` rows, starting `first_row` rows in.
    fn heads(&self, c: &Cols, first_row: usize, count: usize) -> kdsp_tensor {
        let (hd, row) = (self.e.g.head_dim, self.row(c));
        strided(
            self.e.act,
            self.at(c) + first_row * row,
            [hd, c.len / hd, count, 1],
            [4, hd * 4, row, row * count],
        )
    }

    /// NeoX rotary embedding of `src` into `dst` over `count` rows' positions.
    fn rope(&self, dst: kdsp_tensor, src: kdsp_tensor, count: usize) -> kdsp_op {
        let e = self.e;
        let hd = e.g.head_dim;
        let pos_tables = e.cos.len / 4;
        let table = |s: &WeightSlot| {
            rows(
                s.buf.id(),
                s.offset,
                Wire::F32,
                &[hd / 2, pos_tables / (hd / 2)],
            )
        };
        kdsp_op::new(
            KDSP_OP_ROPE_NEOX,
            dst,
            &[
                src,
                rows(e.act, e.pos, Wire::I32, &[count]),
                table(e.cos),
                table(e.sin),
            ],
        )
    }

    /// `out = x / rms(x) * w` over the node's rows.
    fn rms_norm(&self, x: &Cols, w: &WeightSlot, eps: f32, out: &Cols) -> kdsp_op {
        let m = self.m;
        let w = slot_vec(w, x.len);
        let mut op = kdsp_op::new(KDSP_OP_RMS_NORM, self.mat(out, m), &[self.mat(x, m), w]);
        op.params.norm.eps = eps;
        op
    }

    /// The residual add `acc += x`.
    fn add(&self, acc: &Cols, x: &Cols) -> kdsp_op {
        let a = self.mat(acc, self.m);
        kdsp_op::new(KDSP_OP_ADD, a, &[a, self.mat(x, self.m)])
    }

    /// `out = silu(gate) * up`.
    fn swiglu(&self, gate: &Cols, up: &Cols, out: &Cols) -> kdsp_op {
        let m = self.m;
        kdsp_op::new(
            KDSP_OP_SWIGLU,
            self.mat(out, m),
            &[self.mat(gate, m), self.mat(up, m)],
        )
    }

    /// A projection, and the add of its bias if it has one.
    fn matmul(
        &self,
        lin: &super::packed::PackedLinear,
        x: &Cols,
        out: &Cols,
    ) -> (kdsp_op, Option<kdsp_op>) {
        let y = self.mat(out, self.m);
        let op = kdsp_op::new(lin.opcode(), y, &[lin.tensor(), self.mat(x, self.m)]);
        let bias = lin
            .bias
            .map(|bias| kdsp_op::new(KDSP_OP_ADD, y, &[y, slot_vec(&self.e.pinned[bias], lin.n)]));
        (op, bias)
    }

    /// Rotary embedding of the queries in place (row t of item i has position ws + t: the
    /// positions region holds them all).
    fn rope_in_place(&self, x: &Cols) -> kdsp_op {
        let v = self.heads(x, 0, self.m);
        self.rope(v, v, self.m)
    }

    /// Item `bi`'s keys, rotated, into the cache.
    fn cache_keys(&self, x: &Cols, bi: usize) -> kdsp_op {
        let e = self.e;
        let kin = self.heads(x, bi * e.n, e.n);
        self.rope(e.kv.k_rows(self.li, bi, e.len, e.n), kin, e.n)
    }

    /// The values into the cache.
    fn cache_values(&self, x: &Cols) -> kdsp_op {
        let e = self.e;
        kdsp_op::new(
            KDSP_OP_CPY,
            e.kv.v_rows(self.li, e.len, e.n),
            &[self.items(x)],
        )
    }

    /// The `r` requested rows of every item of `x` into `out`.
    fn select_rows(&self, x: &Cols, out: &Cols, r: usize) -> kdsp_op {
        let e = self.e;
        kdsp_op::new(
            KDSP_OP_GET_ROWS,
            rows(e.act, self.at(out), Wire::F32, &[out.len, r, e.b]),
            &[self.items(x), rows(e.act, e.idx, Wire::I32, &[r])],
        )
    }

    /// Attention of item `bi`'s `t` query rows over the cached keys and this forward's.
    fn attention(&self, q: &Cols, out: &Cols, scale: f32, bi: usize) -> kdsp_op {
        let e = self.e;
        let (t, keys) = (self.t, e.len + e.n);
        let mut op = kdsp_op::new(
            KDSP_OP_FLASH_ATTN,
            self.heads(out, bi * t, t),
            &[
                self.heads(q, bi * t, t),
                e.kv.k_rows(self.li, bi, 0, keys),
                e.kv.v_keys(self.li, bi, keys),
            ],
        );
        op.params.attn.scale = scale;
        op.params.attn.kv_skip_begin = e.skip.0;
        op.params.attn.kv_skip_end = e.skip.1;
        op
    }
}
