/*
 * kdsp_f16.h -- bit-exact software fp16 <-> f32 conversion and float bit casts.
 *
 * Deliberately not _Float16: the host (gcc/clang on x86 without F16C) and the Hexagon build must
 * produce the same bits, so both use this integer implementation. f32 -> f16 rounds to nearest,
 * ties to even, including subnormals; overflow gives +-inf; NaN stays NaN (quiet bit set, top
 * payload bits kept), matching the `half` crate's software path.
 */
#ifndef KDSP_F16_H
#define KDSP_F16_H

#include <stdint.h>

typedef union kdsp_fbits {
    float f;
    uint32_t u;
    int32_t i;
} kdsp_fbits;

static inline uint32_t kdsp_f32_bits(float f) {
    kdsp_fbits b;
    b.f = f;
    return b.u;
}

static inline float kdsp_bits_f32(uint32_t u) {
    kdsp_fbits b;
    b.u = u;
    return b.f;
}

static inline uint16_t kdsp_f32_to_f16(float f) {
    const uint32_t x = kdsp_f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf or NaN */
        const uint32_t man = ax & 0x7fffffu;
        return (uint16_t)(sign | 0x7c00u | (man ? (0x0200u | (man >> 13)) : 0u));
    }
    if (ax >= 0x477ff000u) { /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (ax < 0x33000000u) { /* below 2^-25: rounds to zero */
            return (uint16_t)sign;
        }
        const uint32_t e = ax >> 23;                       /* 102..112 */
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;   /* 24-bit significand */
        const uint32_t shift = 126u - e;                   /* 14..24: units of 2^-24 */
        const uint32_t half = 1u << (shift - 1u);
        const uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t r = m >> shift;
        if (rem > half || (rem == half && (r & 1u))) {
            r += 1u; /* may carry into the smallest normal: still the right encoding */
        }
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax - 0x38000000u) >> 13; /* rebias 127 -> 15 */
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
        r += 1u;
    }
    return (uint16_t)(sign | r);
}

/* Exact. Branch-free apart from two selects, so loops over it vectorise: normals and inf/NaN are
 * a shift and a rebias (NaN payloads are kept, not quieted); subnormals are converted as
 * integer * 2^-24, which is exact in f32. */
static inline float kdsp_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    const uint32_t normal = (em << 13) + (em >= 0x7c00u ? 0x70000000u : 0x38000000u); /* rebias; inf/NaN -> 255 */
    const uint32_t sub = kdsp_f32_bits((float)(int32_t)em * 5.9604644775390625e-8f); /* em * 2^-24, exact */
    return kdsp_bits_f32((em < 0x0400u ? sub : normal) | sign);
}

/* Unaligned little-endian loads/stores through byte copies (the compiler turns them into plain
 * loads where legal; no memcpy call is emitted). */
static inline uint16_t kdsp_ld_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void kdsp_st_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xffu);
    p[1] = (uint8_t)(v >> 8);
}

#endif /* KDSP_F16_H */
