/*
 * flash_attn_ops.c -- KDSP_OP_FLASH_ATTN: a window of Tq queries (any positions; RoPE is already
 * applied) against Tk keys (prefix + window, typically a KV-cache view), f16 K/V, optional
 * additive mask, GQA, online softmax in f32.
 *
 * Work items are (kv head, block of query rows, block of the q heads sharing that kv head), so
 * each K/V block is converted to f32 once and reused by every q head of the group. Per item,
 * keys are visited in blocks of KDSP_FA_KB: scores s = scale * q.k + mask; the running max m,
 * normaliser l and output o are rescaled once per block (o *= exp(m_old - m_new)), then
 * o += exp(s - m_new) v. Rows that only ever see -inf produce zeros.
 *
 * A key-exclusion range [kv_skip_begin, kv_skip_end) is applied by walking the visible keys
 * u = 0..Tk-(end-begin) densely and mapping u to the key index (u < begin ? u : u + end - begin),
 * so blocks stay full and the arithmetic is exactly that of attention over the concatenation
 * [0, begin) ++ [end, Tk).
 */
#include <stdint.h>

#include "kdsp_f16.h"
#include "kdsp_internal.h"
#include "kdsp_math.h"

#define KDSP_FA_KB 64u   /* keys per block */
#define KDSP_FA_ROWS 64u /* query rows (query x head) per item */

typedef struct kdsp_fa_plan {
    kdsp_ctx *ctx;
    kdsp_view q, k, v, mask, dst;
    int has_mask;
    float scale;
    uint32_t D, Hq, Hkv, Tq, Tk, G;
    uint32_t skip_begin, skip_len; /* excluded keys [skip_begin, skip_begin + skip_len) */
    uint32_t Tv;                   /* visible keys: Tk - skip_len */
    uint32_t GB;       /* q heads per item */
    uint32_t QB;       /* query rows per item */
    uint32_t n_gb, n_qb;
    uint64_t per_worker;
} kdsp_fa_plan;

/* o[d] += sum_j p[j] * v[j][d], keys in ascending order for every d. Walking d in chunks of 16
 * keeps the chunk's accumulators in registers across the key block (one pass over o instead of
 * one per key) without changing the order of any element's additions. */
static void kdsp_fa_accumulate(float *restrict o, const float *restrict pr, const float *restrict v, uint32_t nk,
                               uint32_t D) {
    uint32_t d0 = 0;
    for (; d0 + 16u <= D; d0 += 16u) {
#if KDSP_HAVE_V4
        kdsp_v4 a0 = kdsp_v4_load(o + d0), a1 = kdsp_v4_load(o + d0 + 4u);
        kdsp_v4 a2 = kdsp_v4_load(o + d0 + 8u), a3 = kdsp_v4_load(o + d0 + 12u);
        for (uint32_t j = 0; j < nk; j++) {
            const kdsp_v4 pj = {pr[j], pr[j], pr[j], pr[j]};
            const float *vj = v + j * D + d0;
            a0 += pj * kdsp_v4_load(vj);
            a1 += pj * kdsp_v4_load(vj + 4u);
            a2 += pj * kdsp_v4_load(vj + 8u);
            a3 += pj * kdsp_v4_load(vj + 12u);
        }
        kdsp_v4_store(o + d0, a0);
        kdsp_v4_store(o + d0 + 4u, a1);
        kdsp_v4_store(o + d0 + 8u, a2);
        kdsp_v4_store(o + d0 + 12u, a3);
#else
        float acc[16];
        for (uint32_t t = 0; t < 16u; t++) {
            acc[t] = o[d0 + t];
        }
        for (uint32_t j = 0; j < nk; j++) {
            const float pj = pr[j];
            const float *vj = v + j * D + d0;
            for (uint32_t t = 0; t < 16u; t++) {
                acc[t] += pj * vj[t];
            }
        }
        for (uint32_t t = 0; t < 16u; t++) {
            o[d0 + t] = acc[t];
        }
#endif
    }
    for (; d0 < D; d0++) {
        float acc = o[d0];
        for (uint32_t j = 0; j < nk; j++) {
            acc += pr[j] * v[j * D + d0];
        }
        o[d0] = acc;
    }
}

/* Key index of the u-th visible key. */
static inline uint32_t kdsp_fa_key(const kdsp_fa_plan *p, uint32_t u) {
    return u < p->skip_begin ? u : u + p->skip_len;
}

static void kdsp_fa_item(const kdsp_fa_plan *p, uint8_t *ws, uint32_t item) {
    const uint32_t D = p->D;
    const uint32_t qb = item % p->n_qb;
    const uint32_t gb = (item / p->n_qb) % p->n_gb;
    const uint32_t hkv = item / (p->n_qb * p->n_gb);
    const uint32_t t0 = qb * p->QB;
    const uint32_t nt = p->Tq - t0 < p->QB ? p->Tq - t0 : p->QB;
    const uint32_t g0 = gb * p->GB;
    const uint32_t ng = p->G - g0 < p->GB ? p->G - g0 : p->GB;
    const uint32_t R = nt * ng;

    float *qf = (float *)(void *)ws;      /* [ROWS][D] */
    float *o = qf + KDSP_FA_ROWS * D;     /* [ROWS][D] */
    float *kf = o + KDSP_FA_ROWS * D;     /* [KB][D] */
    float *vf = kf + KDSP_FA_KB * D;      /* [KB][D] */
    float *s = vf + KDSP_FA_KB * D;       /* [ROWS][KB] */
    float *mrow = s + KDSP_FA_ROWS * KDSP_FA_KB;
    float *lrow = mrow + KDSP_FA_ROWS;
    const float neg_inf = -kdsp_bits_f32(KDSP_INF_BITS);

    for (uint32_t r = 0; r < R; r++) { /* row r = (query t0 + r / ng, head hkv*G + g0 + r % ng) */
        const uint32_t t = t0 + r / ng;
        const uint32_t h = hkv * p->G + g0 + r % ng;
        kdsp_row_load(p->q.dtype, p->q.data + (uint64_t)t * p->q.nb[2] + (uint64_t)h * p->q.nb[1], D, qf + r * D);
        for (uint32_t d = 0; d < D; d++) {
            o[r * D + d] = 0.0f;
        }
        mrow[r] = neg_inf;
        lrow[r] = 0.0f;
    }
    for (uint32_t j0 = 0; j0 < p->Tv; j0 += KDSP_FA_KB) {
        const uint32_t nk = p->Tv - j0 < KDSP_FA_KB ? p->Tv - j0 : KDSP_FA_KB;
        for (uint32_t j = 0; j < nk; j++) {
            const uint32_t key = kdsp_fa_key(p, j0 + j);
            const uint64_t off = (uint64_t)key * p->k.nb[2] + (uint64_t)hkv * p->k.nb[1];
            const uint64_t offv = (uint64_t)key * p->v.nb[2] + (uint64_t)hkv * p->v.nb[1];
            kdsp_row_load(KDSP_DTYPE_F16, p->k.data + off, D, kf + j * D);
            kdsp_row_load(KDSP_DTYPE_F16, p->v.data + offv, D, vf + j * D);
        }
        for (uint32_t r = 0; r < R; r++) {
            const uint32_t t = t0 + r / ng;
            const uint32_t h = hkv * p->G + g0 + r % ng;
            const float *qr = qf + r * D;
            float *sr = s + r * KDSP_FA_KB;
            const uint8_t *mk = NULL;
            if (p->has_mask) {
                const uint32_t mh = p->mask.ne[2] == 1u ? 0u : h;
                mk = p->mask.data + (uint64_t)t * p->mask.nb[1] + (uint64_t)mh * p->mask.nb[2];
            }
            float bmax = neg_inf;
            for (uint32_t j = 0; j < nk; j++) {
                float sc = kdsp_dot_f32(qr, kf + j * D, D) * p->scale;
                if (mk != NULL) {
                    sc += kdsp_row_get(p->mask.dtype, mk, kdsp_fa_key(p, j0 + j));
                }
                sr[j] = sc;
                bmax = sc > bmax ? sc : bmax;
            }
            const float m_old = mrow[r];
            const float m_new = bmax > m_old ? bmax : m_old;
            if (m_new == neg_inf) {
                continue; /* nothing visible yet */
            }
            float *orow = o + r * D;
            if (m_old != m_new) {
                const float corr = m_old == neg_inf ? 0.0f : kdsp_expf(m_old - m_new);
                lrow[r] *= corr;
                for (uint32_t d = 0; d < D; d++) {
                    orow[d] *= corr;
                }
            }
            float l = lrow[r];
            for (uint32_t j = 0; j < nk; j++) {
                sr[j] = sr[j] == neg_inf ? 0.0f : kdsp_expf(sr[j] - m_new);
                l += sr[j];
            }
            lrow[r] = l;
            kdsp_fa_accumulate(orow, sr, vf, nk, D);
            mrow[r] = m_new;
        }
    }
    for (uint32_t r = 0; r < R; r++) {
        const uint32_t t = t0 + r / ng;
        const uint32_t h = hkv * p->G + g0 + r % ng;
        float *orow = o + r * D;
        const float l = lrow[r];
        for (uint32_t d = 0; d < D; d++) {
            orow[d] = l > 0.0f ? orow[d] / l : 0.0f;
        }
        kdsp_row_store(p->dst.dtype, p->dst.data + (uint64_t)t * p->dst.nb[2] + (uint64_t)h * p->dst.nb[1], D, orow);
    }
}

static void kdsp_fa_task(void *arg, uint32_t w, uint32_t nw) {
    const kdsp_fa_plan *p = (const kdsp_fa_plan *)arg;
    uint8_t *ws = kdsp_scratch_worker(p->ctx, 0, p->per_worker, w);
    uint32_t b, e;
    kdsp_split(p->Hkv * p->n_gb * p->n_qb, w, nw, &b, &e);
    for (uint32_t item = b; item < e; item++) {
        kdsp_fa_item(p, ws, item);
    }
}

static int kdsp_fa_row_major_float(const kdsp_view *v) {
    return v->layout == KDSP_LAYOUT_ROW_MAJOR && kdsp_dtype_is_float(v->dtype);
}

kdsp_status_t kdsp_op_flash_attn(kdsp_ctx *ctx, const kdsp_op *op, int run, uint64_t *scratch) {
    kdsp_fa_plan p;
    kdsp_view src[KDSP_MAX_SRC];
    kdsp_status_t st = kdsp_resolve_op(ctx, op, 3, 4, 0, &p.dst, src);
    if (st != KDSP_STATUS_OK) {
        return st;
    }
    p.scale = op->params.attn.scale;
    if (!kdsp_isfinite(p.scale) || !kdsp_params_zero_from(op, 3)) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    p.q = src[0];
    p.k = src[1];
    p.v = src[2];
    p.has_mask = op->n_src == 4u;
    if (!kdsp_fa_row_major_float(&p.q) || !kdsp_fa_row_major_float(&p.dst) ||
        p.k.layout != KDSP_LAYOUT_ROW_MAJOR || p.k.dtype != KDSP_DTYPE_F16 ||
        p.v.layout != KDSP_LAYOUT_ROW_MAJOR || p.v.dtype != KDSP_DTYPE_F16) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    p.D = p.q.ne[0];
    p.Hq = p.q.ne[1];
    p.Tq = p.q.ne[2];
    p.Hkv = p.k.ne[1];
    p.Tk = p.k.ne[2];
    if (p.q.ne[3] != 1 || p.k.ne[0] != p.D || p.k.ne[3] != 1 || !kdsp_same_shape(&p.k, &p.v) ||
        !kdsp_same_shape(&p.q, &p.dst) || p.Hq % p.Hkv != 0) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    if (p.has_mask) {
        p.mask = src[3];
        if (!kdsp_fa_row_major_float(&p.mask)) {
            return KDSP_STATUS_UNSUPPORTED;
        }
        if (p.mask.ne[0] != p.Tk || p.mask.ne[1] != p.Tq || !(p.mask.ne[2] == 1u || p.mask.ne[2] == p.Hq) ||
            p.mask.ne[3] != 1u) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
    }
    {
        const uint32_t b = op->params.attn.kv_skip_begin, e = op->params.attn.kv_skip_end;
        if (!((b == 0u && e == 0u) || (b < e && e <= p.Tk))) {
            return KDSP_STATUS_INVALID_PARAMS;
        }
        p.skip_begin = b;
        p.skip_len = e - b;
        p.Tv = p.Tk - p.skip_len;
    }
    if (p.D > KDSP_FA_MAX_HEAD_DIM) {
        return KDSP_STATUS_UNSUPPORTED;
    }
    p.ctx = ctx;
    p.G = p.Hq / p.Hkv;
    p.GB = p.G < KDSP_FA_ROWS ? p.G : KDSP_FA_ROWS;
    p.QB = KDSP_FA_ROWS / p.GB;
    p.n_gb = (p.G + p.GB - 1u) / p.GB;
    p.n_qb = (p.Tq + p.QB - 1u) / p.QB;
    if ((uint64_t)p.Hkv * p.n_gb * p.n_qb > UINT32_MAX) {
        return KDSP_STATUS_INVALID_PARAMS;
    }
    /* qf + o + kf + vf + s + m + l */
    p.per_worker = ((uint64_t)(2u * KDSP_FA_ROWS + 2u * KDSP_FA_KB) * p.D + KDSP_FA_ROWS * KDSP_FA_KB +
                    2u * KDSP_FA_ROWS) * sizeof(float);
    const uint64_t total = kdsp_scratch_total(0, p.per_worker, ctx->n_workers);
    *scratch = total;
    st = kdsp_scratch_check(ctx, total);
    if (st != KDSP_STATUS_OK || !run) {
        return st;
    }
    kdsp_pool_run(ctx->pool, kdsp_fa_task, &p);
    return KDSP_STATUS_OK;
}
