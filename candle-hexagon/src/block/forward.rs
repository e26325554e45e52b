//! One forward of [`HexTransformer`]: checks, host writes, and the batches — each block's batch
//! cut into the memory runtime's stages, its weights given a place (resident, a staging slot,
//! an on-demand mapping), its matmuls split by rows to fit the scratch arena, then submitted.

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Tensor};
use kernels_dsp::*;

use super::handle::ForwardHandle;
use super::kv::DeviceKv;
use super::plan::{bucket_of, layer_batches, ActPlan, ShapeKey, ShapePlan};
use super::HexTransformer;
use crate::device::{HexagonDevice, PlanKey};
use crate::error::{Error, InputProblem, Result};
use crate::memory::DeviceBuffer;
use crate::ops::{rows, typed_mut, Wire};
use crate::routing::{Decision, OpKind, Reason};
use crate::runtime::pager::Pager;
use crate::runtime::somr::{Context, Somr};
use crate::runtime::{op_weight, relocate, MemoryPolicy, Runtime, State};
use crate::transport::{Batch, Fence};

fn invalid(problem: InputProblem) -> Error {
    Error::input("HexTransformer::submit", problem)
}

/// `somr`'s (block, stage, batch) list in submission order: each block's batch cut at the plan's
/// stages (the plan in force: `Somr::begin` ran).
fn somr_stages(st: &State, batches: &[Batch]) -> Vec<(usize, usize, Batch)> {
    batches
        .iter()
        .enumerate()
        .flat_map(|(li, b)| {
            Somr::cut(st, li, b)
                .into_iter()
                .map(move |(j, b)| (li, j, b))
        })
        .collect()
}

/// Give each stage's weights their place (`somr`'s plan, or the pager's on-demand mappings),
/// point the batch at them, split its matmuls for the scratch arena and submit it; the fences
/// with their batches and blocks, in submission order. `fallback` records a placement failure
/// as the blocks' CPU fallback before returning it.
fn submit_stages(
    dev: &HexagonDevice,
    rt: &Runtime,
    st: &mut State,
    stages: Vec<(usize, usize, Batch)>,
    fallback: &dyn Fn(Error) -> Error,
) -> Result<Vec<(Fence, Batch, usize)>> {
    let somr = rt.policy == MemoryPolicy::Somr;
    let mut fences = Vec::with_capacity(stages.len());
    for (li, j, mut batch) in stages {
        let locs = if somr {
            Somr::prepare(rt, st, j, &batch)
        } else {
            let mut needed: Vec<usize> = batch.ops().iter().filter_map(op_weight).collect();
            needed.dedup();
            Pager::prepare(rt, st, &needed)
        }
        .map_err(fallback)?;
        relocate(&mut batch, &locs)?;
        let batch = split_rows(dev, batch)?;
        let fence = dev.submit(&batch)?;
        let done = fence.completion();
        if somr {
            Somr::submitted(st, j, &done);
        } else {
            st.last = Some(done);
        }
        fences.push((fence, batch, li));
    }
    Ok(fences)
}

/// Split every matmul of `batch` by rows as the DSP scratch arena needs (found with
/// `kdsp_op_check` on the op's real descriptors, once per shape and remembered by the device).
fn split_rows(dev: &HexagonDevice, batch: Batch) -> Result<Batch> {
    let mut out = Batch::new();
    for (i, op) in batch.ops().iter().enumerate() {
        let label = batch.label(i);
        if !matches!(op.opcode, KDSP_OP_MATMUL_F16 | KDSP_OP_MATMUL_Q4_0) {
            out.push(label, *op);
            continue;
        }
        let (w, a, y) = (op.src[0], op.src[1], op.dst);
        let (k, n, m) = (a.ne[0] as usize, y.ne[0] as usize, y.ne[1] as usize);
        let key = PlanKey {
            opcode: op.opcode,
            k: k as u32,
            n: n as u32,
            a_dtype: a.dtype,
            d_dtype: y.dtype,
        };
        let part = |s: usize, r: usize| {
            let mut o = *op;
            o.dst = rows(
                y.buffer_id,
                y.offset as usize + s * n * 4,
                Wire::F32,
                &[n, r],
            );
            o.src[1] = rows(
                a.buffer_id,
                a.offset as usize + s * k * 4,
                Wire::F32,
                &[k, r],
            );
            o.src[0] = w;
            o
        };
        let chunk = dev.rows_per_op(key, m, |r| part(0, r))?.max(1);
        let mut s = 0;
        while s < m {
            let r = chunk.min(m - s);
            out.push(label, part(s, r));
            s += r;
        }
    }
    Ok(out)
}

/// The plan of a shape's bucket (captured once per bucket while it stays in the bounded cache).
fn shape_plan(t: &HexTransformer, key: ShapeKey, kv: &DeviceKv, len: usize) -> Arc<ShapePlan> {
    let bucket = bucket_of(key);
    if let Some(p) = t.inner.plans.lock().expect("plan lock").get(bucket) {
        return p;
    }
    // Built outside the lock (a host-side capture); a racing forward of the same bucket may
    // build it too, and the second insert replaces the first (both are the same plan).
    let p = Arc::new(ShapePlan::new(t, bucket, kv, len));
    let evicted = t
        .inner
        .plans
        .lock()
        .expect("plan lock")
        .insert(bucket, p.clone());
    t.inner.dev.swap_stats().count_shape_plan(evicted);
    p
}

/// The checked call: the input's batch and rows, and the row selection (`None`: every row).
struct Call {
    b: usize,
    n: usize,
    sel: Option<Vec<i32>>,
}

/// Check a call's input, positions and row selection against the stack and the cache.
fn check_call(
    t: &HexTransformer,
    kv: &DeviceKv,
    x: &Tensor,
    ws: usize,
    sel: Option<&[usize]>,
) -> Result<Call> {
    let i = &t.inner;
    let c = &i.cfg;
    let width = i.program.program.acts[i.program.program.input].1;
    let (b, n, hidden) = x.dims3().map_err(|_| {
        invalid(InputProblem::Rank {
            what: "input",
            expected: "(batch, rows, hidden)",
            found: x.dims().to_vec(),
        })
    })?;
    if hidden != width || b == 0 || n == 0 {
        return Err(invalid(InputProblem::Hidden {
            found: x.dims().to_vec(),
            width,
        }));
    }
    if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(invalid(InputProblem::DType {
            what: "input",
            expected: &[DType::F32, DType::F16, DType::BF16],
            found: x.dtype(),
        }));
    }
    kv.check_geometry(t.num_blocks(), c.kv_heads, c.head_dim, b)?;
    if ws.checked_add(n).is_none_or(|e| e > c.max_positions) {
        return Err(invalid(InputProblem::Positions {
            start: ws,
            rows: n,
            max: c.max_positions,
        }));
    }
    let sel: Option<Vec<i32>> = match sel {
        Some(s) if s.len() == n && s.iter().enumerate().all(|(k, &v)| k == v) => None,
        Some(s) => {
            if let Some(&bad) = s.iter().find(|&&v| v >= n) {
                return Err(invalid(InputProblem::RowOutsideWindow {
                    row: bad,
                    rows: n,
                }));
            }
            Some(s.iter().map(|&v| v as i32).collect())
        }
        None => None,
    };
    if sel.is_some() && !i.program.selects {
        return Err(invalid(InputProblem::NoRowSelection));
    }
    Ok(Call { b, n, sel })
}

/// The host's writes into the activation buffer: the input rows (as f32), their positions and
/// the selection; returns the bytes staged in.
fn write_inputs(
    t: &HexTransformer,
    act: &DeviceBuffer,
    plan: &ActPlan,
    x: &Tensor,
    ws: usize,
    call: &Call,
) -> Result<usize> {
    let width = t.inner.program.program.acts[t.inner.program.program.input].1;
    let (m, n) = (call.b * call.n, call.n);
    let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    act.with_host_bytes(plan.x(t), m * width * 4, |d| -> Result<()> {
        typed_mut::<f32>(d)?.copy_from_slice(&xs);
        Ok(())
    })??;
    let pos: Vec<u8> = (0..m)
        .flat_map(|k| ((ws + k % n) as i32).to_le_bytes())
        .collect();
    act.write(plan.pos(), &pos)?;
    let mut staged_in = xs.len() * 4 + pos.len();
    if let Some(s) = &call.sel {
        let bytes: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
        act.write(plan.idx(), &bytes)?;
        staged_in += bytes.len();
    }
    Ok(staged_in)
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
    let start = Instant::now();
    let call = check_call(t, kv, x, ws, sel)?;
    let (b, n) = (call.b, call.n);
    let r = call.sel.as_ref().map(Vec::len);
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
    let rt = &i.runtime;
    let somr = rt.policy == MemoryPolicy::Somr;
    // One forward of this module is prepared at a time (the slots and mappings are shared).
    let mut st = rt.lock();
    // Room for the window's rows in the cache (may grow it: a new mapping + copy).
    let len = rt
        .reclaiming(&mut st, || kv.prepare(ws, n))
        .map_err(fallback)?;
    let shape = shape_plan(t, (b, n, r), kv, len);
    let plan = if somr { &shape.packed } else { &shape.separate };
    let act = rt
        .reclaiming(&mut st, || i.dev.take_buffer_exact(plan.total, somr))
        .map_err(fallback)?;
    let staged_in = write_inputs(t, &act, plan, x, ws, &call)?;
    i.dev.mem().count_staged(staged_in, 0);

    // Stale cached rows of the window's own positions are skipped by attention.
    let skip_end = (ws + n).min(len);
    let skip = if ws < skip_end {
        (ws as u32, skip_end as u32)
    } else {
        (0, 0)
    };
    let batches = layer_batches(t, plan, act.id(), kv, (b, n, r), len, skip);
    let stages = if somr {
        let ctx = Context {
            kv_bytes: kv.mapped_bytes() as u64,
            act_bytes: plan.total as u64,
            act_unpacked_bytes: shape.separate.total as u64,
            pinned_bytes: i.pinned.first().map_or(0, |p| p.buf.len()) as u64,
        };
        Somr::begin(rt, &mut st, &batches, ctx).map_err(fallback)?;
        somr_stages(&st, &batches)
    } else {
        batches
            .into_iter()
            .enumerate()
            .map(|(li, b)| (li, li, b))
            .collect()
    };
    let fences = submit_stages(&i.dev, rt, &mut st, stages, &fallback)?;
    st.forwards += 1;
    let prefetch = if somr { Somr::end(&mut st) } else { None };
    drop(st);
    rt.stats().count_forward();
    kv.forward_wrote(n);
    Ok(ForwardHandle::new(
        i.dev.clone(),
        fences,
        blocks,
        act,
        plan.out(),
        (b, r.unwrap_or(n), plan.width),
        t.output(),
        i.tier,
        staged_in,
        start,
        prefetch.map(|p| (rt.clone(), p)),
    ))
}
