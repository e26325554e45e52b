//! RMSNorm, SwiGLU, add and NeoX RoPE.

use crate::common::reference::*;
use crate::common::*;
use kernels_dsp::*;

fn dt(f16: bool) -> u32 {
    if f16 {
        KDSP_DTYPE_F16
    } else {
        KDSP_DTYPE_F32
    }
}

/// Stores `v` as F32 or F16 (rounded) and returns (id, the values the kernel sees).
fn add_vals(ctx: &mut Ctx, v: &[f32], f16: bool) -> (u32, Vec<f32>) {
    if f16 {
        let h: Vec<u16> = v.iter().map(|&x| f16_bits(x)).collect();
        (ctx.add_u16(&h), h.iter().map(|&b| f16_val(b)).collect())
    } else {
        (ctx.add_f32(v), v.to_vec())
    }
}

fn read_vals(ctx: &Ctx, id: u32, f16: bool) -> Vec<f32> {
    if f16 {
        ctx.u16s(id).iter().map(|&b| f16_val(b)).collect()
    } else {
        ctx.f32s(id)
    }
}

/// Relative tolerance of an output dtype on top of the f32 computation's own `rtol`.
fn out_rtol(f16: bool, rtol: f64) -> f64 {
    rtol + if f16 { 2f64.powi(-11) } else { 0.0 }
}

#[test]
fn rms_norm_matches_f64() {
    // Tolerance: relative 2e-6 + 2 sqrt(n) 2^-24 (f32 sum of n squares in 8 partial sums,
    // kdsp_rsqrtf within 2 ulp) + 1e-7 absolute; plus half an f16 ulp for F16 outputs.
    let mut rng = Rng(61);
    for case in 0..10 {
        let n = [1, 31, 128, 4096, rng.range(2, 300)][case % 5];
        let (r2, r3) = (rng.range(1, 4), rng.range(1, 3));
        let (xf16, wf16, of16) = (case % 2 == 1, case % 3 == 1, case % 4 == 2);
        let eps = [1e-5f32, 1e-6, 0.0][case % 3];
        let mut ctx = Ctx::new(1 + case as u32 % 3);
        let (x, xv) = add_vals(&mut ctx, &rng.vec(n * r2 * r3, 3.0), xf16);
        let (w, wv) = add_vals(&mut ctx, &rng.vec(n, 2.0), wf16);
        let in_place = case == 4 && xf16 == of16;
        let dst = if in_place {
            x
        } else {
            ctx.add_zeroed(n * r2 * r3 * unit_bytes(dt(of16)) as usize)
        };
        let dims = [n as u32, r2 as u32, r3 as u32];
        let mut o = kdsp_op::new(
            KDSP_OP_RMS_NORM,
            rows(dst, dt(of16), &dims),
            &[rows(x, dt(xf16), &dims), rows(w, dt(wf16), &[n as u32])],
        );
        o.params.norm.eps = eps;
        assert_eq!(ctx.run(&o), KDSP_STATUS_OK, "case {case}");
        let want = rms_norm_f64(&xv, &wv, n, eps);
        let (ratio, at) = worst_ratio(
            &read_vals(&ctx, dst, of16),
            &want,
            1e-7,
            out_rtol(of16, 2e-6 + 2.0 * (n as f64).sqrt() * 2f64.powi(-24)),
        );
        assert!(
            ratio <= 1.0,
            "case {case} n={n} in_place={in_place}: {ratio} x tolerance at {at}"
        );
    }
}

#[test]
fn swiglu_matches_f64() {
    // Tolerance: 1e-6 relative + 1e-7 absolute (kdsp_expf within 2 ulp, one division, one
    // multiply); plus half an f16 ulp for F16 outputs. Gate values span +-20 so exp saturates.
    let mut rng = Rng(62);
    for case in 0..8 {
        let (n, r) = (rng.range(1, 200), rng.range(1, 5));
        let (gf16, uf16, of16) = (case % 2 == 0, case % 3 == 0, case % 4 == 1);
        let mut ctx = Ctx::new(1 + case as u32 % 3);
        let (g, gv) = add_vals(&mut ctx, &rng.vec(n * r, 20.0), gf16);
        let (u, uv) = add_vals(&mut ctx, &rng.vec(n * r, 2.0), uf16);
        let in_place = case == 3 && gf16 == of16;
        let dst = if in_place {
            g
        } else {
            ctx.add_zeroed(n * r * unit_bytes(dt(of16)) as usize)
        };
        let dims = [n as u32, r as u32];
        let o = kdsp_op::new(
            KDSP_OP_SWIGLU,
            rows(dst, dt(of16), &dims),
            &[rows(g, dt(gf16), &dims), rows(u, dt(uf16), &dims)],
        );
        assert_eq!(ctx.run(&o), KDSP_STATUS_OK, "case {case}");
        let want: Vec<f64> = gv
            .iter()
            .zip(&uv)
            .map(|(&a, &b)| silu_f64(a as f64) * b as f64)
            .collect();
        let (ratio, at) = worst_ratio(
            &read_vals(&ctx, dst, of16),
            &want,
            1e-7,
            out_rtol(of16, 1e-6),
        );
        assert!(ratio <= 1.0, "case {case}: {ratio} x tolerance at {at}");
    }
}

#[test]
fn add_broadcasts_and_is_exact_in_f32() {
    // F32 + F32 -> F32 is one IEEE addition: exact equality. Broadcast shapes of b: full, a bias
    // row (ne1 = 1), a column (ne0 = 1), a scalar.
    let mut rng = Rng(63);
    let (n, r, s) = (37usize, 5usize, 3usize);
    let a = rng.vec(n * r * s, 1.0);
    for (case, bdims) in [[n, r, s], [n, 1, 1], [1, r, s], [1, 1, 1], [n, 1, s]]
        .iter()
        .enumerate()
    {
        let b = rng.vec(bdims.iter().product(), 1.0);
        let mut ctx = Ctx::new(2);
        let ai = ctx.add_f32(&a);
        let bi = ctx.add_f32(&b);
        let dst = if case == 0 {
            ai
        } else {
            ctx.add_zeroed(n * r * s * 4)
        }; // case 0 in place
        let dims = [n as u32, r as u32, s as u32];
        let bd: Vec<u32> = bdims.iter().map(|&x| x as u32).collect();
        let o = kdsp_op::new(
            KDSP_OP_ADD,
            rows(dst, KDSP_DTYPE_F32, &dims),
            &[
                rows(ai, KDSP_DTYPE_F32, &dims),
                rows(bi, KDSP_DTYPE_F32, &bd),
            ],
        );
        assert_eq!(ctx.run(&o), KDSP_STATUS_OK);
        let got = ctx.f32s(dst);
        for k in 0..s {
            for j in 0..r {
                for i in 0..n {
                    let bidx = (if bdims[2] == 1 { 0 } else { k }) * bdims[1] * bdims[0]
                        + (if bdims[1] == 1 { 0 } else { j }) * bdims[0]
                        + if bdims[0] == 1 { 0 } else { i };
                    assert_eq!(
                        got[(k * r + j) * n + i],
                        a[(k * r + j) * n + i] + b[bidx],
                        "b dims {bdims:?}"
                    );
                }
            }
        }
    }
    // mixed dtypes: F16 a + F32 b -> F16 out, tolerance half an f16 ulp
    let mut ctx = Ctx::new(1);
    let (ai, av) = add_vals(&mut ctx, &a, true);
    let (bi, bv) = add_vals(&mut ctx, &rng.vec(n, 1.0), false);
    let dst = ctx.add_zeroed(n * r * s * 2);
    let dims = [n as u32, r as u32, s as u32];
    assert_eq!(
        ctx.run(&kdsp_op::new(
            KDSP_OP_ADD,
            rows(dst, KDSP_DTYPE_F16, &dims),
            &[
                rows(ai, KDSP_DTYPE_F16, &dims),
                rows(bi, KDSP_DTYPE_F32, &[n as u32])
            ]
        )),
        KDSP_STATUS_OK
    );
    let want: Vec<f64> = av
        .iter()
        .enumerate()
        .map(|(i, &x)| x as f64 + bv[i % n] as f64)
        .collect();
    let (ratio, at) = worst_ratio(&read_vals(&ctx, dst, true), &want, 1e-7, 2f64.powi(-11));
    assert!(ratio <= 1.0, "{ratio} at {at}");
}

#[test]
fn rope_neox_matches_f64() {
    // Tolerance 1e-6 absolute + 1e-6 relative (two f32 products and a sum per output); plus half
    // an f16 ulp for F16 outputs. Positions are arbitrary (a diffusion window), tables LLaDA-like.
    let mut rng = Rng(64);
    for case in 0..6 {
        let d = 2 * rng.range(1, 64);
        let (h, t, p) = (rng.range(1, 5), rng.range(1, 20), 64usize);
        let (xf16, of16) = (case % 2 == 1, case % 3 == 1);
        let half = d / 2;
        let mut cos = vec![0f32; p * half];
        let mut sin = vec![0f32; p * half];
        for pos in 0..p {
            for i in 0..half {
                let ang = pos as f64 * 500000f64.powf(-(2.0 * i as f64) / d as f64);
                cos[pos * half + i] = ang.cos() as f32;
                sin[pos * half + i] = ang.sin() as f32;
            }
        }
        let pos: Vec<i32> = (0..t).map(|_| rng.range(0, p - 1) as i32).collect();
        let mut ctx = Ctx::new(1 + case as u32 % 3);
        let (x, xv) = add_vals(&mut ctx, &rng.vec(d * h * t, 2.0), xf16);
        let in_place = case == 2 && xf16 == of16;
        let dst = if in_place {
            x
        } else {
            ctx.add_zeroed(d * h * t * unit_bytes(dt(of16)) as usize)
        };
        let dims = [d as u32, h as u32, t as u32];
        let srcs = [
            rows(x, dt(xf16), &dims),
            rows(ctx.add_i32(&pos), KDSP_DTYPE_I32, &[t as u32]),
            rows(ctx.add_f32(&cos), KDSP_DTYPE_F32, &[half as u32, p as u32]),
            rows(ctx.add_f32(&sin), KDSP_DTYPE_F32, &[half as u32, p as u32]),
        ];
        assert_eq!(
            ctx.run(&kdsp_op::new(
                KDSP_OP_ROPE_NEOX,
                rows(dst, dt(of16), &dims),
                &srcs
            )),
            KDSP_STATUS_OK,
            "case {case}"
        );
        let want = rope_f64(&xv, &pos, &cos, &sin, d, h);
        let (ratio, at) = worst_ratio(
            &read_vals(&ctx, dst, of16),
            &want,
            1e-6,
            out_rtol(of16, 1e-6),
        );
        assert!(
            ratio <= 1.0,
            "case {case} d={d}: {ratio} x tolerance at {at}"
        );
    }
}

#[test]
fn rope_rejects_out_of_range_positions_before_writing() {
    let (d, h, t, p) = (8usize, 2usize, 3usize, 4usize);
    let mut ctx = Ctx::new(2);
    let x = ctx.add_f32(&vec![1.0; d * h * t]);
    let cs = ctx.add_f32(&vec![0.5; p * d / 2]);
    let sn = ctx.add_f32(&vec![0.5; p * d / 2]);
    for bad in [-1i32, p as i32, i32::MAX] {
        let pos = ctx.add_i32(&[0, bad, 1]);
        let dst = ctx.add(Buf::from_bytes(&vec![0xab; d * h * t * 4]));
        let dims = [d as u32, h as u32, t as u32];
        let srcs = [
            rows(x, KDSP_DTYPE_F32, &dims),
            rows(pos, KDSP_DTYPE_I32, &[t as u32]),
            rows(cs, KDSP_DTYPE_F32, &[d as u32 / 2, p as u32]),
            rows(sn, KDSP_DTYPE_F32, &[d as u32 / 2, p as u32]),
        ];
        let o = kdsp_op::new(KDSP_OP_ROPE_NEOX, rows(dst, KDSP_DTYPE_F32, &dims), &srcs);
        assert_eq!(
            ctx.check(&o).0,
            KDSP_STATUS_OK,
            "check mode does not read positions"
        );
        assert_eq!(ctx.run(&o), KDSP_STATUS_INVALID_PARAMS, "position {bad}");
        assert!(
            ctx.buf(dst).bytes().iter().all(|&b| b == 0xab),
            "dst written despite the error"
        );
    }
}
