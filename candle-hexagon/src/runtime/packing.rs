//! Packing the address window: short-lived tensors share offsets by live range; resident
//! long-lived tensors sit in consumption order inside a few large mappings.

use super::graph::intervals_overlap;

fn align_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

/// Offsets for `items` (`(bytes, live intervals)`) such that two items live at the same time
/// never share a byte, and the total (the scratch region's size). Largest first, each at the
/// lowest aligned offset clear of every placed item it is live with; items never live together
/// may share bytes. An item of 0 bytes gets offset 0 and no space.
pub fn pack_by_lifetime(items: &[(u64, &[(usize, usize)])], align: u64) -> (Vec<u64>, u64) {
    let align = align.max(1);
    let mut order: Vec<usize> = (0..items.len()).collect();
    // Largest first; among equals, the earliest live first (stable, deterministic offsets).
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(items[i].0),
            items[i].1.first().map_or(usize::MAX, |iv| iv.0),
            i,
        )
    });
    let mut offsets = vec![0u64; items.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(items.len());
    let mut total = 0;
    for i in order {
        let (bytes, live) = items[i];
        if bytes == 0 {
            continue;
        }
        let size = align_up(bytes, align);
        // Ranges of the placed items this one is live with, by offset.
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| intervals_overlap(live, items[j].1))
            .map(|&j| (offsets[j], offsets[j] + align_up(items[j].0, align)))
            .collect();
        busy.sort_unstable();
        let mut off = 0;
        for (s, e) in busy {
            if off + size <= s {
                break;
            }
            off = off.max(e);
        }
        offsets[i] = off;
        total = total.max(off + size);
        placed.push(i);
    }
    (offsets, total)
}

/// One mapping of resident tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingPlan {
    /// Bytes of the mapping.
    pub bytes: u64,
    /// `(item, offset)` of the tensors inside it, in consumption order.
    pub members: Vec<(usize, u64)>,
}

/// Resident tensors `(item, bytes)`, given in consumption order, packed back to back into
/// mappings of at most `max_mapping` bytes (a tensor larger than that gets a mapping of its own),
/// so consecutive consumers read neighbouring bytes and the model needs few mapper entries.
pub fn pack_in_order(items: &[(usize, u64)], max_mapping: u64, align: u64) -> Vec<MappingPlan> {
    let align = align.max(1);
    let mut out: Vec<MappingPlan> = Vec::new();
    for &(item, bytes) in items {
        let size = align_up(bytes.max(1), align);
        match out.last_mut() {
            Some(m) if m.bytes + size <= max_mapping => {
                m.members.push((item, m.bytes));
                m.bytes += size;
            }
            _ => out.push(MappingPlan {
                bytes: size,
                members: vec![(item, 0)],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table-driven: (sizes, live intervals) -> every pair live together is disjoint, the total
    /// is what a hand packing gives.
    #[test]
    fn offsets_never_overlap_while_both_live() {
        type Case = (&'static str, Vec<(u64, Vec<(usize, usize)>)>, u64);
        let cases: Vec<Case> = vec![
            (
                "a chain: neighbours overlap, the ends share",
                vec![
                    (100, vec![(0, 1)]),
                    (200, vec![(1, 2)]),
                    (100, vec![(2, 3)]),
                ],
                // 200 at 0; a (0..1) beside it at 200; c (2..3) at 200 too
                300,
            ),
            (
                "all live together: the sum",
                vec![(64, vec![(0, 9)]), (128, vec![(3, 4)]), (32, vec![(4, 9)])],
                224,
            ),
            (
                "never together: the largest",
                vec![(64, vec![(0, 1)]), (128, vec![(2, 3)]), (32, vec![(4, 9)])],
                128,
            ),
            (
                "gaps: a tensor live twice blocks both times",
                vec![
                    (100, vec![(0, 1), (5, 6)]),
                    (100, vec![(2, 4)]),
                    (100, vec![(6, 7)]),
                ],
                200,
            ),
            ("nothing", vec![(0, vec![(0, 1)])], 0),
        ];
        for (what, items, want_total) in cases {
            let refs: Vec<(u64, &[(usize, usize)])> =
                items.iter().map(|(b, l)| (*b, l.as_slice())).collect();
            let (off, total) = pack_by_lifetime(&refs, 1);
            assert_eq!(total, want_total, "{what}: {off:?}");
            for i in 0..items.len() {
                assert!(
                    off[i] + items[i].0 <= total,
                    "{what}: {i} inside the region"
                );
                for j in 0..i {
                    let live = intervals_overlap(&items[i].1, &items[j].1);
                    let disjoint = off[i] + items[i].0 <= off[j] || off[j] + items[j].0 <= off[i];
                    assert!(
                        !live || disjoint || items[i].0 == 0 || items[j].0 == 0,
                        "{what}: {i} and {j} overlap while both live: {off:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn offsets_are_aligned() {
        let items = [(5u64, &[(0usize, 3usize)][..]), (7, &[(1, 2)][..])];
        let (off, total) = pack_by_lifetime(&items, 128);
        assert!(off.iter().all(|o| o % 128 == 0), "{off:?}");
        assert_eq!(total, 256);
    }

    /// Table-driven: residents stay in consumption order, mappings respect the limit, a tensor
    /// above the limit gets its own.
    #[test]
    fn residents_pack_in_consumption_order() {
        type Case = (&'static str, Vec<(usize, u64)>, u64, Vec<Vec<(usize, u64)>>);
        let cases: Vec<Case> = vec![
            (
                "one mapping",
                vec![(3, 100), (1, 200), (2, 50)],
                1024,
                vec![vec![(3, 0), (1, 128), (2, 384)]],
            ),
            (
                "split at the limit, order kept",
                vec![(0, 300), (1, 300), (2, 300)],
                768,
                vec![vec![(0, 0), (1, 384)], vec![(2, 0)]],
            ),
            (
                "an oversized tensor alone",
                vec![(0, 100), (1, 5000), (2, 100)],
                1024,
                vec![vec![(0, 0)], vec![(1, 0)], vec![(2, 0)]],
            ),
        ];
        for (what, items, limit, want) in cases {
            let maps = pack_in_order(&items, limit, 128);
            let got: Vec<Vec<(usize, u64)>> = maps.iter().map(|m| m.members.clone()).collect();
            assert_eq!(got, want, "{what}");
            let order: Vec<usize> = got.iter().flatten().map(|m| m.0).collect();
            let given: Vec<usize> = items.iter().map(|i| i.0).collect();
            assert_eq!(order, given, "{what}: consumption order");
            for m in &maps {
                assert!(m.bytes <= limit || m.members.len() == 1, "{what}");
            }
        }
    }
}
