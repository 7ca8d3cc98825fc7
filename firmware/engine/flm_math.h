/* Deterministic float functions mirrored exactly by converter/reference.py (no libm). */
#ifndef FLM_MATH_H
#define FLM_MATH_H
#include <stdint.h>
#include <string.h>
/* A float's bit pattern and back (memcpy: the defined way in C99; compilers make it a move). */
static inline uint32_t flm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float flm_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
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
float flm_expf(float x);   /* range reduction to [-ln2/2, ln2/2] + degree-6 polynomial */
float flm_sqrtf(float x);  /* correctly rounded, like IEEE sqrt, for x >= 0 */
float flm_silu(float x);   /* x / (1 + exp(-x)) */
float flm_gelu(float x);   /* tanh-approximation GELU: x / (1 + exp(-2u)), u = K0 x + K1 x^3 */
/* The engine's float loops, rounded element by element in this order (a HAL may supply faster ones,
 * bit for bit the same: the defaults are weak). n >= 1; o and v do not overlap. */
float flm_dot_f32(const float *a, const float *b, uint32_t n);        /* ((a0 b0 + a1 b1) + a2 b2) ... */
void flm_axpy_f32(float *o, float a, const float *v, uint32_t n);    /* o[i] = o[i] + a * v[i] */
#endif
