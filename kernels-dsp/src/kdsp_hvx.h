/*
 * kdsp_hvx.h -- HVX build switches and the few vector utilities every HVX helper uses.
 *
 * KDSP_HAVE_HVX is 1 when the compiler targets HVX (clang --target=hexagon -mhvx
 * -mhvx-length=128b). The HVX paths it enables use INTEGER HVX only (vand, vlsr, vshuff, vdeal,
 * vrmpy, vmpyi, vasr, vpack, vmax, vror): those execute under qemu-hexagon and are bit-compared
 * with the portable paths.
 *
 * KDSP_HVX_FLOAT (-DKDSP_HVX_FLOAT=1, needs -mhvx-qfloat) additionally enables the HVX float
 * (qf32/sf) paths in hvx_float.h and matmul_q4_ops.c. QEMU aborts on HVX float instructions, so
 * those paths are only compile-checked here, never executed, and they are not part of the
 * bit-exact contract (qf32 rounds differently from IEEE f32).
 */
#ifndef KDSP_HVX_H
#define KDSP_HVX_H

#include <stdint.h>

#if defined(__HVX__)
#define KDSP_HAVE_HVX 1
#if __HVX_LENGTH__ != 128
#error "kernels-dsp needs 128-byte HVX vectors (-mhvx-length=128b)"
#endif
#include <hexagon_types.h>
#include <hvx_hexagon_protos.h>
#else
#define KDSP_HAVE_HVX 0
#endif

#ifndef KDSP_HVX_FLOAT
#define KDSP_HVX_FLOAT 0
#endif

#if KDSP_HVX_FLOAT && !KDSP_HAVE_HVX
#error "KDSP_HVX_FLOAT=1 needs an HVX target"
#endif

#if KDSP_HAVE_HVX
#define KDSP_VLEN 128

/* A vector-aligned scratch vector that can also be addressed by bytes or words. */
typedef union kdsp_hvx_buf {
    HVX_Vector v;
    uint8_t b[128];
    uint16_t h[64];
    int32_t w[32];
    float f[32];
} kdsp_hvx_buf;

static inline HVX_Vector kdsp_hvx_splat_w(int32_t x) {
    return Q6_V_vsplat_R(x);
}

/* Horizontal max of 32 signed words, broadcast to every lane. */
static inline HVX_Vector kdsp_hvx_hmax_w(HVX_Vector v) {
    for (int sh = 64; sh >= 4; sh >>= 1) {
        v = Q6_Vw_vmax_VwVw(v, Q6_V_vror_VR(v, sh));
    }
    return v;
}
#endif

#endif /* KDSP_HVX_H */
