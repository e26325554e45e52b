//! Profile-guided placement under a VA budget.
//!
//! Input: the forward as a sequence of *segments* (per block, the ops from one weight-consuming
//! op up to the next, with their profiled NPU time) and the weights (bytes, profiled time to
//! stage them into a slot). Output: which weights stay resident, how the blocks are cut into
//! *stages* (one DSP batch each; a new stage starts at every block and wherever a slot would
//! overflow), which slot each streamed stage uses and at which offsets, and the expected
//! synchronous stall per forward.
//!
//! The expected stall comes from a simulation of the host and DSP timelines the runtime
//! actually follows (see [`simulate`]): two slots used alternately by the streamed stages, a
//! slot refilled only after the stage that last read it has finished, the first streamed stage
//! of the next forward prefetched while the current forward ends, and a slot already holding
//! its stage's weights not copied again. Placement fills the budget greedily, each time making
//! resident the weight whose residency lowers the expected stall the most (then the bytes
//! streamed per forward, then the earliest consumed): what stays streamed is what best overlaps
//! with compute on resident data. Weights larger than a slot must be resident.

use std::ops::Range;

/// A weight as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightInfo {
    /// Bytes.
    pub bytes: u64,
    /// Profiled time to stage it into a slot (host copy), ns.
    pub stage_ns: u64,
}

/// A run of ops of one block that starts with the op consuming `weight` (or, for the first
/// segment of a block, the ops before the first weight).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Block (DSP batch when nothing streams).
    pub block: usize,
    /// The weight its first op consumes.
    pub weight: Option<usize>,
    /// Profiled NPU time of its ops, ns.
    pub compute_ns: u64,
}

/// One DSP batch of the planned forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Block it belongs to.
    pub block: usize,
    /// Its segments (indices into the forward's segment list).
    pub segments: Range<usize>,
    /// Streamed weights and their offsets in the slot.
    pub streamed: Vec<(usize, u64)>,
    /// Bytes streamed into the slot.
    pub streamed_bytes: u64,
    /// Which slot (0 or 1) when it streams.
    pub slot: Option<usize>,
    /// Profiled NPU time, ns.
    pub compute_ns: u64,
    /// Time to stage its streamed weights, ns.
    pub stage_ns: u64,
}

/// The placement of one plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Per weight: resident (true) or streamed.
    pub resident: Vec<bool>,
    /// The stages of a forward.
    pub stages: Vec<Stage>,
    /// Bytes of each of the two slots (0 when nothing streams).
    pub slot_bytes: u64,
    /// Resident weight bytes.
    pub resident_bytes: u64,
    /// Expected synchronous stall per forward in steady state, ns.
    pub expected_stall_ns: u64,
    /// Expected bytes copied into slots per forward in steady state.
    pub expected_streamed_bytes: u64,
}

fn align_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align.max(1)) * align.max(1)
}

/// Cut the segments into stages for a residency choice: a stage per block, cut again before a
/// streamed weight that would overflow `slot_max`.
pub fn stages(
    weights: &[WeightInfo],
    segments: &[Segment],
    resident: &[bool],
    slot_max: u64,
    align: u64,
) -> Vec<Stage> {
    let mut out: Vec<Stage> = Vec::new();
    for (i, seg) in segments.iter().enumerate() {
        let streamed = seg.weight.filter(|&w| !resident[w]);
        let size = streamed.map_or(0, |w| align_up(weights[w].bytes, align));
        let cut = match out.last() {
            None => true,
            Some(s) => s.block != seg.block || (size > 0 && s.streamed_bytes + size > slot_max),
        };
        if cut {
            out.push(Stage {
                block: seg.block,
                segments: i..i,
                streamed: Vec::new(),
                streamed_bytes: 0,
                slot: None,
                compute_ns: 0,
                stage_ns: 0,
            });
        }
        let s = out.last_mut().expect("pushed above");
        s.segments.end = i + 1;
        s.compute_ns += seg.compute_ns;
        if let Some(w) = streamed {
            s.streamed.push((w, s.streamed_bytes));
            s.streamed_bytes += size;
            s.stage_ns += weights[w].stage_ns;
        }
    }
    for (k, s) in out.iter_mut().filter(|s| s.streamed_bytes > 0).enumerate() {
        s.slot = Some(k % 2);
    }
    out
}

/// Whether the slots of the streamed stages swap parity every forward: with an odd number
/// (three or more) of streamed stages, fixed slots would give the last stage of a forward and the
/// first of the next the same slot, so that copy could never overlap compute.
pub fn alternates(stages: &[Stage]) -> bool {
    let k = stages.iter().filter(|s| s.slot.is_some()).count();
    k >= 3 && k % 2 == 1
}

/// The slot a stage planned on slot `base` uses in forward number `forward`.
pub fn slot_of(base: usize, forward: u64, alternates: bool) -> usize {
    if alternates {
        (base + (forward % 2) as usize) % 2
    } else {
        base
    }
}

/// Steady-state `(stall ns, bytes copied)` of one forward over `stages`, simulating the
/// runtime's host/DSP timelines over a few forwards (see the module docs).
pub fn simulate(stages: &[Stage]) -> (u64, u64) {
    #[derive(Clone, Copy, Default)]
    struct Slot {
        tag: Option<usize>,
        free_at: u64,
    }
    let alt = alternates(stages);
    let mut slots = [Slot::default(); 2];
    let first_streamed = stages.iter().position(|s| s.slot.is_some());
    let (mut host, mut dsp) = (0u64, 0u64);
    let mut last = (0, 0);
    // Forward 0 warms the slots; later forwards are steady (the last one is reported).
    for f in 0..4u64 {
        let (mut stall, mut bytes) = (0u64, 0u64);
        let copy = |slot: &mut Slot, j: usize, host: &mut u64, dsp: u64| {
            if slot.tag == Some(j) {
                return (0, 0);
            }
            *host = (*host).max(slot.free_at);
            let start = *host;
            *host += stages[j].stage_ns;
            slot.tag = Some(j);
            // The DSP idles from when it ran out of work until the copy ends.
            let idle = host.saturating_sub(start.max(dsp));
            (idle, stages[j].streamed_bytes)
        };
        for (j, s) in stages.iter().enumerate() {
            let k = s.slot.map(|b| slot_of(b, f, alt));
            if let Some(k) = k {
                let (st, b) = copy(&mut slots[k], j, &mut host, dsp);
                stall += st;
                bytes += b;
            }
            let start = host.max(dsp);
            dsp = start + s.compute_ns;
            if let Some(k) = k {
                slots[k].free_at = dsp;
            }
        }
        // While the forward ends, the next forward's first streamed stage is staged.
        if let Some(j0) = first_streamed {
            let k = slot_of(stages[j0].slot.expect("streams"), f + 1, alt);
            let (st, b) = copy(&mut slots[k], j0, &mut host, dsp);
            stall += st;
            bytes += b;
        }
        host = host.max(dsp);
        last = (stall, bytes);
    }
    last
}

/// Every weight resident: one stage per block, no slots, no stall.
pub fn all_resident(weights: &[WeightInfo], segments: &[Segment], align: u64) -> Placement {
    let resident = vec![true; weights.len()];
    let st = stages(weights, segments, &resident, 0, align);
    Placement {
        resident_bytes: weights.iter().map(|w| align_up(w.bytes, align)).sum(),
        resident,
        stages: st,
        slot_bytes: 0,
        expected_stall_ns: 0,
        expected_streamed_bytes: 0,
    }
}

/// Place `weights` for the forward `segments`: at most `total` bytes of window for resident
/// weights plus the two slots (each at most `slot_max`), at most `cap` resident bytes, tensors
/// aligned to `align`. Deterministic.
///
/// Smaller slots leave room for more residents (at the price of more, smaller stages), and a
/// greedy fill at one slot size can stall on a plateau (no single weight frees a slot's worth),
/// so the slot sizes tried are `slot_max` and every distinct weight size below it; the plan
/// that fits with the least expected stall, then the fewest bytes streamed, then the fewest
/// stages wins.
pub fn place(
    weights: &[WeightInfo],
    segments: &[Segment],
    total: u64,
    slot_max: u64,
    cap: Option<u64>,
    align: u64,
) -> Placement {
    let mut sizes: Vec<u64> = weights
        .iter()
        .map(|w| align_up(w.bytes, align))
        .filter(|&b| b < slot_max)
        .collect();
    sizes.push(slot_max);
    sizes.sort_unstable();
    sizes.dedup();
    let fits = |p: &Placement| {
        p.resident_bytes + 2 * p.slot_bytes <= total && cap.is_none_or(|c| p.resident_bytes <= c)
    };
    let mut best: Option<Placement> = None;
    for &slot in sizes.iter().rev() {
        let p = place_with_slot(weights, segments, total, slot, cap, align);
        if !fits(&p) {
            continue;
        }
        let key = |p: &Placement| {
            (
                p.expected_stall_ns,
                p.expected_streamed_bytes,
                p.stages.len(),
            )
        };
        if best.as_ref().is_none_or(|b| key(&p) < key(b)) {
            best = Some(p);
        }
    }
    best.unwrap_or_else(|| place_with_slot(weights, segments, total, slot_max, cap, align))
}

/// [`place`] at one slot size.
fn place_with_slot(
    weights: &[WeightInfo],
    segments: &[Segment],
    total: u64,
    slot_max: u64,
    cap: Option<u64>,
    align: u64,
) -> Placement {
    let size = |w: usize| align_up(weights[w].bytes, align);
    // Weights larger than a slot cannot stream.
    let mut resident: Vec<bool> = (0..weights.len()).map(|w| size(w) > slot_max).collect();
    let first_use: Vec<usize> = (0..weights.len())
        .map(|w| {
            segments
                .iter()
                .position(|s| s.weight == Some(w))
                .unwrap_or(usize::MAX)
        })
        .collect();
    let evaluate = |res: &[bool]| {
        let st = stages(weights, segments, res, slot_max, align);
        let slot = st.iter().map(|s| s.streamed_bytes).max().unwrap_or(0);
        let used: u64 = (0..weights.len())
            .filter(|&w| res[w])
            .map(size)
            .sum::<u64>();
        let (stall, bytes) = simulate(&st);
        (used, slot, stall, bytes)
    };
    let fits = |used: u64, slot: u64| used + 2 * slot <= total && cap.is_none_or(|c| used <= c);
    loop {
        let mut best: Option<((u64, u64, usize), usize)> = None;
        for w in 0..weights.len() {
            if resident[w] {
                continue;
            }
            resident[w] = true;
            let (used, slot, stall, bytes) = evaluate(&resident);
            resident[w] = false;
            if !fits(used, slot) {
                continue;
            }
            let key = (stall, bytes, first_use[w]);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, w));
            }
        }
        match best {
            Some((_, w)) => resident[w] = true,
            None => break,
        }
    }
    let st = stages(weights, segments, &resident, slot_max, align);
    let (stall, bytes) = simulate(&st);
    Placement {
        slot_bytes: st.iter().map(|s| s.streamed_bytes).max().unwrap_or(0),
        resident_bytes: (0..weights.len()).filter(|&w| resident[w]).map(size).sum(),
        resident,
        stages: st,
        expected_stall_ns: stall,
        expected_streamed_bytes: bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `blocks` blocks of `per` weights each (`bytes`, staged in `stage_ns`), every segment
    /// computing `compute_ns`.
    fn model(
        blocks: usize,
        per: usize,
        bytes: u64,
        stage_ns: u64,
        compute_ns: u64,
    ) -> (Vec<WeightInfo>, Vec<Segment>) {
        let weights = vec![WeightInfo { bytes, stage_ns }; blocks * per];
        let mut segments = Vec::new();
        for b in 0..blocks {
            segments.push(Segment {
                block: b,
                weight: None,
                compute_ns: 1,
            });
            for k in 0..per {
                segments.push(Segment {
                    block: b,
                    weight: Some(b * per + k),
                    compute_ns,
                });
            }
        }
        (weights, segments)
    }

    /// Table-driven: (budget, cap, slot max) -> resident bytes within the budget, slots within
    /// the slot limit, every stage's streamed bytes within a slot.
    #[test]
    fn the_budget_and_the_slots_are_respected() {
        let (w, s) = model(4, 3, 1000, 10, 10);
        type Case = (&'static str, u64, Option<u64>, u64, Option<u64>);
        // (what, total, cap, slot max, resident bytes expected when fixed by the budget)
        let cases: Vec<Case> = vec![
            (
                "everything fits: all resident, no slots",
                100_000,
                None,
                4000,
                Some(12_000),
            ),
            ("a cap of 0: all streamed", 100_000, Some(0), 4000, Some(0)),
            (
                "a cap of 5000: five weights",
                100_000,
                Some(5000),
                4000,
                Some(5000),
            ),
            (
                "a window for 2 slots of 3 and some weights",
                10_000,
                None,
                3000,
                None,
            ),
            (
                "slots of one weight: room for one resident",
                3000,
                None,
                1000,
                Some(1000),
            ),
        ];
        for (what, total, cap, slot_max, want) in cases {
            let p = place(&w, &s, total, slot_max, cap, 1);
            if let Some(want) = want {
                assert_eq!(p.resident_bytes, want, "{what}");
            }
            assert!(p.resident_bytes + 2 * p.slot_bytes <= total, "{what}");
            assert!(cap.is_none_or(|c| p.resident_bytes <= c), "{what}");
            assert!(p.slot_bytes <= slot_max, "{what}");
            for st in &p.stages {
                assert!(st.streamed_bytes <= p.slot_bytes, "{what}");
                let inside: Vec<usize> = st
                    .segments
                    .clone()
                    .filter_map(|i| s[i].weight)
                    .filter(|&x| !p.resident[x])
                    .collect();
                let streamed: Vec<usize> = st.streamed.iter().map(|x| x.0).collect();
                assert_eq!(inside, streamed, "{what}: a stage streams its own weights");
            }
            if p.resident.iter().all(|&r| r) {
                assert_eq!(p.stages.len(), 4, "{what}: one stage per block");
                assert_eq!((p.slot_bytes, p.expected_stall_ns), (0, 0), "{what}");
                assert_eq!(p, all_resident(&w, &s, 1), "{what}");
            }
        }
    }

    #[test]
    fn slots_alternate_and_offsets_are_consumption_order() {
        let (w, s) = model(3, 3, 1000, 10, 10);
        let st = stages(&w, &s, &[false; 9], 2000, 1);
        // A block of 3 weights over slots of 2: [w0 w1] [w2] per block.
        let slots: Vec<Option<usize>> = st.iter().map(|st| st.slot).collect();
        assert_eq!(
            slots,
            vec![Some(0), Some(1), Some(0), Some(1), Some(0), Some(1)]
        );
        assert_eq!(st[0].streamed, vec![(0, 0), (1, 1000)]);
        assert_eq!(st[1].streamed, vec![(2, 0)]);
        assert_eq!(st[0].segments, 0..3, "the weight-free segment goes first");
        assert!(!alternates(&st));
        // Resident weights leave their stage's slot.
        let mut res = [false; 9];
        res[1] = true;
        let st = stages(&w, &s, &res, 2000, 1);
        assert_eq!(st[0].streamed, vec![(0, 0), (2, 1000)]);
        assert_eq!(st.len(), 5);
        // An odd number of streamed stages swaps parity every forward.
        let (w, s) = model(3, 1, 1000, 10, 10);
        let p = place(&w, &s, 1_000_000, 2000, Some(0), 1);
        assert!(alternates(&p.stages));
        assert_eq!(
            (
                slot_of(0, 0, true),
                slot_of(0, 1, true),
                slot_of(1, 1, true)
            ),
            (0, 1, 0)
        );
    }

    #[test]
    fn the_simulation_counts_idle_dsp_time_only() {
        let stage = |slot: Option<usize>, compute_ns, stage_ns| Stage {
            block: 0,
            segments: 0..1,
            streamed: Vec::new(),
            streamed_bytes: if slot.is_some() { 100 } else { 0 },
            slot,
            compute_ns,
            stage_ns,
        };
        type Case = (&'static str, Vec<Stage>, (u64, u64));
        let cases: Vec<Case> = vec![
            (
                "nothing streams",
                vec![stage(None, 50, 0), stage(None, 50, 0)],
                (0, 0),
            ),
            (
                "two streamed stages keep their slots: nothing copied in steady state",
                vec![stage(Some(0), 10, 50), stage(Some(1), 10, 50)],
                (0, 0),
            ),
            (
                "three streamed stages: copies hide behind longer compute",
                vec![
                    stage(None, 100, 0),
                    stage(Some(0), 100, 30),
                    stage(Some(1), 100, 30),
                    stage(Some(0), 100, 30),
                ],
                (0, 300),
            ),
            (
                "copies longer than the compute before them: the excess stalls",
                vec![
                    stage(Some(0), 10, 50),
                    stage(Some(1), 10, 50),
                    stage(Some(0), 10, 50),
                ],
                // each 50 ns copy overlaps the 10 ns stage before it
                (120, 300),
            ),
        ];
        for (what, st, want) in cases {
            assert_eq!(simulate(&st), want, "{what}");
        }
    }

    #[test]
    fn residency_goes_where_it_removes_the_most_stall() {
        // Four one-weight blocks, long and short compute alternating; one resident allowed.
        // Each streamed copy hides behind the compute of the block before it: the weights of
        // blocks 0 and 2 follow short blocks, so only their residency removes stall.
        let w = vec![
            WeightInfo {
                bytes: 100,
                stage_ns: 100
            };
            4
        ];
        let s: Vec<Segment> = [1000, 1, 1000, 1]
            .iter()
            .enumerate()
            .map(|(b, &c)| Segment {
                block: b,
                weight: Some(b),
                compute_ns: c,
            })
            .collect();
        let p = place(&w, &s, 10_000, 100, Some(100), 1);
        let chosen = p.resident.iter().position(|&r| r).unwrap();
        let stall_with = |r: usize| {
            let mut res = vec![false; 4];
            res[r] = true;
            simulate(&stages(&w, &s, &res, 100, 1)).0
        };
        assert!(chosen == 0 || chosen == 2, "{:?}", p.resident);
        assert!(
            stall_with(chosen) < stall_with(1),
            "{} vs {}",
            stall_with(chosen),
            stall_with(1)
        );
        assert_eq!(p.expected_stall_ns, stall_with(chosen));
        // Ties (nothing to gain) go to the earliest consumed weight.
        let w = vec![
            WeightInfo {
                bytes: 100,
                stage_ns: 0
            };
            4
        ];
        let p = place(&w, &s, 10_000, 100, Some(100), 1);
        assert_eq!(p.resident, vec![true, false, false, false]);
    }

    #[test]
    fn smaller_slots_make_room_for_residents() {
        // Blocks of 3 x 1000: all streamed needs slots of 3000 (6000 of a 6500 budget); no single
        // resident frees a slot's worth at that size, but slots of 1000 leave 4500 for residents.
        let (w, s) = model(3, 3, 1000, 0, 10);
        let p = place(&w, &s, 6500, 3250, None, 1);
        assert_eq!(p.slot_bytes, 1000, "{p:?}");
        assert_eq!(p.resident_bytes, 4000);
        assert!(p.resident_bytes + 2 * p.slot_bytes <= 6500);
    }

    #[test]
    fn a_weight_larger_than_a_slot_is_resident_even_over_budget() {
        let (w, s) = model(1, 2, 1000, 1, 1);
        let p = place(&w, &s, 0, 500, Some(0), 1);
        assert_eq!(p.resident, vec![true, true]);
        assert_eq!(p.slot_bytes, 0);
    }
}
