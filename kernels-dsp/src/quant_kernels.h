/*
 * quant_kernels.h -- the integer kernels of the quantized path, each as an HVX version next to
 * the portable scalar version that defines its exact result:
 *   kdsp_q8_0_block     f32[32] -> Q8_0 (fp16 d + int8[32]), integer rounding rule below
 *   kdsp_q4_unpack_tile 512 B of Q4_0 tile nibbles -> 1024 B of codes (vand + vlsr)
 *   kdsp_q4_dot_tile    unpacked tile x one Q8_0 block -> 32 int32 row dots (vrmpy)
 * Both versions return bit-identical results; the QEMU test checks it on the Hexagon ISA.
 *
 * Q8_0 rounding rule (integer only, so it runs on integer HVX and is reproducible everywhere):
 *   amax = max |x| compared as IEEE bit patterns; d = fp16(amax / 127) (f32 division, RNE).
 *   For amax normal: A16 = (24-bit significand of amax) >> 8, mult = (127 * 2^23 + A16/2) / A16.
 *   Each x: s = exp(amax) - exp(x) (capped at 31), fixed = significand(x) >> s (0 if x is zero or
 *   subnormal), q = sign(x) * (((fixed >> 8) * mult + 2^22) >> 23).
 *   amax zero/subnormal: d = +0, q = 0. amax inf/NaN: d = fp16 NaN (0x7e00), q = 0.
 * q equals round-half-away(x * 127 / amax) except when x * 127 / amax is within 0.012 of a
 * rounding boundary (16-bit operands: 127/A16 <= 0.004 from truncating fixed, 2 * 2^-15 * 127 from
 * A16 and mult), where it may differ by 1 -- about 0.1% of codes on random data, so the dequantized
 * error is at most 0.512 steps instead of 0.5. |q| <= 127 and |x| = amax maps to exactly +-127.
 */
#ifndef KDSP_QUANT_KERNELS_H
#define KDSP_QUANT_KERNELS_H

#include <stdint.h>

#include "kdsp_f16.h"
#include "kdsp_hvx.h"

typedef struct kdsp_q8_params {
    uint16_t d;    /* fp16 bits of the scale */
    uint16_t zero; /* 1: every q is 0 */
    int32_t ea;    /* biased exponent of amax */
    int32_t mult;  /* rounding multiplier, < 2^15 */
} kdsp_q8_params;

static inline kdsp_q8_params kdsp_q8_params_from_amax(uint32_t amax_bits) {
    kdsp_q8_params p;
    p.ea = 0;
    p.mult = 0;
    p.zero = 1;
    if (amax_bits >= 0x7f800000u) {
        p.d = 0x7e00u;
        return p;
    }
    if (amax_bits < 0x00800000u) {
        p.d = 0;
        return p;
    }
    const uint32_t a16 = ((amax_bits & 0x7fffffu) | 0x800000u) >> 8; /* [2^15, 2^16) */
    p.ea = (int32_t)(amax_bits >> 23);
    p.mult = (int32_t)(((127u << 23) + a16 / 2u) / a16);
    p.d = kdsp_f32_to_f16(kdsp_bits_f32(amax_bits) / 127.0f);
    p.zero = 0;
    return p;
}

static inline int8_t kdsp_q8_quantize_one(uint32_t bits, const kdsp_q8_params *p) {
    const uint32_t a = bits & 0x7fffffffu;
    const int32_t e = (int32_t)(a >> 23);
    if (e == 0) {
        return 0;
    }
    int32_t s = p->ea - e;
    if (s > 31) {
        s = 31;
    }
    const uint32_t fixed = ((a & 0x7fffffu) | 0x800000u) >> s;
    const int32_t mag = (int32_t)(((fixed >> 8) * (uint32_t)p->mult + (1u << 22)) >> 23);
    return (int8_t)((bits >> 31) ? -mag : mag);
}

/* Quantize x[0..n) (n <= 32; missing values are 0) into q[32]; returns fp16 bits of d.
 * x needs 4-byte alignment. */
static inline uint16_t kdsp_q8_0_block(const float *x, uint32_t n, int8_t *q) {
#if KDSP_HAVE_HVX
    kdsp_hvx_buf in;
    if (n == 32u) {
        in.v = *(const HVX_UVector *)(const void *)x;
    } else {
        for (uint32_t i = 0; i < 32u; i++) {
            in.w[i] = i < n ? (int32_t)kdsp_f32_bits(x[i]) : 0;
        }
    }
    const HVX_Vector zero = Q6_V_vzero();
    const HVX_Vector va = Q6_V_vand_VV(in.v, kdsp_hvx_splat_w(0x7fffffff));
    kdsp_hvx_buf mx;
    mx.v = kdsp_hvx_hmax_w(va);
    const kdsp_q8_params p = kdsp_q8_params_from_amax((uint32_t)mx.w[0]);
    if (p.zero) {
        for (uint32_t i = 0; i < 32u; i++) {
            q[i] = 0;
        }
        return p.d;
    }
    const HVX_Vector ve = Q6_Vuw_vlsr_VuwR(va, 23);
    HVX_Vector vm = Q6_V_vor_VV(Q6_V_vand_VV(va, kdsp_hvx_splat_w(0x7fffff)), kdsp_hvx_splat_w(0x800000));
    vm = Q6_V_vmux_QVV(Q6_Q_vcmp_eq_VwVw(ve, zero), zero, vm);
    const HVX_Vector vs = Q6_Vw_vmin_VwVw(Q6_Vw_vsub_VwVw(kdsp_hvx_splat_w(p.ea), ve), kdsp_hvx_splat_w(31));
    const HVX_Vector vfix = Q6_Vw_vasr_VwR(Q6_Vw_vasr_VwVw(vm, vs), 8);
    const int32_t mult2 = (int32_t)(((uint32_t)p.mult << 16) | (uint32_t)p.mult);
    HVX_Vector vmag = Q6_Vw_vmpyi_VwRh(vfix, mult2);
    vmag = Q6_Vw_vasr_VwR(Q6_Vw_vadd_VwVw(vmag, kdsp_hvx_splat_w(1 << 22)), 23);
    const HVX_Vector vq = Q6_V_vmux_QVV(Q6_Q_vcmp_gt_VwVw(zero, in.v), Q6_Vw_vsub_VwVw(zero, vmag), vmag);
    kdsp_hvx_buf out;
    out.v = Q6_Vb_vpack_VhVh_sat(zero, Q6_Vh_vpack_VwVw_sat(zero, vq));
    for (uint32_t i = 0; i < 32u; i++) {
        q[i] = (int8_t)out.b[i];
    }
    return p.d;
#else
    uint32_t bits[32];
    uint32_t amax = 0;
    for (uint32_t i = 0; i < 32u; i++) {
        bits[i] = i < n ? kdsp_f32_bits(x[i]) : 0u;
        const uint32_t a = bits[i] & 0x7fffffffu;
        amax = a > amax ? a : amax;
    }
    const kdsp_q8_params p = kdsp_q8_params_from_amax(amax);
    for (uint32_t i = 0; i < 32u; i++) {
        q[i] = p.zero ? 0 : kdsp_q8_quantize_one(bits[i], &p);
    }
    return p.d;
#endif
}

/* Index of code(r, k) in an unpacked tile. The HVX layout is vrmpy's lane order (byte
 * g*128 + r*4 + i holds code(r, 4g + i)); the portable layout is row-major so that the scalar
 * dot product is a contiguous integer reduction the compiler vectorises. */
#if KDSP_HAVE_HVX
#define KDSP_Q4_UNP(r, k) ((((k) >> 2) << 7) + ((r) << 2) + ((k) & 3u))
#else
#define KDSP_Q4_UNP(r, k) (((r) << 5) + (k))
#endif

/* nib: 512 B of one Q4_0 tile (128-byte aligned); out: 1024 B (128-byte aligned) of codes at
 * KDSP_Q4_UNP. Nibble byte p*128 + r*4 + i holds code(r, 8p+i) low and code(r, 8p+4+i) high, so
 * on HVX vector p unpacks into lane groups 2p (vand) and 2p+1 (vlsr) with no shuffle. */
static inline void kdsp_q4_unpack_tile(const uint8_t *nib, uint8_t *out) {
#if KDSP_HAVE_HVX
    const HVX_Vector *src = (const HVX_Vector *)(const void *)nib;
    HVX_Vector *dst = (HVX_Vector *)(void *)out;
    const HVX_Vector lo4 = Q6_Vb_vsplat_R(0x0f);
    for (uint32_t p = 0; p < 4u; p++) {
        const HVX_Vector v = src[p];
        dst[2u * p] = Q6_V_vand_VV(v, lo4);
        dst[2u * p + 1u] = Q6_V_vand_VV(Q6_Vuh_vlsr_VuhR(v, 4), lo4);
    }
#else
    for (uint32_t p = 0; p < 4u; p++) {
        for (uint32_t r = 0; r < 32u; r++) {
            for (uint32_t i = 0; i < 4u; i++) {
                const uint8_t b = nib[p * 128u + r * 4u + i];
                out[KDSP_Q4_UNP(r, 8u * p + i)] = (uint8_t)(b & 0x0fu);
                out[KDSP_Q4_UNP(r, 8u * p + 4u + i)] = (uint8_t)(b >> 4);
            }
        }
    }
#endif
}

/* sumi[r] = sum_k (code(r, k) - 8) * a[k] for the 32 rows of an unpacked tile and one block of
 * 32 int8 activations a (4-byte aligned) whose sum is asum. sumi: 32 int32, 128-byte aligned.
 * vrmpy multiplies the unsigned codes by the signed activations; the -8 offset is folded into
 * one subtraction of 8 * asum. */
static inline void kdsp_q4_dot_tile(const uint8_t *unp, const int8_t *a, int32_t asum, int32_t *sumi) {
#if KDSP_HAVE_HVX
    const HVX_Vector *u = (const HVX_Vector *)(const void *)unp;
    const int32_t *aw = (const int32_t *)(const void *)a;
    HVX_Vector acc = Q6_V_vzero();
    for (uint32_t g = 0; g < 8u; g++) {
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, u[g], aw[g]);
    }
    *(HVX_Vector *)(void *)sumi = Q6_Vw_vsub_VwVw(acc, kdsp_hvx_splat_w(8 * asum));
#else
    for (uint32_t r = 0; r < 32u; r++) {
        const uint8_t *c = unp + KDSP_Q4_UNP(r, 0u);
        int32_t s = 0;
        for (uint32_t k = 0; k < 32u; k++) {
            s += (int32_t)c[k] * a[k];
        }
        sumi[r] = s - 8 * asum;
    }
#endif
}

#endif /* KDSP_QUANT_KERNELS_H */
