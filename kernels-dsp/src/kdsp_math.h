/*
 * kdsp_math.h -- the few transcendental functions the kernels need, in portable float C.
 *
 * The DSP build is freestanding (no libm), and the host and Hexagon builds must agree bit for
 * bit, so exp and rsqrt are implemented here from IEEE single-precision +, -, *, / only (the
 * library is compiled with -ffp-contract=off, so no FMA changes the rounding). Accuracy: kdsp_expf
 * within 2 ulp over its range, kdsp_rsqrtf within 2 ulp; the tests check both against f64.
 */
#ifndef KDSP_MATH_H
#define KDSP_MATH_H

#include <stdint.h>

#include "kdsp_f16.h"

#define KDSP_INF_BITS 0x7f800000u
#define KDSP_NAN_BITS 0x7fc00000u

static inline int kdsp_isfinite(float x) {
    return (kdsp_f32_bits(x) & 0x7f800000u) != 0x7f800000u;
}

/* 2^n for -126 <= n <= 127 as an exact float. */
static inline float kdsp_exp2i(int32_t n) {
    return kdsp_bits_f32((uint32_t)(n + 127) << 23);
}

static inline float kdsp_expf(float x) {
    if (x != x) {
        return x;
    }
    if (x > 88.7228394f) {
        return kdsp_bits_f32(KDSP_INF_BITS);
    }
    if (x < -103.972084f) {
        return 0.0f;
    }
    /* x = n ln2 + r, |r| <= ln2/2, with ln2 split Cody-Waite style (the high part has 9 bits,
     * so n * hi is exact). */
    const float kf = x * 1.44269504f;
    const int32_t n = (int32_t)(kf + (kf >= 0.0f ? 0.5f : -0.5f));
    const float fn = (float)n;
    float r = x - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.98412698e-4f; /* 1/5040 */
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    if (n > 127) {
        return p * kdsp_exp2i(127) * kdsp_exp2i(n - 127);
    }
    if (n < -126) {
        return p * kdsp_exp2i(n + 64) * kdsp_exp2i(-64);
    }
    return p * kdsp_exp2i(n);
}

/* 1/sqrt(x): NaN for x < 0 or NaN, +inf for +-0, 0 for +inf. */
static inline float kdsp_rsqrtf(float x) {
    if (!(x >= 0.0f)) {
        return kdsp_bits_f32(KDSP_NAN_BITS);
    }
    if (x == 0.0f) {
        return kdsp_bits_f32(KDSP_INF_BITS);
    }
    if (!kdsp_isfinite(x)) {
        return 0.0f;
    }
    float post = 1.0f;
    if (x < 1.17549435e-38f) { /* subnormal: scale into the normal range */
        x = x * kdsp_exp2i(64);
        post = kdsp_exp2i(32);
    }
    float y = kdsp_bits_f32(0x5f3759dfu - (kdsp_f32_bits(x) >> 1));
    const float h = 0.5f * x;
    y = y * (1.5f - h * y * y);
    y = y * (1.5f - h * y * y);
    y = y * (1.5f - h * y * y);
    return y * post;
}

/* 4-lane float vectors for the host build. GCC's auto-vectoriser turns the interleaved partial
 * sums below into shuffle-heavy code, so the host spells the same lanes out with generic vectors;
 * every lane does exactly the scalar path's IEEE operations in the same order, so the results are
 * identical to the portable loops the Hexagon build uses. */
#if defined(__GNUC__) && !defined(__hexagon__) && (defined(__SSE2__) || defined(__aarch64__))
#define KDSP_HAVE_V4 1
typedef float kdsp_v4 __attribute__((vector_size(16)));
static inline kdsp_v4 kdsp_v4_load(const float *p) {
    kdsp_v4 v;
    __builtin_memcpy(&v, p, sizeof(v));
    return v;
}
static inline void kdsp_v4_store(float *p, kdsp_v4 v) {
    __builtin_memcpy(p, &v, sizeof(v));
}
#else
#define KDSP_HAVE_V4 0
#endif

/* sum a[i] * b[i] in 8 interleaved partial sums combined pairwise: more accurate than one running
 * sum, and vectorisable without reassociating anything (same result on every target). */
static inline float kdsp_dot_f32(const float *a, const float *b, uint32_t n) {
    float p[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t i = 0;
#if KDSP_HAVE_V4
    kdsp_v4 p0 = {0.0f, 0.0f, 0.0f, 0.0f};
    kdsp_v4 p1 = p0;
    for (; i + 8u <= n; i += 8u) {
        p0 += kdsp_v4_load(a + i) * kdsp_v4_load(b + i);
        p1 += kdsp_v4_load(a + i + 4u) * kdsp_v4_load(b + i + 4u);
    }
    kdsp_v4_store(p, p0);
    kdsp_v4_store(p + 4, p1);
#else
    for (; i + 8u <= n; i += 8u) {
        for (uint32_t l = 0; l < 8u; l++) {
            p[l] += a[i + l] * b[i + l];
        }
    }
#endif
    float s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

/* silu(x) = x * sigmoid(x) = x / (1 + exp(-x)). */
static inline float kdsp_siluf(float x) {
    return x / (1.0f + kdsp_expf(-x));
}

#endif /* KDSP_MATH_H */
