//! Weight-owning layers: [`Linear`] (`y = x W^T + b`) and [`Embedding`] (row gather), over the
//! weights a checkpoint hands over as a [`Param`].
//!
//! For inference on the CPU the weights are packed once, at load time, for `kernels-cpu`
//! ([`CpuLinear`], a candle custom op like candle's own `QTensor`): GGUF Q4_0 / Q8_0 / Q4_K / Q6_K
//! into 32-row SIMD tiles (Q4_0 byte for byte the NPU's tile layout), dense weights into the
//! NPU's HMX tile order, half-precision weights (F16/BF16 from GGUF or safetensors) kept half in
//! memory. Training keeps candle tensors (differentiable), the Hexagon backend owns NPU-resident
//! weights ([`Linear::Hex`]), and GGUF types kernels-cpu has no kernel for stay on candle's
//! `QMatMul`.

use std::sync::Arc;

#[cfg(not(feature = "hexagon"))]
use crate::hexagon_off::HexLinear;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Module, Shape, Tensor};
#[cfg(feature = "hexagon")]
use candle_hexagon::{HexLinear, Placed};
use kernels_cpu::{DenseMatrix, DenseType, DenseView, GgmlType, QuantMatrix, QuantView};

use crate::backend::Backend;
use crate::role::Role;
use crate::{CanvasDefect, Error, Result};

/// The dense tensor of `p` (the parameter of `role`), dequantized when it is quantized.
pub(crate) fn dense(p: Param, role: Role) -> Result<Tensor> {
    match p {
        Param::Dense(t) => Ok(t),
        Param::Quant(q) => Ok(q.dequantize(&q.device()).map_err(|e| Error::Dequantize {
            tensor: format!("{role:?}"),
            reason: e.to_string(),
        })?),
    }
}

/// A weight as it comes out of a checkpoint.
#[derive(Debug, Clone)]
pub enum Param {
    /// A dense tensor: in the compute dtype, or (matrices for inference) in the half-precision
    /// dtype the checkpoint stores.
    Dense(Tensor),
    /// A GGUF tensor kept in its file type (row-major `(rows, cols)`): quantized blocks, or
    /// F16/BF16 matrices kept half in memory.
    Quant(Arc<QTensor>),
}

/// Which implementation runs the linear layers of a model built on the CPU: a field of the
/// model's [`CpuOptions`] (and of `LoadOptions`), fixed when it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuLinears {
    /// kernels-cpu GEMMs over weights packed once at load ([`CpuLinear`]).
    #[default]
    Packed,
    /// candle: its f32 gemm over compute-dtype tensors stored `(in, out)`, and `QMatMul` over
    /// GGUF blocks. The path before kernels-cpu, kept to compare against and to bisect.
    Candle,
}

/// How a model runs its CPU work, fixed when it is built and held by its weights: nothing here is
/// process-wide, so two models in one process can differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuOptions {
    /// What runs the linear layers.
    pub linears: CpuLinears,
    /// A pool of this many threads (in `1..=`[`crate::threads::MAX_THREADS`]) owned by the model,
    /// on which every forward, refresh and re-score of it runs its CPU kernels (the kernels-cpu
    /// GEMMs and attention, candle's gemm). `None`: the caller's current rayon pool (rayon's
    /// global pool unless the caller installed another).
    pub threads: Option<usize>,
    /// Element type of the K/V cache the model's sequences keep on the host: `F32`, `F16` or
    /// `BF16` (anything else is an error when the model is built); `None` (default): the compute
    /// dtype. Keys and values are rounded to it when written (f16: half the bytes of f32, as
    /// llama.cpp keeps its cache by default); attention reads it widened to f32. The NPU keeps
    /// its own cache in fp16, so with the stack on the NPU only `F16` is accepted.
    pub kv_dtype: Option<DType>,
}

/// The kernels-cpu type of a ggml dtype, when it has a kernel.
fn kernel_type(dt: GgmlDType) -> Option<GgmlType> {
    Some(match dt {
        GgmlDType::F32 => GgmlType::F32,
        GgmlDType::F16 => GgmlType::F16,
        GgmlDType::BF16 => GgmlType::BF16,
        GgmlDType::Q4_0 => GgmlType::Q4_0,
        GgmlDType::Q8_0 => GgmlType::Q8_0,
        GgmlDType::Q4K => GgmlType::Q4K,
        GgmlDType::Q6K => GgmlType::Q6K,
        _ => return None,
    })
}

/// Packed weights of either kernel family.
#[derive(Debug)]
enum Packed {
    Quant(QuantMatrix),
    Dense(DenseMatrix),
    /// Tiles another owner packed (the NPU module's host bytes), read in place.
    Shared(TileFormat, SharedTiles),
}

/// Bytes another owner holds (the NPU module's weight file in shared memory), read in place.
struct SharedTiles(Box<dyn AsRef<[u8]> + Send + Sync>);

impl std::ops::Deref for SharedTiles {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl std::fmt::Debug for SharedTiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedTiles({} bytes)", self.len())
    }
}

/// The NPU tile layouts kernels-cpu reads directly (byte for byte its own packed layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileFormat {
    /// fp16 HMX weight tiles (`KDSP_LAYOUT_HMX_WEIGHT_TILES`).
    F16Hmx,
    /// Q4_0 tiles (`KDSP_LAYOUT_Q4_0_TILES`).
    Q4_0,
}

impl Packed {
    fn gemm_uninit(
        &self,
        n: usize,
        k: usize,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        dst: &mut [std::mem::MaybeUninit<f32>],
    ) -> kernels_cpu::Result<()> {
        match self {
            Packed::Quant(q) => q.view().gemm_uninit(x, rows, bias, dst),
            Packed::Dense(d) => d.view().gemm_uninit(x, rows, bias, dst),
            Packed::Shared(TileFormat::Q4_0, b) => {
                QuantView::q4_0_tiles(b, n, k)?.gemm_uninit(x, rows, bias, dst)
            }
            Packed::Shared(TileFormat::F16Hmx, b) => {
                DenseView::hmx_f16_tiles(b, n, k)?.gemm_uninit(x, rows, bias, dst)
            }
        }
    }
}

/// A linear layer whose weights are packed for kernels-cpu; applying it is one GEMM with the
/// bias fused, on the current rayon pool (f32 activations; other dtypes are converted).
#[derive(Debug, Clone)]
pub struct CpuLinear {
    w: Arc<Packed>,
    bias: Option<Arc<Vec<f32>>>,
    n: usize,
    k: usize,
}

impl CpuLinear {
    /// Pack a GGUF tensor; `None` for a ggml type kernels-cpu has no kernel for.
    pub fn from_qtensor(q: &QTensor, bias: Option<&Tensor>) -> Result<Option<Self>> {
        let Some(ty) = kernel_type(q.dtype()) else {
            return Ok(None);
        };
        let (n, k) = q.shape().dims2()?;
        let data = q.data()?;
        let w = match DenseType::of(ty) {
            Some(dt) => Packed::Dense(DenseMatrix::from_row_major(dt, n, k, &data)?),
            None => Packed::Quant(QuantMatrix::from_ggml(ty, n, k, &data)?),
        };
        Ok(Some(Self::with(w, bias, n, k)?))
    }

    /// Pack a quantized matrix from its ggml blocks in the caller's memory (`n` rows of `k`
    /// values of `dt`; a mapped file: no copy of the blocks on the way); `None` for a type
    /// kernels-cpu has no quantized kernel for.
    pub fn from_ggml_blocks(
        dt: GgmlDType,
        n: usize,
        k: usize,
        blocks: &[u8],
    ) -> Result<Option<Self>> {
        let Some(ty) = kernel_type(dt).filter(|t| DenseType::of(*t).is_none()) else {
            return Ok(None);
        };
        let w = Packed::Quant(QuantMatrix::from_ggml(ty, n, k, blocks)?);
        Ok(Some(Self::with(w, None, n, k)?))
    }

    /// Read `n x k` tiles packed by another owner in place (no copy): the NPU module's host
    /// bytes, so that a CPU path beside the NPU runs on the same weights. The length is checked.
    pub fn from_shared_tiles(
        format: TileFormat,
        n: usize,
        k: usize,
        bytes: impl AsRef<[u8]> + Send + Sync + 'static,
        bias: Option<&Tensor>,
    ) -> Result<Self> {
        let bytes = SharedTiles(Box::new(bytes));
        match format {
            TileFormat::Q4_0 => drop(QuantView::q4_0_tiles(&bytes, n, k)?),
            TileFormat::F16Hmx => drop(DenseView::hmx_f16_tiles(&bytes, n, k)?),
        }
        Self::with(Packed::Shared(format, bytes), bias, n, k)
    }

    /// Whether the weights are another owner's bytes read in place ([`Self::from_shared_tiles`]).
    pub fn is_shared(&self) -> bool {
        matches!(&*self.w, Packed::Shared(..))
    }

    /// `(owned, shared)`: bytes of weights this layer holds itself, and bytes it reads in place
    /// from another owner ([`Self::from_shared_tiles`]).
    pub fn weight_bytes(&self) -> (usize, usize) {
        match &*self.w {
            Packed::Quant(q) => (q.view().bytes().len(), 0),
            Packed::Dense(d) => (d.view().bytes().len(), 0),
            Packed::Shared(_, b) => (0, b.len()),
        }
    }

    /// Pack a dense `(out, in)` weight, keeping f16/bf16 half and anything else as f32. A
    /// contiguous CPU tensor is packed from its own storage (no copy of the matrix on the way).
    pub fn from_dense(weight: &Tensor, bias: Option<&Tensor>) -> Result<Self> {
        let (n, k) = weight.dims2()?;
        let f32_weight;
        let weight = match weight.dtype() {
            DType::F16 | DType::BF16 | DType::F32 => weight,
            _ => {
                f32_weight = weight.to_dtype(DType::F32)?;
                &f32_weight
            }
        };
        let (storage, layout) = weight.storage_and_layout();
        let packed = match (&*storage, layout.contiguous_offsets()) {
            (candle_core::Storage::Cpu(CpuStorage::F16(v)), Some((a, b))) => {
                Some(DenseMatrix::from_f16(&v[a..b], n, k)?)
            }
            (candle_core::Storage::Cpu(CpuStorage::BF16(v)), Some((a, b))) => {
                Some(DenseMatrix::from_bf16(&v[a..b], n, k)?)
            }
            (candle_core::Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => {
                Some(DenseMatrix::from_f32(&v[a..b], n, k)?)
            }
            _ => None,
        };
        drop(storage);
        let w = match packed {
            Some(w) => w,
            None => match weight.dtype() {
                DType::F16 => DenseMatrix::from_f16(&weight.flatten_all()?.to_vec1()?, n, k)?,
                DType::BF16 => DenseMatrix::from_bf16(&weight.flatten_all()?.to_vec1()?, n, k)?,
                _ => DenseMatrix::from_f32(&weight.flatten_all()?.to_vec1()?, n, k)?,
            },
        };
        Self::with(Packed::Dense(w), bias, n, k)
    }

    /// Dense tiles packed by the caller (a loader that streams rows from its file into them).
    pub fn from_packed(w: DenseMatrix) -> Self {
        let (n, k) = w.view().dims();
        Self {
            w: Arc::new(Packed::Dense(w)),
            bias: None,
            n,
            k,
        }
    }

    /// The same weights (shared, not copied) with `bias` fused.
    pub fn with_bias(&self, bias: Option<&Tensor>) -> Result<Self> {
        Ok(Self {
            w: self.w.clone(),
            bias: Self::bias_values(bias, self.n)?,
            n: self.n,
            k: self.k,
        })
    }

    fn with(w: Packed, bias: Option<&Tensor>, n: usize, k: usize) -> Result<Self> {
        Ok(Self {
            w: Arc::new(w),
            bias: Self::bias_values(bias, n)?,
            n,
            k,
        })
    }

    fn bias_values(bias: Option<&Tensor>, n: usize) -> Result<Option<Arc<Vec<f32>>>> {
        Ok(match bias {
            Some(b) => {
                let v: Vec<f32> = b.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
                if v.len() != n {
                    return Err(Error::Shape {
                        what: "bias".into(),
                        expected: vec![n],
                        got: vec![v.len()],
                    });
                }
                Some(Arc::new(v))
            }
            None => None,
        })
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// A short description of the packed weights (`q4_0 tiles`, `f16 hmx tiles`, ...).
    pub fn describe(&self) -> String {
        match &*self.w {
            Packed::Quant(q) => format!("{:?} tiles", q.view().format()).to_lowercase(),
            Packed::Dense(d) => format!("{:?} hmx tiles", d.view().dtype()).to_lowercase(),
            Packed::Shared(TileFormat::Q4_0, _) => "q4_0 tiles (the npu's bytes)".into(),
            Packed::Shared(TileFormat::F16Hmx, _) => "f16 hmx tiles (the npu's bytes)".into(),
        }
    }

    /// Apply to `x` of shape `(..., in)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        let y = x
            .to_dtype(DType::F32)?
            .contiguous()?
            .apply_op1_no_bwd(self)?;
        Ok(y.to_dtype(dt)?)
    }

    /// Row `row` of the weights as f32 (the embedding gather of a tied LM head).
    pub fn row(&self, row: usize, out: &mut [f32]) -> Result<()> {
        match &*self.w {
            Packed::Quant(q) => q.view().dequantize_row(row, out)?,
            Packed::Dense(d) => d.view().row(row, out)?,
            Packed::Shared(TileFormat::Q4_0, b) => {
                QuantView::q4_0_tiles(b, self.n, self.k)?.dequantize_row(row, out)?
            }
            Packed::Shared(TileFormat::F16Hmx, b) => {
                DenseView::hmx_f16_tiles(b, self.n, self.k)?.row(row, out)?
            }
        }
        Ok(())
    }
}

impl CustomOp1 for CpuLinear {
    fn name(&self) -> &'static str {
        "kernels-cpu-linear"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(x) = storage else {
            candle_core::bail!("kernels-cpu linear: activations must be f32")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("kernels-cpu linear: activations must be contiguous")
        };
        let dims = layout.shape().dims();
        if dims.last() != Some(&self.k) {
            candle_core::bail!(
                "kernels-cpu linear: input of shape {dims:?} for a layer of {} inputs",
                self.k
            )
        }
        let rows = (end - start) / self.k;
        let len = rows * self.n;
        let mut out: Vec<f32> = Vec::with_capacity(len);
        let bias = self.bias.as_deref().map(|b| b.as_slice());
        let x = &x[start..end];
        let dst = &mut out.spare_capacity_mut()[..len];
        let r = self.w.gemm_uninit(self.n, self.k, x, rows, bias, dst);
        r.map_err(|e| candle_core::Error::Msg(format!("kernels-cpu linear: {e}")))?;
        // SAFETY: the GEMM succeeded, and it writes every one of the `len` elements.
        unsafe { out.set_len(len) };
        let mut shape = dims.to_vec();
        *shape.last_mut().expect("rank >= 1") = self.n;
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }
}

/// `y = x W^T (+ b)` over dense or quantized weights.
#[derive(Debug, Clone)]
pub enum Linear {
    /// Dense candle tensor (training, and dense weights before [`Linear::for_inference`]).
    Dense {
        /// Weight `(out, in)` as in the checkpoint, or `(in, out)` contiguous when `transposed`.
        weight: Tensor,
        /// Stored as `(in, out)` ([`CpuLinears::Candle`] inference).
        transposed: bool,
        /// Optional bias `(out)`.
        bias: Option<Tensor>,
    },
    /// Weights packed in Hexagon NPU memory (fp16 HMX tiles or Q4_0 tiles), bias included.
    Hex(HexLinear),
    /// Weights packed for the kernels-cpu GEMMs (quantized tiles or HMX-order dense tiles).
    Cpu(CpuLinear),
    /// A GGUF type kernels-cpu has no kernel for, through candle's `QMatMul`.
    Quant {
        /// The quantized matmul.
        weight: QMatMul,
        /// Optional bias `(out)`.
        bias: Option<Tensor>,
        /// Output features.
        out_dim: usize,
        /// Input features.
        in_dim: usize,
    },
}

impl Linear {
    /// Build from a checkpoint parameter: dense tensors stay candle tensors (differentiable);
    /// GGUF tensors are packed for kernels-cpu (or use `QMatMul` for types it lacks, and for
    /// every type under [`CpuLinears::Candle`]).
    pub fn new(weight: Param, bias: Option<Tensor>, which: CpuLinears) -> Result<Self> {
        Ok(match weight {
            Param::Dense(weight) => Linear::Dense {
                weight,
                transposed: false,
                bias,
            },
            Param::Quant(q) => {
                let packed = match which {
                    CpuLinears::Packed => CpuLinear::from_qtensor(&q, bias.as_ref())?,
                    CpuLinears::Candle => None,
                };
                match packed {
                    Some(c) => Linear::Cpu(c),
                    None => {
                        let (out_dim, in_dim) = q.shape().dims2()?;
                        Linear::Quant {
                            weight: QMatMul::from_arc(q)?,
                            bias,
                            out_dim,
                            in_dim,
                        }
                    }
                }
            }
        })
    }

    /// Build from a checkpoint parameter on `backend`: on the Hexagon NPU when the device takes
    /// the weights (dense -> fp16 tiles, Q4_0 -> Q4_0 tiles), otherwise exactly [`Linear::new`]
    /// (the device counts the decision and its reason).
    pub fn on_backend(
        weight: Param,
        bias: Option<Tensor>,
        backend: &Backend,
        which: CpuLinears,
    ) -> Result<Self> {
        let Some(dev) = backend.hexagon() else {
            return Linear::new(weight, bias, which);
        };
        #[cfg(not(feature = "hexagon"))]
        match *dev {}
        #[cfg(feature = "hexagon")]
        Self::place_on(dev, weight, bias, which)
    }

    #[cfg(feature = "hexagon")]
    fn place_on(
        dev: &candle_hexagon::HexagonDevice,
        weight: Param,
        bias: Option<Tensor>,
        which: CpuLinears,
    ) -> Result<Self> {
        let placed = match &weight {
            Param::Dense(t) => HexLinear::from_dense(dev, t, bias.as_ref())?,
            // Half-precision GGUF matrices are dense weights to the NPU.
            Param::Quant(q)
                if kernel_type(q.dtype()).is_some_and(|t| DenseType::of(t).is_some()) =>
            {
                HexLinear::from_dense(dev, &q.dequantize(&q.device())?, bias.as_ref())?
            }
            Param::Quant(q) => HexLinear::from_qtensor(dev, q, bias.as_ref())?,
        };
        match placed {
            Placed::Npu(h) => Ok(Linear::Hex(h)),
            Placed::Cpu(_) => Linear::new(weight, bias, which),
        }
    }

    /// Prepare for inference: pack a dense weight for the kernels-cpu GEMM (f16/bf16 stay half;
    /// no-op for other kinds). Under [`CpuLinears::Candle`], store it `(in, out)` contiguous
    /// instead (candle's gemm runs 1.2-2x faster on a contiguous right-hand side).
    pub fn for_inference(self, which: CpuLinears) -> Result<Self> {
        Ok(match self {
            Linear::Dense {
                weight,
                transposed: false,
                bias,
            } if which == CpuLinears::Candle => Linear::Dense {
                weight: weight.t()?.contiguous()?,
                transposed: true,
                bias,
            },
            Linear::Dense { .. } if which == CpuLinears::Candle => self,
            Linear::Dense {
                weight,
                transposed,
                bias,
            } => {
                let w = if transposed { weight.t()? } else { weight };
                Linear::Cpu(CpuLinear::from_dense(&w, bias.as_ref())?)
            }
            other => other,
        })
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Linear::Dense {
                weight, transposed, ..
            } => {
                let d = weight.dims();
                if *transposed {
                    (d[1], d[0])
                } else {
                    (d[0], d[1])
                }
            }
            Linear::Hex(h) => h.dims(),
            Linear::Cpu(c) => c.dims(),
            Linear::Quant {
                out_dim, in_dim, ..
            } => (*out_dim, *in_dim),
        }
    }

    /// Apply to `x` of shape `(..., in)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match self {
            Linear::Dense {
                weight, transposed, ..
            } => {
                let dims = x.dims().to_vec();
                let k = dims[dims.len() - 1];
                let rows: usize = dims[..dims.len() - 1].iter().product();
                let x2 = x.reshape((rows, k))?.to_dtype(weight.dtype())?;
                let y = if *transposed {
                    x2.matmul(weight)?
                } else {
                    x2.matmul(&weight.t()?)?
                };
                let mut out = dims.clone();
                *out.last_mut().expect("rank >= 1") = self.dims().0;
                y.reshape(out)?.to_dtype(x.dtype())?
            }
            Linear::Quant { weight, .. } => {
                let dt = x.dtype();
                weight.forward(&x.to_dtype(DType::F32)?)?.to_dtype(dt)?
            }
            // The bias is fused into these.
            Linear::Cpu(c) => return c.forward(x),
            Linear::Hex(h) => return Ok(h.forward_hex(x)?),
        };
        match self.bias() {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        }
    }

    /// `(owned, shared)` bytes of host memory the weights take: what the layer holds itself, and
    /// what it reads in place from another owner (the NPU module's packed tiles). Weights packed
    /// in NPU memory ([`Linear::Hex`]) count as neither.
    pub fn weight_bytes(&self) -> (usize, usize) {
        match self {
            Linear::Dense { weight, .. } => {
                (weight.elem_count() * weight.dtype().size_in_bytes(), 0)
            }
            Linear::Cpu(c) => c.weight_bytes(),
            Linear::Quant { weight, .. } => match weight {
                QMatMul::QTensor(q) => (q.storage_size_in_bytes(), 0),
                QMatMul::Tensor(t) | QMatMul::TensorF16(t) => {
                    (t.elem_count() * t.dtype().size_in_bytes(), 0)
                }
            },
            Linear::Hex(_) => (0, 0),
        }
    }

    fn bias(&self) -> Option<&Tensor> {
        match self {
            Linear::Dense { bias, .. } | Linear::Quant { bias, .. } => bias.as_ref(),
            Linear::Hex(_) | Linear::Cpu(_) => None,
        }
    }
}

/// Token embedding over a dense or GGUF table, or over packed tiles a loader streamed from its
/// file (shared with a tied LM head). GGUF tables stay in their file type and are gathered row by
/// row (kernels-cpu's reference dequantization; candle's for other types).
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Table,
    dtype: DType,
}

#[derive(Debug, Clone)]
enum Table {
    Param(Param),
    Packed(CpuLinear),
}

impl Embedding {
    /// Wrap a `(vocab, hidden)` table; outputs are produced in `dtype`.
    pub fn new(table: Param, dtype: DType) -> Self {
        Self {
            table: Table::Param(table),
            dtype,
        }
    }

    /// Gather rows of packed `(vocab, hidden)` weights (a table a loader streamed into tiles,
    /// the same bytes a tied LM head reads); outputs are produced in `dtype`.
    pub fn packed(table: CpuLinear, dtype: DType) -> Self {
        Self {
            table: Table::Packed(table),
            dtype,
        }
    }

    /// Rows of the table.
    pub fn rows(&self) -> Result<usize> {
        Ok(match &self.table {
            Table::Param(Param::Dense(t)) => t.dim(0)?,
            Table::Param(Param::Quant(q)) => q.shape().dims2()?.0,
            Table::Packed(c) => c.dims().0,
        })
    }

    /// `(b, n)` ids to `(b, n, hidden)`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, n) = ids.dims2()?;
        let rows = self.rows()?;
        let flat: Vec<u32> = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1()?;
        if let Some(&bad) = flat.iter().find(|&&i| i as usize >= rows) {
            return Err(CanvasDefect::TokenOutOfRange { token: bad, rows }.into());
        }
        match &self.table {
            Table::Packed(c) => {
                let hidden = c.dims().1;
                let mut out = vec![0f32; flat.len() * hidden];
                for (o, &id) in out.chunks_exact_mut(hidden).zip(&flat) {
                    c.row(id as usize, o)?;
                }
                Ok(Tensor::from_vec(out, (b, n, hidden), &Device::Cpu)?.to_dtype(self.dtype)?)
            }
            Table::Param(Param::Dense(t)) => {
                let idx = Tensor::new(flat, t.device())?;
                Ok(t.index_select(&idx, 0)?
                    .reshape((b, n, ()))?
                    .to_dtype(self.dtype)?)
            }
            Table::Param(Param::Quant(q)) => match kernel_type(q.dtype()) {
                Some(ty) => {
                    let (_, hidden) = q.shape().dims2()?;
                    let data = q.data()?;
                    let row_bytes = ty.row_bytes(hidden)?;
                    let mut out = vec![0f32; flat.len() * hidden];
                    for (o, &id) in out.chunks_exact_mut(hidden).zip(&flat) {
                        let at = id as usize * row_bytes;
                        kernels_cpu::ggml::dequantize_row(ty, &data[at..at + row_bytes], o)?;
                    }
                    Ok(Tensor::from_vec(out, (b, n, hidden), &q.device())?.to_dtype(self.dtype)?)
                }
                None => Ok(q.embedding(ids)?.to_dtype(self.dtype)?),
            },
        }
    }
}
