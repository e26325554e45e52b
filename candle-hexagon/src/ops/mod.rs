//! candle ops that run on the NPU, each beside the CPU implementation it falls back to and a
//! named slow reference the tests compare against.
//!
//! | op | NPU kernel | CPU fallback (what a CPU model runs) | slow reference |
//! |---|---|---|---|
//! | [`HexLinear`] | `MATMUL_F16` (HMX tiles) / `MATMUL_Q4_0` (+ `ADD` bias) | matmul / `QMatMul` on the unpacked weights | [`linear::linear_slow`] |
//! | [`flash_attn`] | `FLASH_ATTN` (f16 K/V, GQA) | candle-nn CPU flash attention | [`attention::attention_slow`] |
//! | [`rms_norm`] | `RMS_NORM` | `candle_nn::ops::rms_norm` | [`norm::rms_norm_slow`] |
//! | [`swiglu`] | `SWIGLU` | `silu(gate) * up` | [`elementwise::swiglu_slow`] |
//! | [`rope`] | `ROPE_NEOX` | `candle_nn::rotary_emb::rope_thd` | [`elementwise::rope_slow`] |
//!
//! Every call goes through [`crate::HexagonDevice::supports`] and is counted. On the NPU path the
//! inputs are copied (and converted: bf16 -> f32, K/V -> f16) into the device's shared staging
//! buffer, one batch is submitted, the fence is awaited, and the result is copied into a new
//! `CpuStorage`: candle's storage is closed, so the copies are the price of the seam (counted as
//! bytes staged).

pub mod attention;
pub mod elementwise;
pub mod linear;
pub mod norm;

pub use attention::flash_attn;
pub use elementwise::{rope, swiglu};
pub use linear::HexLinear;
pub use norm::rms_norm;

use candle_core::{CpuStorage, DType, Layout};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kernels_dsp::*;

use crate::error::{Error, Result};
use crate::memory::{align_tensor, SharedMemory};

/// The element type of a tensor in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    F32,
    F16,
    I32,
}

impl Wire {
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
    let (a, b) = l.contiguous_offsets().ok_or_else(|| Error::InvalidInput {
        op: what,
        detail: "input is not contiguous".into(),
    })?;
    v.get(a..b).ok_or_else(|| Error::InvalidInput {
        op: what,
        detail: format!(
            "layout range {a}..{b} outside a storage of {} elements",
            v.len()
        ),
    })
}

/// Copy a contiguous tensor into shared memory at `off` as `wire`; returns the bytes written.
pub(crate) fn stage_in(
    shm: &SharedMemory,
    off: usize,
    s: &CpuStorage,
    l: &Layout,
    wire: Wire,
    what: &'static str,
) -> Result<usize> {
    let n = l.shape().elem_count();
    // SAFETY (all arms): the staging buffer is locked by the caller for this call and the DSP is
    // idle on it until the batch is submitted; offsets come from a StagePlan (128-aligned).
    match (s, wire) {
        (CpuStorage::F32(v), Wire::F32) => {
            let src = contiguous(v, l, what)?;
            unsafe { shm.slice_mut::<f32>(off, n)? }.copy_from_slice(src);
        }
        (CpuStorage::F32(v), Wire::F16) => {
            let src = contiguous(v, l, what)?;
            unsafe { shm.slice_mut::<f16>(off, n)? }.convert_from_f32_slice(src);
        }
        (CpuStorage::F16(v), Wire::F16) => {
            let src = contiguous(v, l, what)?;
            unsafe { shm.slice_mut::<f16>(off, n)? }.copy_from_slice(src);
        }
        (CpuStorage::F16(v), Wire::F32) => {
            let src = contiguous(v, l, what)?;
            src.convert_to_f32_slice(unsafe { shm.slice_mut::<f32>(off, n)? });
        }
        (CpuStorage::BF16(v), Wire::F32) => {
            let src = contiguous(v, l, what)?;
            let dst = unsafe { shm.slice_mut::<f32>(off, n)? };
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s.to_f32();
            }
        }
        (CpuStorage::BF16(v), Wire::F16) => {
            let src = contiguous(v, l, what)?;
            let dst = unsafe { shm.slice_mut::<f16>(off, n)? };
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f16::from_f32(s.to_f32());
            }
        }
        (s, w) => {
            return Err(Error::InvalidInput {
                op: what,
                detail: format!("cannot stage {:?} as {w:?}", dtype_of(s)),
            })
        }
    }
    Ok(n * wire.size())
}

/// Copy `n` elements of `wire` at `off` out of shared memory as a `dtype` storage.
pub(crate) fn stage_out(
    shm: &SharedMemory,
    off: usize,
    n: usize,
    wire: Wire,
    dtype: DType,
) -> Result<CpuStorage> {
    // SAFETY: the batch that wrote the range has completed (its fence was awaited) and the
    // staging buffer is still locked by the caller.
    Ok(match wire {
        Wire::F32 => {
            let src = unsafe { shm.slice::<f32>(off, n)? };
            match dtype {
                DType::F32 => CpuStorage::F32(src.to_vec()),
                DType::F16 => CpuStorage::F16(src.iter().map(|&x| f16::from_f32(x)).collect()),
                DType::BF16 => CpuStorage::BF16(src.iter().map(|&x| bf16::from_f32(x)).collect()),
                dt => return Err(unstageable(dt)),
            }
        }
        Wire::F16 => {
            let src = unsafe { shm.slice::<f16>(off, n)? };
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
    Error::InvalidInput {
        op: "stage",
        detail: format!("cannot return {dt:?} from the NPU"),
    }
}

/// The `f32` values of a (small) tensor, e.g. a norm weight or rope table.
pub(crate) fn to_f32_vec(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}
