//! Q8_0 quantization and the Q4_0 repack / dequantization.

use crate::common::reference::*;
use crate::common::*;
use kernels_dsp::*;

#[test]
fn quantize_q8_0_follows_the_integer_rule_exactly() {
    let mut rng = Rng(11);
    for case in 0..12 {
        let k = 32 * rng.range(1, 9);
        let r = rng.range(1, 9);
        let mut x = rng.vec(k * r, [1.0, 1e-3, 40.0][case % 3]);
        if case == 0 {
            // special values: zero block, subnormals, -0, a NaN block, an inf block, exact ties
            for (i, v) in x.iter_mut().enumerate().take(k.min(96)) {
                *v = match i / 32 {
                    0 => 0.0,
                    1 => f32::from_bits(i as u32 * 977 + 1),
                    _ => (i % 33) as f32 - 16.0,
                };
            }
            if r > 1 {
                x[k + 1] = f32::NAN;
                x[k.min(64) + k - 1] = f32::INFINITY;
            }
        }
        let mut ctx = Ctx::new(1 + (case % 3) as u32);
        let xs = ctx.add_f32(&x);
        let dst = ctx.add_zeroed(r * k / 32 * 34);
        let st = ctx.run(&kdsp_op::new(
            KDSP_OP_QUANTIZE_Q8_0,
            rows(dst, KDSP_DTYPE_Q8_0, &[k as u32, r as u32]),
            &[rows(xs, KDSP_DTYPE_F32, &[k as u32, r as u32])],
        ));
        assert_eq!(st, KDSP_STATUS_OK);
        // exact: the reference implements the same integer rule independently
        assert_eq!(
            ctx.buf(dst).bytes(),
            &q8_0_rows(&x, r, k)[..],
            "case {case} k={k} rows={r}"
        );
    }
}

#[test]
fn q8_0_rule_stays_within_one_step_of_float_rounding() {
    // The integer rule may differ from round-half-away(x * 127 / amax) by at most 1, and only
    // near a rounding boundary; the extreme element maps to exactly +-127.
    let mut rng = Rng(12);
    let (mut total, mut differ) = (0usize, 0usize);
    for _ in 0..2000 {
        let scale = 10f32.powi(rng.range(0, 8) as i32 - 4);
        let x = rng.vec(32, scale);
        let (d, q) = q8_0_block(&x);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(d, f16_bits(amax / 127.0));
        for (v, &qi) in x.iter().zip(&q) {
            let exact = *v as f64 * 127.0 / amax as f64;
            let rounded = exact.abs().round().copysign(exact) as i32;
            total += 1;
            if rounded != qi as i32 {
                differ += 1;
                let frac = exact.abs().fract();
                assert!((frac - 0.5).abs() < 0.012, "x={v} q={qi} exact={exact}");
                assert_eq!((rounded - qi as i32).abs(), 1);
            }
            if v.abs() == amax {
                assert_eq!(qi.unsigned_abs(), 127);
            }
        }
    }
    eprintln!("q8_0 integer rule: {differ} of {total} codes differ by 1 from float rounding");
    assert!(
        differ * 200 < total,
        "{differ} of {total} differ from float rounding"
    );
}

#[test]
fn pack_q4_0_then_dequant_matches_ggml() {
    let mut rng = Rng(13);
    for case in 0..8 {
        let n = rng.range(1, 80);
        let k = 32 * rng.range(1, 5);
        let w = rng.vec(n * k, 0.1);
        let blocks = ggml_q4_0(&w);
        let mut ctx = Ctx::new(1 + case % 3);
        let src = ctx.add_bytes(&blocks);
        let tile_bytes = ceil32(n) * ceil32(k) * 576;
        let tl = ctx.add_zeroed(tile_bytes);
        let st = ctx.run(&kdsp_op::new(
            KDSP_OP_PACK_Q4_0,
            tiles(tl, KDSP_LAYOUT_Q4_0_TILES, k as u32, n as u32),
            &[rows(src, KDSP_DTYPE_Q4_0, &[k as u32, n as u32])],
        ));
        assert_eq!(st, KDSP_STATUS_OK);
        // the tiles equal the layout written from its definition
        let kt = k / 32;
        let mut codes = vec![0u8; n * k];
        let mut scales = vec![0u16; n * kt];
        for row in 0..n {
            for b in 0..kt {
                let blk = &blocks[(row * kt + b) * 18..(row * kt + b + 1) * 18];
                scales[row * kt + b] = u16::from_le_bytes([blk[0], blk[1]]);
                for j in 0..16 {
                    codes[row * k + 32 * b + j] = blk[2 + j] & 15;
                    codes[row * k + 32 * b + j + 16] = blk[2 + j] >> 4;
                }
            }
        }
        assert_eq!(
            ctx.buf(tl).bytes(),
            &q4_tiles(&codes, &scales, n, k)[..],
            "tiles, case {case}"
        );
        // dequantization (HVX nibble unpack on the DSP) reproduces ggml's, bit for bit
        let want = ggml_q4_0_dequant(&blocks);
        for dtype in [KDSP_DTYPE_F32, KDSP_DTYPE_F16] {
            let out = ctx.add_zeroed(n * k * unit_bytes(dtype) as usize);
            let st = ctx.run(&kdsp_op::new(
                KDSP_OP_DEQUANT_Q4_0,
                rows(out, dtype, &[k as u32, n as u32]),
                &[tiles(tl, KDSP_LAYOUT_Q4_0_TILES, k as u32, n as u32)],
            ));
            assert_eq!(st, KDSP_STATUS_OK);
            if dtype == KDSP_DTYPE_F32 {
                assert_eq!(ctx.f32s(out), want, "dequant f32, case {case}");
            } else {
                let want16: Vec<u16> = want.iter().map(|&v| f16_bits(v)).collect();
                assert_eq!(ctx.u16s(out), want16, "dequant f16, case {case}");
            }
        }
    }
}

#[test]
fn dequant_handles_k_that_is_not_a_multiple_of_32() {
    // Tiles built directly from codes (K = 70): padding codes are never written out.
    let (n, k) = (37usize, 70usize);
    let mut rng = Rng(14);
    let codes: Vec<u8> = (0..n * k).map(|_| rng.byte() & 15).collect();
    let scales: Vec<u16> = (0..n * ceil32(k))
        .map(|_| f16_bits(rng.sym() * 0.1))
        .collect();
    let mut ctx = Ctx::new(2);
    let tl = ctx.add_bytes(&q4_tiles(&codes, &scales, n, k));
    let out = ctx.add_zeroed(n * k * 4);
    let st = ctx.run(&kdsp_op::new(
        KDSP_OP_DEQUANT_Q4_0,
        rows(out, KDSP_DTYPE_F32, &[k as u32, n as u32]),
        &[tiles(tl, KDSP_LAYOUT_Q4_0_TILES, k as u32, n as u32)],
    ));
    assert_eq!(st, KDSP_STATUS_OK);
    let got = ctx.f32s(out);
    for r in 0..n {
        for c in 0..k {
            let want =
                (codes[r * k + c] as i32 - 8) as f32 * f16_val(scales[r * ceil32(k) + c / 32]);
            assert_eq!(got[r * k + c], want, "({r}, {c})");
        }
    }
}
