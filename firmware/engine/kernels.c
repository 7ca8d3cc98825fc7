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
/* The code of x * inv: clamped to +-127 before rounding (the same codes for every finite product);
 * NaN from a broken model becomes 0, inf +-127, instead of an undefined float-to-int conversion. */
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
#ifndef FLM_QUANT_CODES   /* a HAL's, bit for bit act_codes (hal_rp2040.h) */
#define FLM_QUANT_CODES act_codes
#endif

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
        FLM_QUANT_CODES(x + s, len, 127.0f / amax, xq + s);
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

/* Row-scaled q4 codes are stored offset by 8 (docs/formats.md section 1): nibble u is code u - 8. */
static int32_t dot_q4o_scalar(const uint8_t *w, const int8_t *x, uint32_t n) {
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
static int32_t dot_q4o_bytes(const uint8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint32_t b = w[i >> 1];
        s += ((int32_t)(b & 15u) - 8) * (int32_t)x[i] + ((int32_t)(b >> 4) - 8) * (int32_t)x[i + 1];
    }
    if (i < n) s += ((int32_t)(w[i >> 1] & 15u) - 8) * (int32_t)x[i];
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

uint32_t flm_act_group(const flm_tensor *w) { return w->rowscale ? w->cols : w->group; }

static void dot2_scalar(const int8_t *a, const int8_t *b, const int8_t *x, uint32_t n, int32_t out[2]) {
    out[0] = dot_q8_scalar(a, x, n);
    out[1] = dot_q8_scalar(b, x, n);
}

static void axpy_scalar(int32_t *acc, const int8_t *v, int32_t w, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) acc[i] += w * (int32_t)v[i];
}

void flm_dot2_q8(const int8_t *a, const int8_t *b, const int8_t *x, uint32_t n, int32_t out[2]) {
#ifdef FLM_DOT2_Q8   /* a HAL's (hal_rp2040.h), for whole steps of 8 */
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
static float i64_to_f32(int64_t v) {
    uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    uint32_t sh = 0;
    while (m >> sh >= (1u << 24)) sh++;            /* at most 17 steps below 2^41 */
    uint64_t q = m >> sh, rest = m - (q << sh), half = sh ? (uint64_t)1 << (sh - 1u) : 0u;
    if (sh && (rest > half || (rest == half && (q & 1u)))) q++;   /* q <= 2^24: exact below */
    float f = (float)(uint32_t)q * flm_f32_from_bits((127u + sh) << 23);   /* times 2^sh: exact */
    return v < 0 ? -f : f;
}

typedef int32_t (*dot8_fn)(const int8_t *, const int8_t *, uint32_t);
typedef int32_t (*dot4_fn)(const uint8_t *, const int8_t *, uint32_t);

/* Row-scaled: every group's integer dot and the multiplier-weighted sum first (int32 products,
 * docs/formats.md bounds them; an int64 sum), then the one scaling: float(acc) * (S_r * X). */
static inline __attribute__((always_inline)) float row_rs(const flm_tensor *w, uint32_t r, const int8_t *xq,
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

/* A group's term as the reference forms it: float(isum) * (wscale * xscale). */
static inline float group_term(int32_t isum, float sc, float xs) { return (float)isum * (sc * xs); }
#ifndef FLM_GROUP_TERM   /* a HAL may supply a faster one, bit for bit the same (hal_rp2040.h) */
#define FLM_GROUP_TERM group_term
#endif

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

/* The number of groups when the rows of w take the whole-row path, else 0. */
static uint32_t whole_groups(const flm_tensor *w, const int8_t *xq) {
    const uint32_t g = w->group;
    return !w->scale16 && !w->rowscale && w->n_groups * g == w->cols && g % 8u == 0u && !((uintptr_t)xq & 3u)
               ? w->n_groups : 0u;
}

static float row_tuned(const flm_tensor *w, uint32_t r, uint32_t ng, const int8_t *xq, const float *xs) {
    if (ng) return ROW_WHOLE(w->data + (size_t)r * w->stride, xq, xs, ng, w->group, w->fmt == FLM_Q8);
    return row_with(w, r, xq, xs, dot_q8, dot_q4, FLM_GROUP_TERM);
}

#ifdef FLM_RS_ROWS_Q8   /* a HAL's row-scaled rows, bit for bit row_rs (hal_rp2040.h) */
/* The q4 kernel's activations (softfloat_m0.s Q4L_WORD), on the stack: per sub-block of 32 columns
 * a start value, minus the share of the codes' offset 8, then per 8 columns (x_j << 16) + x_{j+4},
 * j = 0..3. Up to LANE_COLS columns: 2,176 bytes of the RP2040's 8 KB stack floor. */
#define LANE_COLS 1024u

/* Their shape: whole groups of a multiple of 8 columns (q4: of 32, at most LANE_COLS), word-aligned
 * activations, and (q8) rows whose sum fits an int32: |code| <= 128, |x| <= 127, k <= 255 make 518
 * columns (docs/formats.md). 0: another shape; else geom = n_groups | group << 16. */
static uint32_t rs_geom(const flm_tensor *w, const int8_t *xq) {
    const uint32_t g = w->group, q8 = w->fmt == FLM_Q8;
    const int ok = w->n_groups * g == w->cols && g % (q8 ? 8u : 32u) == 0u && w->cols <= (q8 ? 518u : LANE_COLS) &&
                   !((uintptr_t)xq & 3u);
    return ok ? w->n_groups | g << 16 : 0u;
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

/* Rows r0, r0 + 1, ... of a row-scaled tensor into out[0, n) (many: a matvec's, worth the q4 lanes;
 * not for one row of the pruned head). */
static void rows_rs(const flm_tensor *w, uint32_t r0, uint32_t n, const int8_t *xq, const float *xs, float *out,
                    int many) {
#ifdef FLM_RS_ROWS_Q8
    const uint32_t geom = rs_geom(w, xq);
    if (geom && (w->fmt == FLM_Q8 || many)) {
        flm_rs_job j = {w->data + (size_t)r0 * w->stride, w->stride, n, xq, geom, xs[0], out};
        if (w->fmt == FLM_Q8) FLM_RS_ROWS_Q8(&j);
        else rows_rs_lanes(&j, w->cols);
#ifdef FLM_FAULT_TUNED_KERNEL   /* (see TUNED) the HAL's q8 rows are off by one ulp */
        for (uint32_t i = 0; i < n && w->fmt == FLM_Q8; i++) out[i] = flm_f32_from_bits(flm_f32_bits(out[i]) ^ 1u);
#endif
        return;
    }
#else
    (void)many;
#endif
    for (uint32_t i = 0; i < n; i++) out[i] = row_rs(w, r0 + i, xq, xs, dot_q8, dot_q4o_bytes);
}

float flm_matvec_row(const flm_tensor *w, uint32_t r, const int8_t *xq, const float *xs) {
    if (w->rowscale) {
        float y;
        rows_rs(w, r, 1u, xq, xs, &y, 0);
        return y;
    }
    return row_tuned(w, r, whole_groups(w, xq), xq, xs);
}

void flm_matvec_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xs, float *out) {
    if (w->rowscale) {
        rows_rs(w, r0, r1 - r0, xq, xs, out + r0, 1);
        return;
    }
    const uint32_t ng = whole_groups(w, xq);
    for (uint32_t r = r0; r < r1; r++) out[r] = row_tuned(w, r, ng, xq, xs);
}

void flm_matvec(const flm_tensor *w, const int8_t *xq, const float *xs, float *out) {
    flm_matvec_rows(w, 0, w->rows, xq, xs, out);
}

/* The default: every row on the calling core. */
__attribute__((weak)) void hal_matvec(const flm_tensor *w, const int8_t *xq, const float *xs, float *out) {
    flm_matvec(w, xq, xs, out);
}

/* ---- boot self-check ---------------------------------------------------------------------- */

/* The activation codes of flm_quantize_act; the int8 attention's loops; built-in tensors of 3 rows
 * with pseudo-random codes and activations (-127 and 127 among them):
 * in groups of 24 (the whole-row loops' odd step and a whole turn of two, softfloat_m0.s) as q8 and
 * q4 with f32, fp16 and row scales, 72 columns (whole groups: the whole-row paths) and 69 (a short
 * last group, odd for q4: the tuned loops' scalar tails); and row-scaled in groups of 32, 96 and 93
 * columns (the row-scaled kernels: a pair of rows and a single one, q4's lanes), multipliers up to
 * 255. Each row as flm_matvec_rows and flm_matvec_row give it, against the scalar dots'. */
#define SC_ROWS 3u
#define SC_NG 3u
#define SC_COLS 96u

static uint32_t sc_mix(uint32_t h) {
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    return h;
}

static int sc_rows_agree(const flm_tensor *w, const int8_t *xq, const float *xs) {
    float rows[SC_ROWS];
    flm_matvec_rows(w, 0, SC_ROWS, xq, xs, rows);
    for (uint32_t r = 0; r < SC_ROWS; r++) {
        const float one = flm_matvec_row(w, r, xq, xs);
        const float ref = w->rowscale ? row_rs(w, r, xq, xs, dot_q8_scalar, dot_q4o_scalar)
                                      : row_with(w, r, xq, xs, dot_q8_scalar, dot_q4_scalar, group_term);
        if (memcmp(&one, &ref, 4) != 0 || memcmp(&rows[r], &ref, 4) != 0) return 0;
    }
    return 1;
}

/* The activation codes: a group of pseudo-random floats scaled to +-127 (the usual case) and the
 * edges (0, -0, the halves around 0.5 and 127, 127.5, subnormals, infinities, NaN), tuned against act_codes. */
static int sc_codes_agree(void) {
    static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x3effffffu, 0xbf000000u, 0x3f000001u, 0x42fe0000u,
                                    0xc2fd0000u, 0x42ff0000u, 0x00000001u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                    0x3fc00000u, 0x40200000u, 0x42fcffffu, 0x7f7fffffu};
    float x[SC_COLS];
    int8_t fast[SC_COLS], ref[SC_COLS];
    for (uint32_t i = 0; i < SC_COLS; i++) x[i] = flm_f32_from_bits((sc_mix(i) & 0x807fffffu) | 0x3c000000u);
    FLM_QUANT_CODES(x, SC_COLS, 0x1.8p+12f, fast);
    act_codes(x, SC_COLS, 0x1.8p+12f, ref);
    if (memcmp(fast, ref, SC_COLS)) return 0;
    const uint32_t ne = sizeof edge / sizeof edge[0];
    for (uint32_t i = 0; i < ne; i++) x[i] = flm_f32_from_bits(edge[i]);
    FLM_QUANT_CODES(x, ne, 1.0f, fast);
    act_codes(x, ne, 1.0f, ref);
    return !memcmp(fast, ref, ne);
}

/* The int8 attention's loops on rows of codes a and b: 32 codes (the tuned words) and 30 (a tail). */
static int sc_attention_agree(const int8_t *a, const int8_t *b, const int8_t *x) {
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

int flm_kernels_self_check(void) {
    static uint8_t buf[SC_ROWS * (8u + SC_COLS + 4u * SC_NG)] __attribute__((aligned(4)));
    static int8_t xq[SC_COLS] __attribute__((aligned(4)));
    static const float xs[SC_NG] = {0.25f, -0.0078125f, 3.0f};
    if (!sc_codes_agree()) return -1;
    for (uint32_t i = 0; i < SC_COLS; i++) xq[i] = (int8_t)(i < 4u ? (i & 1u ? 127 : -127) : (int32_t)(sc_mix(i) % 255u) - 127);
    for (uint32_t g = 24u; g <= 32u; g += 8u) {
        for (uint32_t cols = SC_NG * g - 3u; cols <= SC_NG * g; cols += 3u) {
            for (uint32_t fmt = FLM_Q8; fmt <= FLM_Q4; fmt++) {
                for (uint32_t kind = g == 32u ? 2u : 0u; kind < 3u; kind++) {   /* f32, fp16, row scales */
                    const uint32_t s16 = kind == 1u, rs = kind == 2u, code = fmt == FLM_Q8 ? g : g / 2u;
                    const uint32_t stride = rs ? 8u + SC_NG * code : s16 ? ((2u * SC_NG + 3u) & ~3u) + SC_NG * code
                                                                         : SC_NG * (4u + code);
                    for (uint32_t i = 0; i < SC_ROWS * stride; i++) buf[i] = (uint8_t)sc_mix(i + 977u * fmt + cols);
                    for (uint32_t r = 0; r < SC_ROWS; r++) {   /* scales: 1.5 * 2^-k, f32 or fp16; a row's 2^-7 */
                        uint8_t *p = buf + r * stride;
                        if (rs) { p[0] = p[1] = p[2] = 0; p[3] = 0x3cu; p[4] = 255u; continue; }
                        for (uint32_t k = 0; k < SC_NG; k++) {
                            if (s16) { p[2u * k] = 0; p[2u * k + 1u] = (uint8_t)(0x3eu - 4u * k); }
                            else { uint8_t *q = p + k * (4u + code); q[0] = q[1] = 0; q[2] = 0xc0u; q[3] = (uint8_t)(0x3fu - k); }
                        }
                    }
                    flm_tensor w = {buf, fmt, SC_ROWS, cols, g, stride, FLM_TIER_SRAM, SC_ROWS * stride, s16, rs, SC_NG};
                    if (!sc_rows_agree(&w, xq, xs)) return -1;
                    if (!sc_attention_agree((const int8_t *)buf, (const int8_t *)buf + stride, xq)) return -1;
                }
            }
        }
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
