/*
 * hvx_float.h -- HVX float (qf32/sf) helpers, enabled with -DKDSP_HVX_FLOAT=1 -mhvx-qfloat.
 *
 * COMPILE-CHECKED ONLY: qemu-hexagon aborts on HVX float instructions, so nothing here is executed
 * in the test suite, and the results are not bit-identical to the portable f32 paths (qf32 keeps
 * extra mantissa bits between operations). The portable scalar paths remain the reference; these
 * are the shapes a hardware build uses for the elementwise/norm ops and the Q4_0 scale step.
 */
#ifndef KDSP_HVX_FLOAT_H
#define KDSP_HVX_FLOAT_H

#include <stdint.h>

#include "kdsp_hvx.h"

#if KDSP_HVX_FLOAT

/* out[i] = a[i] + b[i], n f32 values (any 4-byte alignment). */
static inline void kdsp_hvx_add_f32(float *out, const float *a, const float *b, uint32_t n) {
    uint32_t i = 0;
    for (; i + 32u <= n; i += 32u) {
        const HVX_Vector va = *(const HVX_UVector *)(const void *)(a + i);
        const HVX_Vector vb = *(const HVX_UVector *)(const void *)(b + i);
        *(HVX_UVector *)(void *)(out + i) = Q6_Vsf_equals_Vqf32(Q6_Vqf32_vadd_VsfVsf(va, vb));
    }
    for (; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

/* sum of x[i]^2 accumulated in qf32 lanes, then reduced in scalar f32. */
static inline float kdsp_hvx_sumsq_f32(const float *x, uint32_t n) {
    HVX_Vector acc = Q6_V_vzero();
    uint32_t i = 0;
    for (; i + 32u <= n; i += 32u) {
        const HVX_Vector v = *(const HVX_UVector *)(const void *)(x + i);
        acc = Q6_Vqf32_vadd_Vqf32Vqf32(acc, Q6_Vqf32_vmpy_VsfVsf(v, v));
    }
    kdsp_hvx_buf lanes;
    lanes.v = Q6_Vsf_equals_Vqf32(acc);
    float s = 0.0f;
    for (uint32_t l = 0; l < 32u; l++) {
        s += lanes.f[l];
    }
    for (; i < n; i++) {
        s += x[i] * x[i];
    }
    return s;
}

/* out[i] = (x[i] * r) * w[i]. */
static inline void kdsp_hvx_scale_mul_f32(float *out, const float *x, const float *w, float r, uint32_t n) {
    kdsp_hvx_buf rb;
    rb.f[0] = r;
    const HVX_Vector vr = Q6_V_vsplat_R(rb.w[0]);
    uint32_t i = 0;
    for (; i + 32u <= n; i += 32u) {
        const HVX_Vector vx = *(const HVX_UVector *)(const void *)(x + i);
        const HVX_Vector vw = *(const HVX_UVector *)(const void *)(w + i);
        const HVX_Vector xr = Q6_Vsf_equals_Vqf32(Q6_Vqf32_vmpy_VsfVsf(vx, vr));
        *(HVX_UVector *)(void *)(out + i) = Q6_Vsf_equals_Vqf32(Q6_Vqf32_vmpy_VsfVsf(xr, vw));
    }
    for (; i < n; i++) {
        out[i] = (x[i] * r) * w[i];
    }
}

/* acc (32 qf32 lanes) += float(sumi) * (dw * da), lane r = row r of a Q4_0 tile. int32 -> sf uses
 * the 1.5 * 2^23 bias trick (exact for |sumi| < 2^22; |sumi| <= 32 * 8 * 127 here), because
 * Q6_Vsf_equals_Vw is not in clang-19's v73 intrinsics (and QEMU mis-executes it). */
static inline HVX_Vector kdsp_hvx_q4_scale_acc(HVX_Vector acc, const int32_t *sumi, const float *dw, float da) {
    const HVX_Vector bias = Q6_V_vsplat_R(0x4b400000);
    const HVX_Vector vi = Q6_Vw_vadd_VwVw(*(const HVX_Vector *)(const void *)sumi, bias);
    const HVX_Vector vsum = Q6_Vsf_equals_Vqf32(Q6_Vqf32_vsub_VsfVsf(vi, bias));
    kdsp_hvx_buf db;
    db.f[0] = da;
    const HVX_Vector vda = Q6_V_vsplat_R(db.w[0]);
    const HVX_Vector vdw = *(const HVX_UVector *)(const void *)dw;
    const HVX_Vector scale = Q6_Vsf_equals_Vqf32(Q6_Vqf32_vmpy_VsfVsf(vdw, vda));
    return Q6_Vqf32_vadd_Vqf32Vqf32(acc, Q6_Vqf32_vmpy_VsfVsf(vsum, scale));
}

#endif /* KDSP_HVX_FLOAT */

#endif /* KDSP_HVX_FLOAT_H */
