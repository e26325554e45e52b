/*
 * matmul_q4_ops.c -- KDSP_OP_MATMUL_Q4_0: Q4_0 weights in 32x32 tiles times activations
 * quantized to Q8_0 on the DSP side, f32 out.
 *
 * Phase 1: workers split the M rows and quantize them (kdsp_q8_0_block) into scratch as int8
 * codes + f32 scale + code sum per 32-value block (or copy them from Q8_0 input). Phase 2: workers
 * split the output column tiles; per (tile, K block) the nibbles are unpacked once (vand/vlsr) and
 * dotted with every activation row (vrmpy), giving 32 int32 row sums; those are scaled by
 * d_w * d_a and accumulated in f32 along K, in the same order on every path:
 *   acc[m][n] += (float)sumi * (d_w[n] * d_a[m])   for K blocks in ascending order.
 * With KDSP_HVX_FLOAT the scale step runs in qf32 instead (compile-checked only).
 */
#include <stdint.h>

#include "hvx_float.h"
#include "kdsp_f16.h"
#include "kdsp_internal.h"
#include "quant_kernels.h"

#define KDSP_Q4_MB 64u /* activation rows per accumulator chunk */

typedef struct kdsp_mm_q4_plan {
    kdsp_ctx *ctx;
    kdsp_view w;
    kdsp_view a;
    kdsp_view dst;
    uint32_t M, N, K, NT, KT;
    int8_t *qa;   /* [M][KT][32] */
    float *da;    /* [M][KT] */
    int32_t *sa;  /* [M][KT] */
    uint64_t shared;
    uint64_t per_worker;
} kdsp_mm_q4_plan;

static void kdsp_mm_q4_quant_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_mm_q4_plan *p = (const kdsp_mm_q4_plan *)arg;
    uint32_t b, e;
    kdsp_split(p->M, w, nw, &b, &e);
    for (uint32_t m = b; m < e; m++) {
        const uint8_t *row = p->a.data + (uint64_t)m * p->a.nb[1];
        for (uint32_t kt = 0; kt < p->KT; kt++) {
            const uint64_t idx = (uint64_t)m * p->KT + kt;
            int8_t *q = p->qa + idx * 32u;
            uint16_t d;
            if (p->a.dtype == KDSP_DTYPE_F32) {
                const uint32_t k0 = kt * 32u;
                const uint32_t n = p->K - k0 < 32u ? p->K - k0 : 32u;
                d = kdsp_q8_0_block((const float *)(const void *)row + k0, n, q);
            } else {
                const uint8_t *blk = row + (uint64_t)kt * KDSP_Q8_0_BLOCK_BYTES;
                d = kdsp_ld_u16(blk);
                for (uint32_t i = 0; i < 32u; i++) {
                    q[i] = (int8_t)blk[2u + i];
                }
            }
            int32_t s = 0;
            for (uint32_t i = 0; i < 32u; i++) {
                s += q[i];
            }
            p->da[idx] = kdsp_f16_to_f32(d);
            p->sa[idx] = s;
        }
    }
}

static void kdsp_mm_q4_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_mm_q4_plan *p = (const kdsp_mm_q4_plan *)arg;
    uint8_t *ws = kdsp_scratch_worker(p->ctx, p->shared, p->per_worker, w);
    uint8_t *unp = ws;                                  /* 1024 B */
    int32_t *sumi = (int32_t *)(void *)(ws + 1024u);    /* 128 B */
    float *dw = (float *)(void *)(ws + 1152u);          /* 128 B */
    float *acc = (float *)(void *)(ws + 1280u);         /* MB x 32 f32 */
#if KDSP_HVX_FLOAT
    HVX_Vector *accv = (HVX_Vector *)(void *)(ws + 1280u + KDSP_Q4_MB * 128u);
#endif
    const uint64_t n_tiles = (uint64_t)p->NT * p->KT;
    const uint8_t *scales = p->w.data + n_tiles * KDSP_Q4_TILE_NIBBLE_BYTES;
    uint32_t b, e;
    kdsp_split(p->NT, w, nw, &b, &e);
    for (uint32_t nt = b; nt < e; nt++) {
        const uint32_t n0 = nt * 32u;
        const uint32_t nn = p->N - n0 < 32u ? p->N - n0 : 32u;
        for (uint32_t m0 = 0; m0 < p->M; m0 += KDSP_Q4_MB) {
            const uint32_t mb = p->M - m0 < KDSP_Q4_MB ? p->M - m0 : KDSP_Q4_MB;
#if KDSP_HVX_FLOAT
            for (uint32_t m = 0; m < mb; m++) {
                accv[m] = Q6_V_vzero();
            }
#else
            for (uint32_t i = 0; i < mb * 32u; i++) {
                acc[i] = 0.0f;
            }
#endif
            for (uint32_t kt = 0; kt < p->KT; kt++) {
                const uint64_t tile = (uint64_t)nt * p->KT + kt;
                kdsp_q4_unpack_tile(p->w.data + tile * KDSP_Q4_TILE_NIBBLE_BYTES, unp);
                const uint8_t *sc = scales + tile * KDSP_Q4_TILE_SCALE_BYTES;
                for (uint32_t r = 0; r < 32u; r++) {
                    dw[r] = kdsp_f16_to_f32(kdsp_ld_u16(sc + 2u * r));
                }
                for (uint32_t m = 0; m < mb; m++) {
                    const uint64_t idx = (uint64_t)(m0 + m) * p->KT + kt;
                    kdsp_q4_dot_tile(unp, p->qa + idx * 32u, p->sa[idx], sumi);
                    const float da = p->da[idx];
#if KDSP_HVX_FLOAT
                    accv[m] = kdsp_hvx_q4_scale_acc(accv[m], sumi, dw, da);
#else
                    float *am = acc + m * 32u;
                    for (uint32_t r = 0; r < 32u; r++) {
                        am[r] += (float)sumi[r] * (dw[r] * da);
                    }
#endif
                }
            }
            for (uint32_t m = 0; m < mb; m++) {
#if KDSP_HVX_FLOAT
                *(HVX_Vector *)(void *)(acc + m * 32u) = Q6_Vsf_equals_Vqf32(accv[m]);
#endif
                float *out = (float *)(void *)(p->dst.data + (uint64_t)(m0 + m) * p->dst.nb[1]);
                for (uint32_t r = 0; r < nn; r++) {
                    out[n0 + r] = acc[m * 32u + r];
                }
            }
        }
    }
}

kdsp_status_t kdsp_op_matmul_q4_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_mm_q4_plan p;
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
    if (p.w.layout != KDSP_LAYOUT_Q4_0_TILES || p.a.layout != KDSP_LAYOUT_ROW_MAJOR ||
        !(p.a.dtype == KDSP_DTYPE_F32 || p.a.dtype == KDSP_DTYPE_Q8_0) || p.dst.layout != KDSP_LAYOUT_ROW_MAJOR ||
        p.dst.dtype != KDSP_DTYPE_F32) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    p.K = p.w.ne[0];
    p.N = p.w.ne[1];
    p.M = p.a.ne[1];
    if (p.a.ne[0] != p.K || !kdsp_is_2d(&p.a) || p.dst.ne[0] != p.N || p.dst.ne[1] != p.M || !kdsp_is_2d(&p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.ctx = ctx;
    p.NT = kdsp_ceil32(p.N);
    p.KT = kdsp_ceil32(p.K);
    const uint64_t blocks = (uint64_t)p.M * p.KT;
    const uint64_t q_bytes = kdsp_align128(blocks * 32u);
    const uint64_t f_bytes = kdsp_align128(blocks * 4u);
    p.shared = q_bytes + 2u * f_bytes;
    p.per_worker = 1280u + KDSP_Q4_MB * 128u + (KDSP_HVX_FLOAT ? KDSP_Q4_MB * 128u : 0u);
    const uint64_t total = kdsp_scratch_total(p.shared, p.per_worker, ctx->n_workers);
    *scratch = total;
    st = kdsp_scratch_check(ctx, total);
    if (st != KDSP_STATUS_OK || !run) {
        return st;
    }
    p.qa = (int8_t *)(void *)ctx->scratch;
    p.da = (float *)(void *)(ctx->scratch + q_bytes);
    p.sa = (int32_t *)(void *)(ctx->scratch + q_bytes + f_bytes);
    kdsp_pool_run(ctx->pool, kdsp_mm_q4_quant_task, &p);
    kdsp_pool_run(ctx->pool, kdsp_mm_q4_task, &p);
    return KDSP_STATUS_OK;
}
