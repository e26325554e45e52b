//! Load-time packing for the block module: fused projections (QKV, gate/up) stacked along the
//! output dimension and packed once into fp16 HMX tiles or Q4_0 tiles (written straight into the
//! module's shared weight file, the one copy the host reads and the NPU maps; the memory runtime
//! decides where the DSP reads them from), fused biases, and the pinned f32
//! vectors (norm weights, biases, RoPE tables), mapped once into one buffer of their own.

use candle_core::{DType, Tensor};
use half::f16;
use kernels_dsp::*;

use super::WeightRef;
use crate::device::HexagonDevice;
use crate::error::{Error, InputProblem, Result};
use crate::layout;
use crate::memory::{align_tensor, WeightSlot};
use crate::ops::linear::PackedFormat;
use crate::ops::{tiled, to_f32_vec};
use crate::routing::{Reason, WeightFormat};
use crate::runtime::{virtual_id, HostWeight, HostWeights};

/// The packed format a weight of routing format `f` gets, or why it cannot be packed.
pub(crate) fn format_for(f: &WeightFormat) -> std::result::Result<PackedFormat, Reason> {
    match f {
        WeightFormat::Dense(DType::F32 | DType::F16 | DType::BF16) => Ok(PackedFormat::F16Tiles),
        WeightFormat::Dense(dt) => Err(Reason::Dtype(format!(
            "{dt:?} weights (dense weights must be float)"
        ))),
        WeightFormat::Q4_0 => Ok(PackedFormat::Q4_0Tiles),
        WeightFormat::OtherQuant(name) => Err(Reason::Dtype(format!(
            "{name} weights (the NPU kernels take Q4_0 and dense weights)"
        ))),
    }
}

/// The one format of a fused group of `(rows, format)` parts (`what` names it in the reason),
/// checked for Q4_0 alignment.
pub(crate) fn group_format(
    what: &str,
    parts: &[(usize, WeightFormat)],
    k: usize,
) -> std::result::Result<PackedFormat, Reason> {
    let mut formats = parts.iter().map(|p| format_for(&p.1));
    let first = formats.next().expect("a fused group has parts")?;
    for f in formats {
        if f? != first {
            return Err(Reason::Dtype(format!(
                "{what}: dense and Q4_0 weights cannot be fused into one matmul"
            )));
        }
    }
    if first == PackedFormat::Q4_0Tiles && !k.is_multiple_of(32) {
        return Err(Reason::Alignment(format!(
            "{what}: Q4_0 rows of {k} values are not whole 32-value blocks"
        )));
    }
    Ok(first)
}

/// `(rows, cols)` of a checkpoint weight.
pub(crate) fn dims_of(w: &WeightRef<'_>) -> Result<(usize, usize)> {
    Ok(match w {
        WeightRef::Dense(t) => t.dims2()?,
        WeightRef::Quant(q) => q.shape().dims2()?,
        WeightRef::Ggml { n, k, .. } => (*n, *k),
    })
}

/// A linear layer packed for the NPU: `y = x W^T (+ b)`, `W (n, k)`. The weight is runtime
/// weight `w` (its descriptor names a virtual buffer until the runtime places it); the bias is
/// pinned vector `bias`.
#[derive(Debug)]
pub(crate) struct PackedLinear {
    pub(crate) w: usize,
    pub(crate) format: PackedFormat,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) bias: Option<usize>,
}

impl PackedLinear {
    /// Stack `parts` (each `(n_i, k)`, one format) along the output dimension and pack them
    /// once into the shared weight file as runtime weight `name`. `biases` (one per part, or
    /// empty) become one fused pinned f32 bias (zeros where a part has none).
    pub(crate) fn pack(
        name: String,
        parts: &[WeightRef<'_>],
        biases: &[Option<&Tensor>],
        format: PackedFormat,
        k: usize,
        host: &mut HostWeights,
        pinned: &mut Pinned,
    ) -> Result<Self> {
        let widths: Vec<usize> = parts
            .iter()
            .map(|p| dims_of(p).map(|d| d.0))
            .collect::<Result<_>>()?;
        let n: usize = widths.iter().sum();
        // The packed tiles go straight into the (zero-filled) weight file.
        let len = match format {
            PackedFormat::F16Tiles => layout::f16_tiles_len(n, k),
            PackedFormat::Q4_0Tiles => layout::q4_0_tiles_len(n, k),
        };
        let w = match format {
            PackedFormat::F16Tiles => {
                let mut w16: Vec<f16> = Vec::with_capacity(n * k);
                for p in parts {
                    let WeightRef::Dense(t) = p else {
                        return Err(mixed());
                    };
                    w16.extend(t.to_dtype(DType::F16)?.flatten_all()?.to_vec1::<f16>()?);
                }
                host.push(name, len, |dst| {
                    layout::pack_f16_tiles_into(dst, &w16, n, k)
                })?
            }
            PackedFormat::Q4_0Tiles => {
                // ggml Q4_0 rows are independent blocks: stacking rows is concatenating bytes.
                let mut owned: Vec<u8> = Vec::new();
                let blocks: &[u8] = match parts {
                    // One part in the caller's bytes (a mapped file): packed from them in place.
                    [WeightRef::Ggml { bytes, .. }] => bytes,
                    _ => {
                        owned.reserve(n * k / 32 * 18);
                        for p in parts {
                            match p {
                                WeightRef::Quant(q) => owned.extend_from_slice(&q.data()?),
                                WeightRef::Ggml { bytes, .. } => owned.extend_from_slice(bytes),
                                WeightRef::Dense(_) => return Err(mixed()),
                            }
                        }
                        &owned
                    }
                };
                host.push(name, len, |dst| {
                    layout::pack_q4_0_tiles_into(dst, blocks, n, k)
                })?
            }
        };
        let bias = if biases.iter().any(Option::is_some) {
            let mut v: Vec<f32> = Vec::with_capacity(n);
            for (b, &width) in biases.iter().zip(&widths) {
                match b {
                    Some(t) => v.extend(to_f32_vec(t)?),
                    None => v.extend(std::iter::repeat_n(0.0, width)),
                }
            }
            Some(pinned.push(v))
        } else {
            None
        };
        Ok(PackedLinear {
            w,
            format,
            n,
            k,
            bias,
        })
    }

    /// The weight as a kernel operand (a virtual buffer until the runtime relocates it).
    pub(crate) fn tensor(&self) -> kdsp_tensor {
        let (dtype, layout) = match self.format {
            PackedFormat::F16Tiles => (KDSP_DTYPE_F16, KDSP_LAYOUT_HMX_WEIGHT_TILES),
            PackedFormat::Q4_0Tiles => (KDSP_DTYPE_Q4_0, KDSP_LAYOUT_Q4_0_TILES),
        };
        tiled(virtual_id(self.w), 0, dtype, layout, self.k, self.n)
    }

    /// The matmul op code.
    pub(crate) fn opcode(&self) -> u32 {
        match self.format {
            PackedFormat::F16Tiles => KDSP_OP_MATMUL_F16,
            PackedFormat::Q4_0Tiles => KDSP_OP_MATMUL_Q4_0,
        }
    }
}

/// A linear weight of a [`super::HexTransformer`] as the host holds it: the packed bytes the
/// memory runtime maps into the NPU window (in place, when the transport can) or streams through
/// staging, shared (not copied) with any host reader. `bytes` is `W[n][k]` in `format`'s tile
/// layout (fp16 HMX weight tiles or Q4_0 tiles, see [`crate::layout`]); fused groups are stacked
/// along `n`.
#[derive(Debug, Clone)]
pub struct PackedWeight {
    /// The tile layout of `bytes`.
    pub format: PackedFormat,
    /// Output features (rows of `W`).
    pub n: usize,
    /// Input features (columns of `W`).
    pub k: usize,
    /// The packed bytes (`layout::f16_tiles_len(n, k)` or `layout::q4_0_tiles_len(n, k)`): a
    /// read-only view of the module's weight file in shared memory.
    pub bytes: crate::memory::WeightBytes,
}

impl PackedLinear {
    /// The host bytes of this layer (shared) with its geometry.
    pub(crate) fn shared(&self, host: &[HostWeight]) -> PackedWeight {
        PackedWeight {
            format: self.format,
            n: self.n,
            k: self.k,
            bytes: host[self.w].bytes.clone(),
        }
    }
}

/// The pinned f32 vectors of a module (norm weights, biases, RoPE tables): always resident, in
/// one mapping of their own, in the order they were pushed (consumption order).
#[derive(Debug, Default)]
pub(crate) struct Pinned {
    vecs: Vec<Vec<f32>>,
}

impl Pinned {
    /// Add a vector; returns its index.
    pub(crate) fn push(&mut self, v: Vec<f32>) -> usize {
        self.vecs.push(v);
        self.vecs.len() - 1
    }

    /// Map them into one buffer; the slots in push order.
    pub(crate) fn map(self, dev: &HexagonDevice) -> Result<Vec<WeightSlot>> {
        let total: usize = self.vecs.iter().map(|v| align_tensor(v.len() * 4)).sum();
        let buf = std::sync::Arc::new(dev.map_buffer(total)?);
        let mut out = Vec::with_capacity(self.vecs.len());
        let mut off = 0;
        for v in &self.vecs {
            let slot = WeightSlot {
                buf: buf.clone(),
                offset: off,
                len: v.len() * 4,
            };
            slot.fill(|dst| {
                for (d, x) in dst.chunks_exact_mut(4).zip(v) {
                    d.copy_from_slice(&x.to_le_bytes());
                }
                Ok(())
            })?;
            off += align_tensor(v.len() * 4);
            out.push(slot);
        }
        dev.mem().count_weights(total as u64);
        Ok(out)
    }
}

fn mixed() -> Error {
    Error::input("HexTransformer", InputProblem::MixedGroup)
}
