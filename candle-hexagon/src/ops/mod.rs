//! candle ops that run on the NPU, each beside the CPU implementation it falls back to and a
//! named slow reference the tests compare against.
//!
//! | op | NPU kernel | CPU fallback (what a CPU model runs) | slow reference |
//! |---|---|---|---|
//! | [`HexLinear`] | `MATMUL_F16` (HMX tiles) / `MATMUL_Q4_0` (+ `ADD` bias) | matmul / `QMatMul` on the unpacked weights | [`linear::linear_slow`] |
//! | [`flash_attn`], [`flash_attn_with`] (mask, causal) | `FLASH_ATTN` (f16 K/V, GQA, additive mask) | candle-nn CPU flash attention (`AttnMask`) | [`attention::attention_slow_with`] |
//! | [`rms_norm`] | `RMS_NORM` | `candle_nn::ops::rms_norm` | [`norm::rms_norm_slow`] |
//! | [`swiglu`] | `SWIGLU` | `silu(gate) * up` | [`elementwise::swiglu_slow`] |
//! | [`rope`] | `ROPE_NEOX` | `candle_nn::rotary_emb::rope_thd` | [`elementwise::rope_slow`] |
//!
//! Every call goes through [`crate::HexagonDevice::supports`] and is counted. On the NPU path the
//! inputs are copied (and converted: bf16 -> f32, K/V -> f16) into a shared staging buffer taken
//! from the device's pool, one batch is submitted, the fence is awaited, and the result is copied
//! into a new `CpuStorage`: candle's storage is closed, so the copies are the price of the seam
//! (counted as bytes staged). For a whole transformer on the NPU, see [`crate::HexTransformer`]: one
//! batch per block over resident weights, KV cache and activations.

pub mod attention;
pub mod elementwise;
pub mod linear;
pub mod norm;

pub use attention::{flash_attn, flash_attn_with, AttnOptions};
pub use elementwise::{rope, swiglu};
pub use linear::HexLinear;
pub use norm::rms_norm;

use candle_core::{CpuStorage, DType, Layout};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kernels_dsp::*;

use crate::error::{Error, InputProblem, Result};
use crate::memory::{align_tensor, DeviceBuffer};

/// Element types whose every bit pattern is a valid value (so shared bytes can be viewed as them).
pub(crate) trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for f16 {}
impl Plain for i32 {}

/// View host bytes of shared memory as `T`s.
pub(crate) fn typed_mut<T: Plain>(b: &mut [u8]) -> Result<&mut [T]> {
    let size = std::mem::size_of::<T>();
    if !(b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
        || !b.len().is_multiple_of(size)
    {
        return Err(Error::input(
            "stage",
            InputProblem::Unaligned {
                len: b.len(),
                addr: b.as_ptr() as usize,
            },
        ));
    }
    // SAFETY: aligned, whole elements, every bit pattern of T is valid; same lifetime as `b`.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut T, b.len() / size) })
}

/// View host bytes of shared memory as `T`s, read-only.
pub(crate) fn typed<T: Plain>(b: &[u8]) -> Result<&[T]> {
    let size = std::mem::size_of::<T>();
    if !(b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
        || !b.len().is_multiple_of(size)
    {
        return Err(Error::input(
            "read",
            InputProblem::Unaligned {
                len: b.len(),
                addr: b.as_ptr() as usize,
            },
        ));
    }
    // SAFETY: aligned, whole elements, every bit pattern of T is valid; same lifetime as `b`.
    Ok(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const T, b.len() / size) })
}

/// The element type of a tensor in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    F32,
    F16,
    I32,
}

impl Wire {
    /// The wire type's name in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wire::F32 => "f32",
            Wire::F16 => "f16",
            Wire::I32 => "i32",
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Wire::F32 | Wire::I32 => 4,
            Wire::F16 => 2,
        }
    }

    pub(crate) fn kdsp(self) -> u32 {
        match self {
            Wire::F32 => KDSP_DTYPE_F32,
            Wire::F16 => KDSP_DTYPE_F16,
            Wire::I32 => KDSP_DTYPE_I32,
        }
    }

    /// f16 stays f16; f32 and bf16 (which the kernels do not take) travel as f32.
    pub(crate) fn for_dtype(dt: DType) -> Wire {
        if dt == DType::F16 {
            Wire::F16
        } else {
            Wire::F32
        }
    }
}

/// Offsets of the tensors of one call inside the staging buffer.
#[derive(Debug, Default)]
pub(crate) struct StagePlan {
    total: usize,
}

impl StagePlan {
    /// Reserve `bytes` (128-byte aligned) and return its offset.
    pub(crate) fn push(&mut self, bytes: usize) -> usize {
        let off = self.total;
        self.total += align_tensor(bytes.max(1));
        off
    }

    /// Bytes the call needs.
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

/// A contiguous row-major tensor; `ne` innermost first (up to 4 dims).
pub(crate) fn rows(buffer: u32, offset: usize, wire: Wire, ne: &[usize]) -> kdsp_tensor {
    let mut t = kdsp_tensor {
        buffer_id: buffer,
        dtype: wire.kdsp(),
        layout: KDSP_LAYOUT_ROW_MAJOR,
        offset: offset as u64,
        ne: [1; 4],
        ..Default::default()
    };
    let mut stride = wire.size() as u64;
    for i in 0..4 {
        t.ne[i] = ne.get(i).copied().unwrap_or(1) as u32;
        t.nb[i] = stride;
        stride *= t.ne[i] as u64;
    }
    t
}

/// A tiled weight tensor `W[n][k]` (ne `{k, n}`).
pub(crate) fn tiled(
    buffer: u32,
    offset: usize,
    dtype: u32,
    layout: u32,
    k: usize,
    n: usize,
) -> kdsp_tensor {
    kdsp_tensor {
        buffer_id: buffer,
        dtype,
        layout,
        offset: offset as u64,
        ne: [k as u32, n as u32, 1, 1],
        ..Default::default()
    }
}

/// The dtype of a CPU storage.
pub(crate) fn dtype_of(s: &CpuStorage) -> DType {
    use candle_core::backend::BackendStorage;
    s.dtype()
}

fn contiguous<'a, T>(v: &'a [T], l: &Layout, what: &'static str) -> Result<&'a [T]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or(Error::input(what, InputProblem::NotContiguous))?;
    v.get(a..b).ok_or_else(|| {
        Error::input(
            what,
            InputProblem::LayoutRange {
                start: a,
                end: b,
                storage: v.len(),
            },
        )
    })
}

/// Copy a contiguous tensor into shared memory at `off` as `wire` (a checked host write);
/// returns the bytes written.
pub(crate) fn stage_in(
    buf: &DeviceBuffer,
    off: usize,
    s: &CpuStorage,
    l: &Layout,
    wire: Wire,
    what: &'static str,
) -> Result<usize> {
    let n = l.shape().elem_count();
    let bytes = n * wire.size();
    buf.with_host_bytes(off, bytes, |dst| -> Result<()> {
        match (s, wire) {
            (CpuStorage::F32(v), Wire::F32) => {
                typed_mut::<f32>(dst)?.copy_from_slice(contiguous(v, l, what)?);
            }
            (CpuStorage::F32(v), Wire::F16) => {
                typed_mut::<f16>(dst)?.convert_from_f32_slice(contiguous(v, l, what)?);
            }
            (CpuStorage::F16(v), Wire::F16) => {
                typed_mut::<f16>(dst)?.copy_from_slice(contiguous(v, l, what)?);
            }
            (CpuStorage::F16(v), Wire::F32) => {
                contiguous(v, l, what)?.convert_to_f32_slice(typed_mut::<f32>(dst)?);
            }
            (CpuStorage::BF16(v), Wire::F32) => {
                let src = contiguous(v, l, what)?;
                for (d, s) in typed_mut::<f32>(dst)?.iter_mut().zip(src) {
                    *d = s.to_f32();
                }
            }
            (CpuStorage::BF16(v), Wire::F16) => {
                let src = contiguous(v, l, what)?;
                for (d, s) in typed_mut::<f16>(dst)?.iter_mut().zip(src) {
                    *d = f16::from_f32(s.to_f32());
                }
            }
            (s, w) => {
                return Err(Error::input(
                    what,
                    InputProblem::Stage {
                        found: dtype_of(s),
                        wire: w.name(),
                    },
                ))
            }
        }
        Ok(())
    })??;
    Ok(bytes)
}

/// Copy `n` elements of `wire` at `off` out of shared memory as a `dtype` storage (a checked
/// host read).
pub(crate) fn stage_out(
    buf: &DeviceBuffer,
    off: usize,
    n: usize,
    wire: Wire,
    dtype: DType,
) -> Result<CpuStorage> {
    buf.with_host_view(off, n * wire.size(), |bytes| {
        storage_from(bytes, wire, dtype)
    })?
}

/// A `dtype` storage from shared bytes holding `wire` values.
pub(crate) fn storage_from(bytes: &[u8], wire: Wire, dtype: DType) -> Result<CpuStorage> {
    let n = bytes.len() / wire.size();
    Ok(match wire {
        Wire::F32 => {
            let src = typed::<f32>(bytes)?;
            match dtype {
                DType::F32 => CpuStorage::F32(src.to_vec()),
                DType::F16 => CpuStorage::F16(src.iter().map(|&x| f16::from_f32(x)).collect()),
                DType::BF16 => CpuStorage::BF16(src.iter().map(|&x| bf16::from_f32(x)).collect()),
                dt => return Err(unstageable(dt)),
            }
        }
        Wire::F16 => {
            let src = typed::<f16>(bytes)?;
            match dtype {
                DType::F16 => CpuStorage::F16(src.to_vec()),
                DType::F32 => {
                    let mut v = vec![0f32; n];
                    src.convert_to_f32_slice(&mut v);
                    CpuStorage::F32(v)
                }
                DType::BF16 => {
                    CpuStorage::BF16(src.iter().map(|x| bf16::from_f32(x.to_f32())).collect())
                }
                dt => return Err(unstageable(dt)),
            }
        }
        Wire::I32 => return Err(unstageable(dtype)),
    })
}

fn unstageable(dt: DType) -> Error {
    Error::input("stage", InputProblem::Unreturnable { dtype: dt })
}

/// The `f32` values of a (small) tensor, e.g. a norm weight or rope table.
pub(crate) fn to_f32_vec(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}
