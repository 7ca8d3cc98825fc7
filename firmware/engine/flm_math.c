#include "flm_math.h"
#include <stdint.h>

/* Constants as hex floats so both sides hold the very same binary32 values. */
#define LOG2E 0x1.715476p+0f
#define LN2_HI 0x1.62e4p-1f          /* few mantissa bits: k * LN2_HI is exact for |k| < 256 */
#define LN2_LO 0x1.7f7d1cp-20f
#define EXP_LO (-86.0f)              /* below: 0 (keeps 2^k and the result normal) */
#define EXP_HI 88.0f                 /* above: +inf */

/* The range tests compare the floats' bits (the same outcomes as the float comparisons, without a
 * soft-float call each on cores without an FPU): a magnitude orders as an unsigned integer. */
float flm_expf(float x) {
    const uint32_t b = flm_f32_bits(x), mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) return x;                  /* NaN: never converted to an integer (undefined in C) */
    if (b >> 31 && mag > flm_f32_bits(-EXP_LO)) return 0.0f;  /* x < EXP_LO */
    if (!(b >> 31) && mag > flm_f32_bits(EXP_HI)) return flm_f32_from_bits(0x7f800000u);
    float t = x * LOG2E;
    const uint32_t tb = flm_f32_bits(t);   /* t >= 0 (also -0): the sign bit clear or t zero */
    int32_t k = (int32_t)(t + (!(tb >> 31) || !(tb & 0x7fffffffu) ? 0.5f : -0.5f));
    float kf = (float)k;
    float r = (x - kf * LN2_HI) - kf * LN2_LO;
    float p = 0x1.6c16c2p-10f;       /* 1/720 */
    p = p * r + 0x1.111112p-7f;      /* 1/120 */
    p = p * r + 0x1.555556p-5f;      /* 1/24 */
    p = p * r + 0x1.555556p-3f;      /* 1/6 */
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * flm_f32_from_bits((uint32_t)(k + 127) << 23);
}

float flm_sqrtf(float x) {
    const uint32_t b = flm_f32_bits(x);
    if (!(x > 0.0f) || b >= 0x7f800000u) return x;   /* 0, -0, negatives, inf, nan: unused */
    int32_t e = (int32_t)(b >> 23);
    uint32_t m = b & 0x7fffffu;
    if (e == 0) {                                  /* subnormal: normalise */
        e = 1;
        while (!(m & 0x800000u)) { m <<= 1; e--; }
    } else {
        m |= 0x800000u;
    }
    int32_t ex = e - 150;                          /* x = m * 2^ex, m in [2^23, 2^24) */
    if (ex & 1) { m <<= 1; ex -= 1; }              /* even exponent: m in [2^23, 2^25) */
    int s = (m < (1u << 24)) ? 26 : 24;            /* M = m << s in [2^48, 2^50) */
    uint64_t M = (uint64_t)m << s;
    /* floor(sqrt(M)), 25 bits, digit by digit */
    uint64_t root = 0, rem = M, bit = (uint64_t)1 << 48;
    while (bit) {
        if (rem >= root + bit) { rem -= root + bit; root = (root >> 1) + bit; }
        else root >>= 1;
        bit >>= 2;
    }
    /* round to 24 bits; an exact tie is impossible because M is even and not an odd square */
    uint32_t r = (uint32_t)((root + 1) >> 1);
    int32_t k = (ex - s) / 2 + 1;                  /* sqrt(x) = r * 2^k */
    if (r == (1u << 24)) { r >>= 1; k += 1; }
    return flm_f32_from_bits(((uint32_t)(k + 23 + 127) << 23) | (r & 0x7fffffu));
}

float flm_silu(float x) { return x / (1.0f + flm_expf(-x)); }

/* sqrt(2/pi) and sqrt(2/pi) * 0.044715, each rounded once to binary32 (reference.py GELU_K0/K1) */
#define GELU_K0 0x1.988454p-1f
#define GELU_K1 0x1.2444f2p-5f

float flm_gelu(float x) {
    float u = x * (GELU_K0 + GELU_K1 * (x * x));
    return x / (1.0f + flm_expf(-(u + u)));
}

/* The defaults in blocks of 8 elements, loops of a constant length that compilers vectorise at -O2
 * (element-wise products and sums round per element as the scalar code does: the sum keeps its
 * order, one add after another). */
#define BLOCK 8u

__attribute__((weak)) float flm_dot_f32(const float *a, const float *b, uint32_t n) {
    float s = a[0] * b[0];
    uint32_t i = 1;
    for (a++, b++; i + BLOCK <= n; i += BLOCK, a += BLOCK, b += BLOCK) {
        float p[BLOCK];
        for (uint32_t k = 0; k < BLOCK; k++) p[k] = a[k] * b[k];
        for (uint32_t k = 0; k < BLOCK; k++) s = s + p[k];
    }
    for (; i < n; i++) s = s + *a++ * *b++;
    return s;
}

__attribute__((weak)) void flm_axpy_f32(float *restrict o, float a, const float *restrict v, uint32_t n) {
    uint32_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK, o += BLOCK, v += BLOCK)
        for (uint32_t k = 0; k < BLOCK; k++) o[k] = o[k] + a * v[k];
    for (; i < n; i++, o++) *o = *o + a * *v++;
}
