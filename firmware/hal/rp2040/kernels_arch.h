/* The Cortex-M0+ kernels (ARMv6-M: no DSP or SIMD instructions, 1-cycle MULS on the RP2040): this
 * core's kernel_hooks.h hooks. The group dots are inline assembly here; with the soft-float's
 * assembly linked (softfloat_m0.s, declared by softfloat_m0.h, which every RP2040 build
 * force-includes) the group term, the whole-row loops, the row-scaled rows, the attention's integer
 * loops and the activation codes are its entry points. Activation codes are int16 (kernels.h):
 * 12-bit into q8 products and k12 keys, 8-bit into q4 products. A build without it (bench/kernels.py's
 * libgcc probe empties softfloat_m0.h) runs the dots here and the portable rest.
 *
 * The rows take one group at a time (FLM_SCALAR_ROWS): on this core a group's bookkeeping costs
 * more than its dot product, so the whole-row loop walks a row without the per-group format tests. */
#ifndef FLM_KERNELS_ARCH_H
#define FLM_KERNELS_ARCH_H
#include "softfloat_m0.h"
#include "rs_lanes_rp2040.h"

/* Each code byte read once (the tuned kernels' tails: the emulator's read counts must equal the
 * engine's, tests/test_rp2040_emu.py). */
static int32_t dot_q4_bytes(const uint8_t *w, const flm_act *x, uint32_t n) {
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
static int32_t dot_q4o_m0(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    uint32_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint32_t b = w[i >> 1];
        s += ((int32_t)(b & 15u) - 8) * (int32_t)x[i] + ((int32_t)(b >> 4) - 8) * (int32_t)x[i + 1];
    }
    if (i < n) s += ((int32_t)(w[i >> 1] & 15u) - 8) * (int32_t)x[i];
    return s;
}

/* Word loads of codes and activations (LDM with writeback, 2 cycles for 4 code bytes or 2 int16
 * activations against 2 for each LDRSB or LDRSH), code bytes sign-extended in registers by SXTB or
 * a shift, activations by SXTH (the low one) or ASRS #16 (the high one), one MULS and ADDS per
 * product. 8 weights a turn. */
static inline __attribute__((always_inline)) int32_t dot_q8_m0(const int8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    uint32_t n8 = n & ~7u;
    if (n8 && !(((uintptr_t)w | (uintptr_t)x) & 3u)) {   /* codes are; activations are in the engine */
        const int8_t *end = w + n8;
        uint32_t a, b, t, u;
#define Q8_WORD                                                                                     \
        "ldm %[w]!, {%[a]}\n ldm %[x]!, {%[b]}\n"                                                  \
        "sxtb %[t], %[a]\n sxth %[u], %[b]\n muls %[t], %[u]\n adds %[s], %[t]\n"                 \
        "lsrs %[t], %[a], #8\n sxtb %[t], %[t]\n asrs %[b], %[b], #16\n"                           \
        "muls %[t], %[b]\n adds %[s], %[t]\n ldm %[x]!, {%[b]}\n"                                   \
        "lsrs %[t], %[a], #16\n sxtb %[t], %[t]\n sxth %[u], %[b]\n"                               \
        "muls %[t], %[u]\n adds %[s], %[t]\n"                                                       \
        "asrs %[a], %[a], #24\n asrs %[b], %[b], #16\n muls %[a], %[b]\n adds %[s], %[a]\n"
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
    return s + dot_q8_scalar(w, x, n);
}

/* 8 nibbles per code word, each sign-extended by a shift pair (LSLS to the top, ASRS down), times
 * the activations of four words. */
static inline __attribute__((always_inline)) int32_t dot_q4_m0(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0;
    uint32_t n8 = n & ~7u;
    if (n8 && !(((uintptr_t)w | (uintptr_t)x) & 3u)) {
        const uint8_t *end = w + n8 / 2u;
        uint32_t a, b, t, u;
#define Q4_NIB(sh, xv)                                                                              \
        "lsls %[t], %[a], #" #sh "\n asrs %[t], %[t], #28\n " xv "\n muls %[t], %[u]\n adds %[s], %[t]\n"
#define Q4_PAIR(lo, hi)                                                                             \
        "ldm %[x]!, {%[b]}\n" Q4_NIB(lo, "sxth %[u], %[b]") Q4_NIB(hi, "asrs %[u], %[b], #16")
        __asm volatile(".syntax unified\n"
                       "1:\n"
                       "ldm %[w]!, {%[a]}\n"
                       Q4_PAIR(28, 24) Q4_PAIR(20, 16) Q4_PAIR(12, 8)
                       "ldm %[x]!, {%[b]}\n" Q4_NIB(4, "sxth %[u], %[b]")
                       "asrs %[a], %[a], #28\n asrs %[b], %[b], #16\n muls %[a], %[b]\n adds %[s], %[a]\n"
                       "cmp %[w], %[end]\n bne 1b\n"
                       ".syntax divided\n"
                       : [w] "+l"(w), [x] "+l"(x), [s] "+l"(s), [a] "=&l"(a), [b] "=&l"(b), [t] "=&l"(t), [u] "=&l"(u)
                       : [end] "r"(end)
                       : "cc", "memory");
#undef Q4_PAIR
#undef Q4_NIB
        n -= n8;
    }
    return s + dot_q4_bytes(w, x, n);
}
#define FLM_DOT_Q8 dot_q8_m0
#define FLM_DOT_Q4 dot_q4_m0
#define FLM_DOT_Q4O dot_q4o_m0
#define FLM_SCALAR_ROWS 1

#ifdef FLM_SOFTFLOAT_M0_H   /* the soft-float's assembly is linked: its kernels */
#define FLM_GROUP_TERM flm_group_term
#define FLM_ROW_WHOLE(p, x, xs, ng, g, q8) \
    ((q8) ? flm_row_q8_m0((p), (x), (xs), (ng), (g)) : flm_row_q4_m0((p), (x), (xs), (ng), (g) / 2u))
#define FLM_QUANT_CODES flm_quant_codes_m0
#define FLM_ACT_CODES_Q(x, n, inv, qmax, q) flm_act_codes_m0((x), (n), (inv), (q), (qmax))

/* The assembly's attention loops take whole steps of 8 (dot2), 4 (the k12 dot2) and whole words
 * (axpy). */
#define FLM_DOT2_Q8(a, b, x, n, out)                                                                    \
    do {                                                                                               \
        if (!((n) & 7u)) {                                                                             \
            flm_dot2_q8_m0(a, b, x, n, out);                                                           \
            break;                                                                                     \
        }                                                                                              \
        (out)[0] = dot_q8_m0(a, x, n);                                                                 \
        (out)[1] = dot_q8_m0(b, x, n);                                                                 \
    } while (0)

#define FLM_DOT2_Q12(a, b, x, n, out)                                                                   \
    do {                                                                                               \
        if (!((n) & 3u)) flm_dot2_q12_m0(a, b, x, n, out);                                             \
        else dot2_q12_scalar(a, b, x, n, out);                                                         \
    } while (0)

static inline __attribute__((always_inline)) void axpy_m0(int32_t *acc, const int8_t *v, int32_t w, uint32_t n) {
    const uint32_t n4 = n & ~3u;
    if (n4) flm_axpy_q8_m0(acc, v, w, n4);
    axpy_scalar(acc + n4, v + n4, w, n - n4);
}
#define FLM_AXPY_Q8 axpy_m0

/* The row-scaled rows. The q4 kernel's activations (softfloat_m0.s Q4L_WORD), on the stack: per
 * sub-block of 32 columns (16 for groups of 16) a start value, minus the share of the codes' offset
 * 8, then per 8 columns (x_j << 16) + x_{j+4}, j = 0..3 (q4's codes are 8-bit: |x| <= 127 keeps the
 * lanes' sums exact). Up to LANE_COLS columns (groups of 16: 960): FLM_RS_LANE_WORDS words, 2,176
 * bytes of the RP2040's 8 KB stack floor. */
#define LANE_COLS 1024u
_Static_assert(FLM_RS_LANE_WORDS == LANE_COLS / 32u * 17u, "softfloat_m0.h's lanes size");

/* q4's lanes come in sub-blocks of 32 columns, or of 16 for groups of 16 (a start value each: a
 * group's sum is whole sub-blocks'): the sub-block's columns, and the lane words of cols columns. */
static inline uint32_t q4_sub(uint32_t group) {
    return group == 16u ? 16u : 32u;
}

static inline uint32_t lane_words(uint32_t cols, uint32_t sub) {
    return cols / sub * (sub / 2u + 1u);
}

/* Their shape: whole groups of a multiple of 8 columns (q4: 16 or a multiple of 32, lanes of at most
 * FLM_RS_LANE_WORDS words, at most LANE_COLS columns so that its row sums fit an int32; q8's are
 * int64), word-aligned activations (docs/formats.md). 0: another shape (the portable row); else
 * geom = n_groups | group << 16. */
static uint32_t rs_geom(const flm_tensor *w, const flm_act *xq) {
    const uint32_t g = w->group, q8 = w->fmt == FLM_Q8;
    const int ok = w->cols % g == 0u && !((uintptr_t)xq & 3u) &&
                   (q8 ? g % 8u == 0u
                       : (g == 16u || g % 32u == 0u) && w->cols <= LANE_COLS &&
                             lane_words(w->cols, q4_sub(g)) <= FLM_RS_LANE_WORDS);
    return ok ? w->cols / g | g << 16 : 0u;
}

/* The lanes of cols activations x (a multiple of sub, 16 or 32): lane_words(cols, sub) words, one
 * every step words from p on (step 4: one token of four interleaved, the stage of flm_rs_rows4_q4_m0 or
 * of its groups-of-16 form), each start value plus bias (those kernels' 2^15: their high lanes without
 * the low ones' SXTH). */
static inline __attribute__((always_inline)) void lanes_into(const flm_act *x, uint32_t cols, uint32_t sub,
                                                             uint32_t *p, uint32_t step, uint32_t bias) {
    for (uint32_t s = 0; s < cols; s += sub) {
        uint32_t *start = p, sum = 0;
        p += step;
        for (uint32_t b = s; b < s + sub; b += 8u)
            for (uint32_t i = 0; i < 4u; i++, p += step) {
                const uint32_t v = ((uint32_t)(int32_t)x[b + i] << 16) + (uint32_t)(int32_t)x[b + i + 4u];
                *p = v;
                sum += v;
            }
        *start = bias - 8u * 0x10001u * sum;
    }
}

/* One token's lanes, contiguous (a constant step: the one-token products build them per product) */
static __attribute__((noinline)) void lanes_build(const flm_act *x, uint32_t cols, uint32_t sub, uint32_t *p) {
    lanes_into(x, cols, sub, p, 1u, 0u);
}

/* The q4 rows of lanes in sub-blocks of sub columns */
static inline __attribute__((always_inline)) void rows_q4(flm_rs_job *j, uint32_t sub) {
    if (sub == 16u) flm_rs_rows_q4h_m0(j);
    else flm_rs_rows_q4_m0(j);
}

static __attribute__((noinline)) void rows_rs_lanes(flm_rs_job *j, uint32_t cols, uint32_t sub) {
    uint32_t lanes[FLM_RS_LANE_WORDS];
    lanes_build(j->x, cols, sub, lanes);
    j->x = lanes;
    rows_q4(j, sub);
}

/* Per core (SIO CPUID): the lanes a streamed product prepared (flm_rs_lanes_m0), of activations x
 * (none: x 0). A product of one token calls the rows once per chunk, each chunk a few rows: built
 * once per product rather than per call, they save about a row's work a chunk. */
#define CPUID (*(volatile const uint32_t *)0xd0000000u)
static struct {
    const flm_act *x;
    const uint32_t *lanes;
    uint32_t sub;
} lanes_ready[2];

int flm_rs_lanes_fit(const flm_tensor *w, const flm_act *xq) {
    return w->fmt == FLM_Q4 && w->rowscale && rs_geom(w, xq);
}

void flm_rs_lanes_m0(const flm_tensor *w, const flm_act *xq, uint32_t *lanes) {
    const uint32_t core = CPUID & 1u;
    lanes_ready[core].x = 0;
    if (!w) return;
    lanes_ready[core].sub = q4_sub(w->group);
    lanes_build(xq, w->cols, lanes_ready[core].sub, lanes);
    lanes_ready[core].lanes = lanes;
    lanes_ready[core].x = xq;
}

/* q4 for a block of rows only, unless the lanes are prepared: they cost about a row. */
static inline __attribute__((always_inline)) int rs_rows_m0(const flm_tensor *w, uint32_t r0, uint32_t r1,
                                                            const flm_act *xq, const float *xs, float *out) {
    const uint32_t geom = rs_geom(w, xq);
    if (!geom) return 0;
    flm_rs_job j = {w->data + (size_t)r0 * w->stride, w->stride, r1 - r0, xq, geom, xs[0], out};
    if (w->fmt == FLM_Q8) {
        flm_rs_rows_q8_m0(&j);
        return 1;
    }
    const uint32_t core = CPUID & 1u, sub = q4_sub(w->group);
    if (lanes_ready[core].x == xq && lanes_ready[core].sub == sub) {
        j.x = lanes_ready[core].lanes;
        rows_q4(&j, sub);
        return 1;
    }
    if (r1 - r0 < 2u) return 0;
    rows_rs_lanes(&j, w->cols, sub);
    return 1;
}
#define FLM_RS_ROWS rs_rows_m0

/* A pass's staged activations (rs_lanes_rp2040.h): q8, quad q at stage + q * words, per column
 * four int32 (x_4q .. x_4q+3) where every quad of the pass fits so, else two words (x_4q | x_4q+1
 * << 16), (x_4q+2 | x_4q+3 << 16); q4, token t's lanes at stage + t * words, those of a whole quad
 * interleaved there (token t's lane words at stage + t / 4 * 4 * words + t % 4, every fourth). */
static uint32_t q8_wide(const flm_tensor *w, const flm_batch *b) {
    return b->n / 4u * 4u * w->cols <= FLM_RS_STAGE_WORDS;
}

static uint32_t stage_words(const flm_tensor *w, const flm_batch *b) {
    return w->fmt == FLM_Q8 ? (2u + 2u * q8_wide(w, b)) * w->cols : lane_words(w->cols, q4_sub(w->group));
}

int flm_rs_stage_fit(const flm_tensor *w, const flm_batch *b) {
    if (w->fmt == FLM_Q8)
        return b->n >= 4u && w->rowscale && (w->group == 16u || w->group == 32u) && rs_geom(w, b->xq) &&
               2u * w->cols <= FLM_RS_STAGE_WORDS;
    /* q4: every token (the rest would build its lanes per chunk on the stack beside the stage) */
    return b->n >= 2u && flm_rs_lanes_fit(w, b->xq) && b->n * stage_words(w, b) <= FLM_RS_STAGE_WORDS;
}

uint32_t flm_rs_staged(const flm_tensor *w, const flm_batch *b) {
    const uint32_t fit = FLM_RS_STAGE_WORDS / stage_words(w, b);   /* quads (q8) or tokens (q4) */
    if (w->fmt != FLM_Q8) return b->n < fit ? b->n : fit;
    return (b->n / 4u < fit ? b->n / 4u : fit) * 4u;
}

void flm_rs_stage(const flm_tensor *w, const flm_batch *b, uint32_t *stage, uint32_t t0, uint32_t t1) {
    const uint32_t cols = w->cols, words = stage_words(w, b), sub = q4_sub(w->group);
    if (w->fmt != FLM_Q8) {
        const uint32_t quads = flm_rs_staged(w, b) / 4u * 4u;
        for (uint32_t t = t0; t < t1; t++) {
            const flm_act *x = b->xq + (size_t)t * b->xq_stride;
            if (t < quads) lanes_into(x, cols, sub, stage + (size_t)t / 4u * 4u * words + t % 4u, 4u, 0x8000u);
            else lanes_build(x, cols, sub, stage + (size_t)t * words);
        }
        return;
    }
    if (q8_wide(w, b)) {
        for (uint32_t t = t0; t < t1; t++) {
            const flm_act *x = b->xq + (size_t)t * b->xq_stride;
            uint32_t *p = stage + (size_t)t / 4u * words + t % 4u;
            for (uint32_t c = 0; c < cols; c++, p += 4) *p = (uint32_t)(int32_t)x[c];
        }
        return;
    }
    for (uint32_t t = t0; t < t1; t += 2u) {
        const flm_act *lo = b->xq + (size_t)t * b->xq_stride, *hi = lo + b->xq_stride;
        uint32_t *p = stage + (size_t)t / 4u * words + (t / 2u & 1u);
        for (uint32_t c = 0; c < cols; c++, p += 2) *p = (uint16_t)lo[c] | (uint32_t)(uint16_t)hi[c] << 16;
    }
}

/* Rows [0, w->rows) of w (geom: rs_geom's) for tokens [t, t + 4) of b, their activations staged at x,
 * by fn (the job filled field by field: a zeroing initializer calls memset, which runs from flash). */
static void rows4(void (*fn)(flm_rs_job4 *), const flm_tensor *w, uint32_t geom, const flm_batch *b, uint32_t t,
                  const uint32_t *x, uint32_t r) {
    flm_rs_job4 j;
    j.row = w->data;
    j.stride = w->stride;
    j.n = w->rows;
    j.x = x;
    j.geom = geom;
    for (uint32_t k = 0; k < 4u; k++) {
        j.xs[k] = b->xs[(size_t)(t + k) * b->xs_stride];
        j.out[k] = b->out + (size_t)(t + k) * b->out_stride + r;
    }
    fn(&j);
}

void flm_rs_staged_rows(const flm_tensor *w, const flm_batch *b, uint32_t t0, uint32_t t1, const uint32_t *stage,
                        uint32_t r) {
    const uint32_t geom = rs_geom(w, b->xq), words = stage_words(w, b);
    if (w->fmt != FLM_Q8) {
        const uint32_t sub = q4_sub(w->group);
        uint32_t t = t0;
        for (; t + 4u <= t1; t += 4u)
            rows4(sub == 16u ? flm_rs_rows4_q4h_m0 : flm_rs_rows4_q4_m0, w, geom, b, t, stage + (size_t)t * words, r);
        for (; t < t1; t++) {
            flm_rs_job j = {w->data, w->stride, w->rows, stage + (size_t)t * words, geom,
                            b->xs[(size_t)t * b->xs_stride], b->out + (size_t)t * b->out_stride + r};
            rows_q4(&j, sub);
        }
        return;
    }
    void (*const q8)(flm_rs_job4 *) = q8_wide(w, b) ? flm_rs_rows4w_q8_m0 : flm_rs_rows4_q8_m0;
    for (uint32_t t = t0; t < t1; t += 4u) rows4(q8, w, geom, b, t, stage + (size_t)t / 4u * words, r);
}

/* The boot self-check's pass (kernel_hooks.h FLM_PASS_ROWS_AGREE): the staged rows of FLM_CHECK_TOKENS
 * tokens (q8: a quad, q4: a quad and one alone) against row_rs, for a w of at most 3 rows and 96
 * columns they take. */
#define CHECK_ROWS 3u
#define CHECK_STAGE_WORDS 384u   /* q8's quad of 96 columns, four words a column */
static int pass_rows_agree(const flm_tensor *w, const flm_act *x, uint32_t stride, const float *xs) {
    float out[FLM_CHECK_TOKENS * CHECK_ROWS];
    uint32_t stage[CHECK_STAGE_WORDS];
    const flm_batch b = {FLM_CHECK_TOKENS, x, xs, out, stride, 1u, CHECK_ROWS};
    if (w->rows > CHECK_ROWS || w->cols > 96u || !flm_rs_stage_fit(w, &b)) return 1;
    const uint32_t n = flm_rs_staged(w, &b);
    flm_rs_stage(w, &b, stage, 0u, n);
    flm_rs_staged_rows(w, &b, 0u, n, stage, 0u);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t r = 0; r < w->rows; r++) {
            const float ref = row_rs(w, r, x + (size_t)t * stride, xs + t, dot_q8_scalar, dot_q4o_scalar);
            if (memcmp(&ref, &out[t * CHECK_ROWS + r], 4)) return 0;
        }
    return 1;
}
#define FLM_PASS_ROWS_AGREE pass_rows_agree
#else
/* the portable rows take no lanes */
int flm_rs_lanes_fit(const flm_tensor *w, const flm_act *xq) {
    (void)w, (void)xq;
    return 0;
}

void flm_rs_lanes_m0(const flm_tensor *w, const flm_act *xq, uint32_t *lanes) {
    (void)w, (void)xq, (void)lanes;
}

/* nor staged activations */
int flm_rs_stage_fit(const flm_tensor *w, const flm_batch *b) {
    (void)w, (void)b;
    return 0;
}

uint32_t flm_rs_staged(const flm_tensor *w, const flm_batch *b) {
    (void)w, (void)b;
    return 0;
}

void flm_rs_stage(const flm_tensor *w, const flm_batch *b, uint32_t *stage, uint32_t t0, uint32_t t1) {
    (void)w, (void)b, (void)stage, (void)t0, (void)t1;
}

void flm_rs_staged_rows(const flm_tensor *w, const flm_batch *b, uint32_t t0, uint32_t t1, const uint32_t *stage,
                        uint32_t r) {
    (void)w, (void)b, (void)t0, (void)t1, (void)stage, (void)r;
}
#endif
#endif
