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
        let (b, n, act) = (self.b, self.n, self.act);
        let hd = self.g.head_dim;
        let at = |c: &Cols| loc[c.act].off + c.start * 4;
        let mat = |c: &Cols, m: usize| {
            strided(
                act,
                at(c),
                [c.len, m, 1, 1],
                [4, loc[c.act].row, loc[c.act].row * m, loc[c.act].row * m],
            )
        };
        let pos_tables = self.cos.len / 4;
        let tables = |s: &WeightSlot| {
            rows(
                s.buf.id(),
                s.offset,
                Wire::F32,
                &[hd / 2, pos_tables / (hd / 2)],
            )
        };
        // NeoX rotary embedding of `src` into `dst` over `count` rows' positions.
        let rope = |dst: kdsp_tensor, src: kdsp_tensor, count: usize| {
            kdsp_op::new(
                KDSP_OP_ROPE_NEOX,
                dst,
                &[
                    src,
                    rows(act, self.pos, Wire::I32, &[count]),
                    tables(self.cos),
                    tables(self.sin),
                ],
            )
        };
        for (node, &on_selected) in nodes.iter().zip(sel) {
            let label = node.label();
            // Rows per item of this node's operands.
            let t = if on_selected && selecting {
                self.r.unwrap_or(n)
            } else {
                n
            };
            let m = b * t;
            if m == 0 {
                continue;
            }
            match *node {
                Node::RmsNorm {
                    x,
                    weight,
                    eps,
                    out,
                } => {
                    let mut op = kdsp_op::new(
                        KDSP_OP_RMS_NORM,
                        mat(&out, m),
                        &[
                            mat(&x, m),
                            slot_vec(&self.pinned[refs.vectors[weight]], x.len),
                        ],
                    );
                    op.params.norm.eps = eps;
                    batch.push(label, op);
                }
                Node::MatMul { x, weight, out } => {
                    let Some(lin) = &refs.matrices[weight] else {
                        continue; // a tail cut: the caller never asks for this
                    };
                    let op = kdsp_op::new(lin.opcode(), mat(&out, m), &[lin.tensor(), mat(&x, m)]);
                    batch.push(label, op);
                    if let Some(bias) = lin.bias {
                        let yt = mat(&out, m);
                        batch.push(
                            "bias",
                            kdsp_op::new(
                                KDSP_OP_ADD,
                                yt,
                                &[yt, slot_vec(&self.pinned[bias], lin.n)],
                            ),
                        );
                    }
                }
                Node::Add { acc, x } => {
                    let a = mat(&acc, m);
                    batch.push(label, kdsp_op::new(KDSP_OP_ADD, a, &[a, mat(&x, m)]));
                }
                Node::SwiGlu { gate, up, out } => {
                    batch.push(
                        label,
                        kdsp_op::new(KDSP_OP_SWIGLU, mat(&out, m), &[mat(&gate, m), mat(&up, m)]),
                    );
                }
                Node::Rope { x } => {
                    let row = loc[x.act].row;
                    let v = strided(
                        act,
                        at(&x),
                        [hd, x.len / hd, m, 1],
                        [4, hd * 4, row, row * m],
                    );
                    // Row t of item i has position ws + t: the positions region holds them all.
                    batch.push(label, rope(v, v, m));
                }
                Node::CacheKeysRoped { x } => {
                    let row = loc[x.act].row;
                    for bi in 0..b {
                        let kin = strided(
                            act,
                            at(&x) + bi * n * row,
                            [hd, x.len / hd, n, 1],
                            [4, hd * 4, row, row * n],
                        );
                        batch.push(label, rope(self.kv.k_rows(li, bi, self.len, n), kin, n));
                    }
                }
                Node::CacheValues { x } => {
                    let row = loc[x.act].row;
                    let vin = strided(
                        act,
                        at(&x),
                        [x.len, n, b, 1],
                        [4, row, row * n, row * b * n],
                    );
                    batch.push(
                        label,
                        kdsp_op::new(KDSP_OP_CPY, self.kv.v_rows(li, self.len, n), &[vin]),
                    );
                }
                Node::SelectRows { x, out } => {
                    let Some(r) = self.r.filter(|_| selecting) else {
                        continue; // `out` is `x` (`ActPlan::locs` aliases it)
                    };
                    if r == 0 {
                        continue;
                    }
                    let row = loc[x.act].row;
                    let src = strided(
                        act,
                        at(&x),
                        [x.len, n, b, 1],
                        [4, row, row * n, row * b * n],
                    );
                    batch.push(
                        label,
                        kdsp_op::new(
                            KDSP_OP_GET_ROWS,
                            rows(act, at(&out), Wire::F32, &[out.len, r, b]),
                            &[src, rows(act, self.idx, Wire::I32, &[r])],
                        ),
                    );
                }
                Node::Attention { q, out, scale } => {
                    let keys = self.len + n;
                    let (qrow, orow) = (loc[q.act].row, loc[out.act].row);
                    for bi in 0..b {
                        let qt = strided(
                            act,
                            at(&q) + bi * t * qrow,
                            [hd, q.len / hd, t, 1],
                            [4, hd * 4, qrow, qrow * t],
                        );
                        let ot = strided(
                            act,
                            at(&out) + bi * t * orow,
                            [hd, out.len / hd, t, 1],
                            [4, hd * 4, orow, orow * t],
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
                        op.params.attn.scale = scale;
                        op.params.attn.kv_skip_begin = self.skip.0;
                        op.params.attn.kv_skip_end = self.skip.1;
                        batch.push(label, op);
                    }
                }
            }
        }
    }
}
