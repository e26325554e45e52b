/*
 * rows_ops.c -- data movement: KDSP_OP_GET_ROWS (gather rows by an I32 index vector) and
 * KDSP_OP_CPY (strided copy with F32 <-> F16 conversion).
 *
 * These let a whole transformer block stay on the DSP: the last block gathers only the rows
 * whose logits were asked for, and V (or any strided view of a fused projection) is written as
 * fp16 straight into KV-cache rows. Both split destination rows across workers; conversions
 * use the bit-exact software fp16 of kdsp_f16.h, and a same-type copy moves bits unchanged.
 */
#include <stdint.h>

#include "kdsp_f16.h"
#include "kdsp_internal.h"

typedef struct kdsp_rows_plan {
    kdsp_view src, idx, dst;
} kdsp_rows_plan;

static int kdsp_float_rows(const kdsp_view *v) {
    return v->layout == KDSP_LAYOUT_ROW_MAJOR && kdsp_dtype_is_float(v->dtype);
}

/* One contiguous row of n elements from `in` (dtype si) to `out` (dtype so). */
static void kdsp_copy_row(uint32_t so, uint8_t *out, uint32_t si, const uint8_t *in, uint32_t n) {
    if (si == so) {
        const uint32_t bytes = n * (si == KDSP_DTYPE_F16 ? 2u : 4u);
        for (uint32_t i = 0; i < bytes; i++) {
            out[i] = in[i];
        }
    } else if (si == KDSP_DTYPE_F32) {
        const float *f = (const float *)(const void *)in;
        uint16_t *h = (uint16_t *)(void *)out;
        for (uint32_t i = 0; i < n; i++) {
            h[i] = kdsp_f32_to_f16(f[i]);
        }
    } else {
        const uint16_t *h = (const uint16_t *)(const void *)in;
        float *f = (float *)(void *)out;
        for (uint32_t i = 0; i < n; i++) {
            f[i] = kdsp_f16_to_f32(h[i]);
        }
    }
}

/* ---- GET_ROWS ---- */

static int32_t kdsp_index_at(const kdsp_rows_plan *p, uint32_t i, uint32_t b) {
    const uint32_t ib = p->idx.ne[1] == 1u ? 0u : b;
    return *(const int32_t *)(const void *)(p->idx.data + (uint64_t)i * p->idx.nb[0] +
                                            (uint64_t)ib * p->idx.nb[1]);
}

static void kdsp_get_rows_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_rows_plan *p = (const kdsp_rows_plan *)arg;
    const uint32_t N = p->dst.ne[1];
    uint32_t b0, e0;
    kdsp_split(N * p->dst.ne[2], w, nw, &b0, &e0);
    for (uint32_t r = b0; r < e0; r++) {
        const uint32_t i = r % N;
        const uint32_t b = r / N;
        const uint32_t row = (uint32_t)kdsp_index_at(p, i, b); /* validated in range */
        const uint8_t *in = p->src.data + (uint64_t)row * p->src.nb[1] + (uint64_t)b * p->src.nb[2];
        uint8_t *out = p->dst.data + (uint64_t)i * p->dst.nb[1] + (uint64_t)b * p->dst.nb[2];
        kdsp_copy_row(p->dst.dtype, out, p->src.dtype, in, p->dst.ne[0]);
    }
}

kdsp_status_t kdsp_op_get_rows(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_rows_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 2, 2, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.src = src[0];
    p.idx = src[1];
    if (!kdsp_float_rows(&p.src) || !kdsp_float_rows(&p.dst) || p.idx.layout != KDSP_LAYOUT_ROW_MAJOR ||
        p.idx.dtype != KDSP_DTYPE_I32) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    const uint32_t B = p.src.ne[2];
    if (p.src.ne[3] != 1u || p.dst.ne[0] != p.src.ne[0] || p.dst.ne[1] != p.idx.ne[0] || p.dst.ne[2] != B ||
        p.dst.ne[3] != 1u || !(p.idx.ne[1] == 1u || p.idx.ne[1] == B) || p.idx.ne[2] != 1u ||
        p.idx.ne[3] != 1u) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (!run) {
        return KDSP_STATUS_OK;
    }
    /* indices are data: check them all before writing anything */
    for (uint32_t b = 0; b < p.idx.ne[1]; b++) {
        for (uint32_t i = 0; i < p.idx.ne[0]; i++) {
            const int32_t r = kdsp_index_at(&p, i, b);
            if (r < 0 || (uint32_t)r >= p.src.ne[1]) {
                return KDSP_STATUS_INVALID_PARAMS;
            }
        }
    }
    kdsp_pool_run(ctx->pool, kdsp_get_rows_task, &p);
    return KDSP_STATUS_OK;
}

/* ---- CPY ---- */

static void kdsp_cpy_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_rows_plan *p = (const kdsp_rows_plan *)arg;
    uint32_t b, e;
    kdsp_split(kdsp_rows(&p->dst), w, nw, &b, &e);
    for (uint32_t r = b; r < e; r++) {
        kdsp_copy_row(p->dst.dtype, p->dst.data + kdsp_row_offset(&p->dst, r), p->src.dtype,
                      p->src.data + kdsp_row_offset(&p->src, r), p->dst.ne[0]);
    }
}

kdsp_status_t kdsp_op_cpy(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_rows_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 1, 1, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.src = src[0];
    if (!kdsp_float_rows(&p.src) || !kdsp_float_rows(&p.dst)) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_same_shape(&p.src, &p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_cpy_task, &p);
    }
    return KDSP_STATUS_OK;
}
