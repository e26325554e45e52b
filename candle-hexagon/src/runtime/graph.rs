//! The graph of one forward, learnt from the ops it is asked to run.
//!
//! The runtime knows nothing of transformers: it is given the batches a forward would submit and
//! a declaration of the tensors their descriptors point into (a name, a class and a byte range
//! of a buffer id). Every operand of every op is resolved to the byte runs it covers (the same
//! computation the leases use), and from those:
//!
//! - each tensor's **producer** (first op writing it), **consumers** (ops reading it) and the
//!   ops in between;
//! - for short-lived tensors (activations, scratch), the op times at which the tensor's bytes
//!   must exist: a backward byte-level liveness pass over each buffer (bytes are live between a
//!   write and the last read before the next *exact* overwrite; widened runs never count as
//!   overwrites). Two short-lived tensors whose live sets are disjoint may share bytes, which is
//!   what [`super::packing::pack_by_lifetime`] does with them.
//!
//! Time runs `0` (host writes before the first op), `1..=n` (the ops in submission order) and
//! `n + 1` (host reads after the last op).

use crate::memory::leases::tensor_runs_exact;
use crate::transport::Batch;
use kernels_dsp::KDSP_MAX_SRC;

/// Long-lived data stays visible across forwards; short-lived data only inside one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorClass {
    /// Weights (long-lived; candidates for residency or streaming).
    Weight,
    /// KV cache rows (long-lived, resident, updated in place).
    Kv,
    /// Activations and op scratch (short-lived; offsets shared by live range).
    Activation,
}

impl TensorClass {
    /// Weights and the KV cache.
    pub fn is_long_lived(self) -> bool {
        !matches!(self, TensorClass::Activation)
    }
}

/// A tensor as the ops' descriptors see it: bytes `[start, end)` of buffer id `buffer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDecl {
    /// Name (for the plan printout).
    pub name: String,
    /// Long- or short-lived.
    pub class: TensorClass,
    /// Buffer id the descriptors name (real or virtual).
    pub buffer: u32,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// The byte runs one op touches: `(buffer, start, end)`, writes with an exactness flag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpAccess {
    /// Label of the op.
    pub label: &'static str,
    /// Batch the op was submitted in.
    pub batch: usize,
    /// Runs read.
    pub reads: Vec<(u32, u64, u64)>,
    /// Runs written, and whether each is exactly the bytes written (may be taken as overwritten).
    pub writes: Vec<(u32, u64, u64, bool)>,
}

/// One op of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphOp {
    /// Label.
    pub label: &'static str,
    /// Batch it was submitted in.
    pub batch: usize,
    /// Tensors read (indices into [`Graph::tensors`]).
    pub reads: Vec<usize>,
    /// Tensors written.
    pub writes: Vec<usize>,
}

/// One tensor of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphTensor {
    /// The declaration.
    pub decl: TensorDecl,
    /// First op writing it (`None`: written by the host, or never).
    pub producer: Option<usize>,
    /// Ops reading it, in order.
    pub consumers: Vec<usize>,
    /// Times at which its bytes must exist, as inclusive intervals (see the module docs).
    pub live: Vec<(usize, usize)>,
}

impl GraphTensor {
    /// First op that touches it.
    #[cfg(test)]
    pub fn first_use(&self) -> Option<usize> {
        match (self.producer, self.consumers.first()) {
            (Some(p), Some(&c)) => Some(p.min(c)),
            (p, c) => p.or(c.copied()),
        }
    }
}

/// The ops of one forward and the tensors they touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    /// Tensors, in declaration order.
    pub tensors: Vec<GraphTensor>,
    /// Ops, in submission order.
    pub ops: Vec<GraphOp>,
}

/// Sorted, disjoint byte ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RangeSet(Vec<(u64, u64)>);

impl RangeSet {
    fn add(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let (mut a, mut b) = (a, b);
        let mut out = Vec::with_capacity(self.0.len() + 1);
        let mut placed = false;
        for &(s, e) in &self.0 {
            if e < a {
                out.push((s, e));
            } else if b < s {
                if !placed {
                    out.push((a, b));
                    placed = true;
                }
                out.push((s, e));
            } else {
                a = a.min(s);
                b = b.max(e);
            }
        }
        if !placed {
            out.push((a, b));
        }
        out.sort_unstable();
        self.0 = out;
    }

    fn remove(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(s, e) in &self.0 {
            if e <= a || b <= s {
                out.push((s, e));
                continue;
            }
            if s < a {
                out.push((s, a));
            }
            if b < e {
                out.push((b, e));
            }
        }
        self.0 = out;
    }

    fn intersects(&self, a: u64, b: u64) -> bool {
        self.0.iter().any(|&(s, e)| s < b && a < e)
    }
}

/// True when two interval lists (inclusive) share a time.
pub fn intervals_overlap(a: &[(usize, usize)], b: &[(usize, usize)]) -> bool {
    a.iter()
        .any(|&(s, e)| b.iter().any(|&(t, u)| s <= u && t <= e))
}

/// Sorted times as inclusive intervals.
fn to_intervals(mut times: Vec<usize>) -> Vec<(usize, usize)> {
    times.sort_unstable();
    times.dedup();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for t in times {
        match out.last_mut() {
            Some((_, e)) if *e + 1 == t => *e = t,
            _ => out.push((t, t)),
        }
    }
    out
}

impl Graph {
    /// The graph of `batches` (submitted in order) over `decls`. The host writes `host_in`
    /// (whole tensors, indices into `decls`) before the first op and reads `host_out` after the
    /// last.
    pub fn capture(
        decls: Vec<TensorDecl>,
        batches: &[Batch],
        host_in: &[usize],
        host_out: &[usize],
    ) -> Graph {
        let mut ops = Vec::new();
        for (bi, batch) in batches.iter().enumerate() {
            for (i, op) in batch.ops().iter().enumerate() {
                let mut acc = OpAccess {
                    label: batch.label(i),
                    batch: bi,
                    ..Default::default()
                };
                let (runs, exact) = tensor_runs_exact(&op.dst);
                for (s, e) in runs {
                    acc.writes.push((op.dst.buffer_id, s, e, exact));
                }
                let n_src = (op.n_src as usize).min(KDSP_MAX_SRC as usize);
                for src in &op.src[..n_src] {
                    for (s, e) in tensor_runs_exact(src).0 {
                        acc.reads.push((src.buffer_id, s, e));
                    }
                }
                ops.push(acc);
            }
        }
        Self::from_accesses(decls, &ops, host_in, host_out)
    }

    /// The graph of ops given as byte runs (what [`Self::capture`] extracts from descriptors).
    pub fn from_accesses(
        decls: Vec<TensorDecl>,
        accesses: &[OpAccess],
        host_in: &[usize],
        host_out: &[usize],
    ) -> Graph {
        let n = accesses.len();
        let hits = |buf: u32, s: u64, e: u64| -> Vec<usize> {
            decls
                .iter()
                .enumerate()
                .filter(|(_, d)| d.buffer == buf && d.start < e && s < d.end)
                .map(|(i, _)| i)
                .collect()
        };
        let mut ops = Vec::with_capacity(n);
        let mut producer = vec![None; decls.len()];
        let mut consumers = vec![Vec::new(); decls.len()];
        for (i, a) in accesses.iter().enumerate() {
            let mut reads: Vec<usize> = a
                .reads
                .iter()
                .flat_map(|&(b, s, e)| hits(b, s, e))
                .collect();
            let mut writes: Vec<usize> = a
                .writes
                .iter()
                .flat_map(|&(b, s, e, _)| hits(b, s, e))
                .collect();
            reads.sort_unstable();
            reads.dedup();
            writes.sort_unstable();
            writes.dedup();
            for &t in &writes {
                producer[t].get_or_insert(i);
            }
            for &t in &reads {
                consumers[t].push(i);
            }
            ops.push(GraphOp {
                label: a.label,
                batch: a.batch,
                reads,
                writes,
            });
        }
        let live = Self::liveness(&decls, accesses, host_in, host_out);
        let tensors = decls
            .into_iter()
            .zip(producer)
            .zip(consumers)
            .zip(live)
            .map(|(((decl, producer), consumers), live)| GraphTensor {
                decl,
                producer,
                consumers,
                live,
            })
            .collect();
        Graph { tensors, ops }
    }

    /// Live times of every tensor: all times for long-lived ones; a backward byte-level pass
    /// for short-lived ones.
    fn liveness(
        decls: &[TensorDecl],
        accesses: &[OpAccess],
        host_in: &[usize],
        host_out: &[usize],
    ) -> Vec<Vec<(usize, usize)>> {
        let n = accesses.len();
        let mut times: Vec<Vec<usize>> = vec![Vec::new(); decls.len()];
        let short: Vec<usize> = (0..decls.len())
            .filter(|&i| !decls[i].class.is_long_lived())
            .collect();
        let mut buffers: Vec<u32> = short.iter().map(|&i| decls[i].buffer).collect();
        buffers.sort_unstable();
        buffers.dedup();
        for buf in buffers {
            let mine: Vec<usize> = short
                .iter()
                .copied()
                .filter(|&i| decls[i].buffer == buf)
                .collect();
            let touched = |set: &RangeSet, t: usize, times: &mut Vec<Vec<usize>>| {
                for &i in &mine {
                    if set.intersects(decls[i].start, decls[i].end) {
                        times[i].push(t);
                    }
                }
            };
            // Live after the last op: what the host reads.
            let mut live = RangeSet::default();
            for &i in host_out.iter().filter(|&&i| decls[i].buffer == buf) {
                live.add(decls[i].start, decls[i].end);
            }
            touched(&live, n + 1, &mut times);
            for t in (1..=n).rev() {
                let a = &accesses[t - 1];
                let mut here = RangeSet::default();
                for &(_, s, e) in a.reads.iter().filter(|r| r.0 == buf) {
                    here.add(s, e);
                }
                for &(_, s, e, _) in a.writes.iter().filter(|w| w.0 == buf) {
                    here.add(s, e);
                }
                // Bytes live after the op must exist at it (they pass through).
                touched(&live, t, &mut times);
                touched(&here, t, &mut times);
                for &(_, s, e, exact) in a.writes.iter().filter(|w| w.0 == buf) {
                    if exact {
                        live.remove(s, e);
                    }
                }
                for &(_, s, e) in a.reads.iter().filter(|r| r.0 == buf) {
                    live.add(s, e);
                }
                touched(&live, t, &mut times);
            }
            // The host writes its inputs before the first op.
            let mut inputs = RangeSet::default();
            for &i in host_in.iter().filter(|&&i| decls[i].buffer == buf) {
                inputs.add(decls[i].start, decls[i].end);
            }
            touched(&inputs, 0, &mut times);
        }
        (0..decls.len())
            .map(|i| {
                if decls[i].class.is_long_lived() {
                    vec![(0, n + 1)]
                } else {
                    to_intervals(std::mem::take(&mut times[i]))
                }
            })
            .collect()
    }

    /// The tensor declared with `name`.
    #[cfg(test)]
    pub fn tensor(&self, name: &str) -> Option<usize> {
        self.tensors.iter().position(|t| t.decl.name == name)
    }

    /// True when two tensors must exist at the same time.
    #[cfg(test)]
    pub fn live_together(&self, a: usize, b: usize) -> bool {
        intervals_overlap(&self.tensors[a].live, &self.tensors[b].live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(name: &str, start: u64, end: u64) -> TensorDecl {
        TensorDecl {
            name: name.into(),
            class: TensorClass::Activation,
            buffer: 1,
            start,
            end,
        }
    }

    fn op(label: &'static str, reads: &[(u64, u64)], writes: &[(u64, u64, bool)]) -> OpAccess {
        OpAccess {
            label,
            batch: 0,
            reads: reads.iter().map(|&(s, e)| (1, s, e)).collect(),
            writes: writes.iter().map(|&(s, e, x)| (1, s, e, x)).collect(),
        }
    }

    #[test]
    fn range_sets_merge_split_and_intersect() {
        let mut r = RangeSet::default();
        for (a, b) in [(10, 20), (30, 40), (15, 32), (50, 60)] {
            r.add(a, b);
        }
        assert_eq!(r.0, vec![(10, 40), (50, 60)]);
        r.remove(20, 55);
        assert_eq!(r.0, vec![(10, 20), (55, 60)]);
        assert!(r.intersects(19, 21) && !r.intersects(20, 55) && r.intersects(0, 100));
    }

    /// Table-driven: (ops, host in, host out) -> live intervals of a, b, c.
    #[test]
    fn lifetimes_follow_writes_reads_and_exact_overwrites() {
        // a = [0, 100), b = [100, 200), c = [200, 300)
        type Case = (
            &'static str,
            Vec<OpAccess>,
            Vec<usize>,
            Vec<usize>,
            [Vec<(usize, usize)>; 3],
        );
        let cases: Vec<Case> = vec![
            (
                "chain a -> b -> c, host reads c",
                vec![
                    op("b=f(a)", &[(0, 100)], &[(100, 200, true)]),
                    op("c=g(b)", &[(100, 200)], &[(200, 300, true)]),
                ],
                vec![0],
                vec![2],
                [vec![(0, 1)], vec![(1, 2)], vec![(2, 3)]],
            ),
            (
                "a rewritten exactly after its last read: two disjoint lives",
                vec![
                    op("b=f(a)", &[(0, 100)], &[(100, 200, true)]),
                    op("c=g(b)", &[(100, 200)], &[(200, 300, true)]),
                    op("a=h(c)", &[(200, 300)], &[(0, 100, true)]),
                ],
                vec![0],
                vec![0],
                [vec![(0, 1), (3, 4)], vec![(1, 2)], vec![(2, 3)]],
            ),
            (
                "a widened (inexact) write does not end a's life",
                vec![
                    op("b=f(a)", &[(0, 100)], &[(100, 200, true)]),
                    op("c=g(b)", &[(100, 200)], &[(200, 300, true)]),
                    op("a=h(c), hull", &[(200, 300)], &[(0, 100, false)]),
                ],
                vec![0],
                vec![0],
                [vec![(0, 4)], vec![(1, 2)], vec![(2, 3)]],
            ),
            (
                "a partial overwrite keeps the rest of a alive",
                vec![
                    op("b=f(a)", &[(0, 100)], &[(100, 200, true)]),
                    op("a[0..50]=g(b)", &[(100, 200)], &[(0, 50, true)]),
                    op("c=h(a)", &[(0, 100)], &[(200, 300, true)]),
                ],
                vec![0],
                vec![2],
                [vec![(0, 3)], vec![(1, 2)], vec![(3, 4)]],
            ),
            (
                "in place: read and written by the same op",
                vec![op("a+=1", &[(0, 100)], &[(0, 100, true)])],
                vec![0],
                vec![0],
                [vec![(0, 2)], vec![], vec![]],
            ),
        ];
        for (what, ops, host_in, host_out, want) in cases {
            let decls = vec![act("a", 0, 100), act("b", 100, 200), act("c", 200, 300)];
            let g = Graph::from_accesses(decls, &ops, &host_in, &host_out);
            for (i, w) in want.iter().enumerate() {
                assert_eq!(&g.tensors[i].live, w, "{what}: tensor {i}");
            }
        }
    }

    #[test]
    fn producers_consumers_and_long_lived_tensors() {
        let mut decls = vec![act("x", 0, 64), act("y", 64, 128)];
        decls.push(TensorDecl {
            name: "w".into(),
            class: TensorClass::Weight,
            buffer: 7,
            start: 0,
            end: 4096,
        });
        let ops = vec![
            OpAccess {
                label: "mm",
                batch: 0,
                reads: vec![(1, 0, 64), (7, 0, 4096)],
                writes: vec![(1, 64, 128, true)],
            },
            OpAccess {
                label: "add",
                batch: 1,
                reads: vec![(1, 0, 64), (1, 64, 128)],
                writes: vec![(1, 0, 64, true)],
            },
        ];
        let g = Graph::from_accesses(decls, &ops, &[0], &[0]);
        let w = g.tensor("w").unwrap();
        assert_eq!(g.tensors[w].consumers, vec![0]);
        assert_eq!(g.tensors[w].producer, None);
        assert_eq!(
            g.tensors[w].live,
            vec![(0, 3)],
            "long-lived: the whole forward"
        );
        assert_eq!(g.tensors[1].producer, Some(0));
        assert_eq!(g.tensors[1].consumers, vec![1]);
        assert_eq!(g.ops[1].writes, vec![0]);
        assert!(g.live_together(0, 1));
        assert_eq!(g.tensors[0].first_use(), Some(0));
    }
}
