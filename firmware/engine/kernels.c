#include "kernels.h"
#include "flm_math.h"
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

/* The comparisons are on the floats' bits (the same outcomes as the float comparisons, without a
 * soft-float call each on cores without an FPU): |x| as x without its sign bit orders as an
 * unsigned integer, and NaN (above 0x7f800000 so) never becomes the maximum. */
#define BITS_127 0x42fe0000u   /* 127.0f */
/* (int32_t)(v + 0.5f) for the float v of bits mag in [+0, 127] (the reference's round_half_away;
 * -v with -0.5f gives its negation), on the bits: no soft-float add and conversion per code on
 * cores without an FPU. From 0.5 up, v + 0.5 is exact or rounds without crossing an integer, so
 * it is floor(v + 0.5) on the 24-bit significand; below 0.5 only the float just below it makes
 * fl(v + 0.5) = 1.0. tests/test_kernels.py checks every such float against the float form. */
static int32_t round_half_away(uint32_t mag) {
    if (mag < 0x3f000000u) return mag == 0x3effffffu;
    uint32_t sig = mag << 8 | 0x80000000u;   /* the significand, its leading one at bit 31 */
    /* its bits from the halves' place up (v >= 0.5: exponent 126..133, a shift of 31..24), plus a half */
    return (int32_t)(((sig >> (157u - (mag >> 23))) + 1u) >> 1);
}

void flm_quantize_act(const float *x, uint32_t n, uint32_t g, int8_t *xq, float *xs) {
    for (uint32_t s = 0, gi = 0; s < n; s += g, gi++) {
        uint32_t len = n - s < g ? n - s : g;
        uint32_t amax_bits = 0;
        for (uint32_t i = 0; i < len; i++) {
            uint32_t a = flm_f32_bits(x[s + i]) & 0x7fffffffu;
            if (a > amax_bits && a <= 0x7f800000u) amax_bits = a;
        }
        if (amax_bits == 0u) {
            xs[gi] = 0.0f;
            memset(xq + s, 0, len);
            continue;
        }
        const float amax = flm_f32_from_bits(amax_bits);
        xs[gi] = amax / 127.0f;
        float inv = 127.0f / amax;
        for (uint32_t i = 0; i < len; i++) {
            float v = x[s + i] * inv;
            uint32_t b = flm_f32_bits(v), mag = b & 0x7fffffffu;
            /* clamp to +-127 before rounding (same codes for every finite v); NaN from a broken
             * model becomes 0, inf +-127, instead of an undefined float-to-int conversion */
            int32_t q;
            if (mag > 0x7f800000u) q = 0;
            else if (mag > BITS_127) q = (b >> 31) ? -127 : 127;
            else q = (b >> 31) ? -round_half_away(mag) : round_half_away(mag);
            xq[s + i] = (int8_t)q;
        }
    }
}

/* ---- group dot products -------------------------------------------------------------------
 * The scalar kernels define the sums; the tuned ones must agree with them exactly (integer sums are
 * exact in any order), which flm_kernels_self_check verifies at boot. */

static int32_t dot_q8_scalar(const int8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

static int32_t dot_q4_scalar(const uint8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += nib((uint32_t)w[i >> 1] >> (4u * (i & 1u))) * (int32_t)x[i];
    return s;
}

/* FLM_FAULT_TUNED_KERNEL (tests/test_kernels.py only): a build whose tuned q8 kernel is off by one,
 * which the boot self-check must catch. */
#ifdef FLM_FAULT_TUNED_KERNEL
#define TUNED(s) ((s) ^ 1)
#else
#define TUNED(s) (s)
#endif

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

#if defined(__ARM_ARCH_6M__)
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
/* Portable C: q8 unrolled by four (a compiler for a core with SIMD may vectorize it). */
static inline int32_t dot_q8(const int8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4)
        s += (int32_t)w[i] * x[i] + (int32_t)w[i + 1] * x[i + 1] + (int32_t)w[i + 2] * x[i + 2] +
             (int32_t)w[i + 3] * x[i + 3];
    return TUNED(s + dot_q8_scalar(w + i, x + i, n - i));
}

static inline int32_t dot_q4(const uint8_t *w, const int8_t *x, uint32_t n) { return dot_q4_bytes(w, x, n); }
#endif

int32_t flm_dot_q8(const int8_t *w, const int8_t *x, uint32_t n) { return dot_q8(w, x, n); }
int32_t flm_dot_q4(const uint8_t *w, const int8_t *x, uint32_t n) { return dot_q4(w, x, n); }

/* A group's term as the reference forms it: float(isum) * (wscale * xscale). */
static inline float group_term(int32_t isum, float sc, float xs) { return (float)isum * (sc * xs); }
#ifndef FLM_GROUP_TERM   /* a HAL may supply a faster one, bit for bit the same (hal_rp2040.h) */
#define FLM_GROUP_TERM group_term
#endif

typedef int32_t (*dot8_fn)(const int8_t *, const int8_t *, uint32_t);
typedef int32_t (*dot4_fn)(const uint8_t *, const int8_t *, uint32_t);
typedef float (*term_fn)(int32_t, float, float);

/* One output row: per group float(isum) * (wscale * xscale), folded left to right. */
static inline __attribute__((always_inline)) float row_with(const flm_tensor *w, uint32_t r, const int8_t *xq,
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
static uint32_t whole_groups(const flm_tensor *w, const int8_t *xq) {
    const uint32_t g = w->group;
    return !w->scale16 && w->cols % g == 0u && g % 8u == 0u && !((uintptr_t)xq & 3u) ? w->cols / g : 0u;
}

static float row_tuned(const flm_tensor *w, uint32_t r, uint32_t ng, const int8_t *xq, const float *xs) {
    if (ng) return ROW_WHOLE(w->data + (size_t)r * w->stride, xq, xs, ng, w->group, w->fmt == FLM_Q8);
    return row_with(w, r, xq, xs, dot_q8, dot_q4, FLM_GROUP_TERM);
}

float flm_matvec_row(const flm_tensor *w, uint32_t r, const int8_t *xq, const float *xs) {
    return row_tuned(w, r, whole_groups(w, xq), xq, xs);
}

void flm_matvec_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xs, float *out) {
    const uint32_t ng = whole_groups(w, xq);
    for (uint32_t r = r0; r < r1; r++) out[r] = row_tuned(w, r, ng, xq, xs);
}

void flm_matvec(const flm_tensor *w, const int8_t *xq, const float *xs, float *out) {
    flm_matvec_rows(w, 0, w->rows, xq, xs, out);
}

void flm_matmul_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_batch *b, uint8_t *row_buf) {
    if (b->n == 1u) {
        flm_matvec_rows(w, r0, r1, b->xq, b->xs, b->out);
        return;
    }
    /* the copy is the only read of the row's bytes in their tier (flash through an XIP or PSRAM
     * cache, or SRAM): the engine's byte counts and the emulator's count of the core's loads stay
     * equal, and no cache has to keep a row for the n tokens */
    flm_tensor row = *w;
    row.data = row_buf;
    const uint32_t ng = whole_groups(w, b->xq);
    for (uint32_t r = r0; r < r1; r++) {
        memcpy(row_buf, w->data + (size_t)r * w->stride, w->stride);
        for (uint32_t t = 0; t < b->n; t++)
            b->out[(size_t)t * b->out_stride + r] = row_tuned(&row, 0, ng, b->xq + (size_t)t * b->xq_stride,
                                                              b->xs + (size_t)t * b->xs_stride);
    }
}

/* The default: every row on the calling core. */
__attribute__((weak)) void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *const row_buf[2]) {
    flm_matmul_rows(w, 0, w->rows, b, row_buf[0]);
}

/* ---- boot self-check ---------------------------------------------------------------------- */

/* A built-in tensor of 3 rows in groups of 24 (the whole-row loops' odd step and a whole turn of
 * two, softfloat_m0.s), as q8 and q4 with f32 and fp16 scales: 72 columns
 * (whole groups: row_whole's path with f32 scales) and 69 (a short last group, odd for q4: the
 * tuned loops' scalar tails); pseudo-random codes, activations with -127 and 127 among them. */
#define SC_ROWS 3u
#define SC_G 24u
#define SC_NG 3u

static uint32_t sc_mix(uint32_t h) {
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    return h;
}

int flm_kernels_self_check(void) {
    static uint8_t buf[SC_ROWS * SC_NG * (4u + SC_G)] __attribute__((aligned(4)));
    static int8_t xq[SC_NG * SC_G] __attribute__((aligned(4)));
    static const float xs[SC_NG] = {0.25f, -0.0078125f, 3.0f};
    for (uint32_t i = 0; i < SC_NG * SC_G; i++) xq[i] = (int8_t)(i < 4u ? (i & 1u ? 127 : -127) : (int32_t)(sc_mix(i) % 255u) - 127);
    for (uint32_t cols = SC_NG * SC_G - 3u; cols <= SC_NG * SC_G; cols += 3u) {
        for (uint32_t fmt = FLM_Q8; fmt <= FLM_Q4; fmt++) {
            for (uint32_t s16 = 0; s16 < 2u; s16++) {
                uint32_t code = fmt == FLM_Q8 ? SC_G : SC_G / 2u;
                uint32_t stride = s16 ? ((2u * SC_NG + 3u) & ~3u) + SC_NG * code : SC_NG * (4u + code);
                for (uint32_t i = 0; i < SC_ROWS * stride; i++) buf[i] = (uint8_t)sc_mix(i + 977u * fmt + cols);
                for (uint32_t r = 0; r < SC_ROWS; r++) {   /* scales: 1.5 * 2^-k, f32 or fp16 */
                    uint8_t *p = buf + r * stride;
                    for (uint32_t k = 0; k < SC_NG; k++) {
                        if (s16) { p[2u * k] = 0; p[2u * k + 1u] = (uint8_t)(0x3eu - 4u * k); }
                        else { uint8_t *q = p + k * (4u + code); q[0] = q[1] = 0; q[2] = 0xc0u; q[3] = (uint8_t)(0x3fu - k); }
                    }
                }
                flm_tensor w = {buf, fmt, SC_ROWS, cols, SC_G, stride, FLM_TIER_SRAM, SC_ROWS * stride, s16};
                for (uint32_t r = 0; r < SC_ROWS; r++) {
                    float fast = flm_matvec_row(&w, r, xq, xs);
                    float ref = row_with(&w, r, xq, xs, dot_q8_scalar, dot_q4_scalar, group_term);
                    if (memcmp(&fast, &ref, 4) != 0) return -1;
                }
            }
        }
    }
    return 0;
}

void flm_dequant_row(const flm_tensor *w, uint32_t r, float *out) {
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
