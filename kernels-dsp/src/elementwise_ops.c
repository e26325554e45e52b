/*
 * elementwise_ops.c -- KDSP_OP_SWIGLU (silu(gate) * up), KDSP_OP_ADD (with broadcasting of the
 * second operand) and KDSP_OP_ROPE_NEOX (half rotation with host-computed cos/sin tables).
 * All three work row by row (dims 1..3 flattened), rows split across workers, f32 arithmetic,
 * and may write in place over an exactly aliased source.
 */
#include <stdint.h>

#include "hvx_float.h"
#include "kdsp_internal.h"
#include "kdsp_math.h"

typedef struct kdsp_ew_plan {
    kdsp_view a, b, c, d, dst; /* meaning depends on the op */
} kdsp_ew_plan;

static int kdsp_float_row_major(const kdsp_view *v) {
    return v->layout == KDSP_LAYOUT_ROW_MAJOR && kdsp_dtype_is_float(v->dtype);
}

/* ---- SWIGLU ---- */

static void kdsp_swiglu_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_ew_plan *p = (const kdsp_ew_plan *)arg;
    const uint32_t n = p->dst.ne[0];
    uint32_t b, e;
    kdsp_split(kdsp_rows(&p->dst), w, nw, &b, &e);
    for (uint32_t r = b; r < e; r++) {
        const uint8_t *g = p->a.data + kdsp_row_offset(&p->a, r);
        const uint8_t *u = p->b.data + kdsp_row_offset(&p->b, r);
        uint8_t *o = p->dst.data + kdsp_row_offset(&p->dst, r);
        for (uint32_t i = 0; i < n; i++) {
            const float gv = kdsp_row_get(p->a.dtype, g, i);
            const float uv = kdsp_row_get(p->b.dtype, u, i);
            kdsp_row_set(p->dst.dtype, o, i, kdsp_siluf(gv) * uv);
        }
    }
}

kdsp_status_t kdsp_op_swiglu(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_ew_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 2, 2, 0x3u, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.a = src[0];
    p.b = src[1];
    if (!kdsp_float_row_major(&p.a) || !kdsp_float_row_major(&p.b) || !kdsp_float_row_major(&p.dst)) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_same_shape(&p.a, &p.dst) || !kdsp_same_shape(&p.b, &p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_swiglu_task, &p);
    }
    return KDSP_STATUS_OK;
}

/* ---- ADD ---- */

static void kdsp_add_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_ew_plan *p = (const kdsp_ew_plan *)arg;
    const uint32_t n = p->dst.ne[0];
    uint32_t b, e;
    kdsp_split(kdsp_rows(&p->dst), w, nw, &b, &e);
    for (uint32_t r = b; r < e; r++) {
        const uint32_t i1 = r % p->dst.ne[1];
        const uint32_t i2 = (r / p->dst.ne[1]) % p->dst.ne[2];
        const uint32_t i3 = r / (p->dst.ne[1] * p->dst.ne[2]);
        const uint64_t boff = (uint64_t)(p->b.ne[1] == 1u ? 0u : i1) * p->b.nb[1] +
                              (uint64_t)(p->b.ne[2] == 1u ? 0u : i2) * p->b.nb[2] +
                              (uint64_t)(p->b.ne[3] == 1u ? 0u : i3) * p->b.nb[3];
        const uint8_t *ar = p->a.data + kdsp_row_offset(&p->a, r);
        const uint8_t *br = p->b.data + boff;
        uint8_t *o = p->dst.data + kdsp_row_offset(&p->dst, r);
#if KDSP_HVX_FLOAT
        if (p->a.dtype == KDSP_DTYPE_F32 && p->b.dtype == KDSP_DTYPE_F32 && p->dst.dtype == KDSP_DTYPE_F32 &&
            p->b.ne[0] == n) {
            kdsp_hvx_add_f32((float *)(void *)o, (const float *)(const void *)ar, (const float *)(const void *)br, n);
            continue;
        }
#endif
        const int bcast = p->b.ne[0] == 1u;
        for (uint32_t i = 0; i < n; i++) {
            const float av = kdsp_row_get(p->a.dtype, ar, i);
            const float bv = kdsp_row_get(p->b.dtype, br, bcast ? 0u : i);
            kdsp_row_set(p->dst.dtype, o, i, av + bv);
        }
    }
}

kdsp_status_t kdsp_op_add(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_ew_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 2, 2, 0x1u, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.a = src[0];
    p.b = src[1];
    if (!kdsp_float_row_major(&p.a) || !kdsp_float_row_major(&p.b) || !kdsp_float_row_major(&p.dst)) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_same_shape(&p.a, &p.dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    for (uint32_t i = 0; i < KDSP_MAX_DIMS; i++) {
        if (p.b.ne[i] != 1u && p.b.ne[i] != p.a.ne[i]) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
    }
    *scratch = 0;
    if (run) {
        kdsp_pool_run(ctx->pool, kdsp_add_task, &p);
    }
    return KDSP_STATUS_OK;
}

/* ---- ROPE_NEOX ---- (a = x, b = pos, c = cos, d = sin) */

static void kdsp_rope_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_ew_plan *p = (const kdsp_ew_plan *)arg;
    const uint32_t half = p->dst.ne[0] / 2u;
    const uint32_t H = p->dst.ne[1];
    const int32_t *pos = (const int32_t *)(const void *)p->b.data;
    uint32_t b, e;
    kdsp_split(kdsp_rows(&p->dst), w, nw, &b, &e);
    for (uint32_t r = b; r < e; r++) {
        const uint32_t t = r / H;
        const uint32_t ps = (uint32_t)pos[t];
        const float *cs = (const float *)(const void *)(p->c.data + (uint64_t)ps * p->c.nb[1]);
        const float *sn = (const float *)(const void *)(p->d.data + (uint64_t)ps * p->d.nb[1]);
        const uint8_t *x = p->a.data + kdsp_row_offset(&p->a, r);
        uint8_t *o = p->dst.data + kdsp_row_offset(&p->dst, r);
        for (uint32_t i = 0; i < half; i++) {
            const float x0 = kdsp_row_get(p->a.dtype, x, i);
            const float x1 = kdsp_row_get(p->a.dtype, x, i + half);
            kdsp_row_set(p->dst.dtype, o, i, x0 * cs[i] - x1 * sn[i]);
            kdsp_row_set(p->dst.dtype, o, i + half, x1 * cs[i] + x0 * sn[i]);
        }
    }
}

kdsp_status_t kdsp_op_rope_neox(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_ew_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 4, 4, 0x1u, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_params_zero_from(op, 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.a = src[0];
    p.b = src[1];
    p.c = src[2];
    p.d = src[3];
    if (!kdsp_float_row_major(&p.a) || !kdsp_float_row_major(&p.dst) || p.b.layout != KDSP_LAYOUT_ROW_MAJOR ||
        p.b.dtype != KDSP_DTYPE_I32 || p.c.layout != KDSP_LAYOUT_ROW_MAJOR || p.c.dtype != KDSP_DTYPE_F32 ||
        p.d.layout != KDSP_LAYOUT_ROW_MAJOR || p.d.dtype != KDSP_DTYPE_F32) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    const uint32_t D = p.a.ne[0];
    const uint32_t T = p.a.ne[2];
    if (D % 2u != 0 || p.a.ne[3] != 1u || !kdsp_same_shape(&p.a, &p.dst) || p.b.ne[0] != T ||
        kdsp_nelems(&p.b) != T || p.c.ne[0] != D / 2u || !kdsp_is_2d(&p.c) || !kdsp_same_shape(&p.c, &p.d)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    *scratch = 0;
    if (!run) {
        return KDSP_STATUS_OK;
    }
    /* positions are data: check them all before writing anything */
    const int32_t *pos = (const int32_t *)(const void *)p.b.data;
    for (uint32_t t = 0; t < T; t++) {
        if (pos[t] < 0 || (uint32_t)pos[t] >= p.c.ne[1]) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
    }
    kdsp_pool_run(ctx->pool, kdsp_rope_task, &p);
    return KDSP_STATUS_OK;
}
