//! The fp16 HMX-tile matmul and the Q4_0 x Q8_0 matmul.

use crate::common::reference::*;
use crate::common::*;
use kernels_dsp::*;

/// (m, n, k): fixed edges, an LLaDA-like K, then random shapes.
fn shapes(seed: u64, random: usize) -> Vec<(usize, usize, usize)> {
    let mut v = vec![
        (1, 1, 1),
        (32, 32, 32),
        (33, 65, 31),
        (64, 31, 97),
        (32, 40, 4096),
    ];
    let mut rng = Rng(seed);
    for _ in 0..random {
        v.push((rng.range(1, 130), rng.range(1, 100), rng.range(1, 300)));
    }
    v
}

#[test]
fn matmul_f16_matches_f64_reference() {
    // Tolerance: inputs are exactly f16 values, products are exact in f32, so the only error is
    // f32 accumulation: |err| <= 1e-5 * sum_k |a_k w_k| per output (+ half an f16 ulp of the
    // result when dst is F16). A misplaced element would be off by ~|a w| ~ 0.3.
    let mut rng = Rng(31);
    for (case, (m, n, k)) in shapes(32, 10).into_iter().enumerate() {
        let a = round_f16(&rng.vec(m * k, 1.0));
        let w = round_f16(&rng.vec(n * k, 1.0));
        let ah: Vec<u16> = a.iter().map(|&v| f16_bits(v)).collect();
        let wh: Vec<u16> = w.iter().map(|&v| f16_bits(v)).collect();
        let mut ctx = Ctx::new(1 + case as u32 % 4);
        let wt = ctx.add_bytes(&weight_tiles(&wh, n, k));
        let src1 = match case % 3 {
            0 => tiles(
                ctx.add_bytes(&act_tiles(&ah, m, k)),
                KDSP_LAYOUT_HMX_ACT_TILES,
                k as u32,
                m as u32,
            ),
            1 => rows(ctx.add_f32(&a), KDSP_DTYPE_F32, &[k as u32, m as u32]),
            _ => rows(ctx.add_u16(&ah), KDSP_DTYPE_F16, &[k as u32, m as u32]),
        };
        let out_dtype = if case % 4 == 3 {
            KDSP_DTYPE_F16
        } else {
            KDSP_DTYPE_F32
        };
        let dst = ctx.add_zeroed(m * n * unit_bytes(out_dtype) as usize);
        let o = kdsp_op::new(
            KDSP_OP_MATMUL_F16,
            rows(dst, out_dtype, &[n as u32, m as u32]),
            &[
                tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, k as u32, n as u32),
                src1,
            ],
        );
        assert_eq!(ctx.run(&o), KDSP_STATUS_OK, "case {case}");
        let got: Vec<f32> = if out_dtype == KDSP_DTYPE_F16 {
            ctx.u16s(dst).iter().map(|&b| f16_val(b)).collect()
        } else {
            ctx.f32s(dst)
        };
        let (want, mag) = matmul_f64(&a, &w, m, n, k);
        for i in 0..m * n {
            let mut tol = 1e-5 * mag[i] + 1e-30;
            if out_dtype == KDSP_DTYPE_F16 {
                tol += want[i].abs() * 2f64.powi(-11) + 2f64.powi(-25);
            }
            let err = (got[i] as f64 - want[i]).abs();
            assert!(
                err <= tol,
                "case {case} (m={m} n={n} k={k}) out[{}][{}]: got {} want {} (tol {tol:e})",
                i / n,
                i % n,
                got[i],
                want[i]
            );
        }
    }
}

struct Q4Case {
    codes: Vec<u8>,
    scales: Vec<u16>,
    a: Vec<f32>,
}

fn q4_case(rng: &mut Rng, m: usize, n: usize, k: usize) -> Q4Case {
    Q4Case {
        codes: (0..n * k).map(|_| rng.byte() & 15).collect(),
        scales: (0..n * ceil32(k))
            .map(|_| f16_bits(rng.sym() * 0.05))
            .collect(),
        a: rng.vec(m * k, 2.0),
    }
}

/// The activation quantization the kernel does, from the reference rule: (codes, scales).
fn quantize_acts(a: &[f32], m: usize, k: usize) -> (Vec<i8>, Vec<u16>) {
    let kt = ceil32(k);
    let mut qa = vec![0i8; m * kt * 32];
    let mut da = vec![0u16; m * kt];
    for r in 0..m {
        for b in 0..kt {
            let end = (32 * b + 32).min(k);
            let (d, q) = q8_0_block(&a[r * k + 32 * b..r * k + end]);
            da[r * kt + b] = d;
            qa[(r * kt + b) * 32..(r * kt + b + 1) * 32].copy_from_slice(&q);
        }
    }
    (qa, da)
}

#[test]
fn matmul_q4_0_is_exact_against_the_same_quantization() {
    // Exact (bit for bit): the reference quantizes the activations with the same Q8_0 rule and
    // accumulates (sumi as f32) * (d_w * d_a) in the same order, so no tolerance is needed
    // (stricter than the 1e-5 relative the spec allows). A second check bounds the error against
    // the f64 product of the dequantized weights and the unquantized activations.
    let mut rng = Rng(41);
    for (case, (m, n, k)) in shapes(42, 10).into_iter().enumerate() {
        let c = q4_case(&mut rng, m, n, k);
        let use_q8 = case % 2 == 1 && k % 32 == 0;
        let mut ctx = Ctx::new(1 + case as u32 % 4);
        let wt = ctx.add_bytes(&q4_tiles(&c.codes, &c.scales, n, k));
        let src1 = if use_q8 {
            rows(
                ctx.add_bytes(&q8_0_rows(&c.a, m, k)),
                KDSP_DTYPE_Q8_0,
                &[k as u32, m as u32],
            )
        } else {
            rows(ctx.add_f32(&c.a), KDSP_DTYPE_F32, &[k as u32, m as u32])
        };
        let dst = ctx.add_zeroed(m * n * 4);
        let o = kdsp_op::new(
            KDSP_OP_MATMUL_Q4_0,
            rows(dst, KDSP_DTYPE_F32, &[n as u32, m as u32]),
            &[tiles(wt, KDSP_LAYOUT_Q4_0_TILES, k as u32, n as u32), src1],
        );
        assert_eq!(ctx.run(&o), KDSP_STATUS_OK, "case {case}");
        let got = ctx.f32s(dst);
        let (qa, da) = quantize_acts(&c.a, m, k);
        let exact = q4_matmul_exact(&c.codes, &c.scales, &qa, &da, m, n, k);
        for i in 0..m * n {
            assert_eq!(
                got[i].to_bits(),
                exact[i].to_bits(),
                "case {case} (m={m} n={n} k={k} q8={use_q8}) out[{}][{}]: {} vs {}",
                i / n,
                i % n,
                got[i],
                exact[i]
            );
        }
        // vs f64 with unquantized activations: each activation is off by at most 0.6 d_a
        // (half a step plus the fp16 rounding of d), so |err| <= sum_k |w_k| 0.6 d_a(k) + f32 noise.
        let kt = ceil32(k);
        let wf: Vec<f32> = (0..n * k)
            .map(|i| {
                (c.codes[i] as i32 - 8) as f32 * f16_val(c.scales[(i / k) * kt + (i % k) / 32])
            })
            .collect();
        let (want, mag) = matmul_f64(&c.a, &wf, m, n, k);
        for r in 0..m {
            for j in 0..n {
                let bound: f64 = (0..k)
                    .map(|l| wf[j * k + l].abs() as f64 * 0.6 * f16_val(da[r * kt + l / 32]) as f64)
                    .sum::<f64>()
                    + 1e-5 * mag[r * n + j];
                let err = (got[r * n + j] as f64 - want[r * n + j]).abs();
                assert!(
                    err <= bound,
                    "case {case} out[{r}][{j}]: err {err:e} > {bound:e}"
                );
            }
        }
    }
}

#[test]
fn matmul_results_do_not_depend_on_the_worker_count() {
    let (m, n, k) = (70, 100, 200);
    let mut rng = Rng(43);
    let c = q4_case(&mut rng, m, n, k);
    let wh: Vec<u16> = (0..n * k).map(|_| f16_bits(rng.sym())).collect();
    let mut outs = Vec::new();
    for workers in [1u32, 2, 3, 7, 16] {
        let mut ctx = Ctx::new(workers);
        let q4 = ctx.add_bytes(&q4_tiles(&c.codes, &c.scales, n, k));
        let wt = ctx.add_bytes(&weight_tiles(&wh, n, k));
        let a = ctx.add_f32(&c.a);
        let d1 = ctx.add_zeroed(m * n * 4);
        let d2 = ctx.add_zeroed(m * n * 4);
        let ops = [
            kdsp_op::new(
                KDSP_OP_MATMUL_Q4_0,
                rows(d1, KDSP_DTYPE_F32, &[n as u32, m as u32]),
                &[
                    tiles(q4, KDSP_LAYOUT_Q4_0_TILES, k as u32, n as u32),
                    rows(a, KDSP_DTYPE_F32, &[k as u32, m as u32]),
                ],
            ),
            kdsp_op::new(
                KDSP_OP_MATMUL_F16,
                rows(d2, KDSP_DTYPE_F32, &[n as u32, m as u32]),
                &[
                    tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, k as u32, n as u32),
                    rows(a, KDSP_DTYPE_F32, &[k as u32, m as u32]),
                ],
            ),
        ];
        assert_eq!(ctx.run_batch(&ops, 0).0, KDSP_STATUS_OK);
        outs.push((ctx.buf(d1).bytes().to_vec(), ctx.buf(d2).bytes().to_vec()));
    }
    for o in &outs[1..] {
        assert!(o == &outs[0], "results differ between worker counts");
    }
}
