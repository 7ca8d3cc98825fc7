#include "kernels.h"
#include "flm_math.h"
#include <math.h>
#include <string.h>

/* A block's little-endian f32 scale; blocks start 4-byte aligned (docs/formats.md), so this is
 * one word load even on cores without unaligned loads (the Cortex-M0+). */
static float rdf(const uint8_t *p) {
    float f;
    memcpy(&f, __builtin_assume_aligned(p, 4), 4);
    return f;
}
static int32_t nib(uint32_t v) { return (int32_t)(v & 15u) - (int32_t)((v & 8u) << 1); }

/* An fp16 scale, widened exactly (every binary16 value is a binary32 value). */
static float rdh(const uint8_t *p) {
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

static row_reader row_at(const flm_tensor *w, uint32_t r) {
    const uint8_t *p = w->data + (size_t)r * w->stride;
    uint32_t ng = (w->cols + w->group - 1u) / w->group;
    row_reader rr = {p, p, w->scale16};
    if (w->scale16) rr.codes = p + ((2u * ng + 3u) & ~3u);
    return rr;
}

/* The next group's scale; afterwards rr->codes points at that group's codes. */
static float next_scale(row_reader *rr) {
    float s;
    if (rr->scale16) { s = rdh(rr->scale); rr->scale += 2; }
    else { s = rdf(rr->codes); rr->codes += 4; }
    return s;
}

#ifdef FLM_VECTOR
/* Cores with vectors (and an FPU): the reference's own rounding, in blocks of 8 elements, loops of
 * a constant length that compilers vectorise at -O2 (a signed maximum per lane over magnitudes
 * below 2^31; clamps, conversions and stores per lane), then the rest one by one. */
#define QBLOCK 8u
static inline __attribute__((always_inline)) int32_t mag_or_0(float v) {
    const int32_t a = (int32_t)(flm_f32_bits(v) & 0x7fffffffu);
    return a <= 0x7f800000 ? a : 0;   /* NaN is never the maximum */
}

static inline __attribute__((always_inline)) uint32_t amax_bits_of(const float *restrict x, uint32_t len) {
    int32_t lane[QBLOCK] = {0}, m = 0;
    uint32_t i = 0;
    for (; i + QBLOCK <= len; i += QBLOCK, x += QBLOCK)
        for (uint32_t k = 0; k < QBLOCK; k++) {
            const int32_t a = mag_or_0(x[k]);
            lane[k] = a > lane[k] ? a : lane[k];
        }
    for (uint32_t k = 0; k < QBLOCK; k++) m = lane[k] > m ? lane[k] : m;
    for (; i < len; i++) {
        const int32_t a = mag_or_0(*x++);
        m = a > m ? a : m;
    }
    return (uint32_t)m;
}

/* clamp to +-127 before rounding (the same codes for every finite v); NaN from a broken model
 * becomes 0, inf +-127, instead of an undefined float-to-int conversion. The clamp is masks on the
 * bits (gcc vectorises no select of a value a float operation then takes under -ftrapping-math),
 * then the reference's rounding, (int32_t)(v +- 0.5f). */
static inline __attribute__((always_inline)) int32_t code_of(float v) {
    const uint32_t b = flm_f32_bits(v), sign127 = (b & 0x80000000u) | 0x42fe0000u;   /* +-127.0f */
    const int32_t mag = (int32_t)(b & 0x7fffffffu);
    const uint32_t big = 0u - (uint32_t)(mag > 0x42fe0000), nan = 0u - (uint32_t)(mag > 0x7f800000);
    v = flm_f32_from_bits(((b & ~big) | (sign127 & big)) & ~nan);
    return (int32_t)(v + (isless(v, 0.0f) ? -0.5f : 0.5f));
}
#define CODES(T)                                                                                   \
    {                                                                                              \
        T *restrict c = (T *)q;                                                                    \
        const float *restrict v = x;                                                               \
        uint32_t i = 0;                                                                            \
        for (; i + QBLOCK <= len; i += QBLOCK, c += QBLOCK, v += QBLOCK)                           \
            for (uint32_t k = 0; k < QBLOCK; k++) c[k] = (T)code_of(v[k] * inv);                   \
        for (; i < len; i++) *c++ = (T)code_of(*v++ * inv);                                        \
    }
#else
/* The comparisons are on the floats' bits (the same outcomes as the float comparisons, without a
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
/* The code of x * inv: clamped to +-127 before rounding (the same codes for every finite product);
 * NaN from a broken model becomes 0, inf +-127, instead of an undefined float-to-int conversion.
 * The rounding on the bits (flm_round_half_away): no soft-float add and conversion per code. */
static int8_t act_code(float x, float inv) {
    const uint32_t b = flm_f32_bits(x * inv), mag = b & 0x7fffffffu;
    int32_t q;
    if (mag > 0x7f800000u) q = 0;
    else if (mag > BITS_127) q = (b >> 31) ? -127 : 127;
    else q = (b >> 31) ? -flm_round_half_away(mag) : flm_round_half_away(mag);
    return (int8_t)q;
}

static void act_codes(const float *x, uint32_t n, float inv, int8_t *q) {
    for (uint32_t i = 0; i < n; i++) q[i] = act_code(x[i], inv);
}
#ifndef FLM_QUANT_CODES   /* a HAL's, bit for bit act_codes (softfloat_m0.h) */
#define FLM_QUANT_CODES act_codes
#endif
#define CODES(T) FLM_QUANT_CODES(x, len, inv, (int8_t *)q);   /* flm_act is int8_t here */
#endif

/* The codes of x[n] per group of g into q (int8_t or flm_act elements of `size` bytes: a constant
 * once inlined), the scales into xs. */
static inline __attribute__((always_inline)) void quantize(const float *x, uint32_t n, uint32_t g, void *q,
                                                           size_t size, float *xs) {
    for (uint32_t s = 0, gi = 0; s < n; s += g, gi++, x += g, q = (uint8_t *)q + g * size) {
        const uint32_t len = n - s < g ? n - s : g, amax_bits = amax_bits_of(x, len);
        if (amax_bits == 0u) {
            xs[gi] = 0.0f;
            memset(q, 0, len * size);
            continue;
        }
        const float amax = flm_f32_from_bits(amax_bits);
        xs[gi] = amax / 127.0f;
        const float inv = 127.0f / amax;
        if (size == 1u) CODES(int8_t)
        else CODES(flm_act)
    }
}
#undef CODES

void flm_quantize_act(const float *x, uint32_t n, uint32_t g, flm_act *xq, float *xs) {
    quantize(x, n, g, xq, sizeof *xq, xs);
}

void flm_quantize_i8(const float *x, uint32_t n, uint32_t g, int8_t *q, float *xs) {
#ifdef FLM_VECTOR
    quantize(x, n, g, q, 1u, xs);
#else
    flm_quantize_act(x, n, g, q, xs);   /* flm_act is int8_t */
#endif
}

/* ---- group dot products -------------------------------------------------------------------
 * The scalar kernels define the sums; the tuned ones must agree with them exactly (integer sums are
 * exact in any order), which flm_kernels_self_check verifies at boot. */

static int32_t dot_q8_scalar(const int8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

static int32_t dot_q4_scalar(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += nib((uint32_t)w[i >> 1] >> (4u * (i & 1u))) * (int32_t)x[i];
    return s;
}

/* Row-scaled q4 codes are stored offset by 8 (docs/formats.md section 1): nibble u is code u - 8. */
static int32_t dot_q4o_scalar(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += ((int32_t)((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) - 8) * (int32_t)x[i];
    return s;
}

/* FLM_FAULT_TUNED_KERNEL (tests/test_kernels.py only): a build whose tuned q8 kernel is off by one,
 * which the boot self-check must catch. */
#ifdef FLM_FAULT_TUNED_KERNEL
#define TUNED(s) ((s) ^ 1)
#else
#define TUNED(s) (s)
#endif

#if defined(__ARM_ARCH_6M__)
/* Each code byte read once (the tuned kernels' tails: the emulator's read counts must equal the
 * engine's, tests/test_rp2040_emu.py). */
static int32_t dot_q4_bytes(const uint8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint32_t b = w[i >> 1];
        s += nib(b) * (int32_t)x[i] + nib(b >> 4) * (int32_t)x[i + 1];
    }
    if (i < n) s += nib(w[i >> 1]) * (int32_t)x[i];
    return s;
}

/* dot_q4_bytes for codes offset by 8 (row-scaled q4), each code byte read once. */
static int32_t dot_q4o(const uint8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint32_t b = w[i >> 1];
        s += ((int32_t)(b & 15u) - 8) * (int32_t)x[i] + ((int32_t)(b >> 4) - 8) * (int32_t)x[i + 1];
    }
    if (i < n) s += ((int32_t)(w[i >> 1] & 15u) - 8) * (int32_t)x[i];
    return s;
}

/* Cortex-M0+ (ARMv6-M: no DSP or SIMD instructions, 1-cycle MULS on the RP2040): word loads of codes
 * and activations (LDM with writeback, 2 cycles for 4 bytes against 2 for each LDRSB), each byte
 * sign-extended in registers by SXTB or a shift, one MULS and ADDS per product. 8 weights a turn. */
static inline __attribute__((always_inline)) int32_t dot_q8(const int8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t n8 = n & ~7u;
    if (n8 && !(((uintptr_t)w | (uintptr_t)x) & 3u)) {   /* codes are; activations are in the engine */
        const int8_t *end = w + n8;
        uint32_t a, b, t, u;
#define Q8_WORD                                                                                     \
        "ldm %[w]!, {%[a]}\n ldm %[x]!, {%[b]}\n"                                                  \
        "sxtb %[t], %[a]\n sxtb %[u], %[b]\n muls %[t], %[u]\n adds %[s], %[t]\n"                 \
        "lsrs %[t], %[a], #8\n sxtb %[t], %[t]\n lsrs %[u], %[b], #8\n sxtb %[u], %[u]\n"         \
        "muls %[t], %[u]\n adds %[s], %[t]\n"                                                       \
        "lsrs %[t], %[a], #16\n sxtb %[t], %[t]\n lsrs %[u], %[b], #16\n sxtb %[u], %[u]\n"       \
        "muls %[t], %[u]\n adds %[s], %[t]\n"                                                       \
        "asrs %[a], %[a], #24\n asrs %[b], %[b], #24\n muls %[a], %[b]\n adds %[s], %[a]\n"
        __asm volatile(".syntax unified\n"
                       "1:\n" Q8_WORD Q8_WORD
                       "cmp %[w], %[end]\n bne 1b\n"
                       ".syntax divided\n"
                       : [w] "+l"(w), [x] "+l"(x), [s] "+l"(s), [a] "=&l"(a), [b] "=&l"(b), [t] "=&l"(t), [u] "=&l"(u)
                       : [end] "r"(end)
                       : "cc", "memory");
#undef Q8_WORD
        n -= n8;
    }
    return TUNED(s + dot_q8_scalar(w, x, n));
}

/* 8 nibbles per code word, each sign-extended by a shift pair (LSLS to the top, ASRS down). */
static inline __attribute__((always_inline)) int32_t dot_q4(const uint8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t n8 = n & ~7u;
    if (n8 && !(((uintptr_t)w | (uintptr_t)x) & 3u)) {
        const uint8_t *end = w + n8 / 2u;
        uint32_t a, b, t, u;
#define Q4_PAIR(lo, hi, xlo, xhi)                                                                   \
        "lsls %[t], %[a], #" #lo "\n asrs %[t], %[t], #28\n " xlo "\n muls %[t], %[u]\n adds %[s], %[t]\n" \
        "lsls %[t], %[a], #" #hi "\n asrs %[t], %[t], #28\n " xhi "\n muls %[t], %[u]\n adds %[s], %[t]\n"
        __asm volatile(".syntax unified\n"
                       "1:\n"
                       "ldm %[w]!, {%[a]}\n ldm %[x]!, {%[b]}\n"
                       Q4_PAIR(28, 24, "sxtb %[u], %[b]", "lsrs %[u], %[b], #8\n sxtb %[u], %[u]")
                       Q4_PAIR(20, 16, "lsrs %[u], %[b], #16\n sxtb %[u], %[u]", "asrs %[u], %[b], #24")
                       "ldm %[x]!, {%[b]}\n"
                       Q4_PAIR(12, 8, "sxtb %[u], %[b]", "lsrs %[u], %[b], #8\n sxtb %[u], %[u]")
                       "lsls %[t], %[a], #4\n asrs %[t], %[t], #28\n lsrs %[u], %[b], #16\n sxtb %[u], %[u]\n"
                       "muls %[t], %[u]\n adds %[s], %[t]\n"
                       "asrs %[a], %[a], #28\n asrs %[b], %[b], #24\n muls %[a], %[b]\n adds %[s], %[a]\n"
                       "cmp %[w], %[end]\n bne 1b\n"
                       ".syntax divided\n"
                       : [w] "+l"(w), [x] "+l"(x), [s] "+l"(s), [a] "=&l"(a), [b] "=&l"(b), [t] "=&l"(t), [u] "=&l"(u)
                       : [end] "r"(end)
                       : "cc", "memory");
#undef Q4_PAIR
        n -= n8;
    }
    return s + dot_q4_bytes(w, x, n);
}
#else
/* Portable C in the shape compilers vectorise (gcc, clang; SSE2/AVX2 on x86-64, NEON on AArch64):
 * plain reductions over restrict pointers, nibbles widened by masks, xor and subtract (no shift of
 * a negative number). flm_isums_* below instantiate them with the common group sizes as constants,
 * so a group's loop has a known trip count: no runtime checks or scalar epilogue per group. */
static inline __attribute__((always_inline)) int32_t dot_q8(const int8_t *restrict w, const flm_act *restrict x,
                                                            uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return TUNED(s);
}

/* A nibble's code: o = 8 two's complement (q4), o = 0 offset by 8 (row-scaled q4). */
static inline int32_t lo4(uint32_t b, uint32_t o) { return (int32_t)((b & 15u) ^ o) - 8; }
static inline int32_t hi4(uint32_t b, uint32_t o) { return (int32_t)((b >> 4 & 15u) ^ o) - 8; }

#ifdef FLM_VECTOR
/* Cores with vectors: up to 128 codes at a time unpacked into flm_act in element order (low nibble
 * first), then a dot like q8's, whose 16-bit multiply-add takes codes and activations pairwise as
 * they lie. */
#define Q4_CHUNK 128u
static inline __attribute__((always_inline)) int32_t dot_q4x(const uint8_t *restrict w, const flm_act *restrict x,
                                                             uint32_t n, uint32_t o) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i += Q4_CHUNK, w += Q4_CHUNK / 2u, x += Q4_CHUNK) {
        const uint32_t m = (n - i < Q4_CHUNK ? n - i : Q4_CHUNK) / 2u;
        flm_act c[Q4_CHUNK];
        for (uint32_t j = 0; j < m; j++) {
            c[2u * j] = (flm_act)lo4(w[j], o);
            c[2u * j + 1u] = (flm_act)hi4(w[j], o);
        }
        for (uint32_t k = 0; k < 2u * m; k++) s += (int32_t)c[k] * (int32_t)x[k];
        if (2u * m < Q4_CHUNK && (n & 1u)) s += lo4(w[m], o) * (int32_t)x[2u * m];   /* an odd last code */
    }
    return s;
}
#else
static inline __attribute__((always_inline)) int32_t dot_q4x(const uint8_t *restrict w, const flm_act *restrict x,
                                                             uint32_t n, uint32_t o) {
    int32_t s = 0;
    for (uint32_t j = 0; j < n / 2u; j++) s += lo4(w[j], o) * (int32_t)x[2u * j] + hi4(w[j], o) * (int32_t)x[2u * j + 1u];
    if (n & 1u) s += lo4(w[n / 2u], o) * (int32_t)x[n - 1u];
    return s;
}
#endif
static inline __attribute__((always_inline)) int32_t dot_q4(const uint8_t *restrict w, const flm_act *restrict x,
                                                            uint32_t n) {
    return dot_q4x(w, x, n, 8u);
}
static inline __attribute__((always_inline)) int32_t dot_q4o(const uint8_t *restrict w, const flm_act *restrict x,
                                                             uint32_t n) {
    return dot_q4x(w, x, n, 0u);
}
#endif

int32_t flm_dot_q8(const int8_t *w, const flm_act *x, uint32_t n) { return dot_q8(w, x, n); }
int32_t flm_dot_q4(const uint8_t *w, const flm_act *x, uint32_t n) { return dot_q4(w, x, n); }

uint32_t flm_act_group(const flm_tensor *w) { return w->rowscale ? w->cols : w->group; }

static void dot2_scalar(const int8_t *a, const int8_t *b, const flm_act *x, uint32_t n, int32_t out[2]) {
    out[0] = dot_q8_scalar(a, x, n);
    out[1] = dot_q8_scalar(b, x, n);
}

static void axpy_scalar(int32_t *acc, const int8_t *v, int32_t w, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) acc[i] += w * (int32_t)v[i];
}

void flm_dot2_q8(const int8_t *a, const int8_t *b, const flm_act *x, uint32_t n, int32_t out[2]) {
#ifdef FLM_DOT2_Q8   /* a HAL's (softfloat_m0.h), for whole steps of 8 */
    if (!(n & 7u)) {
        FLM_DOT2_Q8(a, b, x, n, out);
        out[0] = TUNED(out[0]);
        return;
    }
#endif
    out[0] = dot_q8(a, x, n);
    out[1] = dot_q8(b, x, n);
}

void flm_axpy_q8(int32_t *acc, const int8_t *v, int32_t w, uint32_t n) {
#ifdef FLM_AXPY_Q8   /* a HAL's, for whole words */
    const uint32_t n4 = n & ~3u;
    if (n4) FLM_AXPY_Q8(acc, v, w, n4);
    axpy_scalar(acc + n4, v + n4, w, n - n4);
#else
    axpy_scalar(acc, v, w, n);
#endif
}

/* The reference's float(acc): an integer below 2^40 in magnitude rounded once to binary32 (to
 * nearest, ties to even), with integer operations only, so every board rounds it alike. */
static inline float i64_to_f32(int64_t v) {
    uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    uint32_t sh = 0;
    while (m >> sh >= (1u << 24)) sh++;            /* at most 17 steps below 2^41 */
    uint64_t q = m >> sh, rest = m - (q << sh), half = sh ? (uint64_t)1 << (sh - 1u) : 0u;
    if (sh && (rest > half || (rest == half && (q & 1u)))) q++;   /* q <= 2^24: exact below */
    float f = (float)(uint32_t)q * flm_f32_from_bits((127u + sh) << 23);   /* times 2^sh: exact */
    return v < 0 ? -f : f;
}

/* A group's term as the reference forms it: float(isum) * (wscale * xscale). */
static inline float group_term(int32_t isum, float sc, float xs) { return (float)isum * (sc * xs); }
#ifndef FLM_GROUP_TERM   /* a HAL may supply a faster one, bit for bit the same (hal_rp2040.h) */
#define FLM_GROUP_TERM group_term
#endif

typedef int32_t (*dot8_fn)(const int8_t *, const flm_act *, uint32_t);
typedef int32_t (*dot4_fn)(const uint8_t *, const flm_act *, uint32_t);
typedef float (*term_fn)(int32_t, float, float);

/* Row-scaled: every group's integer dot and the multiplier-weighted sum first (int32 products,
 * docs/formats.md bounds them; an int64 sum), then the one scaling: float(acc) * (S_r * X). */
static inline __attribute__((always_inline)) float row_rs(const flm_tensor *w, uint32_t r, const flm_act *xq,
                                                          const float *xs, dot8_fn d8, dot4_fn d4) {
    const uint32_t g = w->group, cols = w->cols, ng = (cols + g - 1u) / g;
    const uint8_t *p = w->data + (size_t)r * w->stride, *k = p + 4, *codes = p + 4 + ((ng + 3u) & ~3u);
    int64_t acc = 0;
    for (uint32_t s = 0, gi = 0; s < cols; s += g, gi++) {
        const uint32_t len = cols - s < g ? cols - s : g, nbytes = w->fmt == FLM_Q8 ? len : (len + 1u) / 2u;
        const int32_t isum = w->fmt == FLM_Q8 ? d8((const int8_t *)codes, xq + s, len) : d4(codes, xq + s, len);
        acc += (int32_t)k[gi] * isum;
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

/* ---- the integer dots of a row's groups ---------------------------------------------------- */

#ifdef FLM_VECTOR
/* Where the toolchain clones functions resolved at load time (x86-64 ELF, GNU ifunc: gcc, clang >= 14),
 * the vectorised loops are compiled twice from this same C, for the x86-64 baseline (SSE2) and for
 * AVX2, and the loader picks what this CPU runs; the boot self-check checks the one picked.
 * FLM_NO_CLONES builds the baseline alone (tests/test_kernels.py checks both). */
#if defined(__x86_64__) && defined(__ELF__) && defined(__linux__) && defined(__has_attribute) && !defined(FLM_NO_CLONES)
#if __has_attribute(target_clones)
#define FLM_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#endif
#ifndef FLM_CLONES
#define FLM_CLONES
#endif

/* isum[k], k < ng: inlined into every caller, so that a constant g makes each group's loop one of
 * known length (no runtime checks or scalar epilogue per group). kind: 1 q8, 0 q4, 2 row-scaled q4
 * (codes offset by 8). */
#define KIND_Q4O 2
static inline __attribute__((always_inline)) void isums(const uint8_t *codes, size_t step, const flm_act *x, uint32_t g,
                                                        uint32_t ng, int kind, int32_t *isum) {
    for (uint32_t k = 0; k < ng; k++, codes += step, x += g)
        isum[k] = kind == 1 ? dot_q8((const int8_t *)codes, x, g) : kind == KIND_Q4O ? dot_q4o(codes, x, g)
                                                                                    : dot_q4(codes, x, g);
}

#ifdef FLM_VECTOR
/* The shapes with their own instantiations, (format, q8, group size): loops of a constant length. */
#define EACH_SHAPE(X) X(q8, 1, 32) X(q8, 1, 64) X(q8, 1, 128) X(q4, 0, 32) X(q4, 0, 64) X(q4, 0, 128)
#define ISUMS(fmt, q8, G)                                                                                         \
    static FLM_CLONES void isums_##fmt##_##G(const uint8_t *codes, size_t step, const flm_act *x, uint32_t ng,    \
                                             int32_t *isum) {                                                     \
        isums(codes, step, x, G##u, ng, q8, isum);                                                                \
    }
EACH_SHAPE(ISUMS)
#undef ISUMS
#endif

/* The instantiation for group size g, or 0 (then the loops of the general length). */
typedef void (*isums_fn)(const uint8_t *codes, size_t step, const flm_act *x, uint32_t ng, int32_t *isum);
static isums_fn isums_for(uint32_t g, int q8) {
#ifdef FLM_VECTOR
#define PICK(f, is_q8, G) if (g == G##u && q8 == is_q8) return isums_##f##_##G;
    EACH_SHAPE(PICK)
#undef PICK
#endif
    (void)g, (void)q8;
    return 0;
}

void flm_isums_q8(const uint8_t *codes, size_t step, const flm_act *xq, uint32_t g, uint32_t ng, int32_t *isum) {
    const isums_fn f = isums_for(g, 1);
    if (f) f(codes, step, xq, ng, isum);
    else isums(codes, step, xq, g, ng, 1, isum);
}

void flm_isums_q4(const uint8_t *codes, size_t step, const flm_act *xq, uint32_t g, uint32_t ng, int32_t *isum) {
    const isums_fn f = isums_for(g, 0);
    if (f) f(codes, step, xq, ng, isum);
    else isums(codes, step, xq, g, ng, 0, isum);
}

/* ---- whole rows ------------------------------------------------------------------------------ */

#if defined(__ARM_ARCH_6M__)
/* row_with for the common shape, f32 scales and whole groups of a multiple of 8 (word-aligned
 * activations): one lean loop without the per-group format tests and length arithmetic, which
 * cost more than a group's dot product on the Cortex-M0+. The same sums in the same order. */
static inline __attribute__((always_inline)) float row_whole(const uint8_t *p, const int8_t *x, const float *xs,
                                                             uint32_t ng, uint32_t g, int q8) {
    const uint32_t step = 4u + (q8 ? g : g / 2u);   /* scale + codes, no padding */
    float acc = FLM_GROUP_TERM(q8 ? dot_q8((const int8_t *)(p + 4), x, g) : dot_q4(p + 4, x, g), rdf(p), xs[0]);
    for (uint32_t gi = 1; gi < ng; gi++) {
        p += step;
        x += g;
        acc = acc + FLM_GROUP_TERM(q8 ? dot_q8((const int8_t *)(p + 4), x, g) : dot_q4(p + 4, x, g), rdf(p), xs[gi]);
    }
    return acc;
}

#ifdef FLM_ROW_WHOLE   /* a HAL's whole-row loop, bit for bit row_whole (hal_rp2040.h) */
#ifdef FLM_FAULT_TUNED_KERNEL   /* it calls no dot_q8 to be off by one: its q8 rows are off by one ulp */
static float row_fault(float v, int q8) { return flm_f32_from_bits(flm_f32_bits(v) ^ (uint32_t)q8); }
#define ROW_WHOLE(p, x, xs, ng, g, q8) row_fault(FLM_ROW_WHOLE(p, x, xs, ng, g, q8), q8)
#else
#define ROW_WHOLE FLM_ROW_WHOLE
#endif
#else
#define ROW_WHOLE row_whole
#endif

/* The number of groups when the rows of w take the whole-row path, else 0: the shape tests (a
 * division each) once per matvec, not per row. */
static uint32_t whole_groups(const flm_tensor *w, const flm_act *xq) {
    const uint32_t g = w->group;
    return !w->scale16 && w->cols % g == 0u && g % 8u == 0u && !((uintptr_t)xq & 3u) ? w->cols / g : 0u;
}

#ifdef FLM_RS_ROWS_Q8   /* a HAL's row-scaled rows, bit for bit row_rs (softfloat_m0.h) */
/* The q4 kernel's activations (softfloat_m0.s Q4L_WORD), on the stack: per sub-block of 32 columns
 * a start value, minus the share of the codes' offset 8, then per 8 columns (x_j << 16) + x_{j+4},
 * j = 0..3. Up to LANE_COLS columns: 2,176 bytes of the RP2040's 8 KB stack floor. */
#define LANE_COLS 1024u

/* Their shape: whole groups of a multiple of 8 columns (q4: of 32, at most LANE_COLS), word-aligned
 * activations, and (q8) rows whose sum fits an int32: |code| <= 128, |x| <= 127, k <= 255 make 518
 * columns (docs/formats.md). 0: another shape; else geom = n_groups | group << 16. */
static uint32_t rs_geom(const flm_tensor *w, const flm_act *xq) {
    const uint32_t g = w->group, q8 = w->fmt == FLM_Q8;
    const int ok = w->cols % g == 0u && g % (q8 ? 8u : 32u) == 0u && w->cols <= (q8 ? 518u : LANE_COLS) &&
                   !((uintptr_t)xq & 3u);
    return ok ? w->cols / g | g << 16 : 0u;
}

static __attribute__((noinline)) void rows_rs_lanes(flm_rs_job *j, uint32_t cols) {
    uint32_t lanes[LANE_COLS / 32u * 17u], *p = lanes;
    const int8_t *x = j->x;
    for (uint32_t s = 0; s < cols; s += 32u) {
        uint32_t *start = p++, sum = 0;
        for (uint32_t b = s; b < s + 32u; b += 8u)
            for (uint32_t i = 0; i < 4u; i++) {
                const uint32_t v = ((uint32_t)(int32_t)x[b + i] << 16) + (uint32_t)(int32_t)x[b + i + 4u];
                *p++ = v;
                sum += v;
            }
        *start = 0u - 8u * 0x10001u * sum;
    }
    j->x = lanes;
    FLM_RS_ROWS_Q4(j);
}
#endif

/* Rows [r0, r1) of a row-scaled tensor into out[0..): the HAL's kernels where the shape suits them
 * (q4 for a block of rows only: its lanes cost about a row), else the portable row. */
static void rows_rs(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, const float *xs, float *out) {
#ifdef FLM_RS_ROWS_Q8
    const uint32_t geom = rs_geom(w, xq);
    if (geom && (w->fmt == FLM_Q8 || r1 - r0 > 1u)) {
        flm_rs_job j = {w->data + (size_t)r0 * w->stride, w->stride, r1 - r0, xq, geom, xs[0], out};
        if (w->fmt == FLM_Q8) FLM_RS_ROWS_Q8(&j);
        else rows_rs_lanes(&j, w->cols);
#ifdef FLM_FAULT_TUNED_KERNEL   /* (see TUNED) the HAL's q8 rows are off by one ulp */
        for (uint32_t i = 0; i < r1 - r0 && w->fmt == FLM_Q8; i++) out[i] = flm_f32_from_bits(flm_f32_bits(out[i]) ^ 1u);
#endif
        return;
    }
#endif
    for (uint32_t r = r0; r < r1; r++) *out++ = row_rs(w, r, xq, xs, dot_q8, dot_q4o);
}

static void rows_tuned(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, const float *xs, float *out) {
    if (w->rowscale) {
        rows_rs(w, r0, r1, xq, xs, out);
        return;
    }
    const uint32_t ng = whole_groups(w, xq);
    for (uint32_t r = r0; r < r1; r++)
        *out++ = ng ? ROW_WHOLE(w->data + (size_t)r * w->stride, xq, xs, ng, w->group, w->fmt == FLM_Q8)
                    : row_with(w, r, xq, xs, dot_q8, dot_q4, FLM_GROUP_TERM);
}
#else
/* The integer dots of a block of a row's groups first (vectorised), then their terms folded in the
 * reference's order: the float work per group stays group_term's, one add after another. */
#define ISUM_BLOCK 32u   /* groups per block: the dots' array on the stack */

#ifdef FLM_VECTOR
/* A row of ng whole groups of g codes with f32 scales (blocks of step bytes: the scale, the codes). */
static inline __attribute__((always_inline)) float row_f32(const uint8_t *row, size_t step, const flm_act *x,
                                                           const float *xs, uint32_t g, uint32_t ng, int q8) {
    int32_t isum[ISUM_BLOCK];
    float acc = 0.0f;
    for (uint32_t k = 0, nb; k < ng; k += nb) {
        nb = ng - k < ISUM_BLOCK ? ng - k : ISUM_BLOCK;
        isums(row + k * step + 4u, step, x + (size_t)k * g, g, nb, q8, isum);
        uint32_t j = 0;
        if (k == 0) acc = group_term(isum[j++], rdf(row), xs[0]);   /* the fold starts with the first term */
        for (; j < nb; j++) acc = acc + group_term(isum[j], rdf(row + (k + j) * step), xs[k + j]);
    }
    return acc;
}

/* Rows [r0, r1) of a tensor of ng whole groups of a constant size G with f32 scales, into out[0..):
 * each row's dots and fold, compiled for this core's vectors. */
typedef void (*rows_fn)(const uint8_t *data, size_t stride, uint32_t r0, uint32_t r1, const flm_act *xq,
                        const float *xs, uint32_t ng, float *out);
#define ROWS_F32(fmt, q8, G)                                                                                     \
    static FLM_CLONES void rows_##fmt##_##G(const uint8_t *data, size_t stride, uint32_t r0, uint32_t r1,          \
                                            const flm_act *xq, const float *xs, uint32_t ng, float *out) {          \
        for (uint32_t r = r0; r < r1; r++)                                                                       \
            *out++ = row_f32(data + (size_t)r * stride, 4u + ((q8) ? G##u : G##u / 2u), xq, xs, G##u, ng, q8);  \
    }
EACH_SHAPE(ROWS_F32)
#undef ROWS_F32

/* A row-scaled row of ng whole groups of g codes: the row scale, the multipliers (padded to 4), the
 * groups' codes (steps of step bytes, q4 offset by 8); the integer sum, then the one scaling. */
static inline __attribute__((always_inline)) float row_rs_whole(const uint8_t *row, const flm_act *x, const float *xs,
                                                                uint32_t g, uint32_t ng, int kind) {
    const uint8_t *k = row + 4, *codes = k + ((ng + 3u) & ~3u);
    const size_t step = kind == 1 ? g : g / 2u;   /* g a multiple of 8: no padding */
    int32_t isum[ISUM_BLOCK];
    int64_t acc = 0;
    for (uint32_t b = 0, nb; b < ng; b += nb) {
        nb = ng - b < ISUM_BLOCK ? ng - b : ISUM_BLOCK;
        isums(codes + b * step, step, x + (size_t)b * g, g, nb, kind, isum);
        for (uint32_t j = 0; j < nb; j++) acc += (int32_t)k[b + j] * isum[j];
    }
    return i64_to_f32(acc) * (rdf(row) * xs[0]);
}

/* The row-scaled shapes with their own instantiations: (format, kind, group size). */
#define EACH_RS_SHAPE(X) X(q8, 1, 32) X(q8, 1, 64) X(q8, 1, 128) X(q4, KIND_Q4O, 32) X(q4, KIND_Q4O, 64) X(q4, KIND_Q4O, 128)
#define ROWS_RS(fmt, kind, G)                                                                                     \
    static FLM_CLONES void rows_rs_##fmt##_##G(const uint8_t *data, size_t stride, uint32_t r0, uint32_t r1,        \
                                               const flm_act *xq, const float *xs, uint32_t ng, float *out) {       \
        for (uint32_t r = r0; r < r1; r++) *out++ = row_rs_whole(data + (size_t)r * stride, xq, xs, G##u, ng, kind); \
    }
EACH_RS_SHAPE(ROWS_RS)
#undef ROWS_RS

static inline rows_fn rows_for(const flm_tensor *w) {
    if (w->scale16 || w->cols % w->group) return 0;
    if (w->rowscale) {
#define PICK(f, kind, G) if (w->group == G##u && (w->fmt == FLM_Q8) == (kind == 1)) return rows_rs_##f##_##G;
        EACH_RS_SHAPE(PICK)
#undef PICK
        return 0;
    }
#define PICK(f, is_q8, G) if (w->group == G##u && (w->fmt == FLM_Q8) == is_q8) return rows_##f##_##G;
    EACH_SHAPE(PICK)
#undef PICK
    return 0;
}
#endif

/* Any shape: ng whole groups of g codes (group k's codes at first + k * step in a row) and a last
 * group of tail elements (0: none), with f32 or fp16 scales; fixed per matvec. */
typedef struct { uint32_t g, ng, tail, q8, s16; size_t first, step; } row_plan;

static row_plan plan_of(const flm_tensor *w) {
    const uint32_t g = w->group, ng = w->cols / g, tail = w->cols - ng * g, q8 = w->fmt == FLM_Q8;
    const uint32_t code = ((q8 ? g : (g + 1u) / 2u) + 3u) & ~3u;   /* a group's codes, padded to 4 */
    row_plan pl = {g, ng, tail, q8, w->scale16, 4u, 4u + code};
    if (w->scale16) {
        pl.first = (2u * (ng + (tail != 0u)) + 3u) & ~3u;
        pl.step = code;
    }
    return pl;
}

static float scale_of(const row_plan *pl, const uint8_t *row, uint32_t k) {
    return pl->s16 ? rdh(row + 2u * k) : rdf(row + k * pl->step);
}

static float row_any(const flm_tensor *w, uint32_t r, const row_plan *pl, const flm_act *x, const float *xs) {
    const uint8_t *row = w->data + (size_t)r * w->stride, *codes = row + pl->first;
    int32_t isum[ISUM_BLOCK];
    float acc = 0.0f;
    uint32_t k = 0;
    for (uint32_t nb; k < pl->ng; k += nb) {
        nb = pl->ng - k < ISUM_BLOCK ? pl->ng - k : ISUM_BLOCK;
        (pl->q8 ? flm_isums_q8 : flm_isums_q4)(codes + k * pl->step, pl->step, x + (size_t)k * pl->g, pl->g, nb, isum);
        for (uint32_t j = 0; j < nb; j++) {
            const float t = group_term(isum[j], scale_of(pl, row, k + j), xs[k + j]);
            acc = k + j == 0 ? t : acc + t;
        }
    }
    if (pl->tail) {
        const uint8_t *c = codes + k * pl->step;
        const flm_act *xt = x + (size_t)k * pl->g;
        const float t = group_term(pl->q8 ? dot_q8((const int8_t *)c, xt, pl->tail) : dot_q4(c, xt, pl->tail),
                                   scale_of(pl, row, k), xs[k]);
        acc = k == 0 ? t : acc + t;
    }
    return acc;
}

static __attribute__((noinline)) void rows_any(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq,
                                               const float *xs, float *out) {
    if (w->rowscale) {   /* a shape without its own instantiation: the plain row */
        for (uint32_t r = r0; r < r1; r++) *out++ = row_rs(w, r, xq, xs, dot_q8, dot_q4o);
        return;
    }
    const row_plan pl = plan_of(w);
    for (uint32_t r = r0; r < r1; r++) *out++ = row_any(w, r, &pl, xq, xs);
}

/* (the shape tests inline: a single row's call, the pruned head's, costs little more than the row) */
static inline __attribute__((always_inline)) void rows_tuned(const flm_tensor *w, uint32_t r0, uint32_t r1,
                                                             const flm_act *xq, const float *xs, float *out) {
#ifdef FLM_VECTOR
    const rows_fn fast = rows_for(w);
    if (fast) {
        fast(w->data, w->stride, r0, r1, xq, xs, w->cols / w->group, out);
        return;
    }
#endif
    rows_any(w, r0, r1, xq, xs, out);
}
#endif

float flm_matvec_row(const flm_tensor *w, uint32_t r, const flm_act *xq, const float *xs) {
    float v;
    rows_tuned(w, r, r + 1u, xq, xs, &v);
    return v;
}

void flm_matvec_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, const float *xs, float *out) {
    rows_tuned(w, r0, r1, xq, xs, out + r0);
}

void flm_matvec(const flm_tensor *w, const flm_act *xq, const float *xs, float *out) {
    flm_matvec_rows(w, 0, w->rows, xq, xs, out);
}

void flm_matmul_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_batch *b, uint8_t *row_buf,
                     size_t buf_bytes) {
    if (b->n == 1u) {
        flm_matvec_rows(w, r0, r1, b->xq, b->xs, b->out);
        return;
    }
    /* the copy is the only read of the rows' bytes in their tier (flash through an XIP or PSRAM
     * cache, or SRAM): the engine's byte counts and the emulator's count of the core's loads stay
     * equal, and no cache has to keep a row for the n tokens. Blocks of rows, not one: a kernel
     * call costs its set-up per block, and the M0+'s row-scaled kernel takes rows two at a time. */
    const uint32_t per = (uint32_t)(buf_bytes / w->stride);
    flm_tensor rows = *w;
    rows.data = row_buf;
    for (uint32_t r = r0, k; r < r1; r += k) {
        k = r1 - r < per ? r1 - r : per;
        memcpy(row_buf, w->data + (size_t)r * w->stride, (size_t)k * w->stride);
        for (uint32_t t = 0; t < b->n; t++)
            rows_tuned(&rows, 0, k, b->xq + (size_t)t * b->xq_stride, b->xs + (size_t)t * b->xs_stride,
                       b->out + (size_t)t * b->out_stride + r);
    }
}

/* The default: every row on the calling core, the whole row buffer its own. */
__attribute__((weak)) void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
    flm_matmul_rows(w, 0, w->rows, b, row_buf, row_buf_bytes);
}

/* ---- boot self-check ---------------------------------------------------------------------- */

/* Built-in tensors of 3 rows and 3 groups of g, as q8 and q4 with f32, fp16 and row scales, each
 * with 3g columns (whole groups) and 3g - 3 (a short last group): g = 24 (the Cortex-M0+ whole-row
 * loops' odd step and a whole turn of two, softfloat_m0.s), 23 (odd groups: q4 halves a byte), 32
 * (the Cortex-M0+ row-scaled kernels: a pair of rows and a single one, q4's lanes), and on cores
 * with SIMD the group sizes of the vectorised rows (64, 128); pseudo-random codes, activations with
 * -127 and 127 among them, multipliers up to 255. Every row alone (flm_matvec_row) and all three at
 * once (flm_matvec_rows) against the scalar kernels, bit for bit. Then the int8 attention's loops
 * and (cores without vectors) the activation codes of a HAL. */
#define SC_ROWS 3u
#define SC_NG 3u
#ifdef FLM_VECTOR
static const uint32_t sc_groups[] = {24u, 23u, 32u, 64u, 128u};
#define SC_GMAX 128u
#else
static const uint32_t sc_groups[] = {24u, 23u, 32u};
#define SC_GMAX 32u
#endif

static uint32_t sc_mix(uint32_t h) {
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    return h;
}

/* The tensor of group size g, format fmt, scales kind (0 f32, 1 fp16, 2 row) and cols columns, filled
 * into buf: scales 1.5 * 2^-k (f32 or fp16), or a row scale 2^-7 with the first multiplier 255. */
static flm_tensor sc_tensor(uint8_t *buf, uint32_t g, uint32_t fmt, uint32_t kind, uint32_t cols) {
    const uint32_t code = ((fmt == FLM_Q8 ? g : (g + 1u) / 2u) + 3u) & ~3u;   /* a whole group's, padded */
    const uint32_t s16 = kind == 1u, rs = kind == 2u;
    const uint32_t stride = rs ? 8u + SC_NG * code : s16 ? ((2u * SC_NG + 3u) & ~3u) + SC_NG * code : SC_NG * (4u + code);
    for (uint32_t i = 0; i < SC_ROWS * stride; i++) buf[i] = (uint8_t)sc_mix(i + 977u * fmt + 131u * g + cols);
    for (uint32_t r = 0; r < SC_ROWS; r++) {
        uint8_t *p = buf + r * stride;
        if (rs) { p[0] = p[1] = p[2] = 0; p[3] = 0x3cu; p[4] = 255u; continue; }
        for (uint32_t k = 0; k < SC_NG; k++) {
            if (s16) { p[2u * k] = 0; p[2u * k + 1u] = (uint8_t)(0x3eu - 4u * k); }
            else { uint8_t *q = p + k * (4u + code); q[0] = q[1] = 0; q[2] = 0xc0u; q[3] = (uint8_t)(0x3fu - k); }
        }
    }
    flm_tensor w = {buf, fmt, SC_ROWS, cols, g, stride, FLM_TIER_SRAM, SC_ROWS * stride, (uint8_t)s16, (uint8_t)rs};
    return w;
}

static int sc_rows_agree(const flm_tensor *w, const flm_act *xq, const float *xs) {
    float all[SC_ROWS];
    flm_matvec_rows(w, 0, SC_ROWS, xq, xs, all);
    for (uint32_t r = 0; r < SC_ROWS; r++) {
        const float one = flm_matvec_row(w, r, xq, xs);
        const float ref = w->rowscale ? row_rs(w, r, xq, xs, dot_q8_scalar, dot_q4o_scalar)
                                      : row_with(w, r, xq, xs, dot_q8_scalar, dot_q4_scalar, group_term);
        if (memcmp(&one, &ref, 4) != 0 || memcmp(&all[r], &ref, 4) != 0) return 0;
    }
    return 1;
}

/* The int8 attention's loops on rows of codes a and b: 32 codes (the tuned words) and 30 (a tail). */
static int sc_attention_agree(const int8_t *a, const int8_t *b, const flm_act *x) {
    for (uint32_t n = 30u; n <= 32u; n += 2u) {
        int32_t fast[2], ref[2], acc[32], acc_ref[32];
        flm_dot2_q8(a, b, x, n, fast);
        dot2_scalar(a, b, x, n, ref);
        for (uint32_t i = 0; i < n; i++) acc[i] = acc_ref[i] = (int32_t)sc_mix(i) >> 8;
        flm_axpy_q8(acc, a, -70001, n);
        axpy_scalar(acc_ref, a, -70001, n);
        if (memcmp(fast, ref, sizeof fast) || memcmp(acc, acc_ref, n * 4u)) return 0;
    }
    return 1;
}

#ifndef FLM_VECTOR
/* A HAL's activation codes (FLM_QUANT_CODES) against act_codes: a group of pseudo-random floats
 * scaled to +-127 (the usual case) and the edges (0, -0, the halves around 0.5 and 127, 127.5,
 * subnormals, infinities, NaN). (On cores with vectors tests/test_kernels.py checks every float.) */
static int sc_codes_agree(void) {
    static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x3effffffu, 0xbf000000u, 0x3f000001u, 0x42fe0000u,
                                    0xc2fd0000u, 0x42ff0000u, 0x00000001u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                    0x3fc00000u, 0x40200000u, 0x42fcffffu, 0x7f7fffffu};
    float x[SC_NG * SC_GMAX];
    int8_t fast[SC_NG * SC_GMAX], ref[SC_NG * SC_GMAX];
    const uint32_t n = SC_NG * SC_GMAX, ne = sizeof edge / sizeof edge[0];
    for (uint32_t i = 0; i < n; i++) x[i] = flm_f32_from_bits((sc_mix(i) & 0x807fffffu) | 0x3c000000u);
    FLM_QUANT_CODES(x, n, 0x1.8p+12f, fast);
    act_codes(x, n, 0x1.8p+12f, ref);
    if (memcmp(fast, ref, n)) return 0;
    for (uint32_t i = 0; i < ne; i++) x[i] = flm_f32_from_bits(edge[i]);
    FLM_QUANT_CODES(x, ne, 1.0f, fast);
    act_codes(x, ne, 1.0f, ref);
    return !memcmp(fast, ref, ne);
}
#endif

int flm_kernels_self_check(void) {   /* (its buffers on the stack: no SRAM kept for a boot-time check) */
    uint8_t buf[SC_ROWS * SC_NG * (4u + SC_GMAX)] __attribute__((aligned(4)));
    flm_act xq[SC_NG * SC_GMAX] __attribute__((aligned(4)));
    static const float xs[SC_NG] = {0.25f, -0.0078125f, 3.0f};
#ifndef FLM_VECTOR
    if (!sc_codes_agree()) return -1;
#endif
    for (uint32_t i = 0; i < SC_NG * SC_GMAX; i++)
        xq[i] = (flm_act)(i < 4u ? (i & 1u ? 127 : -127) : (int32_t)(sc_mix(i) % 255u) - 127);
    for (uint32_t gi = 0; gi < sizeof sc_groups / sizeof sc_groups[0]; gi++) {
        const uint32_t g = sc_groups[gi];
        for (uint32_t cols = SC_NG * g - 3u; cols <= SC_NG * g; cols += 3u) {
            for (uint32_t fmt = FLM_Q8; fmt <= FLM_Q4; fmt++) {
                for (uint32_t kind = 0; kind < 3u; kind++) {
                    const flm_tensor w = sc_tensor(buf, g, fmt, kind, cols);
                    if (!sc_rows_agree(&w, xq, xs)) return -1;
                }
            }
        }
        if (!sc_attention_agree((const int8_t *)buf, (const int8_t *)buf + 32u, xq)) return -1;
    }
    return 0;
}

void flm_dequant_row(const flm_tensor *w, uint32_t r, float *out) {
    if (w->rowscale) {   /* float(code * k) * S */
        const uint32_t g = w->group, ng = (w->cols + g - 1u) / g;
        const uint8_t *p = w->data + (size_t)r * w->stride, *k = p + 4, *codes = p + 4 + ((ng + 3u) & ~3u);
        const float sc = rdf(p);
        for (uint32_t s = 0, gi = 0; s < w->cols; s += g, gi++) {
            const uint32_t len = w->cols - s < g ? w->cols - s : g;
            const int32_t kg = k[gi];
            if (w->fmt == FLM_Q8) {
                for (uint32_t i = 0; i < len; i++) out[s + i] = (float)(((const int8_t *)codes)[i] * kg) * sc;
            } else {   /* each code byte read once: two elements */
                for (uint32_t i = 0; i < len; i += 2) {
                    uint32_t b = codes[i >> 1];
                    out[s + i] = (float)(((int32_t)(b & 15u) - 8) * kg) * sc;
                    if (i + 1 < len) out[s + i + 1] = (float)(((int32_t)(b >> 4) - 8) * kg) * sc;
                }
            }
            codes += ((w->fmt == FLM_Q8 ? len : (len + 1u) / 2u) + 3u) & ~3u;
        }
        return;
    }
    row_reader rr = row_at(w, r);
    for (uint32_t s = 0; s < w->cols; s += w->group) {
        uint32_t len = w->cols - s < w->group ? w->cols - s : w->group;
        uint32_t nbytes = w->fmt == FLM_Q8 ? len : (len + 1u) / 2u;
        float sc = next_scale(&rr);
        const uint8_t *p = rr.codes;
        if (w->fmt == FLM_Q8) {
            for (uint32_t i = 0; i < len; i++) out[s + i] = (float)((const int8_t *)p)[i] * sc;
        } else {   /* each code byte read once: two elements */
            uint32_t i = 0;
            for (; i + 1 < len; i += 2) {
                uint32_t b = p[i >> 1];
                out[s + i] = (float)nib(b) * sc;
                out[s + i + 1] = (float)nib(b >> 4) * sc;
            }
            if (i < len) out[s + i] = (float)nib(p[i >> 1]) * sc;
        }
        rr.codes += (nbytes + 3u) & ~3u;
    }
}
