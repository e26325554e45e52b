//! Placing a model on the NPU's block-level module: the block definition recorded as the module's
//! program, the stack declared to the device from the checkpoint's shapes and types before any
//! tensor is read ([`begin`]: a placement the memory policy cannot make is refused then), each
//! layer read once and packed ([`NpuStack::push_layer`]) before the next is read, and the CPU
//! layers the sparse refresh runs over the module's own packed bytes ([`shared_block`], and the
//! head [`NpuStack::finish`] returns; no second copy of the matrices). The sequence paths over the
//! placed module are in `npu_seq.rs`.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use candle_hexagon::{
    Cols, HexTransformer, HexTransformerBuilder, HexTransformerConfig, HexagonDevice, LayerWeights,
    Matrix, MatrixShape, Node, PackedFormat, PackedWeight, Part, Placed, Program, StackShape,
    WeightFormat, WeightRef,
};

use crate::block::{GateUp, Qkv};
use crate::block_def::{self, BlockOps, HeadOps, Norm, Proj};
use crate::config::{MatrixDims, TransformerConfig};
use crate::gguf_raw::RawMatrix;
use crate::layer_params::LayerParams;
use crate::layers::{CpuLinear, Linear, Param, Rope};
use crate::linear::{CpuLinears, TileFormat};
use crate::role::Role;
use crate::weights::WeightSource;
use crate::{Error, Result};

/// The block definition recorded as the NPU module's program: each op becomes a node over
/// named activations (slots reused where the definition's values do not overlap in time, as the
/// fixed regions of a static NPU graph).
struct Recorder {
    acts: Vec<(String, usize)>,
    nodes: Vec<Node>,
    /// Vector and matrix roles by index, in first-use order, for the layer and for the tail.
    vectors: Vec<Norm>,
    matrices: Vec<Proj>,
    dims: Dims,
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    hidden: usize,
    nq: usize,
    nkv: usize,
    ff: usize,
    vocab: usize,
    eps: f32,
    scale: f32,
}

/// A recorded value: columns of an activation, and whether a rotary embedding is pending on it
/// (applied where the value is consumed: fused into the cache write for keys).
#[derive(Debug, Clone, Copy)]
struct Val {
    cols: Cols,
    roped: bool,
}

impl Val {
    fn of(cols: Cols) -> Self {
        Val { cols, roped: false }
    }
}

fn defect(what: &'static str) -> Error {
    Error::Internal { what }
}

impl Recorder {
    fn slot(&mut self, name: &str, width: usize) -> Cols {
        let act = match self.acts.iter().position(|a| a.0 == name) {
            Some(i) => i,
            None => {
                self.acts.push((name.to_string(), width));
                self.acts.len() - 1
            }
        };
        Cols::all(act, width)
    }

    fn vector(&mut self, w: Norm) -> usize {
        index_of(&mut self.vectors, w)
    }

    fn matrix(&mut self, w: Proj) -> usize {
        index_of(&mut self.matrices, w)
    }

    /// Apply a pending rotary embedding in place.
    fn settle(&mut self, x: Val) -> Val {
        if x.roped {
            self.nodes.push(Node::Rope { x: x.cols });
        }
        Val::of(x.cols)
    }

    fn matmul(&mut self, x: &Val, w: Proj, out: &str, n: usize) -> Cols {
        let weight = self.matrix(w);
        let out = self.slot(out, n);
        self.nodes.push(Node::MatMul {
            x: x.cols,
            weight,
            out,
        });
        out
    }
}

/// A checkpoint tensor's name in the NPU module's reports and errors.
fn label(role: Role) -> String {
    match role {
        Role::Embed => "embedding".into(),
        Role::FinalNorm => "final norm".into(),
        Role::Head => "lm head".into(),
        Role::AttnNorm(i) => format!("block {i} attn norm"),
        Role::Q(i) => format!("block {i} q"),
        Role::K(i) => format!("block {i} k"),
        Role::V(i) => format!("block {i} v"),
        Role::QBias(i) => format!("block {i} q bias"),
        Role::KBias(i) => format!("block {i} k bias"),
        Role::VBias(i) => format!("block {i} v bias"),
        Role::O(i) => format!("block {i} o"),
        Role::FfnNorm(i) => format!("block {i} ffn norm"),
        Role::Gate(i) => format!("block {i} gate"),
        Role::Up(i) => format!("block {i} up"),
        Role::Down(i) => format!("block {i} down"),
    }
}

fn index_of<T: PartialEq + Copy>(v: &mut Vec<T>, x: T) -> usize {
    match v.iter().position(|&y| y == x) {
        Some(i) => i,
        None => {
            v.push(x);
            v.len() - 1
        }
    }
}

impl HeadOps for Recorder {
    type X = Val;

    fn rms_norm(&mut self, x: &Val, w: Norm) -> Result<Val> {
        let weight = self.vector(w);
        let out = self.slot("h", x.cols.len);
        self.nodes.push(Node::RmsNorm {
            x: x.cols,
            weight,
            eps: self.dims.eps,
            out,
        });
        Ok(Val::of(out))
    }

    fn linear(&mut self, x: &Val, w: Proj) -> Result<Val> {
        let d = self.dims;
        let (slot, n) = match w {
            Proj::O | Proj::Down => ("h", d.hidden),
            Proj::Head => ("out", d.vocab),
            Proj::Qkv | Proj::GateUp => {
                return Err(defect(
                    "fused projections go through attn_inputs/mlp_inputs",
                ))
            }
        };
        Ok(Val::of(self.matmul(x, w, slot, n)))
    }
}

impl BlockOps for Recorder {
    fn attn_inputs(&mut self, h: &Val) -> Result<(Val, Val, Val)> {
        let d = self.dims;
        let qkv = self.matmul(h, Proj::Qkv, "qkv", d.nq + 2 * d.nkv);
        Ok((
            Val::of(qkv.sub(0, d.nq)),
            Val::of(qkv.sub(d.nq, d.nkv)),
            Val::of(qkv.sub(d.nq + d.nkv, d.nkv)),
        ))
    }

    fn rope(&mut self, x: Val) -> Result<Val> {
        Ok(Val { roped: true, ..x })
    }

    fn cache_kv(&mut self, k: Val, v: Val) -> Result<()> {
        if !k.roped || v.roped {
            return Err(defect("the NPU caches rotated keys and plain values"));
        }
        self.nodes.push(Node::CacheKeysRoped { x: k.cols });
        self.nodes.push(Node::CacheValues { x: v.cols });
        Ok(())
    }

    fn select_rows(&mut self, x: Val) -> Result<Val> {
        let x = self.settle(x);
        let name = format!("{} rows", self.acts[x.cols.act].0);
        let out = self.slot(&name, x.cols.len);
        self.nodes.push(Node::SelectRows { x: x.cols, out });
        Ok(Val::of(out))
    }

    fn attention(&mut self, q: &Val) -> Result<Val> {
        let q = self.settle(*q);
        let out = self.slot("att", q.cols.len);
        self.nodes.push(Node::Attention {
            q: q.cols,
            out,
            scale: self.dims.scale,
        });
        Ok(Val::of(out))
    }

    fn add(&mut self, acc: Val, x: &Val) -> Result<Val> {
        self.nodes.push(Node::Add {
            acc: acc.cols,
            x: x.cols,
        });
        Ok(acc)
    }

    fn mlp_inputs(&mut self, h: &Val) -> Result<(Val, Val)> {
        let ff = self.dims.ff;
        let gu = self.matmul(h, Proj::GateUp, "gu", 2 * ff);
        Ok((Val::of(gu.sub(0, ff)), Val::of(gu.sub(ff, ff))))
    }

    fn swiglu(&mut self, gate: &Val, up: &Val) -> Result<Val> {
        let out = self.slot("act", gate.cols.len);
        self.nodes.push(Node::SwiGlu {
            gate: gate.cols,
            up: up.cols,
            out,
        });
        Ok(Val::of(out))
    }

    fn no_rows(&self, _: &Val) -> Result<bool> {
        Ok(false)
    }
}

/// The recorded program and the roles of its weights: `(program, layer vectors, layer
/// matrices, tail vectors, tail matrices)`.
struct Recorded {
    program: Program,
    layer: (Vec<Norm>, Vec<Proj>),
    tail: (Vec<Norm>, Vec<Proj>),
}

fn record(cfg: &TransformerConfig) -> Result<Recorded> {
    let MatrixDims { nq, nkv, ff, vocab } = cfg.matrix_dims();
    let mut r = Recorder {
        acts: Vec::new(),
        nodes: Vec::new(),
        vectors: Vec::new(),
        matrices: Vec::new(),
        dims: Dims {
            hidden: cfg.hidden_size,
            nq,
            nkv,
            ff,
            vocab,
            eps: cfg.rms_norm_eps as f32,
            scale: 1.0 / (cfg.head_dim() as f32).sqrt(),
        },
    };
    let x = Val::of(r.slot("x", cfg.hidden_size));
    let layer_out = block_def::block(&mut r, x)?;
    let layer = std::mem::take(&mut r.nodes);
    let layer_roles = (
        std::mem::take(&mut r.vectors),
        std::mem::take(&mut r.matrices),
    );
    let out = block_def::head(&mut r, &layer_out)?;
    Ok(Recorded {
        program: Program {
            acts: r.acts,
            input: x.cols.act,
            layer,
            layer_output: layer_out.cols,
            tail: r.nodes,
            output: out.cols,
        },
        layer: layer_roles,
        tail: (r.vectors, r.matrices),
    })
}

/// The checkpoint roles program matrix `p` of layer `i` stacks, in output order: `(role, rows,
/// bias)`, the bias an index into [`LayerParams::bias`] (q 0, k 1, v 2). The one table of which
/// tensors make which NPU matrix: the shape declared before reading and the weights pushed later
/// both come from it.
fn parts_of(cfg: &TransformerConfig, p: Proj, i: usize) -> Vec<(Role, usize, Option<usize>)> {
    let h = cfg.hidden_size;
    let MatrixDims { nq, nkv, ff, vocab } = cfg.matrix_dims();
    match p {
        Proj::Qkv => vec![
            (Role::Q(i), nq, Some(0)),
            (Role::K(i), nkv, Some(1)),
            (Role::V(i), nkv, Some(2)),
        ],
        Proj::O => vec![(Role::O(i), h, None)],
        Proj::GateUp => vec![(Role::Gate(i), ff, None), (Role::Up(i), ff, None)],
        Proj::Down => vec![(Role::Down(i), h, None)],
        Proj::Head => {
            let role = if cfg.tie_word_embeddings {
                Role::Embed
            } else {
                Role::Head
            };
            vec![(role, vocab, None)]
        }
    }
}

/// Input features of a checkpoint matrix.
fn cols_of(cfg: &TransformerConfig, role: Role) -> usize {
    let m = cfg.matrix_dims();
    match role {
        Role::O(_) => m.nq,
        Role::Down(_) => m.ff,
        _ => cfg.hidden_size,
    }
}

/// A program matrix's name in the NPU module's reports and errors.
fn matrix_name(p: Proj, i: usize) -> String {
    match p {
        Proj::Qkv => format!("block {i} q/k/v"),
        Proj::O => format!("block {i} o"),
        Proj::GateUp => format!("block {i} gate/up"),
        Proj::Down => format!("block {i} down"),
        Proj::Head => "lm head".into(),
    }
}

/// Program matrix `p` of layer `i` as declared before reading: its parts' rows and the formats
/// the source says they will have.
fn declared(
    cfg: &TransformerConfig,
    w: &dyn WeightSource,
    p: Proj,
    i: usize,
) -> Result<MatrixShape> {
    let parts = parts_of(cfg, p, i)
        .into_iter()
        .map(|(role, rows, _)| {
            let f = match w.matrix_type(role)? {
                None => WeightFormat::Dense(w.dtype()),
                Some(GgmlDType::Q4_0) => WeightFormat::Q4_0,
                Some(dt) => WeightFormat::OtherQuant(format!("{dt:?}").to_lowercase()),
            };
            Ok((rows, f))
        })
        .collect::<Result<_>>()?;
    Ok(MatrixShape {
        name: matrix_name(p, i),
        parts,
    })
}

/// A checkpoint matrix read for the NPU: in place from a mapped file, or through `get`.
enum Read<'a> {
    Raw(RawMatrix<'a>),
    Param(Param),
}

impl Read<'_> {
    fn of<'a>(
        w: &'a dyn WeightSource,
        cfg: &TransformerConfig,
        role: Role,
        rows: usize,
    ) -> Result<Read<'a>> {
        let shape = [rows, cols_of(cfg, role)];
        Ok(match w.raw_matrix(role, &shape)? {
            Some(r) => Read::Raw(r),
            None => Read::Param(w.get(role, &shape)?),
        })
    }

    fn weight(&self) -> WeightRef<'_> {
        match self {
            Read::Raw(r) => WeightRef::Ggml {
                dtype: r.dtype,
                n: r.rows,
                k: r.cols,
                bytes: &r.bytes,
            },
            Read::Param(Param::Dense(t)) => WeightRef::Dense(t),
            Read::Param(Param::Quant(q)) => WeightRef::Quant(q),
        }
    }
}

/// The NPU's block-level module being packed, a layer at a time: the loader reads a layer's
/// tensors once, pushes them, and drops them before the next layer.
pub(crate) struct NpuStack {
    b: HexTransformerBuilder,
    rec: Recorded,
}

/// Declare the whole stack to the device before anything is read: `None` when the device does
/// not take it (the decision and its reason are counted by the device; the per-op path is kept),
/// an error when the memory policy cannot place it (with the numbers).
pub(crate) fn begin(
    dev: &HexagonDevice,
    cfg: &TransformerConfig,
    w: &dyn WeightSource,
) -> Result<Option<NpuStack>> {
    let rec = record(cfg)?;
    let layers = (0..cfg.num_layers)
        .map(|i| {
            rec.layer
                .1
                .iter()
                .map(|&p| declared(cfg, w, p, i))
                .collect()
        })
        .collect::<Result<Vec<Vec<_>>>>()?;
    let tail = rec
        .tail
        .1
        .iter()
        .map(|&p| declared(cfg, w, p, cfg.num_layers))
        .collect::<Result<_>>()?;
    let hcfg = HexTransformerConfig {
        program: rec.program.clone(),
        heads: cfg.num_heads,
        kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim(),
        max_positions: cfg.max_seq_len,
    };
    Ok(
        match HexTransformer::builder(dev, &hcfg, &StackShape { layers, tail })? {
            Placed::Npu(b) => Some(NpuStack { b, rec }),
            Placed::Cpu(_) => None,
        },
    )
}

/// The weights of one run of the program (a layer, or the tail) for the builder.
fn run_weights<'a>(
    cfg: &TransformerConfig,
    roles: &(Vec<Norm>, Vec<Proj>),
    i: usize,
    vectors: &[&'a Tensor],
    reads: &'a [Vec<(Role, Read<'a>)>],
    biases: Option<&'a LayerParams>,
) -> LayerWeights<'a> {
    LayerWeights {
        vectors: roles
            .0
            .iter()
            .zip(vectors)
            .map(|(&n, &t)| (label(norm_role(n, i)), t))
            .collect(),
        matrices: roles
            .1
            .iter()
            .zip(reads)
            .map(|(&p, rs)| Matrix {
                name: matrix_name(p, i),
                parts: rs
                    .iter()
                    .zip(parts_of(cfg, p, i))
                    .map(|((role, r), (_, _, b))| {
                        let bias = b.and_then(|j| biases.and_then(|l| l.bias(j)));
                        (
                            label(*role),
                            Part {
                                weight: r.weight(),
                                bias,
                            },
                        )
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The checkpoint role of a norm of layer `i`.
fn norm_role(n: Norm, i: usize) -> Role {
    match n {
        Norm::Attn => Role::AttnNorm(i),
        Norm::Ffn => Role::FfnNorm(i),
        Norm::Final => Role::FinalNorm,
    }
}

/// Read the matrices of one run of the program.
fn read_run<'a>(
    cfg: &TransformerConfig,
    w: &'a dyn WeightSource,
    projs: &[Proj],
    i: usize,
) -> Result<Vec<Vec<(Role, Read<'a>)>>> {
    projs
        .iter()
        .map(|&p| {
            parts_of(cfg, p, i)
                .into_iter()
                .map(|(role, rows, _)| Ok((role, Read::of(w, cfg, role, rows)?)))
                .collect()
        })
        .collect()
}

impl NpuStack {
    /// Read layer `i`'s matrices and pack them, with its norms and biases (`params`, read once
    /// by the loader); the matrices are dropped when this returns.
    pub(crate) fn push_layer(
        &mut self,
        cfg: &TransformerConfig,
        w: &dyn WeightSource,
        i: usize,
        params: &LayerParams,
    ) -> Result<()> {
        let vectors: Vec<&Tensor> = self
            .rec
            .layer
            .0
            .iter()
            .map(|n| match n {
                Norm::Attn => Ok(&params.attn_norm),
                Norm::Ffn => Ok(&params.ffn_norm),
                Norm::Final => Err(defect("a layer reads the final norm")),
            })
            .collect::<Result<_>>()?;
        let reads = read_run(cfg, w, &self.rec.layer.1, i)?;
        let lw = run_weights(cfg, &self.rec.layer, i, &vectors, &reads, Some(params));
        Ok(self.b.push_layer(&lw)?)
    }

    /// Pack the tail (the final norm, and the LM head when the device takes it) and finish the
    /// module. Returns it with the head's CPU layer: the NPU's packed head read in place, or
    /// (a head the device does not take) packed for the CPU from the same read; `None` for a
    /// tied head left on the CPU (the caller's embedding table is the head).
    pub(crate) fn finish(
        self,
        cfg: &TransformerConfig,
        w: &dyn WeightSource,
        final_norm: &Tensor,
        which: CpuLinears,
    ) -> Result<(HexTransformer, Option<Linear>)> {
        let reads = read_run(cfg, w, &self.rec.tail.1, cfg.num_layers)?;
        let vectors = vec![final_norm; self.rec.tail.0.len()];
        let tw = run_weights(cfg, &self.rec.tail, cfg.num_layers, &vectors, &reads, None);
        let (cos, sin) = Rope::build(
            cfg.rope_theta,
            cfg.head_dim(),
            cfg.max_seq_len,
            DType::F32,
            &Device::Cpu,
        )?;
        let hex = self.b.finish(&tw, &cos, &sin)?;
        let head = match shared_head_of(&hex, &self.rec)? {
            Some(h) => Some(h),
            None if cfg.tie_word_embeddings => None,
            None => match reads.into_iter().flatten().next() {
                Some((role, read)) => Some(cpu_head(w, cfg, role, read, which)?),
                None => None,
            },
        };
        Ok((hex, head))
    }
}

/// The LM head for the CPU from the read the NPU did not take.
fn cpu_head(
    w: &dyn WeightSource,
    cfg: &TransformerConfig,
    role: Role,
    read: Read<'_>,
    which: CpuLinears,
) -> Result<Linear> {
    let shape = [cfg.vocab_size, cfg.hidden_size];
    let param = match read {
        Read::Raw(r) => match CpuLinear::from_ggml_blocks(r.dtype, r.rows, r.cols, &r.bytes)? {
            Some(c) => return Ok(Linear::Cpu(c)),
            None => w.get(role, &shape)?,
        },
        Read::Param(p) => p,
    };
    Linear::on_backend(param, None, &crate::layers::Backend::Cpu, which)?.for_inference(which)
}

/// A CPU layer over the NPU module's packed bytes (read in place by kernels-cpu).
fn shared(p: PackedWeight, bias: Option<&Tensor>) -> Result<Linear> {
    let format = match p.format {
        PackedFormat::F16Tiles => TileFormat::F16Hmx,
        PackedFormat::Q4_0Tiles => TileFormat::Q4_0,
    };
    Ok(Linear::Cpu(CpuLinear::from_shared_tiles(
        format, p.n, p.k, p.bytes, bias,
    )?))
}

/// The packed matrix of role `p` in layer `i` (or in the tail), by the recorded program's roles.
fn packed(
    hex: &HexTransformer,
    rec: &Recorded,
    i: Option<usize>,
    p: Proj,
) -> Result<Option<PackedWeight>> {
    let roles = if i.is_some() {
        &rec.layer.1
    } else {
        &rec.tail.1
    };
    let Some(j) = roles.iter().position(|&x| x == p) else {
        return Ok(None);
    };
    Ok(match i {
        Some(i) => hex.packed_matrix(i, j),
        None => hex.packed_tail_matrix(j),
    })
}

/// Block `i`'s CPU layers for the paths that run beside the NPU (the sparse refresh), reading
/// the NPU module's packed weights: fused q/k/v (with the fused `qkv_bias`), o, fused gate/up,
/// down. Returns `(qkv, o, gate_up, down)`.
pub(crate) fn shared_block(
    hex: &HexTransformer,
    i: usize,
    cfg: &TransformerConfig,
    qkv_bias: Option<&Tensor>,
) -> Result<(Qkv, Linear, GateUp, Linear)> {
    let rec = record(cfg)?;
    let get = |p: Proj| -> Result<PackedWeight> {
        packed(hex, &rec, Some(i), p)?.ok_or(Error::NpuBlock {
            block: i,
            blocks: hex.num_blocks(),
        })
    };
    let (qkv, o, gate_up, down) = (
        get(Proj::Qkv)?,
        get(Proj::O)?,
        get(Proj::GateUp)?,
        get(Proj::Down)?,
    );
    let MatrixDims {
        nq, nkv, ff: ffn, ..
    } = cfg.matrix_dims();
    if qkv.n != nq + 2 * nkv || gate_up.n != 2 * ffn {
        return Err(Error::Shape {
            what: format!("block {i}: the NPU's (fused q/k/v, fused gate/up) outputs"),
            expected: vec![nq + 2 * nkv, 2 * ffn],
            got: vec![qkv.n, gate_up.n],
        });
    }
    Ok((
        Qkv::Fused {
            qkv: shared(qkv, qkv_bias)?,
            nq,
            nkv,
        },
        shared(o, None)?,
        GateUp::Fused {
            gate_up: shared(gate_up, None)?,
            ffn,
        },
        shared(down, None)?,
    ))
}

/// The LM head over the NPU module's packed head, when the head is on the NPU.
fn shared_head_of(hex: &HexTransformer, rec: &Recorded) -> Result<Option<Linear>> {
    packed(hex, rec, None, Proj::Head)?
        .map(|p| shared(p, None))
        .transpose()
}
