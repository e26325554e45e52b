//! Placing a model on the NPU's block-level module: the whole stack packed into device memory at
//! load ([`place_blocks`]: the block definition recorded as the module's program), and the CPU layers the sparse refresh runs over the module's own packed
//! bytes ([`shared_block`], [`shared_head`]; no second copy of the matrices). The sequence paths
//! over the placed module are in `npu_seq.rs`.

use candle_core::{DType, Device, Tensor};
use candle_hexagon::{
    Cols, HexTransformer, HexTransformerConfig, HexagonDevice, LayerWeights, Matrix, Node,
    PackedFormat, PackedWeight, Part, Placed, Program, WeightRef,
};

use crate::block::{GateUp, Qkv};
use crate::block_def::{self, BlockOps, HeadOps, Norm, Proj};
use crate::config::{MatrixDims, TransformerConfig};
use crate::layers::{CpuLinear, Linear, Param, Rope};
use crate::linear::{dense, TileFormat};
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

/// Pack the whole stack into the NPU's block-level module when the device takes it (`None` keeps
/// the per-op path; the decision and its reason are counted by the device).
pub(crate) fn place_blocks(
    dev: &HexagonDevice,
    cfg: &TransformerConfig,
    w: &dyn WeightSource,
) -> Result<Option<HexTransformer>> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim());
    let MatrixDims {
        nq,
        nkv,
        ff,
        vocab: v,
    } = cfg.matrix_dims();
    let rec = record(cfg)?;
    let norm = |role: Role| -> Result<Tensor> { dense(w.get(role, &[h])?, role) };
    let bias = |role: Role, n: usize| -> Result<Option<Tensor>> {
        if cfg.qkv_bias {
            Ok(Some(dense(w.get(role, &[n])?, role)?))
        } else {
            Ok(None)
        }
    };
    // The checkpoint tensors each role names, read once; `(name, param, bias)` per part.
    type Owned = Vec<(String, Param, Option<Tensor>)>;
    let part = |role: Role,
                dims: [usize; 2],
                b: Option<Tensor>|
     -> Result<(String, Param, Option<Tensor>)> {
        Ok((label(role), w.get(role, &dims)?, b))
    };
    let matrix = |p: Proj, i: usize| -> Result<(String, Owned)> {
        Ok(match p {
            Proj::Qkv => (
                format!("block {i} q/k/v"),
                vec![
                    part(Role::Q(i), [nq, h], bias(Role::QBias(i), nq)?)?,
                    part(Role::K(i), [nkv, h], bias(Role::KBias(i), nkv)?)?,
                    part(Role::V(i), [nkv, h], bias(Role::VBias(i), nkv)?)?,
                ],
            ),
            Proj::O => (
                format!("block {i} o"),
                vec![part(Role::O(i), [h, nq], None)?],
            ),
            Proj::GateUp => (
                format!("block {i} gate/up"),
                vec![
                    part(Role::Gate(i), [ff, h], None)?,
                    part(Role::Up(i), [ff, h], None)?,
                ],
            ),
            Proj::Down => (
                format!("block {i} down"),
                vec![part(Role::Down(i), [h, ff], None)?],
            ),
            Proj::Head => {
                let role = if cfg.tie_word_embeddings {
                    Role::Embed
                } else {
                    Role::Head
                };
                ("lm head".into(), vec![part(role, [v, h], None)?])
            }
        })
    };
    let vector = |n: Norm, i: usize| -> Result<(String, Tensor)> {
        let role = match n {
            Norm::Attn => Role::AttnNorm(i),
            Norm::Ffn => Role::FfnNorm(i),
            Norm::Final => Role::FinalNorm,
        };
        Ok((label(role), norm(role)?))
    };
    struct OwnedLayer {
        vectors: Vec<(String, Tensor)>,
        matrices: Vec<(String, Owned)>,
    }
    let owned = |roles: &(Vec<Norm>, Vec<Proj>), i: usize| -> Result<OwnedLayer> {
        Ok(OwnedLayer {
            vectors: roles
                .0
                .iter()
                .map(|&n| vector(n, i))
                .collect::<Result<_>>()?,
            matrices: roles
                .1
                .iter()
                .map(|&p| matrix(p, i))
                .collect::<Result<_>>()?,
        })
    };
    let layers = (0..cfg.num_layers)
        .map(|i| owned(&rec.layer, i))
        .collect::<Result<Vec<_>>>()?;
    let tail = owned(&rec.tail, cfg.num_layers)?;
    fn r(p: &Param) -> WeightRef<'_> {
        match p {
            Param::Dense(t) => WeightRef::Dense(t),
            Param::Quant(q) => WeightRef::Quant(q),
        }
    }
    fn borrowed(l: &OwnedLayer) -> LayerWeights<'_> {
        LayerWeights {
            vectors: l.vectors.iter().map(|(n, t)| (n.clone(), t)).collect(),
            matrices: l
                .matrices
                .iter()
                .map(|(name, parts)| Matrix {
                    name: name.clone(),
                    parts: parts
                        .iter()
                        .map(|(n, p, b)| {
                            (
                                n.clone(),
                                Part {
                                    weight: r(p),
                                    bias: b.as_ref(),
                                },
                            )
                        })
                        .collect(),
                })
                .collect(),
        }
    }
    let (cos, sin) = Rope::build(
        cfg.rope_theta,
        hd,
        cfg.max_seq_len,
        DType::F32,
        &Device::Cpu,
    )?;
    let hcfg = HexTransformerConfig {
        program: rec.program,
        heads: cfg.num_heads,
        kv_heads: cfg.num_kv_heads,
        head_dim: hd,
        max_positions: cfg.max_seq_len,
    };
    let weights = candle_hexagon::TransformerWeights {
        layers: layers.iter().map(borrowed).collect(),
        tail: borrowed(&tail),
        rope_cos: &cos,
        rope_sin: &sin,
    };
    Ok(match HexTransformer::new(dev, &hcfg, &weights)? {
        Placed::Npu(t) => Some(t),
        Placed::Cpu(_) => None,
    })
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
pub(crate) fn shared_head(hex: &HexTransformer, cfg: &TransformerConfig) -> Result<Option<Linear>> {
    packed(hex, &record(cfg)?, None, Proj::Head)?
        .map(|p| shared(p, None))
        .transpose()
}
