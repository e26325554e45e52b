//! SwiGLU (`KDSP_OP_SWIGLU`) and NeoX RoPE (`KDSP_OP_ROPE_NEOX`) on the NPU, with their CPU
//! fallbacks and slow references.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use kernels_dsp::*;

use super::{dtype_of, rows, stage_in, stage_out, to_f32_vec, StagePlan, Wire};
use crate::device::HexagonDevice;
use crate::error::{Error, InputProblem, Result};
use crate::memory::DeviceBuffer;
use crate::routing::OpDesc;
use crate::transport::Batch;

/// `silu(gate) * up` (same shapes), on the NPU when routed (else [`swiglu_cpu`]).
pub fn swiglu(dev: &HexagonDevice, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.shape() != up.shape() || gate.dtype() != up.dtype() {
        return Err(Error::input(
            "swiglu",
            InputProblem::GateUp {
                gate: gate.dims().to_vec(),
                gate_dtype: gate.dtype(),
                up: up.dims().to_vec(),
                up_dtype: up.dtype(),
            },
        ));
    }
    let n = gate.elem_count();
    let wire = Wire::for_dtype(gate.dtype());
    let mut plan = StagePlan::default();
    let g_off = plan.push(n * wire.size());
    let u_off = plan.push(n * wire.size());
    let desc = OpDesc::Swiglu {
        elems: n,
        dtype: gate.dtype(),
    };
    dev.dispatch(
        &desc,
        plan.total(),
        |buf| {
            let call = SwigluCall {
                dev,
                buf,
                g_off,
                u_off,
                wire,
            };
            Ok(gate
                .contiguous()?
                .apply_op2_no_bwd(&up.contiguous()?, &call)?)
        },
        || swiglu_cpu(gate, up),
    )
}

/// The CPU path: `candle_nn::ops::silu(gate) * up`.
pub fn swiglu_cpu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    Ok((candle_nn::ops::silu(gate)? * up)?)
}

/// Slow reference in f64, returned as f32.
pub fn swiglu_slow(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let g = to_f32_vec(gate)?;
    let u = to_f32_vec(up)?;
    let out: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| {
            let g = g as f64;
            (g / (1.0 + (-g).exp()) * u as f64) as f32
        })
        .collect();
    Ok(Tensor::from_vec(
        out,
        gate.shape(),
        &candle_core::Device::Cpu,
    )?)
}

struct SwigluCall<'a> {
    dev: &'a HexagonDevice,
    buf: &'a DeviceBuffer,
    g_off: usize,
    u_off: usize,
    wire: Wire,
}

impl CustomOp2 for SwigluCall<'_> {
    fn name(&self) -> &'static str {
        "hexagon-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let run = || -> Result<(CpuStorage, Shape)> {
            let n = l1.shape().elem_count();
            let bytes_in = stage_in(self.buf, self.g_off, s1, l1, self.wire, "swiglu")?
                + stage_in(self.buf, self.u_off, s2, l2, self.wire, "swiglu")?;
            let id = self.buf.id();
            let g = rows(id, self.g_off, self.wire, &[n]);
            let u = rows(id, self.u_off, self.wire, &[n]);
            let mut batch = Batch::new();
            batch.push("swiglu", kdsp_op::new(KDSP_OP_SWIGLU, g, &[g, u]));
            self.dev.execute(&batch)?;
            let out = stage_out(self.buf, self.g_off, n, self.wire, dtype_of(s1))?;
            self.dev.mem().count_staged(bytes_in, n * self.wire.size());
            Ok((out, l1.shape().clone()))
        };
        Ok(run()?)
    }
}

/// NeoX ("rotate half") RoPE of `x (b, n, heads, head_dim)` with per-row tables `cos`, `sin`
/// `(>= n, head_dim / 2)` (row `t` rotates position `t` of every batch item), on the NPU when
/// routed (else [`rope_cpu`]).
pub fn rope(dev: &HexagonDevice, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, n, h, d) = x.dims4()?;
    let (cn, half) = cos.dims2()?;
    if sin.dims() != cos.dims() || half * 2 != d || cn < n {
        return Err(Error::input(
            "rope",
            InputProblem::RopeTables {
                cos: cos.dims().to_vec(),
                sin: sin.dims().to_vec(),
                x: x.dims().to_vec(),
            },
        ));
    }
    let wire = Wire::for_dtype(x.dtype());
    let mut plan = StagePlan::default();
    let x_off = plan.push(x.elem_count() * wire.size());
    let pos_off = plan.push(b * n * 4);
    let cos_off = plan.push(n * half * 4);
    let sin_off = plan.push(n * half * 4);
    let desc = OpDesc::Rope {
        rows: b * n,
        heads: h,
        head_dim: d,
        dtype: x.dtype(),
    };
    dev.dispatch(
        &desc,
        plan.total(),
        |buf| {
            let call = RopeCall {
                dev,
                buf,
                offs: [x_off, pos_off, cos_off, sin_off],
                wire,
                dims: (b, n, h, d),
            };
            let cos = cos.narrow(0, 0, n)?.contiguous()?;
            let sin = sin.narrow(0, 0, n)?.contiguous()?;
            Ok(x.contiguous()?.apply_op3_no_bwd(&cos, &sin, &call)?)
        },
        || rope_cpu(x, cos, sin),
    )
}

/// The CPU path: `candle_nn::rotary_emb::rope_thd` on contiguous inputs.
pub fn rope_cpu(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::rotary_emb::rope_thd(
        &x.contiguous()?,
        &cos.contiguous()?,
        &sin.contiguous()?,
    )?)
}

/// Slow reference in f64: `y[i] = x[i] c - x[i + d/2] s`, `y[i + d/2] = x[i + d/2] c + x[i] s`.
pub fn rope_slow(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (b, n, h, d) = x.dims4()?;
    let half = d / 2;
    let xs = to_f32_vec(x)?;
    let c = to_f32_vec(cos)?;
    let s = to_f32_vec(sin)?;
    let mut out = vec![0f32; xs.len()];
    for bi in 0..b {
        for t in 0..n {
            for hi in 0..h {
                let base = ((bi * n + t) * h + hi) * d;
                for i in 0..half {
                    let (x1, x2) = (xs[base + i] as f64, xs[base + i + half] as f64);
                    let (cc, ss) = (c[t * half + i] as f64, s[t * half + i] as f64);
                    out[base + i] = (x1 * cc - x2 * ss) as f32;
                    out[base + i + half] = (x2 * cc + x1 * ss) as f32;
                }
            }
        }
    }
    Ok(Tensor::from_vec(out, x.shape(), &candle_core::Device::Cpu)?)
}

struct RopeCall<'a> {
    dev: &'a HexagonDevice,
    buf: &'a DeviceBuffer,
    offs: [usize; 4],
    wire: Wire,
    dims: (usize, usize, usize, usize),
}

impl CustomOp3 for RopeCall<'_> {
    fn name(&self) -> &'static str {
        "hexagon-rope"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sc: &CpuStorage,
        lc: &Layout,
        ss: &CpuStorage,
        ls: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let run = || -> Result<(CpuStorage, Shape)> {
            let (b, n, h, d) = self.dims;
            let [x_off, pos_off, cos_off, sin_off] = self.offs;
            let mut bytes_in = stage_in(self.buf, x_off, sx, lx, self.wire, "rope")?
                + stage_in(self.buf, cos_off, sc, lc, Wire::F32, "rope cos")?
                + stage_in(self.buf, sin_off, ss, ls, Wire::F32, "rope sin")?;
            // Row t of batch item i uses table row t.
            let pos: Vec<u8> = (0..b * n)
                .flat_map(|r| ((r % n) as i32).to_le_bytes())
                .collect();
            self.buf.write(pos_off, &pos)?;
            bytes_in += pos.len();
            let id = self.buf.id();
            let x = rows(id, x_off, self.wire, &[d, h, b * n]);
            let o = kdsp_op::new(
                KDSP_OP_ROPE_NEOX,
                x,
                &[
                    x,
                    rows(id, pos_off, Wire::I32, &[b * n]),
                    rows(id, cos_off, Wire::F32, &[d / 2, n]),
                    rows(id, sin_off, Wire::F32, &[d / 2, n]),
                ],
            );
            let mut batch = Batch::new();
            batch.push("rope", o);
            self.dev.execute(&batch)?;
            let total = b * n * h * d;
            let out = stage_out(self.buf, x_off, total, self.wire, dtype_of(sx))?;
            self.dev
                .mem()
                .count_staged(bytes_in, total * self.wire.size());
            Ok((out, lx.shape().clone()))
        };
        Ok(run()?)
    }
}
