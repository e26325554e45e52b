/*
 * tensor.c -- descriptor validation shared by every op family, row access helpers, scratch
 * carving and work splitting.
 *
 * Validation never touches tensor memory: it only reads the descriptor and the buffer table, and
 * every size computation is overflow checked in 64 bits, so a random descriptor is rejected with
 * a status before any kernel dereferences a pointer.
 */
#include <stddef.h>
#include <stdint.h>

#include "kdsp_f16.h"
#include "kdsp_internal.h"

int kdsp_dtype_is_float(uint32_t dtype) {
    return dtype == KDSP_DTYPE_F32 || dtype == KDSP_DTYPE_F16;
}

/* a * b + c without wrapping; returns 0 on overflow. */
static int kdsp_mul_add_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) {
    if (a != 0 && b > (UINT64_MAX - c) / a) {
        return 0;
    }
    *out = a * b + c;
    return 1;
}

static int kdsp_dtype_known(uint32_t dtype) {
    return dtype >= KDSP_DTYPE_F32 && dtype <= KDSP_DTYPE_Q4_0;
}

/* Bytes per element (plain types) or per 32-value block (Q8_0, Q4_0) in row-major layout. */
static uint32_t kdsp_row_major_unit(uint32_t dtype) {
    switch (dtype) {
    case KDSP_DTYPE_F32:
    case KDSP_DTYPE_I32:
        return 4u;
    case KDSP_DTYPE_F16:
        return 2u;
    case KDSP_DTYPE_Q8_0:
        return KDSP_Q8_0_BLOCK_BYTES;
    case KDSP_DTYPE_Q4_0:
        return KDSP_Q4_0_BLOCK_BYTES;
    default:
        return 0u;
    }
}

static int kdsp_is_block_dtype(uint32_t dtype) {
    return dtype == KDSP_DTYPE_Q8_0 || dtype == KDSP_DTYPE_Q4_0;
}

kdsp_status_t kdsp_resolve(const kdsp_ctx *ctx, const kdsp_tensor *t, kdsp_view *v) {
    if (t->buffer_id >= ctx->max_buffers || !ctx->buffers[t->buffer_id].in_use) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (t->_pad0 != 0 || !kdsp_dtype_known(t->dtype)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    const kdsp_buffer_slot *buf = &ctx->buffers[t->buffer_id];
    uint64_t elems = 1;
    for (uint32_t i = 0; i < KDSP_MAX_DIMS; i++) {
        if (t->ne[i] == 0 || t->ne[i] > KDSP_MAX_NE) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
        elems *= t->ne[i]; /* <= 2^31 * 2^24 before the check below: no wrap */
        if (elems > KDSP_MAX_ELEMS) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
    }
    uint64_t bytes = 0; /* bytes touched past offset */
    switch (t->layout) {
    case KDSP_LAYOUT_ROW_MAJOR: {
        const uint32_t unit = kdsp_row_major_unit(t->dtype);
        const uint64_t align = (t->dtype == KDSP_DTYPE_F32 || t->dtype == KDSP_DTYPE_I32) ? 4u : 2u;
        uint64_t row_bytes;
        if (kdsp_is_block_dtype(t->dtype)) {
            if (t->ne[0] % KDSP_QBLOCK != 0) {
                return KDSP_STATUS_INVALID_PARAMS;
            }
            row_bytes = (uint64_t)(t->ne[0] / KDSP_QBLOCK) * unit;
        } else {
            row_bytes = (uint64_t)t->ne[0] * unit;
        }
        if (t->nb[0] != unit || t->offset % align != 0) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
        bytes = row_bytes;
        for (uint32_t i = 1; i < KDSP_MAX_DIMS; i++) {
            /* no zero strides: broadcasting is expressed with ne == 1 (ADD), and every used dim
             * then costs at least `align` bytes of buffer, which bounds the work of any op */
            if (t->nb[i] % align != 0 || (t->ne[i] > 1u && t->nb[i] == 0)) {
                return KDSP_STATUS_INVALID_PARAMS;
            }
            if (!kdsp_mul_add_u64(t->ne[i] - 1u, t->nb[i], bytes, &bytes)) {
                return KDSP_STATUS_INVALID_PARAMS;
            }
        }
        break;
    }
    case KDSP_LAYOUT_HMX_ACT_TILES:
    case KDSP_LAYOUT_HMX_WEIGHT_TILES:
    case KDSP_LAYOUT_Q4_0_TILES: {
        const uint32_t want = t->layout == KDSP_LAYOUT_Q4_0_TILES ? KDSP_DTYPE_Q4_0 : KDSP_DTYPE_F16;
        if (t->dtype != want || t->ne[2] != 1 || t->ne[3] != 1 || t->offset % KDSP_BUFFER_ALIGN != 0) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
        for (uint32_t i = 0; i < KDSP_MAX_DIMS; i++) {
            if (t->nb[i] != 0) {
                return KDSP_STATUS_INVALID_PARAMS;
            }
        }
        const uint64_t tiles = (uint64_t)kdsp_ceil32(t->ne[0]) * kdsp_ceil32(t->ne[1]);
        bytes = tiles * (t->layout == KDSP_LAYOUT_Q4_0_TILES
                             ? (uint64_t)(KDSP_Q4_TILE_NIBBLE_BYTES + KDSP_Q4_TILE_SCALE_BYTES)
                             : (uint64_t)KDSP_F16_TILE_BYTES);
        break;
    }
    default:
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (t->offset > buf->size || bytes > buf->size - t->offset) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    v->data = buf->base + t->offset;
    v->dtype = t->dtype;
    v->layout = t->layout;
    v->buffer_id = t->buffer_id;
    for (uint32_t i = 0; i < KDSP_MAX_DIMS; i++) {
        v->ne[i] = t->ne[i];
        v->nb[i] = t->nb[i];
    }
    v->begin = t->offset;
    v->end = t->offset + bytes;
    return KDSP_STATUS_OK;
}

/* Sufficient condition for a row-major view to map distinct elements to distinct bytes: sorted by
 * stride, every used dim steps over the whole span of the dims below it. */
static int kdsp_view_injective(const kdsp_view *v) {
    if (v->layout != KDSP_LAYOUT_ROW_MAJOR) {
        return 1;
    }
    uint64_t span = v->nb[0]; /* bytes of one row */
    if (kdsp_is_block_dtype(v->dtype)) {
        span = (uint64_t)(v->ne[0] / KDSP_QBLOCK) * v->nb[0];
    } else {
        span = (uint64_t)v->ne[0] * v->nb[0];
    }
    uint32_t order[3] = {1, 2, 3};
    for (uint32_t i = 0; i < 3; i++) { /* insertion sort of dims 1..3 by stride */
        for (uint32_t j = i; j > 0 && v->nb[order[j]] < v->nb[order[j - 1]]; j--) {
            const uint32_t tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    }
    for (uint32_t i = 0; i < 3; i++) {
        const uint32_t d = order[i];
        if (v->ne[d] == 1) {
            continue;
        }
        if (v->nb[d] < span) {
            return 0;
        }
        span = v->nb[d] * v->ne[d]; /* bounded by the buffer size: validated extent */
    }
    return 1;
}

static int kdsp_exact_alias(const kdsp_view *a, const kdsp_view *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->layout != b->layout) {
        return 0;
    }
    for (uint32_t i = 0; i < KDSP_MAX_DIMS; i++) {
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i]) {
            return 0;
        }
    }
    return 1;
}

/* Byte ranges compared as addresses, so two buffer ids registered over the same memory are
 * still caught. */
static int kdsp_views_overlap(const kdsp_view *a, const kdsp_view *b) {
    const uintptr_t a0 = (uintptr_t)a->data;
    const uintptr_t a1 = a0 + (uintptr_t)(a->end - a->begin);
    const uintptr_t b0 = (uintptr_t)b->data;
    const uintptr_t b1 = b0 + (uintptr_t)(b->end - b->begin);
    return a0 < b1 && b0 < a1;
}

int kdsp_params_zero_from(const kdsp_op *op, uint32_t first) {
    for (uint32_t i = first; i < 16u; i++) {
        if (op->params.raw[i] != 0) {
            return 0;
        }
    }
    return 1;
}

kdsp_status_t kdsp_resolve_op(const kdsp_ctx *ctx, const kdsp_op *op, uint32_t n_src_min,
                              uint32_t n_src_max, uint32_t alias_mask, kdsp_view *dst,
                              kdsp_view *src) {
    if (op->flags != 0 || op->_pad0 != 0 || op->n_src < n_src_min || op->n_src > n_src_max) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    kdsp_status_t st = kdsp_resolve(ctx, &op->dst, dst);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    if (!kdsp_view_injective(dst)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    for (uint32_t i = 0; i < op->n_src; i++) {
        st = kdsp_resolve(ctx, &op->src[i], &src[i]);
        if (st != KDSP_STATUS_OK) {
            return st;
        }
        const int may_alias = (alias_mask >> i) & 1u;
        if (kdsp_views_overlap(dst, &src[i]) && !(may_alias && kdsp_exact_alias(dst, &src[i]))) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
    }
    return KDSP_STATUS_OK;
}

uint64_t kdsp_nelems(const kdsp_view *v) {
    return (uint64_t)v->ne[0] * v->ne[1] * v->ne[2] * v->ne[3];
}

int kdsp_same_shape(const kdsp_view *a, const kdsp_view *b) {
    return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] && a->ne[3] == b->ne[3];
}

int kdsp_is_2d(const kdsp_view *v) {
    return v->ne[2] == 1 && v->ne[3] == 1;
}

uint32_t kdsp_rows(const kdsp_view *v) {
    return v->ne[1] * v->ne[2] * v->ne[3]; /* <= KDSP_MAX_ELEMS: validated */
}

uint64_t kdsp_row_offset(const kdsp_view *v, uint32_t r) {
    const uint32_t i1 = r % v->ne[1];
    const uint32_t r2 = r / v->ne[1];
    const uint32_t i2 = r2 % v->ne[2];
    const uint32_t i3 = r2 / v->ne[2];
    return (uint64_t)i1 * v->nb[1] + (uint64_t)i2 * v->nb[2] + (uint64_t)i3 * v->nb[3];
}

float kdsp_row_get(uint32_t dtype, const uint8_t *row, uint32_t i) {
    if (dtype == KDSP_DTYPE_F16) {
        return kdsp_f16_to_f32(((const uint16_t *)(const void *)row)[i]);
    }
    return ((const float *)(const void *)row)[i];
}

void kdsp_row_set(uint32_t dtype, uint8_t *row, uint32_t i, float v) {
    if (dtype == KDSP_DTYPE_F16) {
        ((uint16_t *)(void *)row)[i] = kdsp_f32_to_f16(v);
    } else {
        ((float *)(void *)row)[i] = v;
    }
}

void kdsp_row_load(uint32_t dtype, const uint8_t *row, uint32_t n, float *out) {
    if (dtype == KDSP_DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)(const void *)row;
        for (uint32_t i = 0; i < n; i++) {
            out[i] = kdsp_f16_to_f32(h[i]);
        }
    } else {
        const float *f = (const float *)(const void *)row;
        for (uint32_t i = 0; i < n; i++) {
            out[i] = f[i];
        }
    }
}

void kdsp_row_store(uint32_t dtype, uint8_t *row, uint32_t n, const float *in) {
    if (dtype == KDSP_DTYPE_F16) {
        uint16_t *h = (uint16_t *)(void *)row;
        for (uint32_t i = 0; i < n; i++) {
            h[i] = kdsp_f32_to_f16(in[i]);
        }
    } else {
        float *f = (float *)(void *)row;
        for (uint32_t i = 0; i < n; i++) {
            f[i] = in[i];
        }
    }
}

uint64_t kdsp_align128(uint64_t x) {
    if (x > UINT64_MAX - 127u) {
        return UINT64_MAX;
    }
    return (x + 127u) & ~(uint64_t)127u;
}

uint64_t kdsp_scratch_total(uint64_t shared, uint64_t per_worker, uint32_t n_workers) {
    const uint64_t s = kdsp_align128(shared);
    const uint64_t w = kdsp_align128(per_worker);
    uint64_t total;
    if (s == UINT64_MAX || w == UINT64_MAX || !kdsp_mul_add_u64(w, n_workers, s, &total)) {
        return UINT64_MAX;
    }
    return total;
}

kdsp_status_t kdsp_scratch_check(const kdsp_ctx *ctx, uint64_t total) {
    return total <= ctx->scratch_bytes ? KDSP_STATUS_OK : KDSP_STATUS_OUT_OF_BUDGET;
}

uint8_t *kdsp_scratch_worker(const kdsp_ctx *ctx, uint64_t shared, uint64_t per_worker,
                             uint32_t worker) {
    return ctx->scratch + kdsp_align128(shared) + (uint64_t)worker * kdsp_align128(per_worker);
}

void kdsp_split(uint32_t n, uint32_t w, uint32_t nw, uint32_t *begin, uint32_t *end) {
    *begin = (uint32_t)(((uint64_t)n * w) / nw);
    *end = (uint32_t)(((uint64_t)n * (w + 1u)) / nw);
}
