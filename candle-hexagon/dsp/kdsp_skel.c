/*
 * kdsp_skel.c -- the kdsp remote interface on the DSP: context set-up, buffer registration by
 * file descriptor, batch execution, op checks. Only kdsp_ops.h, kdsp_rpc.h and the platform
 * layer of kdsp_skel.h are used, so the file compiles for the host shim and (with the SDK's
 * qaic-generated glue around kdsp_skel_invoke) for a real Hexagon skel.
 */
#include <stdint.h>
#include <string.h>

#include "kdsp_ops.h"
#include "kdsp_rpc.h"
#include "kdsp_skel.h"

struct kdsp_skel_session {
    kdsp_ctx *ctx;
    void *ctx_mem;
    void *scratch;
};

int kdsp_skel_open(kdsp_skel_session **out) {
    if (out == NULL) {
        return AEE_EBADPARM;
    }
    kdsp_skel_session *s = (kdsp_skel_session *)kdsp_plat_alloc(sizeof(*s), 16);
    if (s == NULL) {
        return AEE_ENOMEMORY;
    }
    memset(s, 0, sizeof(*s));
    *out = s;
    return AEE_SUCCESS;
}

void kdsp_skel_close(kdsp_skel_session *s) {
    if (s == NULL) {
        return;
    }
    if (s->ctx != NULL) {
        kdsp_ctx_release(s->ctx);
    }
    kdsp_plat_free(s->ctx_mem);
    kdsp_plat_free(s->scratch);
    kdsp_plat_free(s);
}

/* Input buffer i / output buffer j of an invocation with the given counts. */
static int kdsp_arg_in(uint32_t sc, remote_arg *pra, uint32_t i, size_t want, void **p) {
    if (i >= REMOTE_SCALARS_INBUFS(sc) || pra[i].buf.nLen != want || pra[i].buf.pv == NULL) {
        return 0;
    }
    *p = pra[i].buf.pv;
    return 1;
}

static int kdsp_arg_out(uint32_t sc, remote_arg *pra, uint32_t j, size_t want, void **p) {
    const uint32_t nin = REMOTE_SCALARS_INBUFS(sc);
    if (j >= REMOTE_SCALARS_OUTBUFS(sc) || pra[nin + j].buf.nLen != want || pra[nin + j].buf.pv == NULL) {
        return 0;
    }
    *p = pra[nin + j].buf.pv;
    return 1;
}

static void kdsp_put_u32(void *p, uint32_t v) {
    memcpy(p, &v, sizeof(v));
}

static int kdsp_method_init(kdsp_skel_session *s, uint32_t sc, remote_arg *pra) {
    void *in, *out;
    if (!kdsp_arg_in(sc, pra, 0, sizeof(kdsp_ctx_config), &in) || !kdsp_arg_out(sc, pra, 0, 4, &out)) {
        return AEE_EBADPARM;
    }
    if (s->ctx != NULL) {
        return AEE_EBADSTATE;
    }
    kdsp_ctx_config cfg;
    memcpy(&cfg, in, sizeof(cfg));
    const uint64_t bytes = kdsp_ctx_bytes(&cfg);
    if (bytes == 0 || bytes > SIZE_MAX || cfg.scratch_bytes > SIZE_MAX) {
        kdsp_put_u32(out, KDSP_STATUS_INVALID_PARAMS);
        return AEE_SUCCESS;
    }
    s->ctx_mem = kdsp_plat_alloc((size_t)bytes, 128);
    s->scratch = cfg.scratch_bytes ? kdsp_plat_alloc((size_t)cfg.scratch_bytes, 128) : NULL;
    if (s->ctx_mem == NULL || (cfg.scratch_bytes && s->scratch == NULL)) {
        kdsp_plat_free(s->ctx_mem);
        kdsp_plat_free(s->scratch);
        s->ctx_mem = s->scratch = NULL;
        return AEE_ENOMEMORY;
    }
    const kdsp_status_t st = kdsp_ctx_init(s->ctx_mem, bytes, s->scratch, &cfg, &s->ctx);
    if (st != KDSP_STATUS_OK) {
        s->ctx = NULL;
    }
    kdsp_put_u32(out, st);
    return AEE_SUCCESS;
}

static int kdsp_method_register(kdsp_skel_session *s, uint32_t sc, remote_arg *pra) {
    void *in, *out;
    if (!kdsp_arg_in(sc, pra, 0, sizeof(kdsp_rpc_register), &in) || !kdsp_arg_out(sc, pra, 0, 4, &out)) {
        return AEE_EBADPARM;
    }
    if (s->ctx == NULL) {
        return AEE_EBADSTATE;
    }
    kdsp_rpc_register r;
    memcpy(&r, in, sizeof(r));
    if (r._pad0 != 0) {
        kdsp_put_u32(out, KDSP_STATUS_INVALID_PARAMS);
        return AEE_SUCCESS;
    }
    /* The fd's bytes [offset, offset + size) must lie in one range fastrpc_mmap'ed into this
     * process (a whole rpcmem buffer, or a range of a larger one: weights held once). */
    uint8_t *base = NULL;
    if (kdsp_plat_fd_lookup(r.fd, r.offset, r.size, &base) != 0) {
        return AEE_ENOSUCHMAP;
    }
    kdsp_put_u32(out, kdsp_buffer_register(s->ctx, r.id, base, r.size));
    return AEE_SUCCESS;
}

static int kdsp_method_unregister(kdsp_skel_session *s, uint32_t sc, remote_arg *pra) {
    void *in, *out;
    if (!kdsp_arg_in(sc, pra, 0, 4, &in) || !kdsp_arg_out(sc, pra, 0, 4, &out)) {
        return AEE_EBADPARM;
    }
    if (s->ctx == NULL) {
        return AEE_EBADSTATE;
    }
    uint32_t id;
    memcpy(&id, in, 4);
    kdsp_put_u32(out, kdsp_buffer_unregister(s->ctx, id));
    return AEE_SUCCESS;
}

static int kdsp_method_execute(kdsp_skel_session *s, uint32_t sc, remote_arg *pra) {
    const uint32_t nin = REMOTE_SCALARS_INBUFS(sc);
    if (nin != 1 || REMOTE_SCALARS_OUTBUFS(sc) != 1 || pra[0].buf.pv == NULL || pra[1].buf.pv == NULL) {
        return AEE_EBADPARM;
    }
    if (s->ctx == NULL) {
        return AEE_EBADSTATE;
    }
    /* FastRPC delivers input buffers in DSP-side copies; kdsp_execute_batch wants 8-byte alignment
     * (it re-checks and rejects a misaligned batch with INVALID_PARAMS). */
    const size_t n_status = pra[1].buf.nLen / 4;
    if (pra[1].buf.nLen % 4 != 0 || n_status > UINT32_MAX) {
        return AEE_EBADPARM;
    }
    kdsp_status_t *statuses = (kdsp_status_t *)pra[1].buf.pv;
    for (size_t i = 0; i < n_status; i++) {
        statuses[i] = KDSP_STATUS_NOT_RUN;
    }
    const kdsp_status_t first =
        kdsp_execute_batch(s->ctx, pra[0].buf.pv, pra[0].buf.nLen, statuses, (uint32_t)n_status);
    /* A rejected header leaves no per-op status: report it in every slot. */
    if (first != KDSP_STATUS_OK) {
        int seen = 0;
        for (size_t i = 0; i < n_status; i++) {
            seen |= statuses[i] == first;
        }
        if (!seen) {
            for (size_t i = 0; i < n_status; i++) {
                statuses[i] = first;
            }
        }
    }
    return AEE_SUCCESS;
}

static int kdsp_method_check(kdsp_skel_session *s, uint32_t sc, remote_arg *pra) {
    void *in, *out;
    if (!kdsp_arg_in(sc, pra, 0, sizeof(kdsp_op), &in) || !kdsp_arg_out(sc, pra, 0, sizeof(kdsp_rpc_check), &out)) {
        return AEE_EBADPARM;
    }
    if (s->ctx == NULL) {
        return AEE_EBADSTATE;
    }
    kdsp_op op;
    memcpy(&op, in, sizeof(op));
    kdsp_rpc_check r = {0, 0, 0};
    r.status = kdsp_op_check(s->ctx, &op, &r.scratch_bytes);
    memcpy(out, &r, sizeof(r));
    return AEE_SUCCESS;
}

static int kdsp_method_info(uint32_t sc, remote_arg *pra) {
    void *out;
    if (!kdsp_arg_out(sc, pra, 0, KDSP_RPC_INFO_BYTES, &out)) {
        return AEE_EBADPARM;
    }
    const char *info = kdsp_build_info();
    size_t n = strlen(info);
    if (n >= KDSP_RPC_INFO_BYTES) {
        n = KDSP_RPC_INFO_BYTES - 1;
    }
    memset(out, 0, KDSP_RPC_INFO_BYTES);
    memcpy(out, info, n);
    return AEE_SUCCESS;
}

int kdsp_skel_invoke(kdsp_skel_session *s, uint32_t sc, remote_arg *pra) {
    if (s == NULL) {
        return AEE_EINVHANDLE;
    }
    if (REMOTE_SCALARS_INHANDLES(sc) != 0 || REMOTE_SCALARS_OUTHANDLES(sc) != 0 ||
        (pra == NULL && (REMOTE_SCALARS_INBUFS(sc) | REMOTE_SCALARS_OUTBUFS(sc)) != 0)) {
        return AEE_EBADPARM;
    }
    switch (REMOTE_SCALARS_METHOD(sc)) {
    case KDSP_RPC_METHOD_INIT:
        return kdsp_method_init(s, sc, pra);
    case KDSP_RPC_METHOD_REGISTER:
        return kdsp_method_register(s, sc, pra);
    case KDSP_RPC_METHOD_UNREGISTER:
        return kdsp_method_unregister(s, sc, pra);
    case KDSP_RPC_METHOD_EXECUTE:
        return kdsp_method_execute(s, sc, pra);
    case KDSP_RPC_METHOD_CHECK:
        return kdsp_method_check(s, sc, pra);
    case KDSP_RPC_METHOD_INFO:
        return kdsp_method_info(sc, pra);
    default:
        return AEE_EUNSUPPORTEDAPI;
    }
}
