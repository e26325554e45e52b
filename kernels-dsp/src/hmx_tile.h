/*
 * hmx_tile.h -- the HMX fp16 tile layouts, the HVX pack/unpack of activation tiles, and the
 * portable tile engine.
 *
 * Layouts (REFERENCE §5), halfword indices inside one 32x32 tile of 1024 halfwords:
 *   activation tile [M][K]: (m, k) -> (m/2)*64 + k*2 + (m%2)   (row pairs interleaved)
 *   weight tile     [K][N]: (k, n) -> (k/2)*64 + n*2 + (k%2)   (K pairs interleaved)
 * So one 128-byte HVX vector holds one row pair (activations) or one K pair (weights), and the
 * pack of a row pair from two row-major rows is a single halfword vshuff; unpack is a vdeal.
 *
 * No released clang emits HMX instructions, so the multiply itself is the portable tile engine
 * below: it computes what an HMX tile multiply computes -- products of fp16 inputs (exact in f32)
 * summed in f32 along K, tile after tile -- on the real tile layout. On hardware, an SDK build
 * replaces kdsp_tile_mac with the HMX instruction sequence on the same tiles.
 */
#ifndef KDSP_HMX_TILE_H
#define KDSP_HMX_TILE_H

#include <stdint.h>

#include "kdsp_f16.h"
#include "kdsp_hvx.h"
#include "kdsp_internal.h"

#define KDSP_ACT_HW(m, k) ((((m) >> 1) << 6) + ((k) << 1) + ((m) & 1u))
#define KDSP_WT_HW(k, n) ((((k) >> 1) << 6) + ((n) << 1) + ((k) & 1u))

/* in: 128-byte aligned, row A in halfwords 0..32, row B in 32..64.
 * out (128-byte aligned): out[2k] = A[k], out[2k+1] = B[k]. */
static inline void kdsp_rowpair_shuffle(const uint16_t *in, uint16_t *out) {
#if KDSP_HAVE_HVX
    *(HVX_Vector *)(void *)out = Q6_Vh_vshuff_Vh(*(const HVX_Vector *)(const void *)in);
#else
    for (uint32_t k = 0; k < 32u; k++) {
        out[2u * k] = in[k];
        out[2u * k + 1u] = in[32u + k];
    }
#endif
}

/* Inverse of kdsp_rowpair_shuffle: out[k] = in[2k], out[32+k] = in[2k+1]. */
static inline void kdsp_rowpair_deal(const uint16_t *in, uint16_t *out) {
#if KDSP_HAVE_HVX
    *(HVX_Vector *)(void *)out = Q6_Vh_vdeal_Vh(*(const HVX_Vector *)(const void *)in);
#else
    for (uint32_t k = 0; k < 32u; k++) {
        out[k] = in[2u * k];
        out[32u + k] = in[2u * k + 1u];
    }
#endif
}

typedef union kdsp_rowpair_buf {
#if KDSP_HAVE_HVX
    HVX_Vector v;
#endif
    uint16_t h[64];
    uint8_t b[128];
} __attribute__((aligned(128))) kdsp_rowpair_buf;

/* Pack activation tile (mt, kt) of a row-major F32/F16 [M][K] view into tile (1024 halfwords,
 * 128-byte aligned), zero padding rows >= M and columns >= K. */
static inline void kdsp_pack_act_tile(const kdsp_view *src, uint32_t mt, uint32_t kt, uint16_t *tile) {
    const uint32_t M = src->ne[1];
    const uint32_t K = src->ne[0];
    const uint32_t k0 = kt * 32u;
    const uint32_t nk = K - k0 < 32u ? K - k0 : 32u;
    for (uint32_t j = 0; j < 16u; j++) {
        kdsp_rowpair_buf buf;
        for (uint32_t i = 0; i < 64u; i++) {
            buf.h[i] = 0;
        }
        for (uint32_t h = 0; h < 2u; h++) {
            const uint32_t m = mt * 32u + 2u * j + h;
            if (m >= M) {
                continue;
            }
            const uint8_t *row = src->data + (uint64_t)m * src->nb[1];
            if (src->dtype == KDSP_DTYPE_F16) {
                const uint16_t *r = (const uint16_t *)(const void *)row + k0;
                for (uint32_t k = 0; k < nk; k++) {
                    buf.h[32u * h + k] = r[k];
                }
            } else {
                const float *r = (const float *)(const void *)row + k0;
                for (uint32_t k = 0; k < nk; k++) {
                    buf.h[32u * h + k] = kdsp_f32_to_f16(r[k]);
                }
            }
        }
        kdsp_rowpair_shuffle(buf.h, tile + 64u * j);
    }
}

/* Unpack activation tile (mt, kt) into a row-major F32/F16 [M][K] view (only rows < M and
 * columns < K are written). */
static inline void kdsp_unpack_act_tile(const uint16_t *tile, uint32_t mt, uint32_t kt, const kdsp_view *dst) {
    const uint32_t M = dst->ne[1];
    const uint32_t K = dst->ne[0];
    const uint32_t k0 = kt * 32u;
    const uint32_t nk = K - k0 < 32u ? K - k0 : 32u;
    for (uint32_t j = 0; j < 16u; j++) {
        kdsp_rowpair_buf buf;
        kdsp_rowpair_deal(tile + 64u * j, buf.h);
        for (uint32_t h = 0; h < 2u; h++) {
            const uint32_t m = mt * 32u + 2u * j + h;
            if (m >= M) {
                continue;
            }
            uint8_t *row = dst->data + (uint64_t)m * dst->nb[1];
            if (dst->dtype == KDSP_DTYPE_F16) {
                uint16_t *r = (uint16_t *)(void *)row + k0;
                for (uint32_t k = 0; k < nk; k++) {
                    r[k] = buf.h[32u * h + k];
                }
            } else {
                float *r = (float *)(void *)row + k0;
                for (uint32_t k = 0; k < nk; k++) {
                    r[k] = kdsp_f16_to_f32(buf.h[32u * h + k]);
                }
            }
        }
    }
}

/* ---- portable tile engine ---- */

/* Activation tile -> f32 a[m*32 + k]. */
static inline void kdsp_tile_act_to_f32(const uint16_t *tile, float *a) {
    for (uint32_t j = 0; j < 16u; j++) {
        for (uint32_t k = 0; k < 32u; k++) {
            a[(2u * j) * 32u + k] = kdsp_f16_to_f32(tile[64u * j + 2u * k]);
            a[(2u * j + 1u) * 32u + k] = kdsp_f16_to_f32(tile[64u * j + 2u * k + 1u]);
        }
    }
}

/* Weight tile -> f32 w[k*32 + n]. */
static inline void kdsp_tile_weight_to_f32(const uint16_t *tile, float *w) {
    for (uint32_t kp = 0; kp < 16u; kp++) {
        for (uint32_t n = 0; n < 32u; n++) {
            w[(2u * kp) * 32u + n] = kdsp_f16_to_f32(tile[64u * kp + 2u * n]);
            w[(2u * kp + 1u) * 32u + n] = kdsp_f16_to_f32(tile[64u * kp + 2u * n + 1u]);
        }
    }
}

/* acc[m][n] += sum_k a[m][k] * w[k][n], k ascending: one HMX tile multiply-accumulate.
 * Products of f16 values are exact in f32; only the f32 additions round. */
static inline void kdsp_tile_mac(float *restrict acc, const float *restrict a, const float *restrict w) {
    for (uint32_t m = 0; m < 32u; m++) {
        float *restrict am = acc + 32u * m;
        for (uint32_t k = 0; k < 32u; k++) {
            const float av = a[32u * m + k];
            const float *restrict wk = w + 32u * k;
            for (uint32_t n = 0; n < 32u; n++) {
                am[n] += av * wk[n];
            }
        }
    }
}

#endif /* KDSP_HMX_TILE_H */
