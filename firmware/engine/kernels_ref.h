/* The reference kernels: the numerics of every weight format in portable scalar C, the C form of
 * docs/formats.md section 1 (converter/reference.py is the same in NumPy). Each core's tuned
 * kernels (kernel_hooks.h) must agree with these bit for bit, which the boot self-check
 * (kernels_check.h) verifies; where a reference is also the fastest portable form, it is the
 * hook's fallback too.
 *
 * Included by kernel_hooks.h, in kernels.c: static functions (marked unused: which of them a core's
 * kernels and the self-check call depends on the core; the inline ones are those the tuned kernels
 * inline into their loops). */
#ifndef FLM_KERNELS_REF_H
#define FLM_KERNELS_REF_H
#include "flm_math.h"
#include "kernels.h"
#include <string.h>

#define FLM_REF static __attribute__((unused))

/* A block's little-endian f32 scale; blocks start 4-byte aligned (docs/formats.md), so this is
 * one word load even on cores without unaligned loads (the Cortex-M0+). */
FLM_REF float rdf(const uint8_t *p) {
    float f;
    memcpy(&f, __builtin_assume_aligned(p, 4), 4);
    return f;
}
FLM_REF int32_t nib(uint32_t v) { return (int32_t)(v & 15u) - (int32_t)((v & 8u) << 1); }

/* A nibble's code: o = 8 two's complement (q4), o = 0 offset by 8 (row-scaled q4). */
static inline int32_t lo4(uint32_t b, uint32_t o) { return (int32_t)((b & 15u) ^ o) - 8; }
static inline int32_t hi4(uint32_t b, uint32_t o) { return (int32_t)((b >> 4 & 15u) ^ o) - 8; }

/* An fp16 scale, widened exactly (every binary16 value is a binary32 value). */
FLM_REF float rdh(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0u) {                     /* zero or subnormal: m * 2^-24, exact in binary32 */
        float f = (float)m * 0x1p-24f;
        return (h & 0x8000u) ? -f : f;
    }
    return flm_f32_from_bits((h & 0x8000u) << 16 | (e == 31u ? 255u : e + 112u) << 23 | m << 13);
}

/* Walks one row's groups (docs/formats.md section 1): f32 scales sit in front of each group's
 * codes; fp16 scales sit together at the row's start (padded to 4), then the groups' codes. Codes
 * of every group start 4-byte aligned either way. */
typedef struct { const uint8_t *codes, *scale; uint32_t scale16; } row_reader;

FLM_REF row_reader row_at(const flm_tensor *w, uint32_t r) {
    const uint8_t *p = w->data + (size_t)r * w->stride;
    uint32_t ng = (w->cols + w->group - 1u) / w->group;
    row_reader rr = {p, p, w->scale16};
    if (w->scale16) rr.codes = p + ((2u * ng + 3u) & ~3u);
    return rr;
}

/* The next group's scale; afterwards rr->codes points at that group's codes. */
FLM_REF float next_scale(row_reader *rr) {
    float s;
    if (rr->scale16) { s = rdh(rr->scale); rr->scale += 2; }
    else { s = rdf(rr->codes); rr->codes += 4; }
    return s;
}

/* ---- the activations' codes -----------------------------------------------------------------
 * The comparisons are on the floats' bits (the same outcomes as the float comparisons, without a
 * soft-float call each on cores without an FPU): |x| as x without its sign bit orders as an
 * unsigned integer, and NaN (above 0x7f800000 so) never becomes the maximum. */
static inline __attribute__((always_inline)) uint32_t amax_bits_of(const float *x, uint32_t len) {
    uint32_t amax_bits = 0;
    for (uint32_t i = 0; i < len; i++) {
        uint32_t a = flm_f32_bits(x[i]) & 0x7fffffffu;
        if (a > amax_bits && a <= 0x7f800000u) amax_bits = a;
    }
    return amax_bits;
}

#define BITS_127 0x42fe0000u   /* 127.0f */
/* The code of x * inv, qbits the bits of (float)qmax: clamped to +-qmax before rounding (the same
 * codes for every finite product); NaN from a broken model becomes 0, inf +-qmax, instead of an
 * undefined float-to-int conversion. The rounding on the bits (flm_round_half_away): no soft-float
 * add and conversion per code. */
static inline __attribute__((always_inline)) int32_t act_code_q(float x, float inv, int32_t qmax, uint32_t qbits) {
    const uint32_t b = flm_f32_bits(x * inv), mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) return 0;
    if (mag > qbits) return (b >> 31) ? -qmax : qmax;
    return (b >> 31) ? -flm_round_half_away(mag) : flm_round_half_away(mag);
}

/* int8 codes, qmax 127 (the int8 KV cache's rows; kernel_hooks.h FLM_QUANT_CODES). */
FLM_REF int8_t act_code(float x, float inv) { return (int8_t)act_code_q(x, inv, 127, BITS_127); }

FLM_REF void act_codes(const float *x, uint32_t n, float inv, int8_t *q) {
    for (uint32_t i = 0; i < n; i++) q[i] = act_code(x[i], inv);
}

/* flm_act codes with the largest code qmax (127 or 2047; kernel_hooks.h FLM_ACT_CODES_Q). */
FLM_REF void act_codes_q(const float *x, uint32_t n, float inv, int32_t qmax, flm_act *q) {
    const uint32_t qbits = flm_f32_bits((float)qmax);
    for (uint32_t i = 0; i < n; i++) q[i] = (flm_act)act_code_q(x[i], inv, qmax, qbits);
}

/* ---- group dot products -------------------------------------------------------------------
 * These define the sums; a tuned dot must agree exactly (integer sums are exact in any order). The
 * q8 one is in the shape compilers vectorise (a plain reduction over restrict pointers): it is
 * every core's q8 dot unless the core has its own (kernel_hooks.h FLM_DOT_Q8). */
static inline __attribute__((always_inline)) int32_t dot_q8_scalar(const int8_t *restrict w,
                                                                   const flm_act *restrict x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

FLM_REF int32_t dot_q4_scalar(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += nib((uint32_t)w[i >> 1] >> (4u * (i & 1u))) * (int32_t)x[i];
    return s;
}

/* Row-scaled q4 codes are stored offset by 8 (docs/formats.md section 1): nibble u is code u - 8. */
FLM_REF int32_t dot_q4o_scalar(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += ((int32_t)((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) - 8) * (int32_t)x[i];
    return s;
}

/* The int8 attention's loops: two dots sharing x, and acc[i] += w * v[i]. */
FLM_REF void dot2_scalar(const int8_t *a, const int8_t *b, const flm_act *x, uint32_t n, int32_t out[2]) {
    out[0] = dot_q8_scalar(a, x, n);
    out[1] = dot_q8_scalar(b, x, n);
}

FLM_REF void axpy_scalar(int32_t *acc, const int8_t *v, int32_t w, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) acc[i] += w * (int32_t)v[i];
}

/* The k12 attention's score: the exact dot of int16 K codes and query codes, both |c| <= 2047, an
 * int32 for n <= 512 (2047^2 * 512 < 2^31; the converter refuses k12 for a longer head). In the
 * shape compilers vectorise, as dot_q8_scalar. */
static inline __attribute__((always_inline)) int32_t dot_q12_scalar(const int16_t *restrict a,
                                                                    const flm_act *restrict x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += (int32_t)a[i] * (int32_t)x[i];
    return s;
}

FLM_REF void dot2_q12_scalar(const int16_t *a, const int16_t *b, const flm_act *x, uint32_t n, int32_t out[2]) {
    out[0] = dot_q12_scalar(a, x, n);
    out[1] = dot_q12_scalar(b, x, n);
}

/* ---- rows ------------------------------------------------------------------------------------ */

/* The reference's float(acc): an integer (a row-scaled row's sum is below 2^44 in magnitude,
 * docs/formats.md) rounded once to binary32 (to nearest, ties to even), with integer operations only,
 * so every board rounds it alike. */
static inline float i64_to_f32(int64_t v) {
    uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    uint32_t sh = 0;
    while (m >> sh >= (1u << 24)) sh++;            /* at most 20 steps below 2^44 */
    uint64_t q = m >> sh, rest = m - (q << sh), half = sh ? (uint64_t)1 << (sh - 1u) : 0u;
    if (sh && (rest > half || (rest == half && (q & 1u)))) q++;   /* q <= 2^24: exact below */
    float f = (float)(uint32_t)q * flm_f32_from_bits((127u + sh) << 23);   /* times 2^sh: exact */
    return v < 0 ? -f : f;
}

/* A group's term as the reference forms it: float(isum) * (wscale * xscale). */
static inline float group_term(int32_t isum, float sc, float xs) { return (float)isum * (sc * xs); }

typedef int32_t (*dot8_fn)(const int8_t *, const flm_act *, uint32_t);
typedef int32_t (*dot4_fn)(const uint8_t *, const flm_act *, uint32_t);
typedef float (*term_fn)(int32_t, float, float);

/* Row-scaled: every group's integer dot and the multiplier-weighted sum first (int64 products: with
 * 12-bit activations k * isum exceeds int32 once a group is longer than 32; an int64 sum), then the
 * one scaling: float(acc) * (S_r * X). */
static inline __attribute__((always_inline)) float row_rs(const flm_tensor *w, uint32_t r, const flm_act *xq,
                                                          const float *xs, dot8_fn d8, dot4_fn d4) {
    const uint32_t g = w->group, cols = w->cols, ng = (cols + g - 1u) / g;
    const uint8_t *p = w->data + (size_t)r * w->stride, *k = p + 4, *codes = p + 4 + ((ng + 3u) & ~3u);
    int64_t acc = 0;
    for (uint32_t s = 0, gi = 0; s < cols; s += g, gi++) {
        const uint32_t len = cols - s < g ? cols - s : g, nbytes = w->fmt == FLM_Q8 ? len : (len + 1u) / 2u;
        const int32_t isum = w->fmt == FLM_Q8 ? d8((const int8_t *)codes, xq + s, len) : d4(codes, xq + s, len);
        acc += (int64_t)k[gi] * isum;
        codes += (nbytes + 3u) & ~3u;
    }
    return i64_to_f32(acc) * (rdf(p) * xs[0]);
}

/* One output row: per group float(isum) * (wscale * xscale), folded left to right. */
static inline __attribute__((always_inline)) float row_with(const flm_tensor *w, uint32_t r, const flm_act *xq,
                                                            const float *xs, dot8_fn d8, dot4_fn d4, term_fn tf) {
    const uint32_t g = w->group, cols = w->cols;
    row_reader rr = row_at(w, r);
    float acc = 0.0f;
    for (uint32_t s = 0, gi = 0; s < cols; s += g, gi++) {
        uint32_t len = cols - s < g ? cols - s : g;
        uint32_t nbytes = w->fmt == FLM_Q8 ? len : (len + 1u) / 2u;
        float sc = next_scale(&rr);
        const uint8_t *p = rr.codes;
        int32_t isum = w->fmt == FLM_Q8 ? d8((const int8_t *)p, xq + s, len) : d4(p, xq + s, len);
        float term = tf(isum, sc, xs[gi]);
        acc = gi == 0 ? term : acc + term;
        rr.codes += (nbytes + 3u) & ~3u;
    }
    return acc;
}
#endif
