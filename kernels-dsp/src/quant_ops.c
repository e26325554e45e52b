/*
 * quant_ops.c -- KDSP_OP_QUANTIZE_Q8_0: f32 rows -> ggml block_q8_0 rows with the integer
 * rounding rule of quant_kernels.h (HVX: one 128-byte vector per 32-value block).
 */
#include <stdint.h>

#include "kdsp_f16.h"
#include "kdsp_internal.h"
#include "quant_kernels.h"

typedef struct kdsp_quant_plan {
    kdsp_view x, dst;
} kdsp_quant_plan;

static void kdsp_quant_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_quant_plan *p = (const kdsp_quant_plan *)arg;
    const uint32_t nblk = p->x.ne[0] / KDSP_QBLOCK;
    uint32_t b, e;
    kdsp_split(kdsp_rows(&p->x), w, nw, &b, &e);
    for (uint32_t r = b; r < e; r++) {
        const float *x = (const float *)(const void *)(p->x.data + kdsp_row_offset(&p->x, r));
        uint8_t *out = p->dst.data + kdsp_row_offset(&p->dst, r);
        for (uint32_t k = 0; k < nblk; k++) {
            int8_t q[32];
            const uint16_t d = kdsp_q8_0_block(x + (uint64_t)k * KDSP_QBLOCK, KDSP_QBLOCK, q);
            uint8_t *blk = out + (uint64_t)k * KDSP_Q8_0_BLOCK_BYTES;
            kdsp_st_u16(blk, d);
            for (uint32_t i = 0; i < 32u; i++) {
                blk[2u + i] = (uint8_t)q[i];
            }
        }
    }
}

kdsp_status_t kdsp_op_quantize_q8_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_quant_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 1, 1, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.x = src[0];
    if (p.x.layout != KDSP_LAYOUT_ROW_MAJOR || p.x.dtype != KDSP_DTYPE_F32 ||
        p.dst.layout != KDSP_LAYOUT_ROW_MAJOR || p.dst.dtype != KDSP_DTYPE_Q8_0) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    /* the dst shape check also enforces ne0 % 32 == 0 (validated for Q8_0 rows) */
    if (!kdsp_same_shape(&p.x, &p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_quant_task, &p);
    }
    return KDSP_STATUS_OK;
}
