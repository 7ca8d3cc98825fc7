/* The vectorised kernels of cores with SIMD (FLM_VECTOR, kernels.h: x86 SSE2, Arm NEON; every host
 * build): portable C in the shapes gcc and clang vectorise at -O2, and on x86-64 compiled twice, for
 * the baseline and for AVX2 (FLM_CLONES). They define kernel_hooks.h's FLM_AMAX_BITS,
 * FLM_QUANT_CODES, FLM_ACT_CODES_Q, FLM_DOT_Q4X, FLM_ISUMS_FOR and FLM_ROWS_FOR; the q8 dot and
 * the k12 attention's dots are the reference's own loops (kernels_ref.h dot_q8_scalar,
 * dot_q12_scalar), which vectorise as they are. No loop here assumes 8-bit activations: every
 * product and sum is written in int32 (int64 for a row-scaled row's sum), and the vectorisers keep
 * that integer whatever lanes they pick (PMADDWD's and SMLAL's int16 x int16 products are int32, a
 * pair's sum |2 * 127 * 2047| far inside it).
 *
 * Included by kernel_hooks.h, in kernels.c only (it instantiates the row kernels). */
#ifndef FLM_KERNELS_VEC_H
#define FLM_KERNELS_VEC_H
#include <math.h>

/* ---- the activations' codes ---------------------------------------------------------------
 * The reference's own rounding, in blocks of 8 elements, loops of a constant length that
 * compilers vectorise at -O2 (a signed maximum per lane over magnitudes below 2^31; clamps,
 * conversions and stores per lane), then the rest one by one. */
#define QBLOCK 8u
static inline __attribute__((always_inline)) int32_t mag_or_0(float v) {
    const int32_t a = (int32_t)(flm_f32_bits(v) & 0x7fffffffu);
    return a <= 0x7f800000 ? a : 0;   /* NaN is never the maximum */
}

static inline __attribute__((always_inline)) uint32_t amax_bits_vec(const float *restrict x, uint32_t len) {
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
#define FLM_AMAX_BITS amax_bits_vec

/* clamp to +-qmax before rounding (qbits: the bits of (float)qmax, 127 or 2047; the same codes for
 * every finite v); NaN from a broken model becomes 0, inf +-qmax, instead of an undefined
 * float-to-int conversion. The clamp is masks on the bits (gcc vectorises no select of a value a
 * float operation then takes under -ftrapping-math), then the reference's rounding,
 * (int32_t)(v +- 0.5f). */
static inline __attribute__((always_inline)) int32_t code_of(float v, uint32_t qbits) {
    const uint32_t b = flm_f32_bits(v), signq = (b & 0x80000000u) | qbits;   /* +-qmax */
    const int32_t mag = (int32_t)(b & 0x7fffffffu);
    const uint32_t big = 0u - (uint32_t)(mag > (int32_t)qbits), nan = 0u - (uint32_t)(mag > 0x7f800000);
    v = flm_f32_from_bits(((b & ~big) | (signq & big)) & ~nan);
    return (int32_t)(v + (isless(v, 0.0f) ? -0.5f : 0.5f));
}
/* The codes of x[len] * inv clamped to +-qmax into q, elements of type T (a statement: restrict
 * locals, which the vectoriser needs and an inlined function's parameters would not give it). */
#define VEC_CODES(T, x, len, inv, qmax, q)                                                          \
    {                                                                                              \
        T *restrict c = (T *)(q);                                                                  \
        const float *restrict v = (x);                                                             \
        const uint32_t qb = flm_f32_bits((float)(qmax));                                           \
        uint32_t i = 0;                                                                            \
        for (; i + QBLOCK <= (len); i += QBLOCK, c += QBLOCK, v += QBLOCK)                         \
            for (uint32_t k = 0; k < QBLOCK; k++) c[k] = (T)code_of(v[k] * (inv), qb);             \
        for (; i < (len); i++) *c++ = (T)code_of(*v++ * (inv), qb);                                \
    }
#define FLM_QUANT_CODES(x, len, inv, q) VEC_CODES(int8_t, x, len, inv, 127, q)
#define FLM_ACT_CODES_Q(x, len, inv, qmax, q) VEC_CODES(flm_act, x, len, inv, qmax, q)

/* ---- q4 dots --------------------------------------------------------------------------------
 * Up to 128 codes at a time unpacked into flm_act in element order (low nibble first), then a dot
 * like q8's, whose 16-bit multiply-add takes codes and activations pairwise as they lie. */
#define Q4_CHUNK 128u
static inline __attribute__((always_inline)) int32_t dot_q4x_vec(const uint8_t *restrict w, const flm_act *restrict x,
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
#define FLM_DOT_Q4X dot_q4x_vec

/* ---- rows of the common shapes ------------------------------------------------------------ */

/* Where the toolchain clones functions resolved at load time (x86-64 ELF, GNU ifunc: gcc, clang >= 14),
 * the vectorised loops are compiled twice from this same C, for the x86-64 baseline (SSE2) and for
 * AVX2, and the loader picks what this CPU runs; the boot self-check checks the one picked.
 * FLM_NO_CLONES builds the baseline alone (tests/test_kernels.py checks both). */
#if defined(__x86_64__) && defined(__ELF__) && defined(__linux__) && defined(__has_attribute) && !defined(FLM_NO_CLONES)
#if __has_attribute(target_clones)
#define FLM_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef FLM_CLONES
#define FLM_CLONES
#endif

/* The shapes with their own instantiations, (format, q8, group size): loops of a constant length. */
#define EACH_SHAPE(X) X(q8, 1, 32) X(q8, 1, 64) X(q8, 1, 128) X(q4, 0, 16) X(q4, 0, 32) X(q4, 0, 64) X(q4, 0, 128)
#define ISUMS(fmt, q8, G)                                                                                         \
    static FLM_CLONES void isums_##fmt##_##G(const uint8_t *codes, size_t step, const flm_act *x, uint32_t ng,    \
                                             int32_t *isum) {                                                     \
        isums(codes, step, x, G##u, ng, q8, isum);                                                                \
    }
EACH_SHAPE(ISUMS)
#undef ISUMS

static isums_fn isums_for(uint32_t g, int q8) {
#define PICK(f, is_q8, G) if (g == G##u && q8 == is_q8) return isums_##f##_##G;
    EACH_SHAPE(PICK)
#undef PICK
    return 0;
}
#define FLM_ISUMS_FOR isums_for

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
#define ROWS_F32(fmt, q8, G)                                                                                     \
    static FLM_CLONES void rows_##fmt##_##G(const uint8_t *data, size_t stride, uint32_t r0, uint32_t r1,          \
                                            const flm_act *xq, const float *xs, uint32_t ng, float *out) {          \
        for (uint32_t r = r0; r < r1; r++)                                                                       \
            *out++ = row_f32(data + (size_t)r * stride, 4u + ((q8) ? G##u : G##u / 2u), xq, xs, G##u, ng, q8);  \
    }
EACH_SHAPE(ROWS_F32)
#undef ROWS_F32

/* kernels_ref.h i64_to_f32's value: the IEEE conversion of an int64 to binary32 rounds once to nearest,
 * ties to even (the default rounding mode, which nothing changes), as i64_to_f32 does on the
 * integers; on these cores one instruction (x86-64 CVTSI2SS, AArch64 SCVTF), where i64_to_f32's shift
 * loop takes a turn per bit above 24 (with 12-bit activations a row's sum has four more). */
static inline __attribute__((always_inline)) float i64_to_f32_vec(int64_t v) { return (float)v; }

/* A row-scaled row of ng whole groups of g codes: the row scale, the multipliers (padded to 4), the
 * groups' codes (steps of step bytes, q4 offset by 8); the integer sum, then the one scaling. Each
 * product k * isum in int64: with 12-bit activations it passes 2^31 once a q8 group is longer than 32. */
static inline __attribute__((always_inline)) float row_rs_whole(const uint8_t *row, const flm_act *x, const float *xs,
                                                                uint32_t g, uint32_t ng, int kind) {
    const uint8_t *k = row + 4, *codes = k + ((ng + 3u) & ~3u);
    const size_t step = kind == 1 ? g : g / 2u;   /* g a multiple of 8: no padding */
    int32_t isum[ISUM_BLOCK];
    int64_t acc = 0;
    for (uint32_t b = 0, nb; b < ng; b += nb) {
        nb = ng - b < ISUM_BLOCK ? ng - b : ISUM_BLOCK;
        isums(codes + b * step, step, x + (size_t)b * g, g, nb, kind, isum);
        for (uint32_t j = 0; j < nb; j++) acc += (int64_t)k[b + j] * isum[j];
    }
    return i64_to_f32_vec(acc) * (rdf(row) * xs[0]);
}

/* The row-scaled shapes with their own instantiations: (format, kind, group size). */
/* (q4 in groups of 16: convert's q4 default) */
#define EACH_RS_SHAPE(X) X(q8, 1, 32) X(q8, 1, 64) X(q8, 1, 128) X(q4, KIND_Q4O, 16) X(q4, KIND_Q4O, 32) \
    X(q4, KIND_Q4O, 64) X(q4, KIND_Q4O, 128)
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
#define FLM_ROWS_FOR rows_for
#endif
