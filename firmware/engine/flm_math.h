/* Deterministic float functions mirrored exactly by converter/numerics.py (no libm). */
#ifndef FLM_MATH_H
#define FLM_MATH_H
#include <stdint.h>
#include <string.h>
/* A float's bit pattern and back (memcpy: the defined way in C99; compilers make it a move). */
static inline uint32_t flm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float flm_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* (int32_t)(v + 0.5f) for the float v of bits mag in [+0, 2^23) (the reference's round_half_away;
 * -v with -0.5f gives its negation), on the bits: no soft-float add and conversion on cores without
 * an FPU. From 0.5 up, v + 0.5 is exact or rounds without crossing an integer, so it is floor(v +
 * 0.5) on the 24-bit significand; below 0.5 only the float just below it makes fl(v + 0.5) = 1.0.
 * tests/test_kernels.py checks every float in [0, 127] against the float form. */
static inline int32_t flm_round_half_away(uint32_t mag) {
    if (mag < 0x3f000000u) return mag == 0x3effffffu;
    const uint32_t sig = mag << 8 | 0x80000000u;   /* the significand, its leading one at bit 31 */
    /* its bits from the halves' place up (exponent 126..149, a shift of 31..8), plus a half */
    return (int32_t)(((sig >> (157u - (mag >> 23))) + 1u) >> 1);
}
/* 2^(j/256) in Q23, j = 0..256 (converter/numerics.py EXP2_Q23, which tests/test_engine.py checks) */
extern const uint32_t flm_exp2_q23[257];
/* 2^(f / 65536) in Q23 for f in [0, 65536): the table, interpolated linearly (floor) */
static inline uint32_t flm_exp2_frac(uint32_t f) {
    const uint32_t j = f >> 8, lo = flm_exp2_q23[j];
    return lo + (((flm_exp2_q23[j + 1u] - lo) * (f & 255u)) >> 8);
}
/* a > b and a == b with the float comparisons' outcomes (NaN: false; -0 == +0). A core without an
 * FPU (soft-float ARM such as the Cortex-M0+, RISC-V without F such as the ESP32-C3) compares on the
 * bits instead of calling its soft-float library: sign and magnitude as one integer. */
#if defined(__SOFTFP__) || defined(__riscv_float_abi_soft)
static inline int flm_f32_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
static inline int32_t flm_f32_order(uint32_t u) { return u >> 31 ? -(int32_t)(u & 0x7fffffffu) : (int32_t)u; }
static inline int flm_f32_gt(float a, float b) {
    const uint32_t x = flm_f32_bits(a), y = flm_f32_bits(b);
    return !flm_f32_nan_bits(x) && !flm_f32_nan_bits(y) && flm_f32_order(x) > flm_f32_order(y);
}
static inline int flm_f32_eq(float a, float b) {
    const uint32_t x = flm_f32_bits(a), y = flm_f32_bits(b);
    return !flm_f32_nan_bits(x) && flm_f32_order(x) == flm_f32_order(y) && !flm_f32_nan_bits(y);
}
#else
static inline int flm_f32_gt(float a, float b) { return a > b; }
static inline int flm_f32_eq(float a, float b) { return a == b; }
#endif
/* |f| < inf (not inf, not NaN), on the bits. */
static inline int flm_f32_finite(float f) { return (flm_f32_bits(f) & 0x7fffffffu) < 0x7f800000u; }
float flm_expf(float x);   /* n = round(x log2(e) 2^16), then 2^(n / 2^16) by flm_exp2_frac and the exponent */
float flm_sqrtf(float x);  /* correctly rounded, like IEEE sqrt, for x >= 0 */
float flm_silu(float x);   /* x / (1 + exp(-x)) */
float flm_gelu(float x);   /* tanh-approximation GELU: x / (1 + exp(-2u)), u = K0 x + K1 x^3 */
/* The engine's float loops, rounded element by element in this order (a HAL may supply faster ones,
 * bit for bit the same: the defaults are weak). n >= 1; o and v do not overlap. */
float flm_dot_f32(const float *a, const float *b, uint32_t n);        /* ((a0 b0 + a1 b1) + a2 b2) ... */
void flm_axpy_f32(float *o, float a, const float *v, uint32_t n);    /* o[i] = o[i] + a * v[i] */
#endif
