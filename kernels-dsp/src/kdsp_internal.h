/*
 * kdsp_internal.h -- what the op families share inside the library: the context, resolved
 * tensor views, descriptor validation, scratch carving and work splitting. Not part of the ABI.
 */
#ifndef KDSP_INTERNAL_H
#define KDSP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kdsp_ops.h"
#include "worker_pool.h"

#define KDSP_CTX_MAGIC 0x4b435458u /* "KCTX" */

typedef struct kdsp_buffer_slot {
    uint8_t *base;
    uint64_t size;
    uint32_t in_use;
    uint32_t _pad0;
} kdsp_buffer_slot;

struct kdsp_ctx {
    uint32_t magic;
    uint32_t n_workers;
    uint32_t max_buffers;
    uint32_t _pad0;
    uint8_t *scratch;
    uint64_t scratch_bytes;
    kdsp_buffer_slot *buffers;
    kdsp_pool *pool;
};

/* A validated tensor: data pointer, dims and strides, and the byte range it may touch. */
typedef struct kdsp_view {
    uint8_t *data;
    uint32_t dtype;
    uint32_t layout;
    uint32_t buffer_id;
    uint32_t ne[4];
    uint64_t nb[4];
    uint64_t begin; /* byte offsets into the buffer: [begin, end) covers every touched byte */
    uint64_t end;
} kdsp_view;

/* Op entry points: validate the descriptor (no tensor memory is touched), report the scratch
 * need, and when run != 0 execute across the workers. Called by dispatch.c only. */
typedef kdsp_status_t (*kdsp_op_fn)(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);

kdsp_status_t kdsp_op_matmul_f16(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_matmul_q4_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_flash_attn(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_rms_norm(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_swiglu(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_add(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_rope_neox(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_quantize_q8_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_pack_act_tiles(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_unpack_act_tiles(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_pack_weight_f16(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_pack_q4_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_dequant_q4_0(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_get_rows(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);
kdsp_status_t kdsp_op_cpy(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch);

/* ---- validation (tensor.c) ---- */

/* Resolve a descriptor against the buffer table: buffer registered, dtype/layout known and
 * compatible, dims in range, strides aligned, every touched byte inside the buffer. */
kdsp_status_t kdsp_resolve(const kdsp_ctx *ctx, const kdsp_tensor *t, kdsp_view *v);

/* Resolve dst and its sources; dst must additionally not overlap itself (no zero or interleaved
 * strides) and must not overlap any source, except that source i may be an exact alias of dst when
 * bit i of alias_mask is set (only sources each worker reads at exactly the elements it writes:
 * a source every worker reads whole, such as RMSNorm's weight, must never alias dst). */
kdsp_status_t kdsp_resolve_op(const kdsp_ctx *ctx, const kdsp_op *op, uint32_t n_src_min,
                              uint32_t n_src_max, uint32_t alias_mask, kdsp_view *dst,
                              kdsp_view *src);

/* params.raw[first..16) must all be zero. */
int kdsp_params_zero_from(const kdsp_op *op, uint32_t first);

int kdsp_dtype_is_float(uint32_t dtype);
uint64_t kdsp_nelems(const kdsp_view *v);
int kdsp_same_shape(const kdsp_view *a, const kdsp_view *b);
/* Dims 1..3 are all 1. */
int kdsp_is_2d(const kdsp_view *v);
/* Number of rows (ne1*ne2*ne3). */
uint32_t kdsp_rows(const kdsp_view *v);
/* Byte offset of row r (dims 1..3 flattened in order). */
uint64_t kdsp_row_offset(const kdsp_view *v, uint32_t r);

static inline uint32_t kdsp_ceil32(uint32_t x) {
    return (x + 31u) >> 5;
}

/* Read element i of a contiguous F32 or F16 row as f32. */
float kdsp_row_get(uint32_t dtype, const uint8_t *row, uint32_t i);
/* Write element i of a contiguous F32 or F16 row (f16 rounds to nearest even). */
void kdsp_row_set(uint32_t dtype, uint8_t *row, uint32_t i, float v);
/* Convert n elements of a contiguous F32/F16 row to f32. */
void kdsp_row_load(uint32_t dtype, const uint8_t *row, uint32_t n, float *out);
/* Store n f32 values to a contiguous F32/F16 row. */
void kdsp_row_store(uint32_t dtype, uint8_t *row, uint32_t n, const float *in);

/* ---- scratch and work splitting ---- */

/* Round up to the 128-byte HVX alignment; saturates instead of wrapping. */
uint64_t kdsp_align128(uint64_t x);

/* Scratch layout: `shared` bytes followed by n_workers slices of `per_worker` bytes, each
 * 128-byte aligned. Returns the total (UINT64_MAX on overflow). */
uint64_t kdsp_scratch_total(uint64_t shared, uint64_t per_worker, uint32_t n_workers);
kdsp_status_t kdsp_scratch_check(const kdsp_ctx *ctx, uint64_t total);
uint8_t *kdsp_scratch_worker(const kdsp_ctx *ctx, uint64_t shared, uint64_t per_worker,
                             uint32_t worker);

/* Contiguous balanced split of n items: worker w of nw gets [*begin, *end). */
void kdsp_split(uint32_t n, uint32_t w, uint32_t nw, uint32_t *begin, uint32_t *end);

#endif /* KDSP_INTERNAL_H */
