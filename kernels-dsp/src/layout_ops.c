/*
 * layout_ops.c -- conversions into and out of the tiled layouts:
 *   KDSP_OP_PACK_ACT_TILES / KDSP_OP_UNPACK_ACT_TILES  (HVX vshuff / vdeal per row pair)
 *   KDSP_OP_PACK_WEIGHT_F16                            (load time, portable)
 *   KDSP_OP_PACK_Q4_0                                  (ggml block_q4_0 rows -> Q4_0 tiles)
 *   KDSP_OP_DEQUANT_Q4_0                               (HVX nibble unpack, then code * d)
 * Every op splits its tiles across the workers; tiles never share output bytes.
 */
#include <stdint.h>

#include "hmx_tile.h"
#include "kdsp_f16.h"
#include "kdsp_internal.h"
#include "quant_kernels.h"

typedef struct kdsp_layout_plan {
    kdsp_view src, dst;
    uint32_t R, C;   /* logical rows (M or N) and columns (K) */
    uint32_t RT, CT; /* tile counts */
} kdsp_layout_plan;

static int kdsp_layout_plan_init(kdsp_layout_plan *p, const kdsp_view *logical) {
    p->C = logical->ne[0];
    p->R = logical->ne[1];
    p->RT = kdsp_ceil32(p->R);
    p->CT = kdsp_ceil32(p->C);
    return kdsp_same_shape(&p->src, &p->dst) && kdsp_is_2d(&p->src);
}

static int kdsp_is_float_rows(const kdsp_view *v) {
    return v->layout == KDSP_LAYOUT_ROW_MAJOR && kdsp_dtype_is_float(v->dtype);
}

/* ---- activation tiles ---- */

static void kdsp_pack_act_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_layout_plan *p = (const kdsp_layout_plan *)arg;
    uint32_t b, e;
    kdsp_split(p->RT * p->CT, w, nw, &b, &e);
    for (uint32_t t = b; t < e; t++) {
        kdsp_pack_act_tile(&p->src, t / p->CT, t % p->CT, (uint16_t *)(void *)(p->dst.data + (uint64_t)t * KDSP_F16_TILE_BYTES));
    }
}

kdsp_status_t kdsp_op_pack_act_tiles(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_layout_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 1, 1, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    p.src = src[0];
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (!kdsp_is_float_rows(&p.src) || p.dst.layout != KDSP_LAYOUT_HMX_ACT_TILES) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_layout_plan_init(&p, &p.src)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_pack_act_task, &p);
    }
    return KDSP_STATUS_OK;
}

static void kdsp_unpack_act_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_layout_plan *p = (const kdsp_layout_plan *)arg;
    uint32_t b, e;
    kdsp_split(p->RT * p->CT, w, nw, &b, &e);
    for (uint32_t t = b; t < e; t++) {
        const uint16_t *tile = (const uint16_t *)(const void *)(p->src.data + (uint64_t)t * KDSP_F16_TILE_BYTES);
        kdsp_unpack_act_tile(tile, t / p->CT, t % p->CT, &p->dst);
    }
}

kdsp_status_t kdsp_op_unpack_act_tiles(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_layout_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 1, 1, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    p.src = src[0];
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (p.src.layout != KDSP_LAYOUT_HMX_ACT_TILES || !kdsp_is_float_rows(&p.dst)) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_layout_plan_init(&p, &p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_unpack_act_task, &p);
    }
    return KDSP_STATUS_OK;
}

/* ---- fp16 weight tiles ---- */

static void kdsp_pack_weight_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_layout_plan *p = (const kdsp_layout_plan *)arg;
    uint32_t b, e;
    kdsp_split(p->RT * p->CT, w, nw, &b, &e);
    for (uint32_t t = b; t < e; t++) {
        const uint32_t nt = t / p->CT;
        const uint32_t kt = t % p->CT;
        uint16_t *tile = (uint16_t *)(void *)(p->dst.data + (uint64_t)t * KDSP_F16_TILE_BYTES);
        for (uint32_t n = 0; n < 32u; n++) {
            const uint32_t row = nt * 32u + n;
            const uint8_t *src = row < p->R ? p->src.data + (uint64_t)row * p->src.nb[1] : NULL;
            for (uint32_t k = 0; k < 32u; k++) {
                const uint32_t col = kt * 32u + k;
                uint16_t h = 0;
                if (src != NULL && col < p->C) {
                    h = p->src.dtype == KDSP_DTYPE_F16 ? ((const uint16_t *)(const void *)src)[col]
                                                       : kdsp_f32_to_f16(((const float *)(const void *)src)[col]);
                }
                tile[KDSP_WT_HW(k, n)] = h;
            }
        }
    }
}

kdsp_status_t kdsp_op_pack_weight_f16(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_layout_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 1, 1, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    p.src = src[0];
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (!kdsp_is_float_rows(&p.src) || p.dst.layout != KDSP_LAYOUT_HMX_WEIGHT_TILES) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_layout_plan_init(&p, &p.src)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_pack_weight_task, &p);
    }
    return KDSP_STATUS_OK;
}

/* ---- Q4_0 tiles ---- */

static void kdsp_pack_q4_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_layout_plan *p = (const kdsp_layout_plan *)arg;
    const uint64_t n_tiles = (uint64_t)p->RT * p->CT;
    uint32_t b, e;
    kdsp_split(p->RT * p->CT, w, nw, &b, &e);
    for (uint32_t t = b; t < e; t++) {
        const uint32_t nt = t / p->CT;
        const uint32_t kt = t % p->CT;
        uint8_t *nib = p->dst.data + (uint64_t)t * KDSP_Q4_TILE_NIBBLE_BYTES;
        uint8_t *sc = p->dst.data + n_tiles * KDSP_Q4_TILE_NIBBLE_BYTES + (uint64_t)t * KDSP_Q4_TILE_SCALE_BYTES;
        for (uint32_t r = 0; r < 32u; r++) {
            const uint32_t row = nt * 32u + r;
            uint8_t codes[32];
            uint16_t d = 0;
            if (row < p->R) {
                const uint8_t *blk = p->src.data + (uint64_t)row * p->src.nb[1] + (uint64_t)kt * KDSP_Q4_0_BLOCK_BYTES;
                d = kdsp_ld_u16(blk);
                for (uint32_t j = 0; j < 16u; j++) {
                    codes[j] = (uint8_t)(blk[2u + j] & 0x0fu);
                    codes[j + 16u] = (uint8_t)(blk[2u + j] >> 4);
                }
            } else {
                for (uint32_t j = 0; j < 32u; j++) {
                    codes[j] = 8u;
                }
            }
            kdsp_st_u16(sc + 2u * r, d);
            for (uint32_t q = 0; q < 4u; q++) {
                for (uint32_t i = 0; i < 4u; i++) {
                    nib[q * 128u + r * 4u + i] = (uint8_t)(codes[8u * q + i] | (codes[8u * q + 4u + i] << 4));
                }
            }
        }
    }
}

kdsp_status_t kdsp_op_pack_q4_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_layout_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 1, 1, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    p.src = src[0];
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (p.src.layout != KDSP_LAYOUT_ROW_MAJOR || p.src.dtype != KDSP_DTYPE_Q4_0 ||
        p.dst.layout != KDSP_LAYOUT_Q4_0_TILES) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_layout_plan_init(&p, &p.src)) { /* K % 32 == 0: validated for Q4_0 rows */
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_pack_q4_task, &p);
    }
    return KDSP_STATUS_OK;
}

static void kdsp_dequant_q4_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_layout_plan *p = (const kdsp_layout_plan *)arg;
    const uint64_t n_tiles = (uint64_t)p->RT * p->CT;
    kdsp_rowpair_buf unp[8]; /* 1024 B, 128-byte aligned */
    uint32_t b, e;
    kdsp_split(p->RT * p->CT, w, nw, &b, &e);
    for (uint32_t t = b; t < e; t++) {
        const uint32_t nt = t / p->CT;
        const uint32_t kt = t % p->CT;
        const uint8_t *sc = p->src.data + n_tiles * KDSP_Q4_TILE_NIBBLE_BYTES + (uint64_t)t * KDSP_Q4_TILE_SCALE_BYTES;
        kdsp_q4_unpack_tile(p->src.data + (uint64_t)t * KDSP_Q4_TILE_NIBBLE_BYTES, unp[0].b);
        const uint8_t *codes = unp[0].b;
        const uint32_t nk = p->C - kt * 32u < 32u ? p->C - kt * 32u : 32u;
        for (uint32_t r = 0; r < 32u; r++) {
            const uint32_t row = nt * 32u + r;
            if (row >= p->R) {
                break;
            }
            const float d = kdsp_f16_to_f32(kdsp_ld_u16(sc + 2u * r));
            uint8_t *out = p->dst.data + (uint64_t)row * p->dst.nb[1];
            for (uint32_t k = 0; k < nk; k++) {
                const int32_t c = codes[KDSP_Q4_UNP(r, k)];
                kdsp_row_set(p->dst.dtype, out, kt * 32u + k, (float)(c - 8) * d);
            }
        }
    }
}

kdsp_status_t kdsp_op_dequant_q4_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_layout_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 1, 1, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    p.src = src[0];
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (p.src.layout != KDSP_LAYOUT_Q4_0_TILES || !kdsp_is_float_rows(&p.dst)) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_layout_plan_init(&p, &p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_dequant_q4_task, &p);
    }
    return KDSP_STATUS_OK;
}
