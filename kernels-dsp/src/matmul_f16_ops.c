/*
 * matmul_f16_ops.c -- KDSP_OP_MATMUL_F16: fp16 weights in HMX weight tiles times fp16 activation
 * tiles, f32 accumulation along K, through the portable tile engine (hmx_tile.h).
 *
 * Phase 1 (only for row-major activations): pack A into activation tiles in scratch with the HVX
 * row-pair shuffle. Phase 2: workers split the output column tiles; each walks K tile by tile
 * (consecutive weight tiles), accumulating up to KDSP_MM_NT_CHUNK column tiles x KDSP_MM_MT_CHUNK
 * row tiles of f32 accumulators, and writes f32 or f16 rows.
 */
#include <stdint.h>

#include "hmx_tile.h"
#include "kdsp_internal.h"

#define KDSP_MM_NT_CHUNK 4u
#define KDSP_MM_MT_CHUNK 8u
#define KDSP_TILE_F32_BYTES 4096u

typedef struct kdsp_mm_f16_plan {
    kdsp_ctx *ctx;
    kdsp_view w;
    kdsp_view a;
    kdsp_view dst;
    uint32_t M, N, K, MT, NT, KT;
    const uint16_t *a_tiles;
    uint16_t *packed;
    uint64_t shared;
    uint64_t per_worker;
} kdsp_mm_f16_plan;

static void kdsp_mm_f16_pack_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_mm_f16_plan *p = (const kdsp_mm_f16_plan *)arg;
    uint32_t b, e;
    kdsp_split(p->MT * p->KT, w, nw, &b, &e);
    for (uint32_t t = b; t < e; t++) {
        kdsp_pack_act_tile(&p->a, t / p->KT, t % p->KT, p->packed + (uint64_t)t * 1024u);
    }
}

static void kdsp_mm_f16_store(const kdsp_mm_f16_plan *p, const float *acc, uint32_t mt, uint32_t nt) {
    const uint32_t n0 = nt * 32u;
    const uint32_t nn = p->N - n0 < 32u ? p->N - n0 : 32u;
    for (uint32_t m = 0; m < 32u; m++) {
        const uint32_t row = mt * 32u + m;
        if (row >= p->M) {
            break;
        }
        uint8_t *out = p->dst.data + (uint64_t)row * p->dst.nb[1];
        for (uint32_t n = 0; n < nn; n++) {
            kdsp_row_set(p->dst.dtype, out, n0 + n, acc[m * 32u + n]);
        }
    }
}

static void kdsp_mm_f16_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_mm_f16_plan *p = (const kdsp_mm_f16_plan *)arg;
    float *acc = (float *)(void *)kdsp_scratch_worker(p->ctx, p->shared, p->per_worker, w);
    float *wf = acc + KDSP_MM_NT_CHUNK * KDSP_MM_MT_CHUNK * 1024u;
    float *af = wf + 1024u;
    const uint16_t *wt = (const uint16_t *)(const void *)p->w.data;
    uint32_t b, e;
    kdsp_split(p->NT, w, nw, &b, &e);
    for (uint32_t nt0 = b; nt0 < e; nt0 += KDSP_MM_NT_CHUNK) {
        const uint32_t nch = e - nt0 < KDSP_MM_NT_CHUNK ? e - nt0 : KDSP_MM_NT_CHUNK;
        for (uint32_t mt0 = 0; mt0 < p->MT; mt0 += KDSP_MM_MT_CHUNK) {
            const uint32_t mch = p->MT - mt0 < KDSP_MM_MT_CHUNK ? p->MT - mt0 : KDSP_MM_MT_CHUNK;
            for (uint32_t i = 0; i < nch * mch * 1024u; i++) {
                acc[i] = 0.0f;
            }
            for (uint32_t kt = 0; kt < p->KT; kt++) {
                for (uint32_t m = 0; m < mch; m++) {
                    kdsp_tile_act_to_f32(p->a_tiles + ((uint64_t)(mt0 + m) * p->KT + kt) * 1024u, af + m * 1024u);
                }
                for (uint32_t c = 0; c < nch; c++) {
                    kdsp_tile_weight_to_f32(wt + ((uint64_t)(nt0 + c) * p->KT + kt) * 1024u, wf);
                    for (uint32_t m = 0; m < mch; m++) {
                        kdsp_tile_mac(acc + (c * mch + m) * 1024u, af + m * 1024u, wf);
                    }
                }
            }
            for (uint32_t c = 0; c < nch; c++) {
                for (uint32_t m = 0; m < mch; m++) {
                    kdsp_mm_f16_store(p, acc + (c * mch + m) * 1024u, mt0 + m, nt0 + c);
                }
            }
        }
    }
}

kdsp_status_t kdsp_op_matmul_f16(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_mm_f16_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 2, 2, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.w = src[0];
    p.a = src[1];
    if (p.w.layout != KDSP_LAYOUT_HMX_WEIGHT_TILES ||
        !(p.a.layout == KDSP_LAYOUT_HMX_ACT_TILES ||
          (p.a.layout == KDSP_LAYOUT_ROW_MAJOR && kdsp_dtype_is_float(p.a.dtype))) ||
        p.dst.layout != KDSP_LAYOUT_ROW_MAJOR || !kdsp_dtype_is_float(p.dst.dtype)) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    p.K = p.w.ne[0];
    p.N = p.w.ne[1];
    p.M = p.a.ne[1];
    if (p.a.ne[0] != p.K || !kdsp_is_2d(&p.a) || p.dst.ne[0] != p.N || p.dst.ne[1] != p.M || !kdsp_is_2d(&p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.ctx = ctx;
    p.MT = kdsp_ceil32(p.M);
    p.NT = kdsp_ceil32(p.N);
    p.KT = kdsp_ceil32(p.K);
    const int pack = p.a.layout == KDSP_LAYOUT_ROW_MAJOR;
    p.shared = pack ? (uint64_t)p.MT * p.KT * KDSP_F16_TILE_BYTES : 0u;
    p.per_worker = (uint64_t)(KDSP_MM_NT_CHUNK * KDSP_MM_MT_CHUNK + 1u + KDSP_MM_MT_CHUNK) * KDSP_TILE_F32_BYTES;
    const uint64_t total = kdsp_scratch_total(p.shared, p.per_worker, ctx->n_workers);
    *scratch = total;
    st = kdsp_scratch_check(ctx, total);
    if (st != KDSP_STATUS_OK || !run) {
        return st;
    }
    if (pack) {
        p.packed = (uint16_t *)(void *)ctx->scratch;
        kdsp_pool_run(ctx->pool, kdsp_mm_f16_pack_task, &p);
        p.a_tiles = p.packed;
    } else {
        p.packed = NULL;
        p.a_tiles = (const uint16_t *)(const void *)p.a.data;
    }
    kdsp_pool_run(ctx->pool, kdsp_mm_f16_task, &p);
    return KDSP_STATUS_OK;
}
