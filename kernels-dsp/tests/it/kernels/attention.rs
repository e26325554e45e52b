//! FlashAttention against a naive f64 softmax(QK^T)V.

use crate::common::reference::*;
use crate::common::*;
use kernels_dsp::*;

struct Shape {
    d: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
}

/// Runs one case; K/V live in a KV cache of `cap` tokens laid out [Hkv][cap][D] (a transposed
/// view through strides) and the op reads tokens `k0..k0+tk` of it.
fn run_case(
    rng: &mut Rng,
    s: &Shape,
    q_f16: bool,
    out_f16: bool,
    mask_heads: usize,
    workers: u32,
) -> (f64, usize) {
    let (d, hq, hkv, tq, tk) = (s.d, s.hq, s.hkv, s.tq, s.tk);
    let k0 = rng.range(0, 5);
    let cap = k0 + tk + rng.range(0, 3);
    let mut q = rng.vec(tq * hq * d, 1.0);
    if q_f16 {
        q = round_f16(&q);
    }
    let kc = round_f16(&rng.vec(hkv * cap * d, 1.0));
    let vc = round_f16(&rng.vec(hkv * cap * d, 1.0));
    // dense [tk][hkv][d] copies of the viewed tokens for the reference
    let gather = |c: &[f32]| -> Vec<f32> {
        let mut out = vec![0.0; tk * hkv * d];
        for j in 0..tk {
            for h in 0..hkv {
                out[(j * hkv + h) * d..(j * hkv + h + 1) * d]
                    .copy_from_slice(&c[(h * cap + k0 + j) * d..(h * cap + k0 + j + 1) * d]);
            }
        }
        out
    };
    let (kd, vd) = (gather(&kc), gather(&vc));
    let mask: Option<Vec<f32>> = (mask_heads > 0).then(|| {
        (0..mask_heads * tq * tk)
            .map(|i| {
                if rng.range(0, 9) == 0 && i % tk != 0 {
                    f32::NEG_INFINITY
                } else {
                    rng.sym()
                }
            })
            .collect()
    });
    let scale = 1.0 / (d as f32).sqrt();

    let mut ctx = Ctx::new(workers);
    let qid = if q_f16 {
        ctx.add_u16(&q.iter().map(|&v| f16_bits(v)).collect::<Vec<_>>())
    } else {
        ctx.add_f32(&q)
    };
    let qt = rows(
        qid,
        if q_f16 {
            KDSP_DTYPE_F16
        } else {
            KDSP_DTYPE_F32
        },
        &[d as u32, hq as u32, tq as u32],
    );
    let cache_view = |id: u32| -> kdsp_tensor {
        let mut t = rows(id, KDSP_DTYPE_F16, &[d as u32, hkv as u32, tk as u32]);
        t.offset = (k0 * d * 2) as u64;
        t.nb[1] = (cap * d * 2) as u64; // head stride
        t.nb[2] = (d * 2) as u64; // token stride
        t.nb[3] = t.nb[1] * hkv as u64;
        t
    };
    let kt = cache_view(ctx.add_u16(&kc.iter().map(|&v| f16_bits(v)).collect::<Vec<_>>()));
    let vt = cache_view(ctx.add_u16(&vc.iter().map(|&v| f16_bits(v)).collect::<Vec<_>>()));
    let out_dtype = if out_f16 {
        KDSP_DTYPE_F16
    } else {
        KDSP_DTYPE_F32
    };
    let dst = ctx.add_zeroed(tq * hq * d * unit_bytes(out_dtype) as usize);
    let mut srcs = vec![qt, kt, vt];
    if let Some(m) = &mask {
        srcs.push(rows(
            ctx.add_f32(m),
            KDSP_DTYPE_F32,
            &[tk as u32, tq as u32, mask_heads as u32],
        ));
    }
    let mut o = kdsp_op::new(
        KDSP_OP_FLASH_ATTN,
        rows(dst, out_dtype, &[d as u32, hq as u32, tq as u32]),
        &srcs,
    );
    o.params.attn.scale = scale;
    assert_eq!(ctx.run(&o), KDSP_STATUS_OK);
    let got: Vec<f32> = if out_f16 {
        ctx.u16s(dst).iter().map(|&b| f16_val(b)).collect()
    } else {
        ctx.f32s(dst)
    };
    let want = attention_f64(
        &q,
        &kd,
        &vd,
        mask.as_deref().map(|m| (m, mask_heads)),
        d,
        hq,
        hkv,
        tq,
        tk,
        scale,
    );
    // Tolerance: outputs are convex combinations of V rows (|v| < 1): 1e-5 absolute for f32 out
    // (f32 dots, kdsp_expf, online rescaling; observed ~2e-7), plus half an f16 ulp when dst is
    // F16. K/V (and Q when F16) are rounded to f16 in the reference too, so this is the kernel's
    // own error, far below the 2e-3 that f16 K/V would cost against an f32 model.
    worst_ratio(
        &got,
        &want,
        1e-5,
        if out_f16 { 2f64.powi(-11) } else { 0.0 },
    )
}

#[test]
fn flash_attention_matches_naive_softmax() {
    let mut rng = Rng(51);
    let mut fixed = vec![
        Shape {
            d: 128,
            hq: 4,
            hkv: 4,
            tq: 32,
            tk: 160,
        }, // LLaDA: MHA, head_dim 128, prefix + window
        Shape {
            d: 128,
            hq: 7,
            hkv: 1,
            tq: 9,
            tk: 65,
        }, // Dream-like GQA group of 7
        Shape {
            d: 64,
            hq: 70,
            hkv: 1,
            tq: 2,
            tk: 33,
        }, // group larger than one work item (64 rows)
        Shape {
            d: 1,
            hq: 1,
            hkv: 1,
            tq: 1,
            tk: 1,
        },
    ];
    for _ in 0..10 {
        let hkv = rng.range(1, 3);
        fixed.push(Shape {
            d: [8, 40, 64, 96, 256][rng.range(0, 4)],
            hq: hkv * rng.range(1, 4),
            hkv,
            tq: rng.range(1, 40),
            tk: rng.range(1, 200),
        });
    }
    for (case, s) in fixed.iter().enumerate() {
        let q_f16 = case % 2 == 1;
        let out_f16 = case % 3 == 2;
        let mask_heads = [0, 1, s.hq][case % 3];
        let (ratio, at) = run_case(&mut rng, s, q_f16, out_f16, mask_heads, 1 + case as u32 % 3);
        eprintln!("flash attention case {case}: worst error {ratio:.3} x tolerance");
        assert!(ratio <= 1.0, "case {case} (d={} hq={} hkv={} tq={} tk={} q_f16={q_f16} out_f16={out_f16} mask={mask_heads}): error {ratio:.3} x tolerance at {at}", s.d, s.hq, s.hkv, s.tq, s.tk);
    }
}

#[test]
fn fully_masked_rows_give_zeros_and_others_are_unaffected() {
    let (d, h, tq, tk) = (16usize, 2usize, 3usize, 40usize);
    let mut rng = Rng(52);
    let q = rng.vec(tq * h * d, 1.0);
    let k = round_f16(&rng.vec(tk * h * d, 1.0));
    let v = round_f16(&rng.vec(tk * h * d, 1.0));
    let mut mask = vec![0.0f32; tq * tk];
    for j in 0..tk {
        mask[tk + j] = f32::NEG_INFINITY; // query row 1 sees nothing
        if j >= 20 {
            mask[2 * tk + j] = f32::NEG_INFINITY; // row 2 sees the first 20 keys (one key block boundary)
        }
    }
    let mut ctx = Ctx::new(2);
    let srcs = [
        rows(
            ctx.add_f32(&q),
            KDSP_DTYPE_F32,
            &[d as u32, h as u32, tq as u32],
        ),
        rows(
            ctx.add_u16(&k.iter().map(|&x| f16_bits(x)).collect::<Vec<_>>()),
            KDSP_DTYPE_F16,
            &[d as u32, h as u32, tk as u32],
        ),
        rows(
            ctx.add_u16(&v.iter().map(|&x| f16_bits(x)).collect::<Vec<_>>()),
            KDSP_DTYPE_F16,
            &[d as u32, h as u32, tk as u32],
        ),
        rows(ctx.add_f32(&mask), KDSP_DTYPE_F32, &[tk as u32, tq as u32]),
    ];
    let dst = ctx.add(Buf::from_bytes(&vec![0x7f; tq * h * d * 4])); // garbage that must be overwritten
    let mut o = kdsp_op::new(
        KDSP_OP_FLASH_ATTN,
        rows(dst, KDSP_DTYPE_F32, &[d as u32, h as u32, tq as u32]),
        &srcs,
    );
    o.params.attn.scale = 0.25;
    assert_eq!(ctx.run(&o), KDSP_STATUS_OK);
    let got = ctx.f32s(dst);
    assert!(
        got[h * d..2 * h * d].iter().all(|&x| x == 0.0),
        "fully masked row must be zero"
    );
    let want = attention_f64(&q, &k, &v, Some((&mask, 1)), d, h, h, tq, tk, 0.25);
    let (ratio, at) = worst_ratio(&got, &want, 1e-5, 0.0);
    assert!(ratio <= 1.0, "error {ratio} x tolerance at {at}");
}

/// Runs FlashAttention over a `[tk][hkv][d]` K/V cache with keys `[skip.0, skip.1)` excluded;
/// returns the f32 output.
#[allow(clippy::too_many_arguments)]
fn run_skip(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    (d, hq, hkv, tq, tk): (usize, usize, usize, usize, usize),
    skip: (u32, u32),
    workers: u32,
) -> (kdsp_status_t, Vec<f32>) {
    let mut ctx = Ctx::new(workers);
    let f16s = |x: &[f32]| x.iter().map(|&v| f16_bits(v)).collect::<Vec<_>>();
    let mut srcs = vec![
        rows(
            ctx.add_f32(q),
            KDSP_DTYPE_F32,
            &[d as u32, hq as u32, tq as u32],
        ),
        rows(
            ctx.add_u16(&f16s(k)),
            KDSP_DTYPE_F16,
            &[d as u32, hkv as u32, tk as u32],
        ),
        rows(
            ctx.add_u16(&f16s(v)),
            KDSP_DTYPE_F16,
            &[d as u32, hkv as u32, tk as u32],
        ),
    ];
    if let Some(m) = mask {
        srcs.push(rows(
            ctx.add_f32(m),
            KDSP_DTYPE_F32,
            &[tk as u32, tq as u32],
        ));
    }
    let dst = ctx.add(Buf::from_bytes(&vec![0x7f; tq * hq * d * 4]));
    let mut o = kdsp_op::new(
        KDSP_OP_FLASH_ATTN,
        rows(dst, KDSP_DTYPE_F32, &[d as u32, hq as u32, tq as u32]),
        &srcs,
    );
    o.params.attn.scale = 1.0 / (d as f32).sqrt();
    o.params.attn.kv_skip_begin = skip.0;
    o.params.attn.kv_skip_end = skip.1;
    let st = ctx.run(&o);
    (st, ctx.f32s(dst))
}

#[test]
fn a_key_exclusion_range_equals_attention_over_the_remaining_keys() {
    // [cached rows 0..len) ++ [window rows len..len+n), skipping the stale cached rows of the
    // window's positions: the result must be bit-identical to attention over the keys with
    // those rows removed (same order), and within tolerance of the f64 reference.
    let mut rng = Rng(53);
    let cases = [
        (128usize, 4usize, 4usize, 32usize, 160usize, 64u32, 96u32), // LLaDA window in a prefix
        (64, 6, 2, 7, 100, 0, 37),                                   // skip at the start
        (40, 3, 1, 5, 70, 50, 70),                                   // skip at the end
        (16, 2, 2, 3, 129, 1, 128),                                  // one key left on each side
        (8, 1, 1, 4, 65, 63, 64),                                    // across a 64-key block
    ];
    for (case, &(d, hq, hkv, tq, tk, b, e)) in cases.iter().enumerate() {
        let q = rng.vec(tq * hq * d, 1.0);
        let k = round_f16(&rng.vec(tk * hkv * d, 1.0));
        let v = round_f16(&rng.vec(tk * hkv * d, 1.0));
        let mask: Option<Vec<f32>> = (case % 2 == 1).then(|| rng.vec(tq * tk, 0.5));
        let keep: Vec<usize> = (0..tk)
            .filter(|&j| !(b as usize..e as usize).contains(&j))
            .collect();
        let gather = |x: &[f32], w: usize| -> Vec<f32> {
            keep.iter()
                .flat_map(|&j| x[j * w..(j + 1) * w].to_vec())
                .collect()
        };
        let (kg, vg) = (gather(&k, hkv * d), gather(&v, hkv * d));
        let mg: Option<Vec<f32>> = mask.as_ref().map(|m| {
            (0..tq)
                .flat_map(|t| keep.iter().map(move |&j| m[t * tk + j]))
                .collect()
        });
        let shape = (d, hq, hkv, tq, tk);
        let (st, got) = run_skip(
            &q,
            &k,
            &v,
            mask.as_deref(),
            shape,
            (b, e),
            1 + case as u32 % 3,
        );
        assert_eq!(st, KDSP_STATUS_OK, "case {case}");
        let tv = keep.len();
        let (st, dense) = run_skip(&q, &kg, &vg, mg.as_deref(), (d, hq, hkv, tq, tv), (0, 0), 2);
        assert_eq!(st, KDSP_STATUS_OK, "case {case} dense");
        assert!(
            got.iter()
                .zip(&dense)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "case {case}: skipping keys differs from removing them"
        );
        let want = attention_f64(
            &q,
            &kg,
            &vg,
            mg.as_deref().map(|m| (m, 1)),
            d,
            hq,
            hkv,
            tq,
            tv,
            1.0 / (d as f32).sqrt(),
        );
        let (ratio, at) = worst_ratio(&got, &want, 1e-5, 0.0);
        assert!(
            ratio <= 1.0,
            "case {case}: error {ratio} x tolerance at {at}"
        );
    }
}

#[test]
fn skipping_every_key_gives_zeros_and_bad_ranges_are_rejected() {
    let mut rng = Rng(54);
    let (d, h, tq, tk) = (16usize, 2usize, 3usize, 10usize);
    let q = rng.vec(tq * h * d, 1.0);
    let k = round_f16(&rng.vec(tk * h * d, 1.0));
    let v = round_f16(&rng.vec(tk * h * d, 1.0));
    let shape = (d, h, h, tq, tk);
    let (st, got) = run_skip(&q, &k, &v, None, shape, (0, tk as u32), 2);
    assert_eq!(st, KDSP_STATUS_OK);
    assert!(got.iter().all(|&x| x == 0.0), "no visible key: zeros");
    // begin >= end (other than 0,0), end past Tk: malformed, nothing written.
    for skip in [
        (3, 3),
        (5, 4),
        (0, tk as u32 + 1),
        (tk as u32, tk as u32 + 1),
        (1, 0),
    ] {
        let (st, got) = run_skip(&q, &k, &v, None, shape, skip, 1);
        assert_eq!(st, KDSP_STATUS_INVALID_PARAMS, "skip {skip:?}");
        assert!(
            got.iter().all(|&x| x.to_bits() == 0x7f7f_7f7f),
            "skip {skip:?} wrote"
        );
    }
}
