//! The program [`super::HexTransformer`] runs: a graph of ops over named activations, given by
//! the caller. This crate knows ops (RMSNorm, matmul, rotary embedding, attention over a KV
//! cache, SwiGLU, row selection), not models: the model crate writes its layer once as a
//! [`Program`] and its CPU path interprets the same definition.
//!
//! A program declares its activations (f32 matrices of a fixed number of columns), the nodes of
//! one **layer** (run once per layer, over that layer's weights, one DSP batch per layer) and of
//! the **tail** (run once after the last layer, over the tail's weights). Operands are column
//! ranges ([`Cols`]) of activations, so fused projections are read as strided views without a
//! copy.
//!
//! Rows. Every activation has one row set: the window's rows (`n` per sequence), or, downstream
//! of a [`Node::SelectRows`], the requested rows. Selection happens in the last layer only; in
//! the other layers a `SelectRows` output *is* its input (the same bytes, no op), so one layer
//! program serves every layer. An op over zero rows is not emitted.

use crate::error::{Error, InputProblem, ProgramProblem, ProgramSite, Result};

/// Columns `[start, start + len)` of activation `act` (every row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cols {
    /// Index into [`Program::acts`].
    pub act: usize,
    /// First column.
    pub start: usize,
    /// Columns.
    pub len: usize,
}

impl Cols {
    /// All columns of activation `act` of width `width`.
    pub fn all(act: usize, width: usize) -> Cols {
        Cols {
            act,
            start: 0,
            len: width,
        }
    }

    /// Columns `[start, start + len)` of this range.
    pub fn sub(self, start: usize, len: usize) -> Cols {
        Cols {
            act: self.act,
            start: self.start + start,
            len,
        }
    }
}

/// One op of a [`Program`]. Weights are named by index into the running layer's (or the
/// tail's) vectors and matrices.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `out = x / rms(x) * w` per row; vector `weight` has `x.len` values.
    RmsNorm {
        /// Input.
        x: Cols,
        /// Vector index.
        weight: usize,
        /// Epsilon.
        eps: f32,
        /// Output (same width).
        out: Cols,
    },
    /// `out = x W^T (+ bias)`; matrix `weight` is `(out.len, x.len)`.
    MatMul {
        /// Input.
        x: Cols,
        /// Matrix index.
        weight: usize,
        /// Output.
        out: Cols,
    },
    /// `acc += x`.
    Add {
        /// Accumulator (updated in place).
        acc: Cols,
        /// Addend (same width).
        x: Cols,
    },
    /// `out = silu(gate) * up`.
    SwiGlu {
        /// Gate.
        gate: Cols,
        /// Up (same width).
        up: Cols,
        /// Output (same width).
        out: Cols,
    },
    /// NeoX rotary embedding of `x` in place (`x.len / head_dim` heads), at each row's
    /// position, from the stack's tables.
    Rope {
        /// Heads to rotate.
        x: Cols,
    },
    /// The layer's cache keys for the window's rows: `x` (`kv_heads * head_dim` columns)
    /// rotated like [`Node::Rope`], stored as f16.
    CacheKeysRoped {
        /// Key heads.
        x: Cols,
    },
    /// The layer's cache values for the window's rows: `x` (`kv_heads * head_dim` columns) as
    /// f16.
    CacheValues {
        /// Value heads.
        x: Cols,
    },
    /// `out` = the requested rows of `x` in the last layer; in every other layer (and when
    /// every row is requested) `out` is `x` itself. `out` is a whole activation of `x.len`
    /// columns that no other node writes except in place ([`Node::Add`]).
    SelectRows {
        /// Source.
        x: Cols,
        /// The selected rows.
        out: Cols,
    },
    /// Scaled dot-product attention of queries `q` (`heads * head_dim` columns) over the
    /// layer's cache — the cached rows and the window's, the cached rows of the window's own
    /// positions skipped — written to `out` (same width as `q`).
    Attention {
        /// Query heads.
        q: Cols,
        /// Output.
        out: Cols,
        /// Score scale.
        scale: f32,
    },
}

impl Node {
    /// The op's label in batches, reports and errors.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Node::RmsNorm { .. } => "rms_norm",
            Node::MatMul { .. } => "matmul",
            Node::Add { .. } => "add",
            Node::SwiGlu { .. } => "swiglu",
            Node::Rope { .. } => "rope",
            Node::CacheKeysRoped { .. } => "rope -> kv cache",
            Node::CacheValues { .. } => "v -> kv cache",
            Node::SelectRows { .. } => "select rows",
            Node::Attention { .. } => "flash_attn",
        }
    }

    /// `(read, written)` operands.
    fn operands(&self) -> (Vec<Cols>, Vec<Cols>) {
        match *self {
            Node::RmsNorm { x, out, .. } | Node::MatMul { x, out, .. } => (vec![x], vec![out]),
            Node::Add { acc, x } => (vec![acc, x], vec![acc]),
            Node::SwiGlu { gate, up, out } => (vec![gate, up], vec![out]),
            Node::Rope { x } => (vec![x], vec![x]),
            Node::CacheKeysRoped { x } | Node::CacheValues { x } => (vec![x], vec![]),
            Node::SelectRows { x, out } => (vec![x], vec![out]),
            Node::Attention { q, out, .. } => (vec![q], vec![out]),
        }
    }
}

/// What a [`super::HexTransformer`] runs (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Activation names (for reports and errors) and widths in f32 columns.
    pub acts: Vec<(String, usize)>,
    /// The activation the stack's input rows are written to: every layer's input.
    pub input: usize,
    /// One layer's nodes, in order.
    pub layer: Vec<Node>,
    /// Where a layer leaves its result: in every layer but the last (no selection) it must be
    /// the `input` activation itself, so the next layer reads it in place.
    pub layer_output: Cols,
    /// The tail's nodes (after the last layer), in order.
    pub tail: Vec<Node>,
    /// What a forward returns.
    pub output: Cols,
}

/// Where a row set's activations live in an activation buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Written by a layer node: sized for the window's rows (or more requested rows).
    Layer,
    /// Written only by the tail: sized for the requested rows.
    Tail,
    /// The output of a `SelectRows`: its own bytes only while selecting.
    Selected,
}

/// A program checked against the stack's geometry.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub(crate) program: Program,
    pub(crate) kinds: Vec<Kind>,
    /// Per node: whether its operands hold the selected rows.
    pub(crate) layer_sel: Vec<bool>,
    pub(crate) tail_sel: Vec<bool>,
    /// Whether the layer selects rows at all.
    pub(crate) selects: bool,
    /// `(n, k)` of each layer matrix, then of each tail matrix.
    pub(crate) layer_mats: Vec<(usize, usize)>,
    pub(crate) tail_mats: Vec<(usize, usize)>,
    /// Length of each layer vector, then of each tail vector.
    pub(crate) layer_vecs: Vec<usize>,
    pub(crate) tail_vecs: Vec<usize>,
}

fn bad(site: ProgramSite, problem: ProgramProblem) -> Error {
    Error::input(
        "HexTransformer program",
        InputProblem::Program { site, problem },
    )
}

/// A problem of the program as a whole.
fn whole(problem: ProgramProblem) -> Error {
    bad(ProgramSite::Program, problem)
}

/// Heads geometry the attention and cache nodes are checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
}

/// A problem found at a node or output, before its site is attached.
type Found<T> = std::result::Result<T, ProgramProblem>;

/// Record that weight `i` is used with `val` (its size): a second use must agree.
fn note<T: PartialEq + Copy>(
    v: &mut Vec<Option<T>>,
    i: usize,
    val: T,
    conflict: fn(usize, T, T) -> ProgramProblem,
) -> Found<()> {
    if v.len() <= i {
        v.resize(i + 1, None);
    }
    match v[i] {
        Some(old) if old != val => Err(conflict(i, old, val)),
        _ => {
            v[i] = Some(val);
            Ok(())
        }
    }
}

/// Weight indices and their sizes, every index used.
fn dense<T>(v: Vec<Option<T>>, what: &'static str) -> Result<Vec<T>> {
    v.into_iter()
        .enumerate()
        .map(|(index, x)| x.ok_or_else(|| whole(ProgramProblem::Unused { what, index })))
        .collect()
}

/// One check of a [`Program`], node by node: per activation the row set and kind its last write
/// gave it, per weight index the size its first use gave it.
struct Checker<'a> {
    p: &'a Program,
    g: Heads,
    /// Per activation: `Some(false)` window rows, `Some(true)` selected rows, `None` unwritten.
    selected: Vec<Option<bool>>,
    kinds: Vec<Option<Kind>>,
    layer_mats: Vec<Option<(usize, usize)>>,
    tail_mats: Vec<Option<(usize, usize)>>,
    layer_vecs: Vec<Option<usize>>,
    tail_vecs: Vec<Option<usize>>,
    layer_sel: Vec<bool>,
    tail_sel: Vec<bool>,
}

impl<'a> Checker<'a> {
    /// The activations as declared: the input among them, none without columns.
    fn new(p: &'a Program, g: Heads) -> Result<Self> {
        let na = p.acts.len();
        if na == 0 || p.input >= na {
            return Err(whole(ProgramProblem::InputIndex {
                input: p.input,
                count: na,
            }));
        }
        if let Some((name, _)) = p.acts.iter().find(|(_, w)| *w == 0) {
            return Err(whole(ProgramProblem::ZeroColumns { name: name.clone() }));
        }
        let mut c = Checker {
            p,
            g,
            selected: vec![None; na],
            kinds: vec![None; na],
            layer_mats: Vec::new(),
            tail_mats: Vec::new(),
            layer_vecs: Vec::new(),
            tail_vecs: Vec::new(),
            layer_sel: Vec::new(),
            tail_sel: Vec::new(),
        };
        c.selected[p.input] = Some(false);
        c.kinds[p.input] = Some(Kind::Layer);
        Ok(c)
    }

    fn name(&self, c: &Cols) -> String {
        self.p
            .acts
            .get(c.act)
            .map_or("?", |a| a.0.as_str())
            .to_string()
    }

    fn in_bounds(&self, c: &Cols) -> Found<()> {
        match self.p.acts.get(c.act) {
            Some((_, w)) if c.len > 0 && c.start + c.len <= *w => Ok(()),
            Some((n, w)) => Err(ProgramProblem::Columns {
                name: n.clone(),
                start: c.start,
                end: c.start + c.len,
                width: *w,
            }),
            None => Err(ProgramProblem::NoActivation {
                act: c.act,
                count: self.p.acts.len(),
            }),
        }
    }

    fn same(&self, a: &Cols, b: &Cols) -> Found<()> {
        if a.len != b.len {
            return Err(ProgramProblem::ColumnCounts {
                a: self.name(a),
                a_len: a.len,
                b: self.name(b),
                b_len: b.len,
            });
        }
        Ok(())
    }

    /// One node: operands in bounds and on one row set, its shape, then what it writes.
    fn node(&mut self, tail: bool, node: &Node) -> Found<()> {
        let (reads, writes) = node.operands();
        for c in reads.iter().chain(&writes) {
            self.in_bounds(c)?;
        }
        let mut row_set = None;
        for c in &reads {
            let s = self.selected[c.act]
                .ok_or_else(|| ProgramProblem::ReadBeforeWrite { name: self.name(c) })?;
            if row_set.is_some_and(|r| r != s) {
                return Err(ProgramProblem::MixedRowSets);
            }
            row_set = Some(s);
        }
        let row_set = row_set.unwrap_or(false);
        self.shape(tail, row_set, node)?;
        if tail {
            self.tail_sel.push(row_set)
        } else {
            self.layer_sel.push(row_set)
        }
        let out_set = matches!(node, Node::SelectRows { .. }) || row_set;
        for c in &writes {
            // An activation holds the rows of its last write; in-place updates keep them.
            self.selected[c.act] = Some(out_set);
            if reads.contains(c) {
                continue;
            }
            let kind = match (node, tail) {
                (Node::SelectRows { .. }, _) => Kind::Selected,
                (_, false) => Kind::Layer,
                (_, true) => Kind::Tail,
            };
            self.kinds[c.act] = Some(match (self.kinds[c.act], kind) {
                (None, k) => k,
                (Some(old), k) if old == k && k != Kind::Selected => k,
                (Some(Kind::Layer), Kind::Tail) => Kind::Layer,
                _ => return Err(ProgramProblem::SelectionRewritten { name: self.name(c) }),
            });
        }
        Ok(())
    }

    /// A node's own rules: column counts, weight sizes, head geometry, where it may run.
    fn shape(&mut self, tail: bool, row_set: bool, node: &Node) -> Found<()> {
        let (g, hd) = (self.g, self.g.head_dim);
        let whole_act = |c: &Cols| c.start == 0 && c.len == self.p.acts[c.act].1;
        match node {
            Node::RmsNorm {
                x,
                weight,
                out,
                eps,
            } => {
                self.same(x, out)?;
                if !(eps.is_finite() && *eps >= 0.0) {
                    return Err(ProgramProblem::Eps { value: *eps });
                }
                let v = if tail {
                    &mut self.tail_vecs
                } else {
                    &mut self.layer_vecs
                };
                let conflict = |index, first, second| ProgramProblem::VectorUse {
                    index,
                    first,
                    second,
                };
                note(v, *weight, x.len, conflict)?;
            }
            Node::MatMul { x, weight, out } => {
                if let Some(c) = [x, out].into_iter().find(|c| !whole_act(c)) {
                    return Err(ProgramProblem::PartialMatMul { name: self.name(c) });
                }
                let m = if tail {
                    &mut self.tail_mats
                } else {
                    &mut self.layer_mats
                };
                let conflict = |index, first, second| ProgramProblem::MatrixUse {
                    index,
                    first,
                    second,
                };
                note(m, *weight, (out.len, x.len), conflict)?;
            }
            Node::Add { acc, x } => self.same(acc, x)?,
            Node::SwiGlu { gate, up, out } => {
                self.same(gate, up)?;
                self.same(gate, out)?;
            }
            Node::Rope { x } => {
                if !x.len.is_multiple_of(hd) {
                    return Err(ProgramProblem::NotWholeHeads {
                        columns: x.len,
                        head_dim: hd,
                    });
                }
            }
            Node::CacheKeysRoped { x } | Node::CacheValues { x } => {
                if tail || row_set {
                    return Err(ProgramProblem::CacheOutsideWindow);
                }
                if x.len != g.kv_heads * hd {
                    return Err(ProgramProblem::CacheWidth {
                        columns: x.len,
                        expected: g.kv_heads * hd,
                    });
                }
            }
            Node::SelectRows { x, out } => {
                self.same(x, out)?;
                if tail || row_set {
                    return Err(ProgramProblem::SelectOutsideLayer);
                }
                if !whole_act(out) || self.kinds[out.act].is_some() {
                    return Err(ProgramProblem::SelectionOutput {
                        name: self.name(out),
                    });
                }
            }
            Node::Attention { q, out, scale } => {
                self.same(q, out)?;
                if tail {
                    return Err(ProgramProblem::AttentionInTail);
                }
                if q.len != g.heads * hd {
                    return Err(ProgramProblem::QueryWidth {
                        columns: q.len,
                        heads: g.heads,
                        head_dim: hd,
                    });
                }
                if !scale.is_finite() {
                    return Err(ProgramProblem::Scale { value: *scale });
                }
            }
        }
        Ok(())
    }

    /// The layer's output: written, and the whole input itself (through row selections only),
    /// so the next layer reads what this one wrote.
    fn layer_output(&self) -> Result<()> {
        let p = self.p;
        let o = &p.layer_output;
        self.in_bounds(o)
            .map_err(|e| bad(ProgramSite::LayerOutput, e))?;
        if self.selected[o.act].is_none() {
            return Err(whole(ProgramProblem::Unwritten {
                what: "the layer output",
                name: self.name(o),
            }));
        }
        let (mut a, mut start) = (o.act, o.start);
        while a != p.input {
            let src = p.layer.iter().find_map(|n| match n {
                Node::SelectRows { x, out } if out.act == a => Some(*x),
                _ => None,
            });
            let Some(x) = src else {
                return Err(whole(ProgramProblem::NotTheInput {
                    output: self.name(o),
                    input: p.acts[p.input].0.clone(),
                }));
            };
            a = x.act;
            start += x.start;
        }
        if start != 0 || o.len != p.acts[p.input].1 {
            return Err(whole(ProgramProblem::PartialLayerOutput));
        }
        Ok(())
    }

    /// The program's output written; every weight index used.
    fn finish(self) -> Result<Checked> {
        let p = self.p;
        self.in_bounds(&p.output)
            .map_err(|e| bad(ProgramSite::Output, e))?;
        if self.selected[p.output.act].is_none() {
            return Err(whole(ProgramProblem::Unwritten {
                what: "the output",
                name: self.name(&p.output),
            }));
        }
        Ok(Checked {
            program: p.clone(),
            kinds: self
                .kinds
                .into_iter()
                .map(|k| k.unwrap_or(Kind::Layer))
                .collect(),
            selects: p.layer.iter().any(|n| matches!(n, Node::SelectRows { .. })),
            layer_sel: self.layer_sel,
            tail_sel: self.tail_sel,
            layer_mats: dense(self.layer_mats, "layer matrix")?,
            tail_mats: dense(self.tail_mats, "tail matrix")?,
            layer_vecs: dense(self.layer_vecs, "layer vector")?,
            tail_vecs: dense(self.tail_vecs, "tail vector")?,
        })
    }
}

impl Program {
    /// Check every operand, row set and weight use; returns the sizes the weights must have.
    pub(crate) fn check(&self, g: Heads) -> Result<Checked> {
        let mut c = Checker::new(self, g)?;
        for (part, nodes) in [("layer", &self.layer), ("tail", &self.tail)] {
            for (index, node) in nodes.iter().enumerate() {
                let site = ProgramSite::Node {
                    part,
                    index,
                    label: node.label(),
                };
                c.node(part == "tail", node).map_err(|e| bad(site, e))?;
            }
            if part == "layer" {
                c.layer_output()?;
            }
        }
        c.finish()
    }

    /// The widest activation (for the routing entry point).
    pub(crate) fn widest(&self) -> usize {
        self.acts.iter().map(|a| a.1).max().unwrap_or(0)
    }
}
