//! GET_ROWS (gather by an I32 index vector) and CPY (strided copy with F32 <-> F16 conversion)
//! against plain Rust references: both are data movement, so every case is bit-exact (f32 -> f16
//! rounds to nearest even like the `half` crate).

use crate::common::*;
use kernels_dsp::*;

/// A value of `dtype` from f32 bits (f16 rounding through `half`), as the f32 it represents.
fn as_dtype(x: f32, dtype: u32) -> f32 {
    if dtype == KDSP_DTYPE_F16 {
        f16_val(f16_bits(x))
    } else {
        x
    }
}

fn add_values(ctx: &mut Ctx, v: &[f32], dtype: u32, pad: usize) -> u32 {
    let mut bytes = vec![0u8; pad];
    for &x in v {
        if dtype == KDSP_DTYPE_F16 {
            bytes.extend_from_slice(&f16_bits(x).to_le_bytes());
        } else {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    ctx.add_bytes(&bytes)
}

fn read_values(ctx: &Ctx, id: u32, dtype: u32) -> Vec<f32> {
    if dtype == KDSP_DTYPE_F16 {
        ctx.u16s(id).iter().map(|&b| f16_val(b)).collect()
    } else {
        ctx.f32s(id)
    }
}

#[test]
fn get_rows_gathers_and_converts_bit_exactly() {
    let mut rng = Rng(61);
    let dts = [KDSP_DTYPE_F32, KDSP_DTYPE_F16];
    for case in 0..16 {
        let (si, so) = (dts[case % 2], dts[(case / 2) % 2]);
        let (c, r, b) = (rng.range(1, 70), rng.range(1, 40), rng.range(1, 3));
        let per_batch = case % 3 == 0 && b > 1;
        let n = rng.range(1, 50); // duplicates and any order allowed
        let idx: Vec<i32> = (0..n * if per_batch { b } else { 1 })
            .map(|_| rng.range(0, r - 1) as i32)
            .collect();
        // src rows padded: row stride c + 3 elements, batch stride (r + 1) rows
        let row = c + 3;
        let data: Vec<f32> = rng.vec(b * (r + 1) * row, 2.0);
        let mut ctx = Ctx::new(1 + case as u32 % 3);
        let sid = add_values(&mut ctx, &data, si, 0);
        let es = unit_bytes(si);
        let mut st = rows(sid, si, &[c as u32, r as u32, b as u32]);
        st.nb[1] = row as u64 * es;
        st.nb[2] = ((r + 1) * row) as u64 * es;
        st.nb[3] = st.nb[2] * b as u64;
        let iid = ctx.add_i32(&idx);
        let it = rows(
            iid,
            KDSP_DTYPE_I32,
            &[n as u32, if per_batch { b as u32 } else { 1 }],
        );
        let did = ctx.add_zeroed(c * n * b * unit_bytes(so) as usize);
        let op = kdsp_op::new(
            KDSP_OP_GET_ROWS,
            rows(did, so, &[c as u32, n as u32, b as u32]),
            &[st, it],
        );
        assert_eq!(ctx.run(&op), KDSP_STATUS_OK, "case {case}");
        let got = read_values(&ctx, did, so);
        for bi in 0..b {
            for i in 0..n {
                let src_row = idx[if per_batch { bi * n + i } else { i }] as usize;
                for x in 0..c {
                    let v = as_dtype(data[(bi * (r + 1) + src_row) * row + x], si);
                    let want = as_dtype(v, so);
                    let g = got[(bi * n + i) * c + x];
                    assert_eq!(g.to_bits(), want.to_bits(), "case {case} b{bi} i{i} x{x}");
                }
            }
        }
    }
}

#[test]
fn get_rows_checks_every_index_before_writing() {
    let mut ctx = Ctx::new(2);
    let sid = ctx.add_f32(&[1.0; 4 * 8]);
    for bad in [-1i32, 8, i32::MAX, i32::MIN] {
        let iid = ctx.add_i32(&[0, 3, bad, 1]);
        let did = ctx.add(Buf::from_bytes(&[0x55; 4 * 4 * 4]));
        let op = kdsp_op::new(
            KDSP_OP_GET_ROWS,
            rows(did, KDSP_DTYPE_F32, &[4, 4]),
            &[
                rows(sid, KDSP_DTYPE_F32, &[4, 8]),
                rows(iid, KDSP_DTYPE_I32, &[4]),
            ],
        );
        // check mode cannot see data: OK; running finds the index and writes nothing
        assert_eq!(ctx.check(&op).0, KDSP_STATUS_OK);
        assert_eq!(ctx.run(&op), KDSP_STATUS_INVALID_PARAMS, "index {bad}");
        assert!(
            ctx.buf(did).bytes().iter().all(|&b| b == 0x55),
            "index {bad}"
        );
    }
    // Shapes that do not line up, a non-I32 index, a Q8_0 source.
    let iid = ctx.add_i32(&[0, 1]);
    let did = ctx.add_zeroed(4096);
    let src = rows(sid, KDSP_DTYPE_F32, &[4, 8]);
    let idx = rows(iid, KDSP_DTYPE_I32, &[2]);
    let cases = [
        (
            rows(did, KDSP_DTYPE_F32, &[3, 2]),
            src,
            idx,
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            rows(did, KDSP_DTYPE_F32, &[4, 1]),
            src,
            idx,
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            rows(did, KDSP_DTYPE_F32, &[4, 2, 2]),
            src,
            idx,
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            rows(did, KDSP_DTYPE_F32, &[4, 2]),
            src,
            rows(iid, KDSP_DTYPE_F32, &[2]),
            KDSP_STATUS_UNSUPPORTED,
        ),
        (
            rows(did, KDSP_DTYPE_F32, &[32, 2]),
            rows(sid, KDSP_DTYPE_Q8_0, &[32, 2]),
            idx,
            KDSP_STATUS_UNSUPPORTED,
        ),
    ];
    for (i, (dst, s, ix, want)) in cases.into_iter().enumerate() {
        let op = kdsp_op::new(KDSP_OP_GET_ROWS, dst, &[s, ix]);
        assert_eq!(ctx.check(&op).0, want, "case {i}");
    }
    // The destination may not overlap the source.
    let op = kdsp_op::new(
        KDSP_OP_GET_ROWS,
        rows(sid, KDSP_DTYPE_F32, &[4, 2]),
        &[src, idx],
    );
    assert_eq!(ctx.check(&op).0, KDSP_STATUS_INVALID_PARAMS);
}

#[test]
fn cpy_moves_strided_views_and_converts_bit_exactly() {
    let mut rng = Rng(62);
    let dts = [KDSP_DTYPE_F32, KDSP_DTYPE_F16];
    for case in 0..16 {
        let (si, so) = (dts[case % 2], dts[(case / 2) % 2]);
        let ne = [
            rng.range(1, 40),
            rng.range(1, 5),
            rng.range(1, 6),
            rng.range(1, 2),
        ];
        let count: usize = ne.iter().product();
        // source: a column block of a wider row (like the V part of a fused QKV output)
        let (lead, row) = (rng.range(0, 7), ne[0] * ne[1] + rng.range(0, 9));
        let data = rng.vec(lead + row * ne[2] * ne[3] + 8, 3.0);
        let mut ctx = Ctx::new(1 + case as u32 % 3);
        let sid = add_values(&mut ctx, &data, si, 0);
        let es = unit_bytes(si);
        let mut st = rows(
            sid,
            si,
            &[ne[0] as u32, ne[1] as u32, ne[2] as u32, ne[3] as u32],
        );
        st.offset = lead as u64 * es;
        st.nb[2] = row as u64 * es;
        st.nb[3] = st.nb[2] * ne[2] as u64;
        // destination: rows spaced out (like KV-cache rows of a larger capacity)
        let cap = ne[2] + rng.range(0, 4);
        let eo = unit_bytes(so) as usize;
        let did = ctx.add_zeroed(ne[0] * ne[1] * cap * ne[3] * eo);
        let mut dt = rows(
            did,
            so,
            &[ne[0] as u32, ne[1] as u32, ne[2] as u32, ne[3] as u32],
        );
        dt.nb[3] = (ne[0] * ne[1] * cap * eo) as u64;
        let op = kdsp_op::new(KDSP_OP_CPY, dt, &[st]);
        assert_eq!(ctx.run(&op), KDSP_STATUS_OK, "case {case}");
        let got = read_values(&ctx, did, so);
        let mut n = 0;
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        let s =
                            as_dtype(data[lead + (i3 * ne[2] + i2) * row + i1 * ne[0] + i0], si);
                        let want = as_dtype(s, so);
                        let g = got[((i3 * cap + i2) * ne[1] + i1) * ne[0] + i0];
                        assert_eq!(g.to_bits(), want.to_bits(), "case {case}");
                        n += 1;
                    }
                }
            }
        }
        assert_eq!(n, count);
    }
}

#[test]
fn cpy_rejects_overlap_shape_mismatch_and_other_dtypes() {
    let mut ctx = Ctx::new(1);
    let a = ctx.add_zeroed(4096);
    let b = ctx.add_zeroed(4096);
    let mut shifted = rows(a, KDSP_DTYPE_F32, &[16, 4]);
    shifted.offset = 32;
    let cases = [
        (
            rows(a, KDSP_DTYPE_F32, &[16, 4]),
            rows(a, KDSP_DTYPE_F32, &[16, 4]),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            shifted,
            rows(a, KDSP_DTYPE_F32, &[16, 4]),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            rows(b, KDSP_DTYPE_F32, &[16, 3]),
            rows(a, KDSP_DTYPE_F32, &[16, 4]),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            rows(b, KDSP_DTYPE_I32, &[16, 4]),
            rows(a, KDSP_DTYPE_F32, &[16, 4]),
            KDSP_STATUS_UNSUPPORTED,
        ),
        (
            rows(b, KDSP_DTYPE_F16, &[32, 4]),
            rows(a, KDSP_DTYPE_Q8_0, &[32, 4]),
            KDSP_STATUS_UNSUPPORTED,
        ),
    ];
    for (i, (dst, src, want)) in cases.into_iter().enumerate() {
        let op = kdsp_op::new(KDSP_OP_CPY, dst, &[src]);
        assert_eq!(ctx.check(&op).0, want, "case {i}");
        assert_eq!(ctx.run(&op), want, "case {i}");
    }
    let mut op = kdsp_op::new(
        KDSP_OP_CPY,
        rows(b, KDSP_DTYPE_F16, &[16, 4]),
        &[rows(a, KDSP_DTYPE_F32, &[16, 4])],
    );
    let mut raw = [0u32; 16];
    raw[0] = 1; // CPY has no params
    op.params = kdsp_op_params { raw };
    assert_eq!(ctx.check(&op).0, KDSP_STATUS_INVALID_PARAMS);
}
