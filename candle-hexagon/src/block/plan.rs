//! The forward of [`HexTransformer`]: activation plan (offsets per shape), the host writes of a
//! forward, and one batch of kernel ops per block.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use kernels_dsp::*;

use super::handle::ForwardHandle;
use super::kv::DeviceKv;
use super::packed::PackedLinear;
use super::{HexTransformer, PackedBlock};
use crate::device::PlanKey;
use crate::error::{Error, Result};
use crate::memory::leases::Access;
use crate::memory::{DeviceBuffer, WeightSlot};
use crate::ops::{rows, typed_mut, StagePlan, Wire};
use crate::routing::{Decision, OpKind, Reason};
use crate::transport::Batch;

/// `(b, n, selected rows per item or None for all)`.
pub(crate) type ShapeKey = (usize, usize, Option<usize>);

/// Offsets (bytes) of a forward's activations in its pooled buffer; all f32 except `pos`/`idx`
/// (i32). Row counts: `m = b * n` window rows, `mq = b * r` rows after the last block's
/// selection.
#[derive(Debug, Clone)]
pub(crate) struct ActPlan {
    pub(crate) x: usize,
    pub(crate) h: usize,
    pub(crate) qkv: usize,
    pub(crate) att: usize,
    pub(crate) gu: usize,
    pub(crate) act: usize,
    pub(crate) pos: usize,
    pub(crate) idx: usize,
    pub(crate) xs: usize,
    pub(crate) qs: usize,
    pub(crate) out: usize,
    pub(crate) total: usize,
    pub(crate) width: usize,
    /// Rows per matmul op (scratch-arena split), per matmul kind and row count.
    pub(crate) chunks: std::collections::HashMap<(u8, usize), usize>,
}

const MM_QKV: u8 = 0;
const MM_O: u8 = 1;
const MM_GATE_UP: u8 = 2;
const MM_DOWN: u8 = 3;
const MM_HEAD: u8 = 4;

impl ActPlan {
    fn new(t: &HexTransformer, b: usize, n: usize, r: Option<usize>) -> Self {
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
        let mut p = StagePlan::default();
        let sel = |rows: usize| if r.is_some() { rows } else { 0 };
        ActPlan {
            x: p.push(m * h * 4),
            h: p.push(m * h * 4),
            qkv: p.push(m * (q + 2 * kv) * 4),
            att: p.push(m * q * 4),
            gu: p.push(m * 2 * f * 4),
            act: p.push(m * f * 4),
            pos: p.push(m * 4),
            idx: p.push(sel(r.unwrap_or(0)) * 4),
            xs: p.push(sel(mq * h * 4)),
            qs: p.push(sel(mq * q * 4)),
            out: p.push(mq * width * 4),
            total: p.total(),
            width,
            chunks: Default::default(),
        }
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
struct Fwd<'a> {
    t: &'a HexTransformer,
    plan: &'a ActPlan,
    act: u32,
    kv: &'a DeviceKv,
    b: usize,
    n: usize,
    /// Selected rows per item in the last block (None: all `n`).
    r: Option<usize>,
    len: usize,
    skip: (u32, u32),
}

impl Fwd<'_> {
    /// `y (m, n_out) = a (m, k) W^T (+ bias)`, split by rows as the scratch arena needs.
    fn matmul(
        &self,
        batch: &mut Batch,
        kind: u8,
        lin: &PackedLinear,
        a: usize,
        y: usize,
        m: usize,
    ) {
        let chunk = self
            .plan
            .chunks
            .get(&(kind, m))
            .copied()
            .unwrap_or(m)
            .max(1);
        let mut s = 0;
        while s < m {
            let r = chunk.min(m - s);
            let op = kdsp_op::new(
                lin.opcode(),
                mat(self.act, y + s * lin.n * 4, lin.n, r),
                &[lin.tensor(), mat(self.act, a + s * lin.k * 4, lin.k, r)],
            );
            batch.push(label(kind), op);
            s += r;
        }
        if let Some(bias) = &lin.bias {
            let yt = mat(self.act, y, lin.n, m);
            batch.push(
                "bias",
                kdsp_op::new(KDSP_OP_ADD, yt, &[yt, slot_vec(bias, lin.n)]),
            );
        }
    }

    fn norm(&self, batch: &mut Batch, w: &WeightSlot, x: usize, y: usize, m: usize) {
        let h = self.t.inner.cfg.hidden;
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

    fn block(&self, li: usize, blk: &PackedBlock, last: bool) -> Batch {
        let i = &self.t.inner;
        let c = &i.cfg;
        let p = self.plan;
        let (b, n, act) = (self.b, self.n, self.act);
        let (h, hd, hq, hkv, f) = (c.hidden, c.head_dim, c.heads, c.kv_heads, c.ffn);
        let (q, kvw) = (hq * hd, hkv * hd);
        let nqkv = q + 2 * kvw;
        let m = b * n;
        let row = nqkv * 4; // bytes of one fused QKV output row
        let pos_tables = i.cos.len / 4;
        let tables = |s: &WeightSlot| {
            rows(
                s.buf.id(),
                s.offset,
                Wire::F32,
                &[hd / 2, pos_tables / (hd / 2)],
            )
        };
        let mut batch = Batch::new();

        self.norm(&mut batch, &blk.attn_norm, p.x, p.h, m);
        self.matmul(&mut batch, MM_QKV, &blk.qkv, p.h, p.qkv, m);
        // RoPE on q, in place over all window rows (row t of item i has position ws + t).
        let qv = view(act, p.qkv, [hd, hq, m, 1], [4, hd * 4, row, row * m]);
        batch.push(
            "rope q",
            kdsp_op::new(
                KDSP_OP_ROPE_NEOX,
                qv,
                &[
                    qv,
                    rows(act, p.pos, Wire::I32, &[m]),
                    tables(&i.cos),
                    tables(&i.sin),
                ],
            ),
        );
        // RoPE on k, written as f16 straight into the cache rows [len, len + n) of each item.
        for bi in 0..b {
            let kin = view(
                act,
                p.qkv + bi * n * row + q * 4,
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
                        rows(act, p.pos, Wire::I32, &[n]),
                        tables(&i.cos),
                        tables(&i.sin),
                    ],
                ),
            );
        }
        // V as f16 into the same rows.
        let vin = view(
            act,
            p.qkv + (q + kvw) * 4,
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
                    let idx = rows(act, p.idx, Wire::I32, &[r]);
                    let qall = view(act, p.qkv, [q, n, b, 1], [4, row, row * n, row * m]);
                    batch.push(
                        "select q rows",
                        kdsp_op::new(
                            KDSP_OP_GET_ROWS,
                            rows(act, p.qs, Wire::F32, &[q, r, b]),
                            &[qall, idx],
                        ),
                    );
                    batch.push(
                        "select x rows",
                        kdsp_op::new(
                            KDSP_OP_GET_ROWS,
                            rows(act, p.xs, Wire::F32, &[h, r, b]),
                            &[rows(act, p.x, Wire::F32, &[h, n, b]), idx],
                        ),
                    );
                }
                (r, p.qs, q * 4, p.xs)
            }
            _ => (n, p.qkv, row, p.x),
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
                p.att + bi * tq * q * 4,
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
        self.matmul(&mut batch, MM_O, &blk.o, p.att, p.h, mq);
        self.add(&mut batch, xr, p.h, mq);
        self.norm(&mut batch, &blk.ffn_norm, xr, p.h, mq);
        self.matmul(&mut batch, MM_GATE_UP, &blk.gate_up, p.h, p.gu, mq);
        // silu(gate) * up over the two halves of each fused row (strided views, no copy).
        let gate = view(
            act,
            p.gu,
            [f, mq, 1, 1],
            [4, 2 * f * 4, 2 * f * 4 * mq, 2 * f * 4 * mq],
        );
        let up = view(
            act,
            p.gu + f * 4,
            [f, mq, 1, 1],
            [4, 2 * f * 4, 2 * f * 4 * mq, 2 * f * 4 * mq],
        );
        batch.push(
            "swiglu",
            kdsp_op::new(KDSP_OP_SWIGLU, mat(act, p.act, f, mq), &[gate, up]),
        );
        self.matmul(&mut batch, MM_DOWN, &blk.down, p.act, p.h, mq);
        self.add(&mut batch, xr, p.h, mq);
        if last {
            match &i.head {
                Some(head) => {
                    self.norm(&mut batch, &i.final_norm, xr, p.h, mq);
                    self.matmul(&mut batch, MM_HEAD, head, p.h, p.out, mq);
                }
                None => self.norm(&mut batch, &i.final_norm, xr, p.out, mq),
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

fn invalid(detail: String) -> Error {
    Error::InvalidInput {
        op: "HexTransformer::submit",
        detail,
    }
}

/// The plan for a shape, with matmul row splits found (once) with `kdsp_op_check`.
fn plan_for(t: &HexTransformer, key: ShapeKey, act: &DeviceBuffer) -> Result<Arc<ActPlan>> {
    if let Some(p) = t.inner.plans.lock().expect("plan lock").get(&key) {
        return Ok(p.clone());
    }
    let (b, n, r) = key;
    let mut plan = ActPlan::new(t, b, n, r);
    let blk = &t.inner.blocks[0];
    let mq = b * r.unwrap_or(n);
    // (kind, layer, rows, activation offset, output offset) as the batches use them
    let mut need: Vec<(u8, &PackedLinear, usize, usize, usize)> = vec![
        (MM_QKV, &blk.qkv, b * n, plan.h, plan.qkv),
        (MM_O, &blk.o, b * n, plan.att, plan.h),
        (MM_GATE_UP, &blk.gate_up, b * n, plan.h, plan.gu),
        (MM_DOWN, &blk.down, b * n, plan.act, plan.h),
        (MM_O, &blk.o, mq, plan.att, plan.h),
        (MM_GATE_UP, &blk.gate_up, mq, plan.h, plan.gu),
        (MM_DOWN, &blk.down, mq, plan.act, plan.h),
    ];
    if let Some(head) = &t.inner.head {
        need.push((MM_HEAD, head, mq, plan.h, plan.out));
    }
    for (kind, lin, m, a_off, y_off) in need {
        if m == 0 || plan.chunks.contains_key(&(kind, m)) {
            continue;
        }
        // Every block's matmul of a kind has the same shape and format as block 0's.
        let key = PlanKey {
            opcode: lin.opcode(),
            k: lin.k as u32,
            n: lin.n as u32,
            a_dtype: KDSP_DTYPE_F32,
            d_dtype: KDSP_DTYPE_F32,
        };
        let id = act.id();
        let chunk = t.inner.dev.rows_per_op(key, m, |rr| {
            kdsp_op::new(
                lin.opcode(),
                mat(id, y_off, lin.n, rr),
                &[lin.tensor(), mat(id, a_off, lin.k, rr)],
            )
        })?;
        plan.chunks.insert((kind, m), chunk);
    }
    let plan = Arc::new(plan);
    t.inner
        .plans
        .lock()
        .expect("plan lock")
        .insert(key, plan.clone());
    Ok(plan)
}

/// [`HexTransformer::submit`].
pub(crate) fn submit(
    t: &HexTransformer,
    kv: &mut DeviceKv,
    x: &Tensor,
    ws: usize,
    sel: Option<&[usize]>,
) -> Result<ForwardHandle> {
    let i = &t.inner;
    let c = &i.cfg;
    let start = std::time::Instant::now();
    let (b, n, hidden) = x
        .dims3()
        .map_err(|_| invalid(format!("input {:?} is not (batch, rows, hidden)", x.dims())))?;
    if hidden != c.hidden || b == 0 || n == 0 {
        return Err(invalid(format!(
            "input {:?} is not (batch >= 1, rows >= 1, {})",
            x.dims(),
            c.hidden
        )));
    }
    if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(invalid(format!(
            "input dtype {:?} (use f32, f16 or bf16)",
            x.dtype()
        )));
    }
    kv.check_geometry(t.num_blocks(), c.kv_heads, c.head_dim, b)?;
    if ws.checked_add(n).is_none_or(|e| e > c.max_positions) {
        return Err(invalid(format!(
            "window [{ws}, {ws} + {n}) exceeds the {} positions of the RoPE tables",
            c.max_positions
        )));
    }
    let sel: Option<Vec<i32>> = match sel {
        Some(s) if s.len() == n && s.iter().enumerate().all(|(k, &v)| k == v) => None,
        Some(s) => {
            if let Some(&bad) = s.iter().find(|&&v| v >= n) {
                return Err(invalid(format!(
                    "row {bad} requested from a window of {n} rows"
                )));
            }
            Some(s.iter().map(|&v| v as i32).collect())
        }
        None => None,
    };
    let r = sel.as_ref().map(Vec::len);
    let blocks = t.num_blocks();
    let fallback = |e: Error| -> Error {
        if let Some(reason) = Reason::from_error(&e) {
            for _ in 0..blocks {
                i.dev
                    .stats()
                    .record_call(OpKind::Block, Decision::Cpu(reason.key()), 0, 0);
            }
        }
        e
    };
    // Room for the window's rows in the cache (may grow it: a new mapping + copy).
    let len = kv.prepare(ws, n).map_err(fallback)?;
    let key = (b, n, r);
    let plan_total = i
        .plans
        .lock()
        .expect("plan lock")
        .get(&key)
        .map(|p| p.total)
        .unwrap_or_else(|| ActPlan::new(t, b, n, r).total);
    let act = i.dev.take_buffer(plan_total).map_err(fallback)?;
    let plan = plan_for(t, key, &act)?;

    // Host writes: input rows (as f32), positions, selection.
    let m = b * n;
    let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    act.with_host_bytes(plan.x, m * c.hidden * 4, Access::Write, |d| -> Result<()> {
        typed_mut::<f32>(d)?.copy_from_slice(&xs);
        Ok(())
    })??;
    let pos: Vec<u8> = (0..m)
        .flat_map(|k| ((ws + k % n) as i32).to_le_bytes())
        .collect();
    act.write(plan.pos, &pos)?;
    let mut staged_in = xs.len() * 4 + pos.len();
    if let Some(s) = &sel {
        let bytes: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
        act.write(plan.idx, &bytes)?;
        staged_in += bytes.len();
    }
    i.dev.mem().count_staged(staged_in, 0);

    // Stale cached rows of the window's own positions are skipped by attention.
    let skip_end = (ws + n).min(len);
    let skip = if ws < skip_end {
        (ws as u32, skip_end as u32)
    } else {
        (0, 0)
    };
    let fwd = Fwd {
        t,
        plan: &plan,
        act: act.id(),
        kv,
        b,
        n,
        r,
        len,
        skip,
    };
    let mut fences = Vec::with_capacity(blocks);
    for (li, blk) in i.blocks.iter().enumerate() {
        let batch = fwd.block(li, blk, li + 1 == blocks);
        let fence = i.dev.submit(&batch)?;
        fences.push((fence, batch));
    }
    kv.set_pending(ws, n, len);
    Ok(ForwardHandle::new(
        i.dev.clone(),
        fences,
        act,
        plan.out,
        (b, r.unwrap_or(n), plan.width),
        t.output(),
        i.tier,
        staged_in,
        start,
    ))
}
