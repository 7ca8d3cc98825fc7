/* The kernels' one translation unit: the entry points kernels.h declares, in portable C that calls
 * each core's tuned kernels through kernel_hooks.h (hot helpers are inline functions of the
 * headers it includes, so every loop is compiled here, where it is called), and the boot
 * self-check (kernels_check.h, included last). */
#include "kernels.h"
#include "hal.h"
#include "kernel_hooks.h"
#include "flm_math.h"
#include <string.h>

/* ---- the activations' quantizer ------------------------------------------------------------ */

/* The codes of x[n] per group of g, the largest qmax, into q (int8_t or flm_act elements of `size`
 * bytes: a constant once inlined; int8_t only with qmax 127), the scales into xs. The scale and its
 * inverse in binary32 as the reference: amax / qmax, qmax / amax. */
static inline __attribute__((always_inline)) void quantize(const float *x, uint32_t n, uint32_t g, int32_t qmax,
                                                           void *q, size_t size, float *xs) {
    const float qf = (float)qmax;
    for (uint32_t s = 0, gi = 0; s < n; s += g, gi++, x += g, q = (uint8_t *)q + g * size) {
        const uint32_t len = n - s < g ? n - s : g, amax_bits = FLM_AMAX_BITS(x, len);
        if (amax_bits == 0u) {
            xs[gi] = 0.0f;
            memset(q, 0, len * size);
            continue;
        }
        const float amax = flm_f32_from_bits(amax_bits);
        xs[gi] = amax / qf;
        const float inv = qf / amax;
        if (size == 1u) {
            FLM_QUANT_CODES(x, len, inv, (int8_t *)q);
        } else {
            FLM_ACT_CODES_Q(x, len, inv, qmax, (flm_act *)q);
        }
    }
}

void flm_quantize_act(const float *x, uint32_t n, uint32_t g, int32_t qmax, flm_act *xq, float *xs) {
    quantize(x, n, g, qmax, xq, sizeof *xq, xs);
}

void flm_quantize_i8(const float *x, uint32_t n, uint32_t g, int8_t *q, float *xs) { quantize(x, n, g, 127, q, 1u, xs); }

/* flm_quantize_act on the board's cores (hal_parallel): whole groups a core, or one group's largest
 * |x| by halves (the larger of the two halves' is the whole's) and then its codes by halves (each
 * code depends on its element and the scale only): the same scales and codes. */
typedef struct {
    const float *x;
    uint32_t n, g;
    int32_t qmax;
    flm_act *xq;
    float *xs, inv;
    uint32_t amax[2];   /* one group: each range's largest |x| (its bits) */
} quant_job;

static void quant_groups(void *ctx, uint32_t g0, uint32_t g1) {
    const quant_job *j = ctx;
    const uint32_t a = g0 * j->g, z = g1 * j->g < j->n ? g1 * j->g : j->n;
    flm_quantize_act(j->x + a, z - a, j->g, j->qmax, j->xq + a, j->xs + g0);
}

static void quant_amax(void *ctx, uint32_t i0, uint32_t i1) {
    quant_job *j = ctx;
    j->amax[i0 != 0u] = FLM_AMAX_BITS(j->x + i0, i1 - i0);
}

static void quant_codes(void *ctx, uint32_t i0, uint32_t i1) {
    const quant_job *j = ctx;
    FLM_ACT_CODES_Q(j->x + i0, i1 - i0, j->inv, j->qmax, j->xq + i0);
}

void flm_quantize_act_parallel(const float *x, uint32_t n, uint32_t g, int32_t qmax, flm_act *xq, float *xs) {
    quant_job j = {x, n, g, qmax, xq, xs, 0.0f, {0u, 0u}};
    if (g < n) {
        hal_parallel(quant_groups, &j, (n + g - 1u) / g);
        return;
    }
    hal_parallel(quant_amax, &j, n);
    const uint32_t amax_bits = j.amax[0] > j.amax[1] ? j.amax[0] : j.amax[1];
    if (amax_bits == 0u) {
        xs[0] = 0.0f;
        memset(xq, 0, n * sizeof *xq);
        return;
    }
    const float qf = (float)qmax, amax = flm_f32_from_bits(amax_bits);
    xs[0] = amax / qf;
    j.inv = qf / amax;
    hal_parallel(quant_codes, &j, n);
}

/* ---- group dot products -------------------------------------------------------------------- */

int32_t flm_dot_q8(const int8_t *w, const flm_act *x, uint32_t n) { return FLM_DOT_Q8(w, x, n); }
int32_t flm_dot_q4(const uint8_t *w, const flm_act *x, uint32_t n) { return FLM_DOT_Q4(w, x, n); }

float flm_i64_to_f32(int64_t v) { return i64_to_f32(v); }

uint32_t flm_act_group(const flm_tensor *w) { return w->rowscale ? w->cols : w->group; }

void flm_dot2_q8(const int8_t *a, const int8_t *b, const flm_act *x, uint32_t n, int32_t out[2]) {
    FLM_DOT2_Q8(a, b, x, n, out);
}

void flm_axpy_q8(int32_t *acc, const int8_t *v, int32_t w, uint32_t n) { FLM_AXPY_Q8(acc, v, w, n); }

int32_t flm_dot_q12(const int16_t *a, const flm_act *x, uint32_t n) { return dot_q12_scalar(a, x, n); }

void flm_dot2_q12(const int16_t *a, const int16_t *b, const flm_act *x, uint32_t n, int32_t out[2]) {
    FLM_DOT2_Q12(a, b, x, n, out);
}

/* isum[k], k < ng: inlined into every caller, so that a constant g makes each group's loop one of
 * known length (no runtime checks or scalar epilogue per group). */
static inline __attribute__((always_inline)) void isums(const uint8_t *codes, size_t step, const flm_act *x, uint32_t g,
                                                        uint32_t ng, int kind, int32_t *isum) {
    for (uint32_t k = 0; k < ng; k++, codes += step, x += g)
        isum[k] = kind == 1 ? FLM_DOT_Q8((const int8_t *)codes, x, g) : kind == KIND_Q4O ? FLM_DOT_Q4O(codes, x, g)
                                                                                        : FLM_DOT_Q4(codes, x, g);
}

void flm_isums_q8(const uint8_t *codes, size_t step, const flm_act *xq, uint32_t g, uint32_t ng, int32_t *isum) {
    const isums_fn f = FLM_ISUMS_FOR(g, 1);
    if (f) f(codes, step, xq, ng, isum);
    else isums(codes, step, xq, g, ng, 1, isum);
}

void flm_isums_q4(const uint8_t *codes, size_t step, const flm_act *xq, uint32_t g, uint32_t ng, int32_t *isum) {
    const isums_fn f = FLM_ISUMS_FOR(g, 0);
    if (f) f(codes, step, xq, ng, isum);
    else isums(codes, step, xq, g, ng, 0, isum);
}

/* ---- rows ------------------------------------------------------------------------------------ */

#if FLM_SCALAR_ROWS
/* One group at a time (cores without SIMD). */

/* The number of groups when the rows of w take the whole-row path, else 0: the shape tests (a
 * division each) once per matvec, not per row. */
static uint32_t whole_groups(const flm_tensor *w, const flm_act *xq) {
    const uint32_t g = w->group;
    return !w->scale16 && w->cols % g == 0u && g % 8u == 0u && !((uintptr_t)xq & 3u) ? w->cols / g : 0u;
}

/* Rows [r0, r1) of a row-scaled tensor into out[0..): the core's kernels where the shape suits them,
 * else the portable row. */
static void rows_rs(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, const float *xs, float *out) {
    if (FLM_RS_ROWS(w, r0, r1, xq, xs, out)) return;
    for (uint32_t r = r0; r < r1; r++) *out++ = row_rs(w, r, xq, xs, FLM_DOT_Q8, FLM_DOT_Q4O);
}

static void rows_scalar(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, const float *xs, float *out) {
    if (w->rowscale) {
        rows_rs(w, r0, r1, xq, xs, out);
        return;
    }
    const uint32_t ng = whole_groups(w, xq);
    for (uint32_t r = r0; r < r1; r++)
        *out++ = ng ? FLM_ROW_WHOLE(w->data + (size_t)r * w->stride, xq, xs, ng, w->group, w->fmt == FLM_Q8)
                    : row_with(w, r, xq, xs, FLM_DOT_Q8, FLM_DOT_Q4, FLM_GROUP_TERM);
}

#define ROWS rows_scalar
#else
/* A block of integer dots at a time: the integer dots of a block of a row's groups first
 * (vectorised where the core has vectors), then their terms folded in the reference's order: the
 * float work per group stays group_term's, one add after another. */

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
        const float t = group_term(pl->q8 ? FLM_DOT_Q8((const int8_t *)c, xt, pl->tail) : FLM_DOT_Q4(c, xt, pl->tail),
                                   scale_of(pl, row, k), xs[k]);
        acc = k == 0 ? t : acc + t;
    }
    return acc;
}

static __attribute__((noinline)) void rows_any(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq,
                                               const float *xs, float *out) {
    if (w->rowscale) {   /* a shape without its own instantiation: the plain row */
        for (uint32_t r = r0; r < r1; r++) *out++ = row_rs(w, r, xq, xs, FLM_DOT_Q8, FLM_DOT_Q4O);
        return;
    }
    const row_plan pl = plan_of(w);
    for (uint32_t r = r0; r < r1; r++) *out++ = row_any(w, r, &pl, xq, xs);
}

/* (the shape tests inline: a single row's call, the pruned head's, costs little more than the row) */
static inline __attribute__((always_inline)) void rows_blocks(const flm_tensor *w, uint32_t r0, uint32_t r1,
                                                              const flm_act *xq, const float *xs, float *out) {
    const rows_fn fast = FLM_ROWS_FOR(w);
    if (fast) {
        fast(w->data, w->stride, r0, r1, xq, xs, w->cols / w->group, out);
        return;
    }
    rows_any(w, r0, r1, xq, xs, out);
}
#define ROWS rows_blocks
#endif

/* ---- matrix products ------------------------------------------------------------------------ */

float flm_matvec_row(const flm_tensor *w, uint32_t r, const flm_act *xq, const float *xs) {
    float v;
    ROWS(w, r, r + 1u, xq, xs, &v);
    return v;
}

void flm_matvec_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, const float *xs, float *out) {
    ROWS(w, r0, r1, xq, xs, out + r0);
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
            ROWS(&rows, 0, k, b->xq + (size_t)t * b->xq_stride, b->xs + (size_t)t * b->xs_stride,
                       b->out + (size_t)t * b->out_stride + r);
    }
}

/* The default: every row on the calling core, the whole row buffer its own. */
__attribute__((weak)) void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
    flm_matmul_rows(w, 0, w->rows, b, row_buf, row_buf_bytes);
}

/* The default: no hint taken. */
__attribute__((weak)) void hal_matmul_then(const flm_tensor *w) {
    (void)w;
}

/* The default: no per-row work taken (the engine runs it after the product). */
__attribute__((weak)) int hal_matmul_each(const flm_tensor *w, flm_range_fn fn, void *ctx) {
    (void)w;
    (void)fn;
    (void)ctx;
    return 0;
}

/* The default: on the calling core. */
__attribute__((weak)) void hal_parallel(flm_range_fn fn, void *ctx, uint32_t n) {
    fn(ctx, 0, n);
}

/* ---- dequantization (the embedding and PLE rows) --------------------------------------------- */

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

#include "kernels_check.h"
