/*
 * driver_cases.h -- the HVX self tests and the op cases of the Hexagon test driver (included by
 * driver.c only). "int" cases exercise the integer HVX paths (vand/vlsr nibble unpack, Q8_0
 * quantize, vrmpy dots, vshuff/vdeal tile packing) and must match the host build bit for bit;
 * "float" cases run scalar float code on the Hexagon core and are compared within tolerance.
 * Shapes are drawn from the seed (mostly not multiples of 32), so every seed is a new set of edges.
 */

static void selftest_report(const char *name, int ok) {
    out_str("SELFTEST ");
    out_str(name);
    out_str(ok ? " ok\n" : " FAIL\n");
    if (!ok) {
        n_fail++;
    }
}

static void selftests(void) {
#if KDSP_HAVE_HVX
    kdsp_hvx_buf u, o, in;
    int ok = 1;
    /* vrmpy(Vu.ub, Rt.b): lane j = sum_i u[4j+i] * rt.b[i] */
    for (uint32_t i = 0; i < 128u; i++) {
        u.b[i] = (uint8_t)((i * 37u + 11u) & 0xffu);
    }
    const int8_t rtb[4] = {-2, 2, -1, 127};
    const int32_t rt = (int32_t)((uint32_t)(uint8_t)rtb[0] | ((uint32_t)(uint8_t)rtb[1] << 8) |
                                 ((uint32_t)(uint8_t)rtb[2] << 16) | ((uint32_t)(uint8_t)rtb[3] << 24));
    o.v = Q6_Vw_vrmpy_VubRb(u.v, rt);
    for (uint32_t j = 0; j < 32u; j++) {
        int32_t s = 0;
        for (uint32_t i = 0; i < 4u; i++) {
            s += (int32_t)u.b[4u * j + i] * rtb[i];
        }
        ok &= o.w[j] == s;
    }
    selftest_report("vrmpy_VubRb", ok);
    /* vshuff(Vu.h) interleaves the two halves; vdeal undoes it */
    for (uint32_t i = 0; i < 64u; i++) {
        in.h[i] = (uint16_t)(i * 3u + 1u);
    }
    o.v = Q6_Vh_vshuff_Vh(in.v);
    ok = 1;
    for (uint32_t k = 0; k < 32u; k++) {
        ok &= o.h[2u * k] == in.h[k] && o.h[2u * k + 1u] == in.h[32u + k];
    }
    u.v = Q6_Vh_vdeal_Vh(o.v);
    for (uint32_t i = 0; i < 64u; i++) {
        ok &= u.h[i] == in.h[i];
    }
    selftest_report("vshuff_vdeal_h", ok);
    /* two saturating packs: words -> halfwords -> bytes, in order, in the low bytes */
    for (uint32_t i = 0; i < 32u; i++) {
        in.w[i] = ((int32_t)i - 16) * 20;
    }
    o.v = Q6_Vb_vpack_VhVh_sat(Q6_V_vzero(), Q6_Vh_vpack_VwVw_sat(Q6_V_vzero(), in.v));
    ok = 1;
    for (uint32_t i = 0; i < 32u; i++) {
        const int32_t want = in.w[i] < -128 ? -128 : (in.w[i] > 127 ? 127 : in.w[i]);
        ok &= (int8_t)o.b[i] == want;
    }
    selftest_report("vpack_sat_w_to_b", ok);
    /* vmpyi(Vu.w, Rt.h) with the halfword replicated in both halves of Rt */
    for (uint32_t i = 0; i < 32u; i++) {
        in.w[i] = (int32_t)(i * 1000u + 7u);
    }
    o.v = Q6_Vw_vmpyi_VwRh(in.v, (int32_t)((31000u << 16) | 31000u));
    ok = 1;
    for (uint32_t i = 0; i < 32u; i++) {
        ok &= o.w[i] == in.w[i] * 31000;
    }
    selftest_report("vmpyi_VwRh", ok);
#else
    out_str("SELFTEST hvx skipped (built without HVX)\n");
#endif
}

/* ---- integer-path cases ---- */

static void case_quantize_q8_0(void) {
    reset_bufs();
    const uint32_t K = 96u + 32u * rnd(0, 2), R = 7u + rnd(0, 3);
    const uint32_t x = new_buf(K * R * 4u, 0);
    fill_f32(x, K * R, 3.0f);
    float *f = (float *)(void *)buf_ptr[x];
    for (uint32_t k = 0; k < K; k++) {
        f[1u * K + k] = 0.0f;                                          /* all-zero row */
        f[2u * K + k] *= 1e-3f;                                        /* one outlier */
        f[3u * K + k] = k < 32u ? kdsp_bits_f32(k * 977u + 1u)         /* subnormals */
                                : (k < 64u ? -0.0f : (k % 2u ? 1e-30f : 1.0f));
        f[5u * K + k] = (float)((int32_t)(k % 33u) - 16);             /* exact .5 ties */
    }
    f[2u * K + 5u] = 1000.0f;
    f[4u * K + 3u] = kdsp_bits_f32(0x7fc00000u); /* NaN block */
    f[4u * K + 40u] = kdsp_bits_f32(0x7f800000u); /* inf block */
    const uint32_t dst = new_buf(R * (K / 32u) * KDSP_Q8_0_BLOCK_BYTES, 0xa5);
    const kdsp_tensor src = t_rows(x, KDSP_DTYPE_F32, K, R, 1);
    const kdsp_op op = make_op(KDSP_OP_QUANTIZE_Q8_0, t_rows(dst, KDSP_DTYPE_Q8_0, K, R, 1), 1, &src);
    run_case("quantize_q8_0", "int", &op);
}

/* Q4_0 tiles with random nibbles and finite fp16 scales. */
static uint32_t random_q4_tiles(uint32_t K, uint32_t N) {
    const uint32_t nt = tiles(K, N);
    const uint32_t id = new_buf(nt * (KDSP_Q4_TILE_NIBBLE_BYTES + KDSP_Q4_TILE_SCALE_BYTES), 0);
    fill_bytes(id, 0, nt * KDSP_Q4_TILE_NIBBLE_BYTES);
    uint16_t *sc = (uint16_t *)(void *)(buf_ptr[id] + nt * KDSP_Q4_TILE_NIBBLE_BYTES);
    for (uint32_t i = 0; i < nt * 32u; i++) {
        sc[i] = kdsp_f32_to_f16(rng_sym() * 0.05f);
    }
    return id;
}

static void case_dequant_q4_0(void) {
    reset_bufs();
    const uint32_t K = rnd(1, 100), N = rnd(1, 70);
    const uint32_t w = random_q4_tiles(K, N);
    const uint32_t dst = new_buf(K * N * 4u, 0xa5);
    const kdsp_tensor src = t_tiles(w, KDSP_LAYOUT_Q4_0_TILES, K, N);
    const kdsp_op op = make_op(KDSP_OP_DEQUANT_Q4_0, t_rows(dst, KDSP_DTYPE_F32, K, N, 1), 1, &src);
    run_case("dequant_q4_0", "int", &op);
}

static void case_pack_q4_0(void) {
    reset_bufs();
    const uint32_t K = 32u * rnd(1, 3), N = rnd(1, 70);
    const uint32_t blocks = N * K / 32u;
    const uint32_t src_id = new_buf(blocks * KDSP_Q4_0_BLOCK_BYTES, 0);
    fill_bytes(src_id, 0, blocks * KDSP_Q4_0_BLOCK_BYTES);
    for (uint32_t b = 0; b < blocks; b++) {
        kdsp_st_u16(buf_ptr[src_id] + b * KDSP_Q4_0_BLOCK_BYTES, kdsp_f32_to_f16(rng_sym() * 0.05f));
    }
    const uint32_t dst = new_buf(tiles(K, N) * 576u, 0xa5);
    const kdsp_tensor src = t_rows(src_id, KDSP_DTYPE_Q4_0, K, N, 1);
    const kdsp_op op = make_op(KDSP_OP_PACK_Q4_0, t_tiles(dst, KDSP_LAYOUT_Q4_0_TILES, K, N), 1, &src);
    run_case("pack_q4_0", "int", &op);
}

static void case_matmul_q4_q8(void) {
    reset_bufs();
    const uint32_t K = 32u * rnd(1, 4), N = rnd(1, 80), M = rnd(1, 40);
    const uint32_t w = random_q4_tiles(K, N);
    const uint32_t blocks = M * K / 32u;
    const uint32_t a = new_buf(blocks * KDSP_Q8_0_BLOCK_BYTES, 0);
    fill_bytes(a, 0, blocks * KDSP_Q8_0_BLOCK_BYTES);
    for (uint32_t b = 0; b < blocks; b++) {
        kdsp_st_u16(buf_ptr[a] + b * KDSP_Q8_0_BLOCK_BYTES, kdsp_f32_to_f16(rng_sym() * 0.02f));
    }
    const uint32_t dst = new_buf(M * N * 4u, 0xa5);
    const kdsp_tensor src[2] = {t_tiles(w, KDSP_LAYOUT_Q4_0_TILES, K, N), t_rows(a, KDSP_DTYPE_Q8_0, K, M, 1)};
    const kdsp_op op = make_op(KDSP_OP_MATMUL_Q4_0, t_rows(dst, KDSP_DTYPE_F32, N, M, 1), 2, src);
    run_case("matmul_q4_0_x_q8_0", "int", &op);
}

static void case_matmul_q4_f32(void) {
    reset_bufs();
    const uint32_t K = rnd(1, 300), N = rnd(1, 80), M = rnd(1, 70);
    const uint32_t w = random_q4_tiles(K, N);
    const uint32_t a = new_buf(M * K * 4u, 0);
    fill_f32(a, M * K, 2.0f);
    const uint32_t dst = new_buf(M * N * 4u, 0xa5);
    const kdsp_tensor src[2] = {t_tiles(w, KDSP_LAYOUT_Q4_0_TILES, K, N), t_rows(a, KDSP_DTYPE_F32, K, M, 1)};
    const kdsp_op op = make_op(KDSP_OP_MATMUL_Q4_0, t_rows(dst, KDSP_DTYPE_F32, N, M, 1), 2, src);
    run_case("matmul_q4_0_x_f32", "int", &op);
}

static void case_pack_act(uint32_t dtype, const char *name) {
    reset_bufs();
    const uint32_t K = rnd(1, 100), M = rnd(1, 100);
    const uint32_t es = dtype == KDSP_DTYPE_F16 ? 2u : 4u;
    const uint32_t a = new_buf(M * K * es, 0);
    if (dtype == KDSP_DTYPE_F16) {
        fill_f16(a, M * K, 4.0f);
    } else {
        fill_f32(a, M * K, 4.0f);
    }
    const uint32_t dst = new_buf(tiles(K, M) * KDSP_F16_TILE_BYTES, 0xa5);
    const kdsp_tensor src = t_rows(a, dtype, K, M, 1);
    const kdsp_op op = make_op(KDSP_OP_PACK_ACT_TILES, t_tiles(dst, KDSP_LAYOUT_HMX_ACT_TILES, K, M), 1, &src);
    run_case(name, "int", &op);
}

static void case_unpack_act(uint32_t dtype, const char *name) {
    reset_bufs();
    const uint32_t K = rnd(1, 100), M = rnd(1, 100);
    const uint32_t es = dtype == KDSP_DTYPE_F16 ? 2u : 4u;
    const uint32_t t = new_buf(tiles(K, M) * KDSP_F16_TILE_BYTES, 0);
    fill_bytes(t, 0, tiles(K, M) * KDSP_F16_TILE_BYTES); /* any bits: unpack is a pure shuffle */
    const uint32_t dst = new_buf(M * K * es, 0xa5);
    const kdsp_tensor src = t_tiles(t, KDSP_LAYOUT_HMX_ACT_TILES, K, M);
    const kdsp_op op = make_op(KDSP_OP_UNPACK_ACT_TILES, t_rows(dst, dtype, K, M, 1), 1, &src);
    run_case(name, "int", &op);
}

static void case_pack_weight(void) {
    reset_bufs();
    const uint32_t K = rnd(1, 100), N = rnd(1, 70);
    const uint32_t wr = new_buf(N * K * 2u, 0);
    fill_f16(wr, N * K, 1.0f);
    const uint32_t dst = new_buf(tiles(K, N) * KDSP_F16_TILE_BYTES, 0xa5);
    const kdsp_tensor src = t_rows(wr, KDSP_DTYPE_F16, K, N, 1);
    const kdsp_op op = make_op(KDSP_OP_PACK_WEIGHT_F16, t_tiles(dst, KDSP_LAYOUT_HMX_WEIGHT_TILES, K, N), 1, &src);
    run_case("pack_weight_f16", "int", &op);
}

/* GET_ROWS: data movement (and the integer f32 <-> f16 conversion), bit-exact. */
static void case_get_rows(void) {
    reset_bufs();
    const uint32_t si = rnd(0, 1) ? KDSP_DTYPE_F32 : KDSP_DTYPE_F16;
    const uint32_t so = rnd(0, 1) ? KDSP_DTYPE_F32 : KDSP_DTYPE_F16;
    const uint32_t C = rnd(1, 100), R = rnd(1, 40), B = rnd(1, 2), N = rnd(1, 30);
    const uint32_t per_batch = B > 1u && rnd(0, 1);
    const uint32_t es = si == KDSP_DTYPE_F16 ? 2u : 4u, eo = so == KDSP_DTYPE_F16 ? 2u : 4u;
    const uint32_t src = new_buf(C * R * B * es, 0);
    if (si == KDSP_DTYPE_F16) {
        fill_f16(src, C * R * B, 3.0f);
    } else {
        fill_f32(src, C * R * B, 3.0f);
    }
    const uint32_t ni = N * (per_batch ? B : 1u);
    const uint32_t idx = new_buf(ni * 4u, 0);
    for (uint32_t i = 0; i < ni; i++) {
        ((int32_t *)(void *)buf_ptr[idx])[i] = (int32_t)rnd(0, R - 1u);
    }
    const uint32_t dst = new_buf(C * N * B * eo, 0xa5);
    const kdsp_tensor srcs[2] = {t_rows(src, si, C, R, B), t_rows(idx, KDSP_DTYPE_I32, N, per_batch ? B : 1u, 1)};
    const kdsp_op op = make_op(KDSP_OP_GET_ROWS, t_rows(dst, so, C, N, B), 2, srcs);
    run_case("get_rows", "int", &op);
}

/* CPY: a column block of wider rows (V of a fused QKV) into spaced-out rows (a KV cache). */
static void case_cpy(void) {
    reset_bufs();
    const uint32_t si = rnd(0, 1) ? KDSP_DTYPE_F32 : KDSP_DTYPE_F16;
    const uint32_t so = rnd(0, 1) ? KDSP_DTYPE_F32 : KDSP_DTYPE_F16;
    const uint32_t C = rnd(1, 64), T = rnd(1, 20), lead = rnd(0, 7), row = C + lead + rnd(0, 9), cap = T + rnd(0, 5);
    const uint32_t es = si == KDSP_DTYPE_F16 ? 2u : 4u, eo = so == KDSP_DTYPE_F16 ? 2u : 4u;
    const uint32_t src = new_buf(row * T * es, 0);
    if (si == KDSP_DTYPE_F16) {
        fill_f16(src, row * T, 5.0f);
    } else {
        fill_f32(src, row * T, 5.0f);
    }
    const uint32_t dst = new_buf(C * cap * eo, 0xa5);
    kdsp_tensor s = t_rows(src, si, C, T, 1);
    s.offset = (uint64_t)lead * es;
    s.nb[1] = (uint64_t)row * es;
    s.nb[2] = s.nb[3] = s.nb[1] * T;
    kdsp_tensor d = t_rows(dst, so, C, T, 1);
    d.offset = (uint64_t)(cap - T) * C * eo; /* the last T rows of the cache */
    const kdsp_op op = make_op(KDSP_OP_CPY, d, 1, &s);
    run_case("cpy", "int", &op);
}

/* ---- scalar-float cases ---- */

/* FlashAttention over [cache ++ window] with the stale cached rows of the window skipped. */
static void case_flash_attn_skip(void) {
    reset_bufs();
    const uint32_t D = rnd(1, 96), Hkv = rnd(1, 2), Hq = Hkv * rnd(1, 3), Tq = rnd(1, 8), Tk = rnd(2, 140);
    const uint32_t b = rnd(0, Tk - 2u), e = rnd(b + 1u, Tk);
    const uint32_t q = new_buf(D * Hq * Tq * 4u, 0);
    fill_f32(q, D * Hq * Tq, 1.0f);
    const uint32_t k = new_buf(D * Hkv * Tk * 2u, 0);
    fill_f16(k, D * Hkv * Tk, 1.0f);
    const uint32_t v = new_buf(D * Hkv * Tk * 2u, 0);
    fill_f16(v, D * Hkv * Tk, 1.0f);
    const uint32_t dst = new_buf(D * Hq * Tq * 4u, 0xa5);
    const kdsp_tensor src[3] = {t_rows(q, KDSP_DTYPE_F32, D, Hq, Tq), t_rows(k, KDSP_DTYPE_F16, D, Hkv, Tk),
                                t_rows(v, KDSP_DTYPE_F16, D, Hkv, Tk)};
    kdsp_op op = make_op(KDSP_OP_FLASH_ATTN, t_rows(dst, KDSP_DTYPE_F32, D, Hq, Tq), 3, src);
    op.params.attn.scale = 0.125f;
    op.params.attn.kv_skip_begin = b;
    op.params.attn.kv_skip_end = e;
    run_case("flash_attn_skip", "float", &op);
}

static void case_matmul_f16_tiles(void) {
    reset_bufs();
    const uint32_t K = rnd(1, 130), N = rnd(1, 80), M = rnd(1, 70);
    const uint32_t wr = new_buf(N * K * 2u, 0);
    fill_f16(wr, N * K, 0.5f);
    const uint32_t ar = new_buf(M * K * 2u, 0);
    fill_f16(ar, M * K, 1.0f);
    const uint32_t wt = new_buf(tiles(K, N) * KDSP_F16_TILE_BYTES, 0);
    const uint32_t at = new_buf(tiles(K, M) * KDSP_F16_TILE_BYTES, 0);
    kdsp_tensor s = t_rows(wr, KDSP_DTYPE_F16, K, N, 1);
    kdsp_op prep = make_op(KDSP_OP_PACK_WEIGHT_F16, t_tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, K, N), 1, &s);
    prepare(&prep);
    s = t_rows(ar, KDSP_DTYPE_F16, K, M, 1);
    prep = make_op(KDSP_OP_PACK_ACT_TILES, t_tiles(at, KDSP_LAYOUT_HMX_ACT_TILES, K, M), 1, &s);
    prepare(&prep);
    const uint32_t dst = new_buf(M * N * 4u, 0xa5);
    const kdsp_tensor src[2] = {t_tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, K, N),
                                t_tiles(at, KDSP_LAYOUT_HMX_ACT_TILES, K, M)};
    const kdsp_op op = make_op(KDSP_OP_MATMUL_F16, t_rows(dst, KDSP_DTYPE_F32, N, M, 1), 2, src);
    run_case("matmul_f16_tiles", "float", &op);
}

static void case_matmul_f16_rows(void) {
    reset_bufs();
    const uint32_t K = rnd(1, 100), N = rnd(1, 70), M = rnd(1, 40);
    const uint32_t wr = new_buf(N * K * 2u, 0);
    fill_f16(wr, N * K, 0.5f);
    const uint32_t wt = new_buf(tiles(K, N) * KDSP_F16_TILE_BYTES, 0);
    const kdsp_tensor s = t_rows(wr, KDSP_DTYPE_F16, K, N, 1);
    const kdsp_op prep = make_op(KDSP_OP_PACK_WEIGHT_F16, t_tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, K, N), 1, &s);
    prepare(&prep);
    const uint32_t a = new_buf(M * K * 4u, 0);
    fill_f32(a, M * K, 1.0f);
    const uint32_t dst = new_buf(M * N * 2u, 0xa5);
    const kdsp_tensor src[2] = {t_tiles(wt, KDSP_LAYOUT_HMX_WEIGHT_TILES, K, N), t_rows(a, KDSP_DTYPE_F32, K, M, 1)};
    const kdsp_op op = make_op(KDSP_OP_MATMUL_F16, t_rows(dst, KDSP_DTYPE_F16, N, M, 1), 2, src);
    run_case("matmul_f16_rows", "float", &op);
}

static void case_flash_attn_mask(void) {
    reset_bufs();
    const uint32_t D = rnd(1, 128), Hkv = rnd(1, 2), Hq = Hkv * rnd(1, 3), Tq = rnd(1, 8), Tk = rnd(1, 130);
    const uint32_t q = new_buf(D * Hq * Tq * 4u, 0);
    fill_f32(q, D * Hq * Tq, 1.0f);
    const uint32_t k = new_buf(D * Hkv * Tk * 2u, 0);
    fill_f16(k, D * Hkv * Tk, 1.0f);
    const uint32_t v = new_buf(D * Hkv * Tk * 2u, 0);
    fill_f16(v, D * Hkv * Tk, 1.0f);
    const uint32_t m = new_buf(Tk * Tq * 4u, 0);
    fill_f32(m, Tk * Tq, 0.5f);
    float *mf = (float *)(void *)buf_ptr[m];
    for (uint32_t t = 0; t < Tq; t++) {
        for (uint32_t j = 0; j < Tk; j++) {
            if (j % 7u == t || t == Tq - 1u) { /* the last query row sees nothing */
                mf[t * Tk + j] = -kdsp_bits_f32(0x7f800000u);
            }
        }
    }
    const uint32_t dst = new_buf(D * Hq * Tq * 4u, 0xa5);
    const kdsp_tensor src[4] = {t_rows(q, KDSP_DTYPE_F32, D, Hq, Tq), t_rows(k, KDSP_DTYPE_F16, D, Hkv, Tk),
                                t_rows(v, KDSP_DTYPE_F16, D, Hkv, Tk), t_rows(m, KDSP_DTYPE_F32, Tk, Tq, 1)};
    kdsp_op op = make_op(KDSP_OP_FLASH_ATTN, t_rows(dst, KDSP_DTYPE_F32, D, Hq, Tq), 4, src);
    op.params.attn.scale = 0.125f;
    run_case("flash_attn_gqa_mask", "float", &op);
}

static void case_flash_attn_f16(void) {
    reset_bufs();
    const uint32_t D = rnd(1, 80), H = rnd(1, 3), Tq = rnd(1, 6), Tk = rnd(1, 100);
    const uint32_t q = new_buf(D * H * Tq * 2u, 0);
    fill_f16(q, D * H * Tq, 1.0f);
    const uint32_t k = new_buf(D * H * Tk * 2u, 0);
    fill_f16(k, D * H * Tk, 1.0f);
    const uint32_t v = new_buf(D * H * Tk * 2u, 0);
    fill_f16(v, D * H * Tk, 1.0f);
    const uint32_t dst = new_buf(D * H * Tq * 2u, 0xa5);
    const kdsp_tensor src[3] = {t_rows(q, KDSP_DTYPE_F16, D, H, Tq), t_rows(k, KDSP_DTYPE_F16, D, H, Tk),
                                t_rows(v, KDSP_DTYPE_F16, D, H, Tk)};
    kdsp_op op = make_op(KDSP_OP_FLASH_ATTN, t_rows(dst, KDSP_DTYPE_F16, D, H, Tq), 3, src);
    op.params.attn.scale = 0.158113883f;
    run_case("flash_attn_f16", "float", &op);
}

static void case_rms_norm(void) {
    reset_bufs();
    const uint32_t n = rnd(1, 300), R = rnd(1, 8);
    const uint32_t x = new_buf(n * R * 4u, 0);
    fill_f32(x, n * R, 2.0f);
    const uint32_t w = new_buf(n * 4u, 0);
    fill_f32(w, n, 1.0f);
    const uint32_t dst = new_buf(n * R * 4u, 0xa5);
    const kdsp_tensor src[2] = {t_rows(x, KDSP_DTYPE_F32, n, R, 1), t_rows(w, KDSP_DTYPE_F32, n, 1, 1)};
    kdsp_op op = make_op(KDSP_OP_RMS_NORM, t_rows(dst, KDSP_DTYPE_F32, n, R, 1), 2, src);
    op.params.norm.eps = 1e-5f;
    run_case("rms_norm", "float", &op);
}

static void case_swiglu(void) {
    reset_bufs();
    const uint32_t n = rnd(1, 100), R = rnd(1, 4);
    const uint32_t g = new_buf(n * R * 2u, 0);
    fill_f16(g, n * R, 6.0f);
    const uint32_t u = new_buf(n * R * 2u, 0);
    fill_f16(u, n * R, 2.0f);
    const uint32_t dst = new_buf(n * R * 2u, 0xa5);
    const kdsp_tensor src[2] = {t_rows(g, KDSP_DTYPE_F16, n, R, 1), t_rows(u, KDSP_DTYPE_F16, n, R, 1)};
    const kdsp_op op = make_op(KDSP_OP_SWIGLU, t_rows(dst, KDSP_DTYPE_F16, n, R, 1), 2, src);
    run_case("swiglu", "float", &op);
}

static void case_add(void) {
    reset_bufs();
    const uint32_t n = rnd(1, 80), R = rnd(1, 5);
    const uint32_t a = new_buf(n * R * 4u, 0);
    fill_f32(a, n * R, 1.0f);
    const uint32_t b = new_buf(n * 4u, 0);
    fill_f32(b, n, 1.0f);
    const uint32_t dst = new_buf(n * R * 4u, 0xa5);
    const kdsp_tensor src[2] = {t_rows(a, KDSP_DTYPE_F32, n, R, 1), t_rows(b, KDSP_DTYPE_F32, n, 1, 1)};
    const kdsp_op op = make_op(KDSP_OP_ADD, t_rows(dst, KDSP_DTYPE_F32, n, R, 1), 2, src);
    run_case("add_broadcast", "float", &op);
}

static void case_rope(void) {
    reset_bufs();
    const uint32_t D = 2u * rnd(1, 32), H = rnd(1, 4), T = 5, P = 10;
    const uint32_t x = new_buf(D * H * T * 4u, 0);
    fill_f32(x, D * H * T, 1.0f);
    const uint32_t pos = new_buf(T * 4u, 0);
    const int32_t pv[5] = {0, 3, 9, 2, 7};
    for (uint32_t t = 0; t < T; t++) {
        ((int32_t *)(void *)buf_ptr[pos])[t] = pv[t];
    }
    const uint32_t c = new_buf(D / 2u * P * 4u, 0);
    fill_f32(c, D / 2u * P, 1.0f);
    const uint32_t s = new_buf(D / 2u * P * 4u, 0);
    fill_f32(s, D / 2u * P, 1.0f);
    const uint32_t dst = new_buf(D * H * T * 4u, 0xa5);
    const kdsp_tensor src[4] = {t_rows(x, KDSP_DTYPE_F32, D, H, T), t_rows(pos, KDSP_DTYPE_I32, T, 1, 1),
                                t_rows(c, KDSP_DTYPE_F32, D / 2u, P, 1), t_rows(s, KDSP_DTYPE_F32, D / 2u, P, 1)};
    const kdsp_op op = make_op(KDSP_OP_ROPE_NEOX, t_rows(dst, KDSP_DTYPE_F32, D, H, T), 4, src);
    run_case("rope_neox", "float", &op);
}

static void run_all_cases(void) {
    case_quantize_q8_0();
    case_dequant_q4_0();
    case_pack_q4_0();
    case_matmul_q4_q8();
    case_matmul_q4_f32();
    case_pack_act(KDSP_DTYPE_F16, "pack_act_tiles_f16");
    case_pack_act(KDSP_DTYPE_F32, "pack_act_tiles_f32");
    case_unpack_act(KDSP_DTYPE_F16, "unpack_act_tiles_f16");
    case_unpack_act(KDSP_DTYPE_F32, "unpack_act_tiles_f32");
    case_pack_weight();
    case_get_rows();
    case_cpy();
    case_matmul_f16_tiles();
    case_matmul_f16_rows();
    case_flash_attn_mask();
    case_flash_attn_f16();
    case_flash_attn_skip();
    case_rms_norm();
    case_swiglu();
    case_add();
    case_rope();
}
