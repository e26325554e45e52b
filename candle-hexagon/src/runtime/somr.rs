//! The `somr` policy: plan, resident mappings and the two staging slots.
//!
//! The first forward that needs a plan makes one, before any of its batches is submitted, from
//! the op stream it is about to submit (graph-guided, paper §3.4): its batches (one per block,
//! weights named by virtual ids) are cut into *segments* (the ops from one weight-consuming op to
//! the next), each segment's NPU time and each weight's staging time estimated from the
//! descriptors and sizes (`cost.rs`, the planner's latency table). When every weight fits the
//! budget, all are made resident at once: mapped in place from the module's weight file (runs of
//! weights adjacent in the file, which is in consumption order, one mapping each: no copy) when
//! the transport can map ranges of shared memory, else copied in consumption order into a few
//! large mappings. Otherwise the weights are placed from those estimates
//! ([`super::placement::place`]), the residents and the two slots mapped, and every forward, the
//! first included, runs pipelined (no forward streams a weight twice):
//!
//! - a stage's streamed weights are copied into its slot only after the stage that last read the
//!   slot has completed (its `Completion`); the copy goes through the buffer's checked host
//!   write, so the leases refuse it if a batch in flight still reads those bytes;
//! - the copy for stage `j + 1` runs on the host while the DSP runs stage `j` (already queued);
//! - at the end of a forward, while its last stages run, the first streamed stage of the next
//!   forward is staged ([`prefetch`], called from `ForwardHandle::wait`);
//! - a slot that still holds its stage's weights is not copied again.
//!
//! When a later mapping (KV growth, a larger activation buffer) finds the window full, the
//! residents and slots are released ([`Somr::demote`]) and the next forward re-plans with the
//! space that is left.

use std::ops::Range;
use std::time::Instant;

use super::packing::{pack_in_order, MappingPlan};
use super::placement::{self, Placement, Segment, WeightInfo};
use super::report::{MemoryPlan, PlanRow};
use super::{cost, op_weight, Loc, Policy, Runtime, State};
use crate::error::{fmt_bytes, Error, Result, TransportFault};
use crate::memory::{align_tensor, round_up, DeviceBuffer, TENSOR_ALIGN};
use crate::transport::{Batch, Completion};

/// Largest single mapping (v73: 2 GB per `HAP_mmap`).
pub const MAX_MAPPING_BYTES: u64 = 2 << 30;

/// Share of the window kept free for what the plan cannot see (other shapes' activations,
/// KV growth): 1/32.
pub const HEADROOM_DIVISOR: u64 = 32;

/// The segments of one block's batch: `(weight its first op consumes, op range)`.
pub(crate) fn segments_of(batch: &Batch) -> Vec<(Option<usize>, Range<usize>)> {
    let mut out: Vec<(Option<usize>, Range<usize>)> = Vec::new();
    for (i, op) in batch.ops().iter().enumerate() {
        let w = op_weight(op);
        match out.last_mut() {
            Some((cur, r)) if w.is_none() || w == *cur => r.end = i + 1,
            _ => out.push((w, i..i + 1)),
        }
    }
    out
}

/// What the forward tells the plan about the rest of the window (for the printout).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Context {
    pub(crate) kv_bytes: u64,
    pub(crate) act_bytes: u64,
    pub(crate) act_unpacked_bytes: u64,
    pub(crate) pinned_bytes: u64,
}

// Built here rather than in `report.rs`, so the printout does not import the runtime.
impl MemoryPlan {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rt: &Runtime,
        p: &Placement,
        segments: &[Segment],
        resident: &[Option<Loc>],
        mappings: &[DeviceBuffer],
        ctx: Context,
        budget: u64,
        headroom: u64,
    ) -> Self {
        let va = rt.dev.memory_stats().va;
        let mine: u64 = mappings.iter().map(|m| m.len() as u64).sum::<u64>() + 2 * p.slot_bytes;
        let mut order: Vec<usize> = Vec::new();
        for s in segments {
            if let Some(w) = s.weight {
                if !order.contains(&w) {
                    order.push(w);
                }
            }
        }
        let unseen: Vec<usize> = (0..rt.weights.len())
            .filter(|w| !order.contains(w))
            .collect();
        order.extend(unseen);
        let stage_of = |w: usize| {
            p.stages.iter().position(|st| {
                segments[st.segments.clone()]
                    .iter()
                    .any(|s| s.weight == Some(w))
            })
        };
        let rows = order
            .into_iter()
            .map(|w| {
                let bytes = rt.weights[w].bytes.len() as u64;
                let stage = stage_of(w);
                let place = match resident[w] {
                    Some(l) => {
                        let m = mappings
                            .iter()
                            .position(|b| b.id() == l.buffer)
                            .unwrap_or(0);
                        format!("mapping {m} +{}", fmt_bytes(l.offset as u64))
                    }
                    None => {
                        let (slot, off) = stage
                            .and_then(|j| {
                                let st = &p.stages[j];
                                st.streamed
                                    .iter()
                                    .find(|x| x.0 == w)
                                    .map(|x| (st.slot, x.1))
                            })
                            .unwrap_or((None, 0));
                        match slot {
                            Some(k) => format!("slot {k} +{}", fmt_bytes(off)),
                            None => "-".into(),
                        }
                    }
                };
                PlanRow {
                    tensor: rt.weights[w].name.clone(),
                    bytes,
                    resident: resident[w].is_some(),
                    place,
                    stage,
                }
            })
            .collect();
        MemoryPlan {
            window_bytes: va.window_bytes,
            mapped_before: va.mapped_bytes.saturating_sub(mine),
            kv_bytes: ctx.kv_bytes,
            act_bytes: ctx.act_bytes,
            act_unpacked_bytes: ctx.act_unpacked_bytes,
            pinned_bytes: ctx.pinned_bytes,
            headroom_bytes: headroom,
            budget_bytes: budget,
            resident_bytes: mappings.iter().map(|m| m.len() as u64).sum(),
            mappings: mappings.iter().map(|m| m.len() as u64).collect(),
            slot_bytes: p.slot_bytes,
            blocks: p.stages.last().map_or(0, |s| s.block + 1),
            stages: p.stages.len(),
            expected_stall_ns: p.expected_stall_ns,
            expected_streamed_bytes: p.expected_streamed_bytes,
            rows,
            stage_plan: p.stages.clone(),
        }
    }
}

struct Slot {
    buf: DeviceBuffer,
    tag: Option<usize>,
    reader: Option<Completion>,
}

/// A plan in force: residents mapped, slots mapped.
struct Active {
    epoch: u64,
    placement: Placement,
    /// Per weight: its stage (None: never consumed by the planned forward; kept resident).
    stage_of: Vec<Option<usize>>,
    block_first: Vec<usize>,
    resident: Vec<Option<Loc>>,
    mappings: Vec<DeviceBuffer>,
    slots: Vec<Slot>,
    alternates: bool,
    report: MemoryPlan,
    /// Stages submitted in the current forward (stage index, slot used).
    submitted: Vec<(usize, Option<usize>)>,
}

/// The `somr` state of one module.
#[derive(Default)]
pub(crate) struct Somr {
    active: Option<Active>,
    epoch: u64,
}

/// What `ForwardHandle::wait` needs to stage the next forward's first streamed stage.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prefetch {
    pub(crate) epoch: u64,
    pub(crate) forward: u64,
    /// Wait for this many of the forward's batches first (the last one reading the slot).
    pub(crate) after: usize,
}

fn somr(st: &mut State) -> &mut Somr {
    match &mut st.policy {
        Policy::Somr(s) => s,
        Policy::Pager(_) => unreachable!("somr state"),
    }
}

impl Somr {
    /// Make sure a plan is in force for the forward whose per-block batches are `blocks`.
    pub(crate) fn begin(
        rt: &Runtime,
        st: &mut State,
        blocks: &[Batch],
        ctx: Context,
    ) -> Result<()> {
        let s = somr(st);
        let known = |a: &Active| {
            blocks
                .iter()
                .flat_map(|b| b.ops())
                .filter_map(op_weight)
                .all(|w| a.stage_of[w].is_some() || a.resident[w].is_some())
        };
        if s.active.as_ref().is_some_and(known) {
            return Ok(());
        }
        // Release the old plan first: its space is part of the budget.
        s.active = None;
        s.epoch += 1;
        let segments = Self::segments(blocks);
        let w = &rt.weights;
        // Mapped in place, a resident weight takes whole pages of the window (its range of the
        // weight file); copied, it is packed at tensor alignment.
        let page = rt.dev.mem().window.page();
        let in_place = in_place(rt);
        let size = |i: usize| {
            let len = w[i].bytes.len();
            if in_place {
                round_up(len.max(1) as u64, page)
            } else {
                align_tensor(len) as u64
            }
        };
        // Idle activation buffers of other shapes hold window space the plan can use.
        rt.dev.release_idle_buffers();
        let va = rt.dev.memory_stats().va;
        let cfg = rt.dev.config();
        let free = va.window_bytes.saturating_sub(va.mapped_bytes);
        let headroom = va.window_bytes / HEADROOM_DIVISOR;
        let total = free.saturating_sub(headroom);
        let slot_max = (cfg.staging_bytes / 2).min(total / 2);
        let all: u64 = (0..w.len()).map(size).sum();
        let fits = all <= total && cfg.resident_weight_bytes.is_none_or(|c| all <= c);
        let infos: Vec<WeightInfo> = (0..w.len())
            .map(|i| WeightInfo {
                bytes: size(i),
                stage_ns: cost::stage_ns(w[i].bytes.len() as u64),
            })
            .collect();
        let placement = if fits {
            placement::all_resident(&infos, &segments, TENSOR_ALIGN as u64)
        } else {
            placement::place(
                &infos,
                &segments,
                total,
                slot_max,
                cfg.resident_weight_bytes,
                TENSOR_ALIGN as u64,
            )
        };
        rt.stats().count_plan();
        let active = Self::map(rt, s.epoch, placement, segments, ctx, total, headroom)?;
        somr(st).active = Some(active);
        Ok(())
    }

    /// The planning segments of this forward's batches, with their estimated NPU times.
    fn segments(blocks: &[Batch]) -> Vec<Segment> {
        let mut out = Vec::new();
        for (li, b) in blocks.iter().enumerate() {
            for (w, ops) in segments_of(b) {
                out.push(Segment {
                    block: li,
                    weight: w,
                    compute_ns: b.ops()[ops].iter().map(cost::op_ns).sum(),
                });
            }
        }
        out
    }

    /// Map the residents and the slots of `placement`.
    #[allow(clippy::too_many_arguments)]
    fn map(
        rt: &Runtime,
        epoch: u64,
        placement: Placement,
        segments: Vec<Segment>,
        ctx: Context,
        total: u64,
        headroom: u64,
    ) -> Result<Active> {
        let n = rt.weights.len();
        let mut stage_of = vec![None; n];
        let mut block_first = Vec::new();
        for (j, st) in placement.stages.iter().enumerate() {
            if block_first.len() <= st.block {
                block_first.resize(st.block + 1, j);
            }
            for seg in &segments[st.segments.clone()] {
                if let Some(w) = seg.weight {
                    stage_of[w] = Some(j);
                }
            }
        }
        // Residents in consumption order; weights the forward never consumed go last.
        let mut order: Vec<usize> = Vec::new();
        for seg in &segments {
            if let Some(w) = seg.weight {
                if placement.resident[w] && !order.contains(&w) {
                    order.push(w);
                }
            }
        }
        order.extend((0..n).filter(|&w| stage_of[w].is_none()));
        let (resident, mappings) = map_residents(rt, &order)?;
        let mut slots = Vec::new();
        if placement.slot_bytes > 0 {
            for _ in 0..2 {
                let mut buf = rt.dev.map_buffer(placement.slot_bytes as usize)?;
                // Streamed weights are copied through the slots.
                buf.hold_weight_copy(placement.slot_bytes);
                slots.push(Slot {
                    buf,
                    tag: None,
                    reader: None,
                });
            }
        }
        let report = MemoryPlan::new(
            rt, &placement, &segments, &resident, &mappings, ctx, total, headroom,
        );
        rt.dev.note_plan(&report);
        Ok(Active {
            epoch,
            alternates: placement::alternates(&placement.stages),
            placement,
            stage_of,
            block_first,
            resident,
            mappings,
            slots,
            report,
            submitted: Vec::new(),
        })
    }

    /// Cut block `li`'s batch into the plan's stages: `(stage, batch)` in order.
    pub(crate) fn cut(st: &State, li: usize, batch: &Batch) -> Vec<(usize, Batch)> {
        let Policy::Somr(s) = &st.policy else {
            unreachable!("somr state")
        };
        let a = s.active.as_ref().expect("begin() made a plan");
        let first = a.block_first.get(li).copied().unwrap_or(0);
        let mut out: Vec<(usize, Batch)> = Vec::new();
        for (w, range) in segments_of(batch) {
            let stage = match w.and_then(|w| a.stage_of[w]) {
                Some(j) => j,
                None => out.last().map_or(first, |(j, _)| *j),
            };
            if out.last().map(|(j, _)| *j) != Some(stage) {
                out.push((stage, Batch::new()));
            }
            let b = &mut out.last_mut().expect("pushed above").1;
            for i in range {
                b.push(batch.labels()[i], batch.ops()[i]);
            }
        }
        out
    }

    /// Where the weights of `batch` (stage `j`) are, staging the streamed ones into the stage's
    /// slot (after the stage that last read the slot has finished).
    pub(crate) fn prepare(
        rt: &Runtime,
        st: &mut State,
        j: usize,
        batch: &Batch,
    ) -> Result<Vec<(usize, Loc)>> {
        let forward = st.forwards;
        let last = st.last.clone();
        let a = somr(st).active.as_mut().expect("begin() made a plan");
        let stage = &a.placement.stages[j];
        let mut locs: Vec<(usize, Loc)> = Vec::new();
        let slot = stage
            .slot
            .map(|b| placement::slot_of(b, forward, a.alternates));
        if let Some(k) = slot {
            let s = &mut a.slots[k];
            if s.tag != Some(j) {
                if let Some(r) = &s.reader {
                    rt.stats().wait_for_slot(r);
                }
                let start = Instant::now();
                for &(w, off) in &stage.streamed {
                    s.buf.write(off as usize, &rt.weights[w].bytes)?;
                }
                s.tag = Some(j);
                rt.stats()
                    .staged(stage.streamed_bytes, start, Instant::now(), last.as_ref());
            }
        }
        for w in batch.ops().iter().filter_map(op_weight) {
            if locs.iter().any(|(x, _)| *x == w) {
                continue;
            }
            let loc = match (
                a.resident[w],
                stage.streamed.iter().find(|(x, _)| *x == w),
                slot,
            ) {
                (Some(l), _, _) => l,
                (None, Some(&(_, off)), Some(k)) => Loc {
                    buffer: a.slots[k].buf.id(),
                    offset: off as usize,
                },
                _ => {
                    return Err(Error::Transport(TransportFault::WeightUnplaced {
                        weight: rt.weights[w].name.clone(),
                        stage: j,
                    }))
                }
            };
            locs.push((w, loc));
        }
        Ok(locs)
    }

    /// Stage `j` was submitted with `done`.
    pub(crate) fn submitted(st: &mut State, j: usize, done: &Completion) {
        let forward = st.forwards;
        st.last = Some(done.clone());
        let a = somr(st).active.as_mut().expect("begin() made a plan");
        let slot = a.placement.stages[j]
            .slot
            .map(|b| placement::slot_of(b, forward, a.alternates));
        if let Some(k) = slot {
            a.slots[k].reader = Some(done.clone());
        }
        a.submitted.push((j, slot));
    }

    /// The forward's batches are all submitted; `st.forwards` is the next forward's number.
    pub(crate) fn end(st: &mut State) -> Option<Prefetch> {
        let forward = st.forwards;
        let s = somr(st);
        let a = s.active.as_mut()?;
        let submitted = std::mem::take(&mut a.submitted);
        let j0 = a.placement.stages.iter().position(|s| s.slot.is_some())?;
        let k0 = placement::slot_of(a.placement.stages[j0].slot?, forward, a.alternates);
        let after = submitted
            .iter()
            .rposition(|&(_, k)| k == Some(k0))
            .map_or(0, |i| i + 1);
        Some(Prefetch {
            epoch: a.epoch,
            forward,
            after,
        })
    }

    /// Release the residents and slots (the next forward re-plans). True when anything was
    /// mapped.
    pub(crate) fn demote(&mut self, rt: &Runtime) -> bool {
        match self.active.take() {
            Some(a) => {
                let n = (a.mappings.len() + a.slots.len()) as u64;
                rt.stats().count_evictions(n);
                self.epoch += 1;
                n > 0
            }
            None => false,
        }
    }

    pub(crate) fn report(&self, _rt: &Runtime) -> Option<MemoryPlan> {
        self.active.as_ref().map(|a| a.report.clone())
    }
}

/// Stage the first streamed stage of forward `p.forward` while the current forward ends.
pub(crate) fn prefetch(rt: &Runtime, p: Prefetch) -> Result<()> {
    let Some(mut st) = rt.try_lock() else {
        return Ok(()); // another forward is being prepared: it stages for itself
    };
    if st.forwards != p.forward {
        return Ok(());
    }
    let last = st.last.clone();
    let Policy::Somr(s) = &mut st.policy else {
        return Ok(());
    };
    let Some(a) = s.active.as_mut().filter(|a| a.epoch == p.epoch) else {
        return Ok(());
    };
    let Some(j0) = a.placement.stages.iter().position(|s| s.slot.is_some()) else {
        return Ok(());
    };
    let stage = &a.placement.stages[j0];
    let k = placement::slot_of(stage.slot.expect("streams"), p.forward, a.alternates);
    let slot = &mut a.slots[k];
    if slot.tag == Some(j0) {
        return Ok(());
    }
    if let Some(r) = &slot.reader {
        rt.stats().wait_for_slot(r);
    }
    let start = Instant::now();
    for &(w, off) in &stage.streamed {
        slot.buf.write(off as usize, &rt.weights[w].bytes)?;
    }
    slot.tag = Some(j0);
    rt.stats()
        .staged(stage.streamed_bytes, start, Instant::now(), last.as_ref());
    Ok(())
}

/// Map the resident weights `order` (consumption order): where each weight is, and the mappings.
fn map_residents(rt: &Runtime, order: &[usize]) -> Result<(Vec<Option<Loc>>, Vec<DeviceBuffer>)> {
    let n = rt.weights.len();
    // In place: mappings of runs of residents adjacent in the weight file (the file is in
    // load order, which is consumption order), nothing copied. Otherwise: residents copied
    // back to back in consumption order into mappings of their own.
    let in_place = in_place(rt);
    let page = rt.dev.mem().window.page();
    let plan = |ws: &[usize], limit: u64| {
        if in_place {
            file_runs(rt, ws, page, limit)
        } else {
            let items: Vec<(usize, u64)> = ws
                .iter()
                .map(|&w| (w, rt.weights[w].bytes.len() as u64))
                .collect();
            pack_in_order(&items, limit, TENSOR_ALIGN as u64)
        }
    };
    let mut resident = vec![None; n];
    let mut mappings = Vec::new();
    let mut pending = plan(order, MAX_MAPPING_BYTES);
    pending.reverse();
    while let Some(m) = pending.pop() {
        let mapped = if in_place {
            // A run's first member is at offset 0 of the run.
            let first = &rt.weights[m.members[0].0].bytes;
            rt.dev
                .mem()
                .map_weights(first.file(), first.file_offset(), m.bytes as usize)
        } else {
            rt.dev.map_buffer(m.bytes as usize)
        };
        let mut buf = match mapped {
            Ok(b) => b,
            // A fragmented window: the same tensors in smaller mappings.
            Err(Error::VaBudget { have, .. }) if m.members.len() > 1 && have > 0 => {
                let sub: Vec<usize> = m.members.iter().map(|&(w, _)| w).collect();
                let mut parts = plan(&sub, have.min(m.bytes / 2).max(1));
                parts.reverse();
                pending.extend(parts);
                continue;
            }
            Err(e) => return Err(e),
        };
        for &(w, off) in &m.members {
            if !in_place {
                buf.write(off as usize, &rt.weights[w].bytes)?;
            }
            resident[w] = Some(Loc {
                buffer: buf.id(),
                offset: off as usize,
            });
        }
        let bytes = m
            .members
            .iter()
            .map(|&(w, _)| rt.weights[w].bytes.len() as u64)
            .sum();
        rt.dev.mem().count_weights(bytes);
        if !in_place {
            buf.hold_weight_copy(bytes);
        }
        mappings.push(buf);
    }
    Ok((resident, mappings))
}

/// True when the module's resident weights are mapped from its weight file in place.
fn in_place(rt: &Runtime) -> bool {
    rt.weights.first().is_some_and(|w| w.bytes.file().shared())
}

/// Resident weights `ws` mapped in place: runs of weights adjacent in the weight file (in file
/// order), each of at most `max_mapping` bytes (a larger weight gets a run of its own); every
/// member's offset is relative to the run's first byte, the first member's file offset.
fn file_runs(rt: &Runtime, ws: &[usize], page: u64, max_mapping: u64) -> Vec<MappingPlan> {
    let mut ws = ws.to_vec();
    ws.sort_by_key(|&w| rt.weights[w].bytes.file_offset());
    let mut out: Vec<(u64, MappingPlan)> = Vec::new();
    for w in ws {
        let b = &rt.weights[w].bytes;
        let (off, size) = (
            b.file_offset() as u64,
            round_up(b.len().max(1) as u64, page),
        );
        match out.last_mut() {
            Some((start, m)) if *start + m.bytes == off && m.bytes + size <= max_mapping => {
                m.members.push((w, off - *start));
                m.bytes += size;
            }
            _ => out.push((
                off,
                MappingPlan {
                    bytes: size,
                    members: vec![(w, 0)],
                },
            )),
        }
    }
    out.into_iter().map(|(_, m)| m).collect()
}
