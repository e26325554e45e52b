//! The dispatcher and the buffer table: batches and per-op statuses, the serialized batch format,
//! registration rules, check mode and scratch budgets, overlap and alias rules.

use crate::common;

use common::reference::*;
use common::*;
use kernels_dsp::*;

/// A small valid ADD over fresh buffers: (ctx, op, dst id).
fn add_setup(n: usize) -> (Ctx, kdsp_op, u32) {
    let mut ctx = Ctx::new(2);
    let a = ctx.add_f32(&vec![1.0; n]);
    let b = ctx.add_f32(&vec![2.0; n]);
    let d = ctx.add_zeroed(4 * n);
    let o = kdsp_op::new(
        KDSP_OP_ADD,
        rows(d, KDSP_DTYPE_F32, &[n as u32]),
        &[
            rows(a, KDSP_DTYPE_F32, &[n as u32]),
            rows(b, KDSP_DTYPE_F32, &[n as u32]),
        ],
    );
    (ctx, o, d)
}

#[test]
fn a_batch_chains_ops_and_stops_at_the_first_failure() {
    // quantize -> Q4_0 matmul on the Q8_0 result; pack -> fp16 matmul on the tiles
    let (m, n, k) = (9usize, 40usize, 64usize);
    let mut rng = Rng(71);
    let a = rng.vec(m * k, 1.0);
    let codes: Vec<u8> = (0..n * k).map(|_| rng.byte() & 15).collect();
    let scales: Vec<u16> = (0..n * 2).map(|_| f16_bits(rng.sym() * 0.1)).collect();
    let wh: Vec<u16> = (0..n * k).map(|_| f16_bits(rng.sym())).collect();
    let mut ctx = Ctx::new(3);
    let ai = ctx.add_f32(&a);
    let q8 = ctx.add_zeroed(m * 2 * 34);
    let q4 = ctx.add_bytes(&q4_tiles(&codes, &scales, n, k));
    let d1 = ctx.add_zeroed(m * n * 4);
    let at = ctx.add_zeroed(2048 * 2);
    let wt = ctx.add_bytes(&weight_tiles(&wh, n, k));
    let d2 = ctx.add_zeroed(m * n * 4);
    let (ku, mu, nu) = (k as u32, m as u32, n as u32);
    let ops = vec![
        kdsp_op::new(
            KDSP_OP_QUANTIZE_Q8_0,
            rows(q8, KDSP_DTYPE_Q8_0, &[ku, mu]),
            &[rows(ai, KDSP_DTYPE_F32, &[ku, mu])],
        ),
        kdsp_op::new(
            KDSP_OP_MATMUL_Q4_0,
            rows(d1, KDSP_DTYPE_F32, &[nu, mu]),
            &[
                tiles(q4, KDSP_LAYOUT_Q4_0_TILES, ku, nu),
                rows(q8, KDSP_DTYPE_Q8_0, &[ku, mu]),
            ],
        ),
        kdsp_op::new(
            KDSP_OP_PACK_ACT_TILES,
            tiles(at, KDSP_LAYOUT_HMX_ACT_TILES, ku, mu),
            &[rows(ai, KDSP_DTYPE_F32, &[ku, mu])],
        ),
        kdsp_op::new(
            KDSP_OP_MATMUL_F16,
            rows(d2, KDSP_DTYPE_F32, &[nu, mu]),
            &[
                tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, ku, nu),
                tiles(at, KDSP_LAYOUT_HMX_ACT_TILES, ku, mu),
            ],
        ),
    ];
    let (st, sts) = ctx.run_batch(&ops, 0);
    assert_eq!((st, sts), (KDSP_STATUS_OK, vec![KDSP_STATUS_OK; 4]));
    // the chained Q4_0 result equals the direct f32-activation path (same quantization)
    let d3 = ctx.add_zeroed(m * n * 4);
    let direct = kdsp_op::new(
        KDSP_OP_MATMUL_Q4_0,
        rows(d3, KDSP_DTYPE_F32, &[nu, mu]),
        &[
            tiles(q4, KDSP_LAYOUT_Q4_0_TILES, ku, nu),
            rows(ai, KDSP_DTYPE_F32, &[ku, mu]),
        ],
    );
    assert_eq!(ctx.run(&direct), KDSP_STATUS_OK);
    assert_eq!(ctx.buf(d1).bytes(), ctx.buf(d3).bytes());
    // and the fp16 chain equals the internal-pack path
    let d4 = ctx.add_zeroed(m * n * 4);
    let internal = kdsp_op::new(
        KDSP_OP_MATMUL_F16,
        rows(d4, KDSP_DTYPE_F32, &[nu, mu]),
        &[
            tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, ku, nu),
            rows(ai, KDSP_DTYPE_F32, &[ku, mu]),
        ],
    );
    assert_eq!(ctx.run(&internal), KDSP_STATUS_OK);
    assert_eq!(ctx.buf(d2).bytes(), ctx.buf(d4).bytes());

    // a bad op in the middle: later ops are NOT_RUN, unless CONTINUE_ON_ERROR
    let mut bad = ops.clone();
    bad[1].src[0].buffer_id = 60; // unregistered
    let before = ctx.buf(d2).bytes().to_vec();
    ctx.buf_mut(d2).bytes_mut().fill(0);
    let (st, sts) = ctx.run_batch(&bad, 0);
    assert_eq!(st, KDSP_STATUS_INVALID_PARAMS);
    assert_eq!(
        sts,
        vec![
            KDSP_STATUS_OK,
            KDSP_STATUS_INVALID_PARAMS,
            KDSP_STATUS_NOT_RUN,
            KDSP_STATUS_NOT_RUN
        ]
    );
    assert!(
        ctx.buf(d2).bytes().iter().all(|&b| b == 0),
        "a NOT_RUN op wrote its output"
    );
    let (st, sts) = ctx.run_batch(&bad, KDSP_EXEC_CONTINUE_ON_ERROR);
    assert_eq!(st, KDSP_STATUS_INVALID_PARAMS);
    assert_eq!(
        sts,
        vec![
            KDSP_STATUS_OK,
            KDSP_STATUS_INVALID_PARAMS,
            KDSP_STATUS_OK,
            KDSP_STATUS_OK
        ]
    );
    assert_eq!(ctx.buf(d2).bytes(), &before[..]);
    // unknown flags reject the whole batch
    let (st, sts) = ctx.run_batch(&ops, 0x80);
    assert_eq!(
        (st, sts),
        (
            KDSP_STATUS_INVALID_PARAMS,
            vec![KDSP_STATUS_INVALID_PARAMS; 4]
        )
    );
}

fn serialize(ops: &[kdsp_op], magic: u32, version: u32, flags: u32) -> Vec<u64> {
    let header = kdsp_batch_header {
        magic,
        abi_version: version,
        n_ops: ops.len() as u32,
        flags,
    };
    let mut bytes = Vec::new();
    // SAFETY: plain-old-data structs viewed as bytes.
    unsafe {
        bytes.extend_from_slice(std::slice::from_raw_parts(
            (&header as *const kdsp_batch_header).cast::<u8>(),
            16,
        ));
        bytes.extend_from_slice(std::slice::from_raw_parts(
            ops.as_ptr().cast::<u8>(),
            std::mem::size_of_val(ops),
        ));
    }
    // 8-byte aligned storage, as a FastRPC buffer would be
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: words has at least bytes.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), bytes.len())
    };
    words
}

#[test]
fn serialized_batches_are_checked_before_running() {
    let (mut ctx, o, d) = add_setup(33);
    let run = |ctx: &mut Ctx, words: &[u64], len: usize, max: u32| -> (u32, Vec<u32>) {
        let mut st = vec![u32::MAX; 4];
        // SAFETY: words holds len bytes; st has room for max <= 4 entries.
        let r = unsafe {
            kdsp_execute_batch(
                ctx.raw(),
                words.as_ptr().cast(),
                len as u64,
                st.as_mut_ptr(),
                max,
            )
        };
        (r, st)
    };
    let ok = serialize(&[o, o], KDSP_BATCH_MAGIC, KDSP_ABI_VERSION, 0);
    let len = 16 + 2 * 440;
    assert_eq!(
        run(&mut ctx, &ok, len, 4),
        (KDSP_STATUS_OK, vec![0, 0, u32::MAX, u32::MAX])
    );
    assert_eq!(ctx.f32s(d), vec![3.0; 33]);
    assert_eq!(
        run(
            &mut ctx,
            &serialize(&[o], 0x1234, KDSP_ABI_VERSION, 0),
            16 + 440,
            4
        )
        .0,
        KDSP_STATUS_INVALID_PARAMS
    );
    assert_eq!(
        run(
            &mut ctx,
            &serialize(&[o], KDSP_BATCH_MAGIC, KDSP_ABI_VERSION + 1, 0),
            16 + 440,
            4
        )
        .0,
        KDSP_STATUS_UNSUPPORTED
    );
    assert_eq!(
        run(&mut ctx, &ok, len - 8, 4).0,
        KDSP_STATUS_INVALID_PARAMS,
        "truncated"
    );
    assert_eq!(
        run(&mut ctx, &ok, len + 8, 4).0,
        KDSP_STATUS_INVALID_PARAMS,
        "trailing bytes"
    );
    assert_eq!(
        run(&mut ctx, &ok, 8, 4).0,
        KDSP_STATUS_INVALID_PARAMS,
        "shorter than a header"
    );
    assert_eq!(
        run(&mut ctx, &ok, len, 1).0,
        KDSP_STATUS_INVALID_PARAMS,
        "status array too small"
    );
    // misaligned batch pointer
    let mut st = [0u32; 2];
    // SAFETY: the pointer is in bounds; the callee must reject the misalignment before reading.
    let r = unsafe {
        kdsp_execute_batch(
            ctx.raw(),
            ok.as_ptr().cast::<u8>().add(4).cast(),
            len as u64,
            st.as_mut_ptr(),
            2,
        )
    };
    assert_eq!(r, KDSP_STATUS_INVALID_PARAMS);
}

#[test]
fn buffer_registration_rules() {
    let mut ctx = Ctx::with(1, 4, 0);
    let a = Buf::new(256);
    let raw = ctx.raw();
    // SAFETY: pointers stay valid for the calls; nothing is executed on them.
    unsafe {
        assert_eq!(
            kdsp_buffer_register(raw, 0, a.ptr().add(4).cast(), 128),
            KDSP_STATUS_INVALID_PARAMS,
            "unaligned base"
        );
        assert_eq!(
            kdsp_buffer_register(raw, 4, a.ptr().cast(), 128),
            KDSP_STATUS_INVALID_PARAMS,
            "id out of range"
        );
        assert_eq!(
            kdsp_buffer_register(raw, 0, a.ptr().cast(), 0),
            KDSP_STATUS_INVALID_PARAMS,
            "empty"
        );
        assert_eq!(
            kdsp_buffer_register(raw, 0, std::ptr::null_mut(), 128),
            KDSP_STATUS_INVALID_PARAMS,
            "null"
        );
        assert_eq!(
            kdsp_buffer_register(raw, 0, a.ptr().cast(), 256),
            KDSP_STATUS_OK
        );
        assert_eq!(
            kdsp_buffer_register(raw, 0, a.ptr().cast(), 256),
            KDSP_STATUS_INVALID_PARAMS,
            "slot taken"
        );
        assert_eq!(
            kdsp_buffer_unregister(raw, 1),
            KDSP_STATUS_INVALID_PARAMS,
            "free slot"
        );
        assert_eq!(kdsp_buffer_unregister(raw, 0), KDSP_STATUS_OK);
    }
    // an op on an unregistered id is rejected
    let o = kdsp_op::new(
        KDSP_OP_ADD,
        rows(0, KDSP_DTYPE_F32, &[4]),
        &[rows(0, KDSP_DTYPE_F32, &[4]), rows(0, KDSP_DTYPE_F32, &[4])],
    );
    assert_eq!(ctx.check(&o).0, KDSP_STATUS_INVALID_PARAMS);
    // context configs
    for (w, b) in [
        (0u32, 4u32),
        (KDSP_MAX_WORKERS + 1, 4),
        (1, 0),
        (1, KDSP_MAX_BUFFERS + 1),
    ] {
        let cfg = kdsp_ctx_config {
            n_workers: w,
            max_buffers: b,
            scratch_bytes: 0,
        };
        // SAFETY: valid pointer.
        assert_eq!(
            unsafe { kdsp_ctx_bytes(&cfg) },
            0,
            "{w} workers / {b} buffers"
        );
    }
}

#[test]
fn check_mode_reports_scratch_and_budgets_are_enforced() {
    let (m, n, k) = (64u32, 64u32, 4096u32);
    let mut big = Ctx::new(2);
    let a = big.add_zeroed((m * k * 4) as usize);
    let w = big.add_zeroed((n * k / 32 * 576 / 32) as usize);
    let d = big.add_zeroed((m * n * 4) as usize);
    let o = kdsp_op::new(
        KDSP_OP_MATMUL_Q4_0,
        rows(d, KDSP_DTYPE_F32, &[n, m]),
        &[
            tiles(w, KDSP_LAYOUT_Q4_0_TILES, k, n),
            rows(a, KDSP_DTYPE_F32, &[k, m]),
        ],
    );
    let (st, need) = big.check(&o);
    assert_eq!(st, KDSP_STATUS_OK);
    // activations quantized into scratch: codes + scale + sum per 32 values, plus per-worker state
    assert!(
        need >= (m * k + 2 * 4 * m * k / 32) as u64 && need < 1 << 20,
        "scratch {need}"
    );
    // the same op on a context whose scratch is one byte short
    let mut small = Ctx::with(2, 8, need - 1);
    let (a2, w2) = (
        small.add_zeroed((m * k * 4) as usize),
        small.add_zeroed((n * k / 32 * 576 / 32) as usize),
    );
    let d2 = small.add(Buf::from_bytes(&vec![0x5a; (m * n * 4) as usize]));
    let o2 = kdsp_op::new(
        KDSP_OP_MATMUL_Q4_0,
        rows(d2, KDSP_DTYPE_F32, &[n, m]),
        &[
            tiles(w2, KDSP_LAYOUT_Q4_0_TILES, k, n),
            rows(a2, KDSP_DTYPE_F32, &[k, m]),
        ],
    );
    assert_eq!(small.check(&o2).0, KDSP_STATUS_OUT_OF_BUDGET);
    assert_eq!(small.run(&o2), KDSP_STATUS_OUT_OF_BUDGET);
    assert!(
        small.buf(d2).bytes().iter().all(|&b| b == 0x5a),
        "output written despite OUT_OF_BUDGET"
    );
    // FlashAttention beyond the supported head dim is UNSUPPORTED, not INVALID
    let mut ctx = Ctx::new(1);
    let q = ctx.add_zeroed(300 * 4);
    let kv = ctx.add_zeroed(300 * 2);
    let dst = ctx.add_zeroed(300 * 4);
    let mut fa = kdsp_op::new(
        KDSP_OP_FLASH_ATTN,
        rows(dst, KDSP_DTYPE_F32, &[300]),
        &[
            rows(q, KDSP_DTYPE_F32, &[300]),
            rows(kv, KDSP_DTYPE_F16, &[300]),
            rows(kv, KDSP_DTYPE_F16, &[300]),
        ],
    );
    fa.params.attn.scale = 1.0;
    assert_eq!(ctx.check(&fa).0, KDSP_STATUS_UNSUPPORTED);
    fa.params.attn.scale = f32::NAN;
    assert_eq!(ctx.check(&fa).0, KDSP_STATUS_INVALID_PARAMS);
}

#[test]
fn outputs_may_not_overlap_inputs_except_exact_in_place_aliases() {
    let n = 64u32;
    let (mut ctx, o, _) = add_setup(n as usize);
    assert_eq!(ctx.check(&o).0, KDSP_STATUS_OK);
    let a = o.src[0];
    // exact alias of src0: in-place add is allowed and correct
    let mut inplace = o;
    inplace.dst = a;
    assert_eq!(ctx.run(&inplace), KDSP_STATUS_OK);
    assert_eq!(ctx.f32s(a.buffer_id), vec![3.0; n as usize]);
    // only the sources an op documents as aliasable: ADD writes in place over src0, never src1
    let mut over_b = o;
    over_b.dst = o.src[1];
    assert_eq!(ctx.check(&over_b).0, KDSP_STATUS_INVALID_PARAMS);
    // partial overlap: same buffer, shifted by one element
    let mut shifted = o;
    shifted.dst = a;
    shifted.dst.ne[0] = n - 1;
    shifted.dst.offset = 4;
    shifted.src[0].ne[0] = n - 1;
    shifted.src[1].ne[0] = n - 1;
    assert_eq!(ctx.check(&shifted).0, KDSP_STATUS_INVALID_PARAMS);
    // same memory under a second buffer id
    let base = ctx.buf(a.buffer_id).ptr();
    // SAFETY: the memory stays alive (owned by ctx) while registered under id 40.
    assert_eq!(
        unsafe { kdsp_buffer_register(ctx.raw(), 40, base.cast(), 4 * n as u64) },
        KDSP_STATUS_OK
    );
    let mut other_id = o;
    other_id.dst = a;
    other_id.dst.buffer_id = 40;
    other_id.dst.ne[0] = n / 2;
    other_id.src[0].ne[0] = n / 2;
    other_id.src[1].ne[0] = n / 2;
    other_id.src[0].offset = 4 * (n / 4) as u64;
    assert_eq!(ctx.check(&other_id).0, KDSP_STATUS_INVALID_PARAMS);
    // a destination that overlaps itself (zero or interleaved strides)
    let mut selfov = o;
    selfov.dst.ne = [n / 2, 2, 1, 1];
    selfov.dst.nb = [4, 4, 4 * n as u64, 4 * n as u64]; // rows 1 element apart
    selfov.src[0].ne = [n / 2, 2, 1, 1];
    selfov.src[0].nb = [4, 2 * n as u64, 4 * n as u64, 4 * n as u64];
    selfov.src[1].ne = [n / 2, 1, 1, 1];
    assert_eq!(ctx.check(&selfov).0, KDSP_STATUS_INVALID_PARAMS);
    // ops without in-place support reject any overlap; disjoint ranges of one buffer are fine
    let shared = ctx.add_zeroed(4096);
    let mut pack = kdsp_op::new(
        KDSP_OP_PACK_ACT_TILES,
        tiles(shared, KDSP_LAYOUT_HMX_ACT_TILES, 4, 2),
        &[rows(shared, KDSP_DTYPE_F32, &[4, 2])],
    );
    assert_eq!(
        ctx.check(&pack).0,
        KDSP_STATUS_INVALID_PARAMS,
        "tile output over its own input"
    );
    pack.dst.offset = 2048;
    assert_eq!(
        ctx.check(&pack).0,
        KDSP_STATUS_OK,
        "disjoint ranges of one buffer"
    );
}

#[test]
fn malformed_fields_are_rejected_with_a_status() {
    // A quick host-side sweep (the sanitizer test covers this far more heavily).
    let (ctx, o, _) = add_setup(40);
    type Mutation = Box<dyn Fn(&mut kdsp_op)>;
    let cases: Vec<(&str, Mutation, u32)> = vec![
        (
            "dim 0",
            Box::new(|o| o.dst.ne[1] = 0),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "dim huge",
            Box::new(|o| o.src[0].ne[0] = u32::MAX),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "stride overflow",
            Box::new(|o| {
                o.src[1].ne[1] = 3;
                o.src[1].nb[1] = u64::MAX / 2;
            }),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "offset past end",
            Box::new(|o| o.src[0].offset = 4),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "offset wraps",
            Box::new(|o| o.src[0].offset = u64::MAX - 3),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "misaligned offset",
            Box::new(|o| o.src[0].offset = 2),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "inner stride",
            Box::new(|o| o.src[0].nb[0] = 8),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "zero stride",
            Box::new(|o| {
                o.src[1].ne[1] = 2;
                o.src[1].nb[1] = 0;
            }),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "dtype",
            Box::new(|o| o.src[0].dtype = 9),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "dtype for the op",
            Box::new(|o| o.src[0].dtype = KDSP_DTYPE_I32),
            KDSP_STATUS_UNSUPPORTED,
        ),
        (
            "layout",
            Box::new(|o| o.dst.layout = 0),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "pad",
            Box::new(|o| o.dst._pad0 = 1),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "flags",
            Box::new(|o| o.flags = 1),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "n_src",
            Box::new(|o| o.n_src = 5),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "params",
            Box::new(|o| unsafe { o.params.raw[3] = 1 }),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "buffer id",
            Box::new(|o| o.src[1].buffer_id = 1 << 20),
            KDSP_STATUS_INVALID_PARAMS,
        ),
        (
            "shape",
            Box::new(|o| o.src[1].ne[0] = 20),
            KDSP_STATUS_INVALID_PARAMS,
        ),
    ];
    for (name, f, want) in cases {
        let mut bad = o;
        f(&mut bad);
        assert_eq!(ctx.check(&bad).0, want, "{name}");
    }
}
