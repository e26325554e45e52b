//! Activation and weight tile (un)packing against the layouts written from their definition.

use crate::common::reference::*;
use crate::common::*;
use kernels_dsp::*;

/// A row-major [m][k] view at a byte offset with a padded row stride (exercises nb[1] != K).
fn strided_rows(id: u32, dtype: u32, k: usize, m: usize, offset: u64, row_pad: u64) -> kdsp_tensor {
    let mut t = rows(id, dtype, &[k as u32, m as u32]);
    t.offset = offset;
    t.nb[1] += row_pad;
    t.nb[2] = t.nb[1] * m as u64;
    t.nb[3] = t.nb[2];
    t
}

#[test]
fn pack_act_tiles_matches_the_layout() {
    let mut rng = Rng(21);
    for case in 0..10 {
        let (m, k) = (rng.range(1, 100), rng.range(1, 100));
        let dtype = if case % 2 == 0 {
            KDSP_DTYPE_F16
        } else {
            KDSP_DTYPE_F32
        };
        let es = unit_bytes(dtype) as usize;
        let (offset, pad) = ((case % 3) as u64 * 8, (case % 4) as u64 * 4);
        let vals = rng.vec(m * k, 3.0);
        let mut buf = Buf::new(offset as usize + m * (k * es + pad as usize));
        for i in 0..m {
            let at = offset as usize + i * (k * es + pad as usize);
            if dtype == KDSP_DTYPE_F16 {
                buf.write_u16(
                    at,
                    &vals[i * k..(i + 1) * k]
                        .iter()
                        .map(|&v| f16_bits(v))
                        .collect::<Vec<_>>(),
                );
            } else {
                buf.write_f32(at, &vals[i * k..(i + 1) * k]);
            }
        }
        let mut ctx = Ctx::new(1 + case as u32 % 4);
        let src = ctx.add(buf);
        let dst = ctx.add_zeroed(ceil32(m) * ceil32(k) * 2048);
        let st = ctx.run(&kdsp_op::new(
            KDSP_OP_PACK_ACT_TILES,
            tiles(dst, KDSP_LAYOUT_HMX_ACT_TILES, k as u32, m as u32),
            &[strided_rows(src, dtype, k, m, offset, pad)],
        ));
        assert_eq!(st, KDSP_STATUS_OK);
        let h: Vec<u16> = vals.iter().map(|&v| f16_bits(v)).collect();
        assert_eq!(
            ctx.buf(dst).bytes(),
            &act_tiles(&h, m, k)[..],
            "case {case}: m={m} k={k}"
        );
    }
}

#[test]
fn unpack_act_tiles_inverts_pack() {
    let mut rng = Rng(22);
    for case in 0..8 {
        let (m, k) = (rng.range(1, 90), rng.range(1, 90));
        let h: Vec<u16> = (0..m * k).map(|_| f16_bits(rng.sym() * 8.0)).collect();
        let mut ctx = Ctx::new(1 + case % 3);
        let tl = ctx.add_bytes(&act_tiles(&h, m, k));
        for dtype in [KDSP_DTYPE_F16, KDSP_DTYPE_F32] {
            let out = ctx.add_zeroed(m * k * unit_bytes(dtype) as usize);
            let st = ctx.run(&kdsp_op::new(
                KDSP_OP_UNPACK_ACT_TILES,
                rows(out, dtype, &[k as u32, m as u32]),
                &[tiles(tl, KDSP_LAYOUT_HMX_ACT_TILES, k as u32, m as u32)],
            ));
            assert_eq!(st, KDSP_STATUS_OK);
            if dtype == KDSP_DTYPE_F16 {
                assert_eq!(ctx.u16s(out), h, "case {case}");
            } else {
                assert_eq!(
                    ctx.f32s(out),
                    h.iter().map(|&b| f16_val(b)).collect::<Vec<_>>(),
                    "case {case}"
                );
            }
        }
    }
}

#[test]
fn pack_weight_tiles_matches_the_layout() {
    let mut rng = Rng(23);
    for case in 0..8 {
        let (n, k) = (rng.range(1, 100), rng.range(1, 100));
        let w = rng.vec(n * k, 1.0);
        let h: Vec<u16> = w.iter().map(|&v| f16_bits(v)).collect();
        let mut ctx = Ctx::new(1 + case % 3);
        let src = if case % 2 == 0 {
            ctx.add_u16(&h)
        } else {
            ctx.add_f32(&w)
        };
        let dtype = if case % 2 == 0 {
            KDSP_DTYPE_F16
        } else {
            KDSP_DTYPE_F32
        };
        let dst = ctx.add_zeroed(ceil32(n) * ceil32(k) * 2048);
        let st = ctx.run(&kdsp_op::new(
            KDSP_OP_PACK_WEIGHT_F16,
            tiles(dst, KDSP_LAYOUT_HMX_WEIGHT_TILES, k as u32, n as u32),
            &[rows(src, dtype, &[k as u32, n as u32])],
        ));
        assert_eq!(st, KDSP_STATUS_OK);
        assert_eq!(
            ctx.buf(dst).bytes(),
            &weight_tiles(&h, n, k)[..],
            "case {case}: n={n} k={k}"
        );
    }
}

#[test]
fn f32_to_f16_rounding_matches_the_half_crate() {
    // Through PACK_ACT_TILES (f32 -> f16 in C) then UNPACK to f16 rows: every special class
    // (subnormals, ties, overflow to inf, NaN, -0) rounds like `half` (round to nearest even).
    let mut vals: Vec<f32> = vec![
        0.0,
        -0.0,
        65504.0,
        65519.99,
        65520.0,
        -1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        5.96e-8,
        2.98e-8,
        2.9802322e-8,
        2.9802326e-8,
        6.1e-5,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        f32::MIN_POSITIVE,
    ];
    let mut rng = Rng(24);
    for _ in 0..4000 {
        vals.push(f32::from_bits(
            rng.next_u64() as u32 & 0xbfff_ffff | 0x3000_0000,
        ));
        vals.push(f32::from_bits((rng.next_u64() as u32) & 0x7fff_ffff).min(70000.0));
    }
    vals.push(f32::NAN);
    let (m, k) = (vals.len().div_ceil(64), 64);
    vals.resize(m * k, 1.5);
    let mut ctx = Ctx::new(2);
    let src = ctx.add_f32(&vals);
    let tl = ctx.add_zeroed(ceil32(m) * 2 * 2048);
    let out = ctx.add_zeroed(m * k * 2);
    assert_eq!(
        ctx.run(&kdsp_op::new(
            KDSP_OP_PACK_ACT_TILES,
            tiles(tl, KDSP_LAYOUT_HMX_ACT_TILES, k as u32, m as u32),
            &[rows(src, KDSP_DTYPE_F32, &[k as u32, m as u32])]
        )),
        KDSP_STATUS_OK
    );
    assert_eq!(
        ctx.run(&kdsp_op::new(
            KDSP_OP_UNPACK_ACT_TILES,
            rows(out, KDSP_DTYPE_F16, &[k as u32, m as u32]),
            &[tiles(tl, KDSP_LAYOUT_HMX_ACT_TILES, k as u32, m as u32)]
        )),
        KDSP_STATUS_OK
    );
    for (i, (&got, &v)) in ctx.u16s(out).iter().zip(&vals).enumerate() {
        if v.is_nan() {
            assert!(half::f16::from_bits(got).is_nan(), "NaN at {i}");
        } else {
            assert_eq!(got, f16_bits(v), "value {v:e} ({:#010x})", v.to_bits());
        }
    }
}

#[test]
fn f16_to_f32_is_exact_for_every_bit_pattern() {
    // All 65536 halves through UNPACK_ACT_TILES into F32 rows: equal to `half`'s conversion
    // (NaNs only need to stay NaN with the sign kept: the payload is not quieted).
    let (m, k) = (2048usize, 32usize);
    let h: Vec<u16> = (0..=u16::MAX).collect();
    let mut ctx = Ctx::new(2);
    let tl = ctx.add_bytes(&act_tiles(&h, m, k));
    let out = ctx.add_zeroed(m * k * 4);
    assert_eq!(
        ctx.run(&kdsp_op::new(
            KDSP_OP_UNPACK_ACT_TILES,
            rows(out, KDSP_DTYPE_F32, &[k as u32, m as u32]),
            &[tiles(tl, KDSP_LAYOUT_HMX_ACT_TILES, k as u32, m as u32)]
        )),
        KDSP_STATUS_OK
    );
    for (&bits, &got) in h.iter().zip(&ctx.f32s(out)) {
        let want = half::f16::from_bits(bits).to_f32();
        if want.is_nan() {
            assert!(
                got.is_nan() && got.is_sign_negative() == want.is_sign_negative(),
                "{bits:#06x}"
            );
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
        }
    }
}
