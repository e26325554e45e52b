/*
 * norm_ops.c -- KDSP_OP_RMS_NORM: y = x * rsqrt(mean(x^2) + eps) * w over the innermost dim,
 * computed in f32 (sum of squares in order, mean by division, kdsp_rsqrtf), rows split across
 * workers. With KDSP_HVX_FLOAT and all-F32 contiguous rows the sum and the scaling run in qf32
 * (compile-checked only).
 */
#include <stdint.h>

#include "hvx_float.h"
#include "kdsp_internal.h"
#include "kdsp_math.h"

typedef struct kdsp_norm_plan {
    kdsp_ctx *ctx;
    kdsp_view x, w, dst;
    float eps;
    uint64_t per_worker;
} kdsp_norm_plan;

static void kdsp_norm_task(void *arg, uint32_t wi, uint32_t nw) {
    const kdsp_norm_plan *p = (const kdsp_norm_plan *)arg;
    const uint32_t n = p->x.ne[0];
    float *xf = (float *)(void *)kdsp_scratch_worker(p->ctx, 0, p->per_worker, wi);
    float *wf = xf + n;
    kdsp_row_load(p->w.dtype, p->w.data, n, wf);
    uint32_t b, e;
    kdsp_split(kdsp_rows(&p->x), wi, nw, &b, &e);
    for (uint32_t r = b; r < e; r++) {
        kdsp_row_load(p->x.dtype, p->x.data + kdsp_row_offset(&p->x, r), n, xf);
#if KDSP_HVX_FLOAT
        const float ss = kdsp_hvx_sumsq_f32(xf, n);
#else
        const float ss = kdsp_dot_f32(xf, xf, n);
#endif
        const float rs = kdsp_rsqrtf(ss / (float)n + p->eps);
#if KDSP_HVX_FLOAT
        kdsp_hvx_scale_mul_f32(xf, xf, wf, rs, n);
#else
        for (uint32_t j = 0; j < n; j++) {
            xf[j] = (xf[j] * rs) * wf[j];
        }
#endif
        kdsp_row_store(p->dst.dtype, p->dst.data + kdsp_row_offset(&p->dst, r), n, xf);
    }
}

kdsp_status_t kdsp_op_rms_norm(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_norm_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    /* x may alias dst (each worker rewrites its own rows); the weight, read whole by every
     * worker, may not. */
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 2, 2, 0x1u, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    p.eps = op->params.norm.eps;
    if (!kdsp_isfinite(p.eps) || !(p.eps >= 0.0f) || !kdsp_params_zero_from(op, 1)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.x = src[0];
    p.w = src[1];
    if (p.x.layout != KDSP_LAYOUT_ROW_MAJOR || !kdsp_dtype_is_float(p.x.dtype) ||
        p.w.layout != KDSP_LAYOUT_ROW_MAJOR || !kdsp_dtype_is_float(p.w.dtype) ||
        p.dst.layout != KDSP_LAYOUT_ROW_MAJOR || !kdsp_dtype_is_float(p.dst.dtype)) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if (!kdsp_same_shape(&p.x, &p.dst) || p.w.ne[0] != p.x.ne[0] || kdsp_nelems(&p.w) != p.w.ne[0]) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.ctx = ctx;
    p.per_worker = (uint64_t)p.x.ne[0] * 2u * sizeof(float);
    const uint64_t total = kdsp_scratch_total(0, p.per_worker, ctx->n_workers);
    *scratch = total;
    st = kdsp_scratch_check(ctx, total);
    if (st != KDSP_STATUS_OK || !run) {
        return st;
    }
    kdsp_pool_run(ctx->pool, kdsp_norm_task, &p);
    return KDSP_STATUS_OK;
}
