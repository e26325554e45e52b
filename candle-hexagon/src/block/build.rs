//! Building a [`HexTransformer`] a layer at a time: the stack's shape (every program matrix's
//! parts, their output rows and weight formats) is declared first, before any weight is read, so
//! routing, the weight file's room and the memory policy's fit are decided up front
//! ([`HexTransformer::builder`]); then each layer's weights are packed into the weight file as
//! they arrive ([`HexTransformerBuilder::push_layer`]), so a loader holds one layer's checkpoint
//! tensors at a time, never the whole model beside its packed copy.

use std::sync::{Arc, Mutex};

use candle_core::quantized::GgmlDType;
use candle_core::Tensor;

use super::packed::{self, group_format, PackedLinear, Pinned};
use super::program::Checked;
use super::{
    check_layer, invalid, plan, HexTransformer, HexTransformerConfig, Inner, LayerWeights, Matrix,
    Node, PackedLayer, WeightRef,
};
use crate::device::HexagonDevice;
use crate::error::{InputProblem, Result};
use crate::layout;
use crate::ops::linear::{PackedFormat, Placed};
use crate::routing::{Decision, OpDesc, Reason, Support, Tier, WeightFormat};
use crate::runtime::{fit, HostWeights, Runtime};

/// A program matrix as declared before its weights are read: its name and, per part (in output
/// order), the part's output rows and weight format.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixShape {
    /// Its name in reports and errors (e.g. `block 3 q/k/v`).
    pub name: String,
    /// `(rows, format)` of each part.
    pub parts: Vec<(usize, WeightFormat)>,
}

/// The matrices of a whole stack, declared before anything is read: per layer, then the tail's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StackShape {
    /// Each layer's matrices, in the program's matrix order.
    pub layers: Vec<Vec<MatrixShape>>,
    /// The tail's matrices.
    pub tail: Vec<MatrixShape>,
}

impl StackShape {
    /// The shape of weights already in hand.
    pub fn of(w: &super::TransformerWeights<'_>) -> Result<Self> {
        let layer = |l: &LayerWeights<'_>| -> Result<Vec<MatrixShape>> {
            l.matrices.iter().map(matrix_shape).collect()
        };
        Ok(StackShape {
            layers: w.layers.iter().map(layer).collect::<Result<_>>()?,
            tail: layer(&w.tail)?,
        })
    }
}

fn matrix_shape(m: &Matrix<'_>) -> Result<MatrixShape> {
    let parts = m
        .parts
        .iter()
        .map(|(_, p)| Ok((packed::dims_of(&p.weight)?.0, weight_format(&p.weight))))
        .collect::<Result<_>>()?;
    Ok(MatrixShape {
        name: m.name.clone(),
        parts,
    })
}

/// The routing format of a checkpoint weight.
pub(crate) fn weight_format(w: &WeightRef<'_>) -> WeightFormat {
    let q = |dt: GgmlDType| match dt {
        GgmlDType::Q4_0 => WeightFormat::Q4_0,
        other => WeightFormat::OtherQuant(format!("{other:?}").to_lowercase()),
    };
    match w {
        WeightRef::Dense(t) => WeightFormat::Dense(t.dtype()),
        WeightRef::Quant(x) => q(x.dtype()),
        WeightRef::Ggml { dtype, .. } => q(*dtype),
    }
}

/// Rows of `m`'s parts, checked against the `(n, k)` the program's matmul needs.
fn check_shape(layer: Option<usize>, m: &MatrixShape, n: usize) -> Result<()> {
    let rows: usize = m.parts.iter().map(|p| p.0).sum();
    if m.parts.is_empty() || rows != n {
        return Err(invalid(InputProblem::ShapeRows {
            layer,
            matrix: m.name.clone(),
            parts: m.parts.len(),
            rows,
            expected: n,
        }));
    }
    Ok(())
}

/// Check the declared matrices of layer `layer` (`None`: the tail) against its program's.
fn check_shapes(layer: Option<usize>, ms: &[MatrixShape], mats: &[(usize, usize)]) -> Result<()> {
    if ms.len() != mats.len() {
        return Err(invalid(InputProblem::ShapeCount {
            layer,
            matrices: ms.len(),
            program_matrices: mats.len(),
        }));
    }
    ms.iter()
        .zip(mats)
        .try_for_each(|(m, &(n, _))| check_shape(layer, m, n))
}

/// A stack being packed: its shape decided, its layers arriving one at a time.
pub struct HexTransformerBuilder {
    dev: HexagonDevice,
    cfg: HexTransformerConfig,
    checked: Checked,
    shape: StackShape,
    formats: Vec<Vec<PackedFormat>>,
    tail_formats: Vec<std::result::Result<PackedFormat, Reason>>,
    tier: Tier,
    host: HostWeights,
    pinned: Pinned,
    layers: Vec<PackedLayer>,
}

impl std::fmt::Debug for HexTransformerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HexTransformerBuilder({} of {} layers packed)",
            self.layers.len(),
            self.shape.layers.len()
        )
    }
}

impl HexTransformer {
    /// Start packing a stack of `shape` for `cfg` on `dev`, before any weight is read. A malformed
    /// shape is an error; anything the device does not run (deny-list, shapes, weight formats) is
    /// `Placed::Cpu(reason)`, counted as a placement of [`crate::OpKind::Block`]; a stack the
    /// device's memory policy cannot place in the NPU window (`naive`: every weight mapped at once;
    /// `paging`: one layer's weights; `somr`: the weights too large to stream) is
    /// [`crate::Error::WontFit`] with the numbers — nothing has been read or allocated then.
    pub fn builder(
        dev: &HexagonDevice,
        cfg: &HexTransformerConfig,
        shape: &StackShape,
    ) -> Result<Placed<HexTransformerBuilder>> {
        let checked = cfg.check()?;
        if shape.layers.is_empty() {
            return Err(invalid(InputProblem::NoLayers));
        }
        for (i, l) in shape.layers.iter().enumerate() {
            check_shapes(Some(i), l, &checked.layer_mats)?;
        }
        check_shapes(None, &shape.tail, &checked.tail_mats)?;
        let stats = dev.stats();
        let refuse = |r: Reason| {
            stats.record_placement(crate::OpKind::Block, Decision::Cpu(r.key()), 0);
            Ok(Placed::Cpu(r))
        };
        if let Support::No(r) = dev.supports(&cfg.desc()) {
            return refuse(r);
        }
        let mut formats = Vec::with_capacity(shape.layers.len());
        for l in &shape.layers {
            let mut f = Vec::with_capacity(l.len());
            for (m, &(_, k)) in l.iter().zip(&checked.layer_mats) {
                match group_format(&m.name, &m.parts, k) {
                    Ok(x) => f.push(x),
                    Err(r) => return refuse(r),
                }
            }
            formats.push(f);
        }
        let tier = if formats
            .iter()
            .flatten()
            .all(|&f| f == PackedFormat::F16Tiles)
        {
            Tier::Hmx
        } else {
            Tier::Hvx
        };
        let tail_formats: Vec<_> = shape
            .tail
            .iter()
            .zip(&checked.tail_mats)
            .map(|(m, &(n, k))| route_tail(dev, m, n, k))
            .collect();
        // The weight file's room, per layer and the tail's, in consumption order.
        let len = |f: PackedFormat, n: usize, k: usize| match f {
            PackedFormat::F16Tiles => layout::f16_tiles_len(n, k),
            PackedFormat::Q4_0Tiles => layout::q4_0_tiles_len(n, k),
        };
        let mut lens: Vec<Vec<usize>> = formats
            .iter()
            .map(|f| {
                f.iter()
                    .zip(&checked.layer_mats)
                    .map(|(&f, &(n, k))| len(f, n, k))
                    .collect()
            })
            .collect();
        lens.push(
            tail_formats
                .iter()
                .zip(&checked.tail_mats)
                .filter_map(|(f, &(n, k))| f.as_ref().ok().map(|&f| len(f, n, k)))
                .collect(),
        );
        fit::check(dev, &lens, pinned_bytes(cfg, &checked, shape.layers.len()))?;
        let host = HostWeights::new(dev, lens.iter().flatten().copied())?;
        Ok(Placed::Npu(HexTransformerBuilder {
            dev: dev.clone(),
            cfg: cfg.clone(),
            checked,
            shape: shape.clone(),
            formats,
            tail_formats,
            tier,
            host,
            pinned: Pinned::default(),
            layers: Vec::new(),
        }))
    }
}

/// Bytes the pinned vectors will take (norm weights and the rotary tables; biases, which few
/// models have, are not counted): what the fit check sets aside before anything is read.
fn pinned_bytes(cfg: &HexTransformerConfig, c: &Checked, layers: usize) -> u64 {
    let vecs = |v: &[usize]| {
        v.iter()
            .map(|&n| crate::memory::align_tensor(4 * n))
            .sum::<usize>()
    };
    let rope = 2 * crate::memory::align_tensor(4 * cfg.max_positions * cfg.head_dim / 2);
    (layers * vecs(&c.layer_vecs) + vecs(&c.tail_vecs) + rope) as u64
}

/// A tail matrix is routed like a linear layer (deny-list, dtype, alignment); the runtime
/// places its weights with the others. The decision is counted.
fn route_tail(
    dev: &HexagonDevice,
    m: &MatrixShape,
    n: usize,
    k: usize,
) -> std::result::Result<PackedFormat, Reason> {
    let desc = OpDesc::Linear {
        weights: m.parts[0].1.clone(),
        n,
        k,
        rows: 1,
        dtype: candle_core::DType::F32,
    };
    let kind = desc.kind();
    let decision = match dev.supports(&desc) {
        Support::Yes(tier) => group_format(&m.name, &m.parts, k).map(|f| (f, tier)),
        Support::No(reason) => Err(reason),
    };
    match decision {
        Ok((f, tier)) => {
            let bytes = match f {
                PackedFormat::F16Tiles => layout::f16_tiles_len(n, k),
                PackedFormat::Q4_0Tiles => layout::q4_0_tiles_len(n, k),
            } as u64;
            dev.stats()
                .record_placement(kind, Decision::Npu(tier), bytes);
            Ok(f)
        }
        Err(reason) => {
            dev.stats()
                .record_placement(kind, Decision::Cpu(reason.key()), 0);
            Err(reason)
        }
    }
}

/// Check `w` against its declared shape, then pack its vectors and (where `formats` has one) its
/// matrices.
fn pack_layer(
    layer: Option<usize>,
    w: &LayerWeights<'_>,
    declared: &[MatrixShape],
    formats: &[Option<PackedFormat>],
    mats: &[(usize, usize)],
    host: &mut HostWeights,
    pinned: &mut Pinned,
) -> Result<PackedLayer> {
    // Rows and packed format must be as declared (a dense part may come in another float type:
    // every float type packs to the same fp16 tiles).
    let packs = |s: &MatrixShape| -> Vec<(usize, &'static str)> {
        let label = |f| match packed::format_for(f) {
            Ok(PackedFormat::F16Tiles) => "fp16 tiles",
            Ok(PackedFormat::Q4_0Tiles) => "Q4_0 tiles",
            Err(_) => "cpu only",
        };
        s.parts.iter().map(|(r, f)| (*r, label(f))).collect()
    };
    for (m, d) in w.matrices.iter().zip(declared) {
        let got = matrix_shape(m)?;
        let (parts, declared) = (packs(&got), packs(d));
        if parts != declared {
            return Err(invalid(InputProblem::DeclaredParts {
                layer,
                matrix: m.name.clone(),
                parts,
                declared,
            }));
        }
    }
    let vectors = w
        .vectors
        .iter()
        .map(|(_, t)| Ok(pinned.push(crate::ops::to_f32_vec(t)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut matrices = Vec::with_capacity(w.matrices.len());
    for ((m, &(_, k)), f) in w.matrices.iter().zip(mats).zip(formats) {
        matrices.push(match f {
            Some(f) => {
                let (parts, biases): (Vec<_>, Vec<_>) =
                    m.parts.iter().map(|(_, p)| (p.weight, p.bias)).unzip();
                Some(PackedLinear::pack(
                    m.name.clone(),
                    &parts,
                    &biases,
                    *f,
                    k,
                    host,
                    pinned,
                )?)
            }
            None => None,
        });
    }
    Ok(PackedLayer { vectors, matrices })
}

impl HexTransformerBuilder {
    /// Layers packed so far.
    pub fn layers_pushed(&self) -> usize {
        self.layers.len()
    }

    /// Pack the next layer's weights (checked against the program and the declared shape); the
    /// caller may drop them as soon as this returns.
    pub fn push_layer(&mut self, w: &LayerWeights<'_>) -> Result<()> {
        let i = self.layers.len();
        if i >= self.shape.layers.len() {
            return Err(invalid(InputProblem::ExtraLayer {
                layer: i,
                layers: self.shape.layers.len(),
            }));
        }
        let c = &self.checked;
        check_layer(Some(i), w, &c.layer_vecs, &c.layer_mats)?;
        let formats: Vec<_> = self.formats[i].iter().map(|&f| Some(f)).collect();
        let l = pack_layer(
            Some(i),
            w,
            &self.shape.layers[i],
            &formats,
            &c.layer_mats,
            &mut self.host,
            &mut self.pinned,
        )?;
        self.layers.push(l);
        Ok(())
    }

    /// Pack the tail and the rotary tables `(positions, head_dim / 2)` (the first
    /// `max_positions` rows are kept) after the last layer: the finished module.
    pub fn finish(
        mut self,
        tail: &LayerWeights<'_>,
        rope_cos: &Tensor,
        rope_sin: &Tensor,
    ) -> Result<HexTransformer> {
        let cfg = &self.cfg;
        if self.layers.len() != self.shape.layers.len() {
            return Err(invalid(InputProblem::Unfinished {
                pushed: self.layers.len(),
                layers: self.shape.layers.len(),
            }));
        }
        let half = cfg.head_dim / 2;
        for (what, t) in [("rotary cosines", rope_cos), ("rotary sines", rope_sin)] {
            if t.rank() != 2 || t.dim(0)? < cfg.max_positions || t.dim(1)? != half {
                return Err(invalid(InputProblem::RopeTable {
                    what,
                    found: t.dims().to_vec(),
                    positions: cfg.max_positions,
                    half,
                }));
            }
        }
        let c = &self.checked;
        check_layer(None, tail, &c.tail_vecs, &c.tail_mats)?;
        let table = |t: &Tensor| -> Result<Vec<f32>> {
            crate::ops::to_f32_vec(&t.narrow(0, 0, cfg.max_positions)?.flatten_all()?)
        };
        let formats: Vec<_> = self.tail_formats.iter().map(|f| f.clone().ok()).collect();
        let tail_layer = pack_layer(
            None,
            tail,
            &self.shape.tail,
            &formats,
            &c.tail_mats,
            &mut self.host,
            &mut self.pinned,
        )?;
        let cos = self.pinned.push(table(rope_cos)?);
        let sin = self.pinned.push(table(rope_sin)?);
        let tail_cut = c
            .program
            .tail
            .iter()
            .enumerate()
            .find_map(|(j, node)| match node {
                Node::MatMul { weight, .. } => {
                    self.tail_formats[*weight].clone().err().map(|r| (j, r))
                }
                _ => None,
            });
        // Only the pinned vectors are mapped now; the runtime places the weights.
        let pinned = self.pinned.map(&self.dev)?;
        let t = HexTransformer {
            inner: Arc::new(Inner {
                dev: self.dev.clone(),
                cfg: self.cfg.clone(),
                program: self.checked,
                layers: self.layers,
                tail: tail_layer,
                tail_cut,
                cos,
                sin,
                pinned,
                runtime: Runtime::new(&self.dev, self.host.seal(&self.dev)),
                tier: self.tier,
                plans: Mutex::new(plan::PlanCache::default()),
            }),
        };
        let bytes = t.packed_bytes();
        self.dev.stats().record_placement(
            crate::OpKind::Block,
            Decision::Npu(self.tier),
            bytes as u64,
        );
        Ok(t)
    }
}
