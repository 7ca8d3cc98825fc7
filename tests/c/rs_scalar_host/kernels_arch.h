/* A host build's kernels_arch.h for tests/test_kernels.py: firmware/hal/kernels_rs_scalar.h (the
 * row-scaled rows of the RV32 and Xtensa kernels: int32 sums where they cannot overflow, the split at
 * bit 16 beyond, float(acc) on the bits) over portable dots in place of those ISAs' assembly, so
 * its integer bounds meet the reference on the host's worst-case tensors. Built without SIMD (i386
 * with SSE, not SSE2), as those cores are. */
#ifndef FLM_KERNELS_ARCH_H
#define FLM_KERNELS_ARCH_H

/* sum u x over n codes, nibbles unsigned, low first (the ISAs' RS_DOT_U4) */
static inline int32_t host_dot_u4(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += (int32_t)((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) * x[i];
    return s;
}
static inline uint32_t host_bit_length(uint32_t x) { return 32u - (uint32_t)__builtin_clz(x); }
static inline float host_scale(float f, float s, float x) { return f * (s * x); }

#define FLM_SCALAR_ROWS 1
#define RS_DOT_Q8 dot_q8_scalar
#define RS_DOT_U4 host_dot_u4
#define RS_BIT_LENGTH host_bit_length
#define RS_SCALE host_scale
#include "kernels_rs_scalar.h"
#endif
