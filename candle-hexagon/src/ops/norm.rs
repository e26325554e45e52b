//! RMSNorm on the NPU (`KDSP_OP_RMS_NORM`), its CPU fallback and its slow reference.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor, D};
use kernels_dsp::*;

use super::{dtype_of, rows, stage_in, stage_out, to_f32_vec, StagePlan, Wire};
use crate::device::HexagonDevice;
use crate::error::{Error, InputProblem, Result};
use crate::memory::DeviceBuffer;
use crate::routing::OpDesc;
use crate::transport::Batch;

/// `x * rsqrt(mean(x^2) + eps) * w` over the last dimension, in f32, on the NPU when routed
/// (else [`rms_norm_cpu`]). Output dtype = `x`'s.
pub fn rms_norm(dev: &HexagonDevice, x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let hidden = x.dim(D::Minus1)?;
    if w.dims() != [hidden] {
        return Err(Error::input(
            "rms_norm",
            InputProblem::NormWeight {
                found: w.dims().to_vec(),
                hidden,
            },
        ));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::input(
            "rms_norm",
            InputProblem::Eps {
                value: f64::from(eps),
            },
        ));
    }
    let n_rows = x.elem_count() / hidden.max(1);
    let wire = Wire::for_dtype(x.dtype());
    let mut plan = StagePlan::default();
    let x_off = plan.push(x.elem_count() * wire.size());
    let w_off = plan.push(hidden * 4);
    let desc = OpDesc::RmsNorm {
        rows: n_rows,
        hidden,
        dtype: x.dtype(),
    };
    dev.dispatch(
        &desc,
        plan.total(),
        |buf| {
            let call = RmsNormCall {
                dev,
                buf,
                x_off,
                w_off,
                eps,
                wire,
                hidden,
            };
            Ok(x.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &call)?)
        },
        || rms_norm_cpu(x, w, eps),
    )
}

/// The CPU path a model runs without the NPU: candle-nn's fused `rms_norm`.
pub fn rms_norm_cpu(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps)?)
}

/// Slow reference in f64: `x / sqrt(mean(x^2) + eps) * w`, returned as f32.
pub fn rms_norm_slow(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let hidden = x.dim(D::Minus1)?;
    let xs = to_f32_vec(x)?;
    let ws = to_f32_vec(w)?;
    let mut out = Vec::with_capacity(xs.len());
    for row in xs.chunks(hidden) {
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / hidden as f64;
        let r = 1.0 / (ms + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(&ws)
                .map(|(&v, &g)| (v as f64 * r * g as f64) as f32),
        );
    }
    Ok(Tensor::from_vec(out, x.shape(), &candle_core::Device::Cpu)?)
}

struct RmsNormCall<'a> {
    dev: &'a HexagonDevice,
    buf: &'a DeviceBuffer,
    x_off: usize,
    w_off: usize,
    eps: f32,
    wire: Wire,
    hidden: usize,
}

impl RmsNormCall<'_> {
    fn run(
        &self,
        s: &CpuStorage,
        l: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = l.shape().elem_count();
        let bytes_in = stage_in(self.buf, self.x_off, s, l, self.wire, "rms_norm")?
            + stage_in(self.buf, self.w_off, ws, wl, Wire::F32, "rms_norm weight")?;
        let id = self.buf.id();
        let x = rows(id, self.x_off, self.wire, &[self.hidden, n / self.hidden]);
        let w = rows(id, self.w_off, Wire::F32, &[self.hidden]);
        // In place: the kernel allows dst to alias x exactly.
        let mut o = kdsp_op::new(KDSP_OP_RMS_NORM, x, &[x, w]);
        o.params.norm.eps = self.eps;
        let mut batch = Batch::new();
        batch.push("rms_norm", o);
        self.dev.execute(&batch)?;
        let out = stage_out(self.buf, self.x_off, n, self.wire, dtype_of(s))?;
        self.dev.mem().count_staged(bytes_in, n * self.wire.size());
        Ok((out, l.shape().clone()))
    }
}

impl CustomOp2 for RmsNormCall<'_> {
    fn name(&self) -> &'static str {
        "hexagon-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok(self.run(s1, l1, s2, l2)?)
    }
}
