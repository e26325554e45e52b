/*
 * dispatch.c -- contexts, the buffer table, and running batches of op descriptors.
 *
 * A host runtime (the emulated DSP thread on the host, or the FastRPC skel on the DSP) creates one
 * context, registers its shared buffers by id, and submits batches. Ops run in order; each op is
 * split across the context's workers by its family file. One thread at a time may call into a
 * context.
 */
#include <stddef.h>
#include <stdint.h>

#include "kdsp_hvx.h"
#include "kdsp_internal.h"

static const kdsp_op_fn kdsp_op_table[KDSP_OP_COUNT] = {
    NULL,
    kdsp_op_matmul_f16,
    kdsp_op_matmul_q4_0,
    kdsp_op_flash_attn,
    kdsp_op_rms_norm,
    kdsp_op_swiglu,
    kdsp_op_add,
    kdsp_op_rope_neox,
    kdsp_op_quantize_q8_0,
    kdsp_op_pack_act_tiles,
    kdsp_op_unpack_act_tiles,
    kdsp_op_pack_weight_f16,
    kdsp_op_pack_q4_0,
    kdsp_op_dequant_q4_0,
    kdsp_op_get_rows,
    kdsp_op_cpy,
};

static uint64_t kdsp_align16(uint64_t x) {
    return (x + 15u) & ~(uint64_t)15u;
}

static int kdsp_config_valid(const kdsp_ctx_config *cfg) {
    return cfg != NULL && cfg->n_workers >= 1u && cfg->n_workers <= KDSP_MAX_WORKERS &&
           cfg->max_buffers >= 1u && cfg->max_buffers <= KDSP_MAX_BUFFERS;
}

static int kdsp_ctx_valid(const kdsp_ctx *ctx) {
    return ctx != NULL && ctx->magic == KDSP_CTX_MAGIC;
}

uint64_t kdsp_ctx_bytes(const kdsp_ctx_config *cfg) {
    if (!kdsp_config_valid(cfg)) {
        return 0;
    }
    return kdsp_align16(sizeof(kdsp_ctx)) + kdsp_align16((uint64_t)cfg->max_buffers * sizeof(kdsp_buffer_slot)) +
           kdsp_align16(kdsp_pool_bytes(cfg->n_workers));
}

kdsp_status_t kdsp_ctx_init(void *mem, uint64_t mem_bytes, void *scratch, const kdsp_ctx_config *cfg,
                            kdsp_ctx **out) {
    if (out == NULL || mem == NULL || !kdsp_config_valid(cfg) || ((uintptr_t)mem & 15u) != 0 ||
        mem_bytes < kdsp_ctx_bytes(cfg)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (cfg->scratch_bytes != 0 && (scratch == NULL || ((uintptr_t)scratch & (KDSP_BUFFER_ALIGN - 1u)) != 0)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (cfg->scratch_bytes > (uint64_t)UINTPTR_MAX) { /* not addressable on a 32-bit DSP */
        return KDSP_STATUS_INVALID_PARAMS;
    }
    uint8_t *base = (uint8_t *)mem;
    kdsp_ctx *ctx = (kdsp_ctx *)(void *)base;
    base += kdsp_align16(sizeof(kdsp_ctx));
    ctx->buffers = (kdsp_buffer_slot *)(void *)base;
    base += kdsp_align16((uint64_t)cfg->max_buffers * sizeof(kdsp_buffer_slot));
    for (uint32_t i = 0; i < cfg->max_buffers; i++) {
        ctx->buffers[i].base = NULL;
        ctx->buffers[i].size = 0;
        ctx->buffers[i].in_use = 0;
        ctx->buffers[i]._pad0 = 0;
    }
    ctx->n_workers = cfg->n_workers;
    ctx->max_buffers = cfg->max_buffers;
    ctx->_pad0 = 0;
    ctx->scratch = (uint8_t *)scratch;
    ctx->scratch_bytes = cfg->scratch_bytes;
    if (kdsp_pool_init(base, cfg->n_workers, &ctx->pool) != 0) {
        ctx->magic = 0;
        return KDSP_STATUS_OUT_OF_BUDGET;
    }
    ctx->magic = KDSP_CTX_MAGIC;
    *out = ctx;
    return KDSP_STATUS_OK;
}

void kdsp_ctx_release(kdsp_ctx *ctx) {
    if (!kdsp_ctx_valid(ctx)) {
        return;
    }
    kdsp_pool_release(ctx->pool);
    ctx->magic = 0;
}

kdsp_status_t kdsp_buffer_register(kdsp_ctx *ctx, uint32_t id, void *base, uint64_t size) {
    if (!kdsp_ctx_valid(ctx) || id >= ctx->max_buffers || ctx->buffers[id].in_use || base == NULL ||
        size == 0 || ((uintptr_t)base & (KDSP_BUFFER_ALIGN - 1u)) != 0) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    /* the whole range must be addressable (matters on the 32-bit DSP) */
    if (size - 1u > (uint64_t)(UINTPTR_MAX - (uintptr_t)base)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    ctx->buffers[id].base = (uint8_t *)base;
    ctx->buffers[id].size = size;
    ctx->buffers[id].in_use = 1;
    return KDSP_STATUS_OK;
}

kdsp_status_t kdsp_buffer_unregister(kdsp_ctx *ctx, uint32_t id) {
    if (!kdsp_ctx_valid(ctx) || id >= ctx->max_buffers || !ctx->buffers[id].in_use) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    ctx->buffers[id].base = NULL;
    ctx->buffers[id].size = 0;
    ctx->buffers[id].in_use = 0;
    return KDSP_STATUS_OK;
}

static kdsp_status_t kdsp_run_one(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    if (op->opcode == 0 || op->opcode >= KDSP_OP_COUNT) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    uint64_t need = 0;
    const kdsp_status_t st = kdsp_op_table[op->opcode](ctx, op, run, &need);
    if (st == KDSP_STATUS_OK && scratch != NULL) {
        *scratch = need;
    }
    return st;
}

kdsp_status_t kdsp_op_check(const kdsp_ctx *ctx, const kdsp_op *op, uint64_t *scratch_bytes) {
    if (!kdsp_ctx_valid(ctx) || op == NULL) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    /* run == 0: the op only reads the descriptor and the context */
    return kdsp_run_one((kdsp_ctx *)(uintptr_t)ctx, op, 0, scratch_bytes);
}

kdsp_status_t kdsp_execute(kdsp_ctx *ctx, const kdsp_op *ops, uint32_t n_ops, uint32_t flags,
                           kdsp_status_t *statuses) {
    if (!kdsp_ctx_valid(ctx) || (ops == NULL && n_ops != 0) || (flags & ~(uint32_t)KDSP_EXEC_CONTINUE_ON_ERROR) != 0) {
        if (statuses != NULL) {
            for (uint32_t i = 0; i < n_ops; i++) {
                statuses[i] = KDSP_STATUS_INVALID_PARAMS;
            }
        }
        return KDSP_STATUS_INVALID_PARAMS;
    }
    kdsp_status_t first = KDSP_STATUS_OK;
    for (uint32_t i = 0; i < n_ops; i++) {
        kdsp_status_t st;
        if (first != KDSP_STATUS_OK && !(flags & KDSP_EXEC_CONTINUE_ON_ERROR)) {
            st = KDSP_STATUS_NOT_RUN;
        } else {
            st = kdsp_run_one(ctx, &ops[i], 1, NULL);
            if (st != KDSP_STATUS_OK && first == KDSP_STATUS_OK) {
                first = st;
            }
        }
        if (statuses != NULL) {
            statuses[i] = st;
        }
    }
    return first;
}

kdsp_status_t kdsp_execute_batch(kdsp_ctx *ctx, const void *batch, uint64_t batch_bytes,
                                 kdsp_status_t *statuses, uint32_t max_statuses) {
    if (!kdsp_ctx_valid(ctx) || batch == NULL || ((uintptr_t)batch & 7u) != 0 ||
        batch_bytes < sizeof(kdsp_batch_header)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    const kdsp_batch_header *h = (const kdsp_batch_header *)batch;
    if (h->magic != KDSP_BATCH_MAGIC) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (h->abi_version != KDSP_ABI_VERSION) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    if ((batch_bytes - sizeof(kdsp_batch_header)) / sizeof(kdsp_op) != h->n_ops ||
        (batch_bytes - sizeof(kdsp_batch_header)) % sizeof(kdsp_op) != 0 ||
        (statuses != NULL && max_statuses < h->n_ops)) {
        if (statuses != NULL && max_statuses >= h->n_ops) {
            for (uint32_t i = 0; i < h->n_ops; i++) {
                statuses[i] = KDSP_STATUS_INVALID_PARAMS;
            }
        }
        return KDSP_STATUS_INVALID_PARAMS;
    }
    const kdsp_op *ops = (const kdsp_op *)(const void *)((const uint8_t *)batch + sizeof(kdsp_batch_header));
    return kdsp_execute(ctx, ops, h->n_ops, h->flags, statuses);
}

#if KDSP_HAVE_HVX
#define KDSP_INFO_HVX "1"
#else
#define KDSP_INFO_HVX "0"
#endif
#if KDSP_HVX_FLOAT
#define KDSP_INFO_HVXF "1"
#else
#define KDSP_INFO_HVXF "0"
#endif
#if defined(KDSP_POOL_SERIAL)
#define KDSP_INFO_POOL "serial"
#else
#define KDSP_INFO_POOL "pthreads"
#endif

const char *kdsp_build_info(void) {
    return "kernels-dsp abi=2 hvx=" KDSP_INFO_HVX " hvx_float=" KDSP_INFO_HVXF " workers=" KDSP_INFO_POOL;
}
