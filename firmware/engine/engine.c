/* The forward pass (engine.h): the state's regions carved from the arena, the layers (RMSNorm, the
 * matrix products through hal_matmul, RoPE, the KV cache, float and int8 attention, the FFN, PLE),
 * the sliding window and the output layer with its greedy tile scan.
 *
 * One translation unit on purpose, though near 600 lines: its parts are static functions the
 * compiler sees whole (inlined, or called knowing which registers they clobber), so their callers
 * compile to the instruction counts bench measures (callgrind per decode token, emulated cycles per
 * token); in files of their own they would become external calls and those counts would move. */
#include "engine.h"
#include "flm_math.h"
#include "hal.h"
#include "kernels.h"
#include <string.h>

static size_t up8(size_t n) { return (n + 7u) & ~(size_t)7u; }

/* The parts of a layer that make bench's call profile times by their symbols on the emulated
 * RP2040 (host/emu/harness.mjs --profile): out of line and not cloned, so each keeps its name. A
 * few calls per layer and token: the calls themselves cost nothing measurable. */
#if defined(__GNUC__) && !defined(__clang__)
#define PROFILED __attribute__((noinline, noclone))
#else
#define PROFILED __attribute__((noinline))
#endif

/* Exact pruning of the greedy head by its tiles (docs/formats.md section 3; converter/headprune.py). */
#define PRUNE_MARGIN 0x1.02p+0f      /* 1 + 2^-7: Xm >= ||x|| (1 + 2^-8) after every rounding */
#define PRUNE_FLOOR 0x1p-64f         /* below it no tile is skipped: no underflow can matter */

/* Bytes of a V row, and of a K row (converter/footprint.py kv_row_bytes). */
static uint32_t v_row_bytes(const flm_model *m) {
    return m->kv_fmt == FLM_KV_F32 ? m->head_dim * 4u : 4u + ((m->head_dim + 3u) & ~3u);
}

static uint32_t k_row_bytes(const flm_model *m) {
    return m->kv_fmt == FLM_KV_K12 ? 4u + ((2u * m->head_dim + 3u) & ~3u) : v_row_bytes(m);
}

/* Bytes of one core's attention scratch (hal_parallel runs the heads on up to two at once): the
 * scores of positions 0..seq_len-1, then a query head's codes (converter/footprint.py). */
static size_t att_scratch_bytes(const flm_model *m) {
    return up8((size_t)m->seq_len * 4u) + up8((size_t)m->head_dim * sizeof(flm_act));
}

typedef struct { uint8_t *p; size_t used, cap; } carver;

static void *carve(carver *c, size_t bytes) {
    void *r = c->p ? c->p + c->used : 0;
    c->used += up8(bytes);
    return r;
}

/* Bytes of a copy of any weight row the engine multiplies (kernels.h flm_matmul_rows): a row of
 * at most `wide` columns in groups of at least min_group, q8 with f32 scales the largest (each
 * group's codes padded to 4, its scale 4 bytes; fp16 and row scales take less). */
static size_t row_copy_bytes(const flm_model *m, uint32_t wide) {
    return (size_t)wide + 7u * (wide / m->min_group + 1u) + 3u;
}

/* Carves the regions; base[r] == 0 only measures. Returns region r's size in *size[r]. A batch of
 * one carves exactly the one-token engine's buffers. */
static void layout(flm_state *s, const flm_model *m, uint8_t *const base[FLM_N_REGIONS], size_t size[FLM_N_REGIONS]) {
    carver sc = {base[FLM_REG_SCRATCH], 0, 0}, lg = {base[FLM_REG_LOGITS], 0, 0}, kvc = {base[FLM_REG_KV], 0, 0};
    const uint32_t nt = m->batch;
    uint32_t wide = m->dim > m->hidden ? m->dim : m->hidden;   /* longest matmul input */
    if (m->ple_dim > wide) wide = m->ple_dim;
    const size_t kv_rows = (size_t)m->n_layers * m->seq_len * m->n_kv_heads;
    size_t ple = (size_t)m->n_layers * m->ple_dim * 4u;
    s->xq_stride = (uint32_t)up8(wide);
    s->xs_stride = wide / m->min_group + 1u;   /* activation scales: one per group */
    s->x = carve(&sc, nt * m->dim * 4u);
    s->xb = carve(&sc, nt * m->dim * 4u);
    s->xb2 = carve(&sc, nt * m->dim * 4u);
    s->q = carve(&sc, nt * m->dim * 4u);
    s->att = carve(&sc, 2u * att_scratch_bytes(m));   /* one a core (attend_heads) */
    s->hb = carve(&sc, nt * m->hidden * 4u);
    s->hb2 = carve(&sc, nt * m->hidden * 4u);
    s->cos = carve(&sc, nt * (m->head_dim / 2u) * 4u);
    s->sin = carve(&sc, nt * (m->head_dim / 2u) * 4u);
    s->pu = carve(&sc, nt * ple);
    s->pt = carve(&sc, nt > m->n_layers ? (size_t)nt * m->ple_dim * 4u : ple);   /* a table row, or the pass's gates */
    s->xq = carve(&sc, (size_t)nt * s->xq_stride * 2u);   /* flm_act codes: 2 bytes on SIMD cores, room for them everywhere */
    s->xs = carve(&sc, (size_t)nt * s->xs_stride * 4u);
    s->macc = carve(&sc, m->n_experts ? (size_t)nt * m->dim * 4u : 0u);
    s->mlogit = carve(&sc, m->n_experts * 4u);
    s->mweight = carve(&sc, (size_t)nt * m->top_k * 4u);
    s->routes = carve(&sc, (size_t)m->n_layers * nt * m->top_k);
    s->msel = carve(&sc, m->n_experts ? 2u * nt : 0u);
    s->row_buf = 0;
    s->row_buf_bytes = 0;
    if (nt > 1u) {   /* two rows: one a core on two cores (halves 8-byte aligned), or blocks of two on one */
        s->row_buf_bytes = 2u * up8(row_copy_bytes(m, wide));
        s->row_buf = carve(&sc, s->row_buf_bytes);
    }
    s->logits = carve(&lg, (size_t)nt * m->n_out * 4u);
    s->probs = carve(&lg, m->n_out * 4u);
    s->idx = carve(&lg, m->n_out * 4u);
    s->kc = carve(&kvc, kv_rows * k_row_bytes(m));
    s->vc = carve(&kvc, kv_rows * v_row_bytes(m));
    s->k_row = k_row_bytes(m);
    s->v_row = v_row_bytes(m);
    s->kv_bytes = kvc.used;
    size[FLM_REG_SCRATCH] = sc.used;
    size[FLM_REG_LOGITS] = lg.used;
    size[FLM_REG_KV] = kvc.used;
}

size_t flm_state_region_bytes(const flm_model *m, int region) {
    flm_state tmp;
    uint8_t *const none[FLM_N_REGIONS] = {0, 0, 0};
    size_t size[FLM_N_REGIONS];
    layout(&tmp, m, none, size);
    return size[region];
}

size_t flm_state_bytes(const flm_model *m) {
    return flm_state_region_bytes(m, FLM_REG_KV) + flm_state_region_bytes(m, FLM_REG_LOGITS) +
           flm_state_region_bytes(m, FLM_REG_SCRATCH);
}

void flm_state_init_regions(flm_state *s, const flm_model *m, uint8_t *const base[FLM_N_REGIONS], uint32_t kv_tier) {
    size_t size[FLM_N_REGIONS];
    memset(s, 0, sizeof *s);
    layout(s, m, base, size);
    s->m = m;
    s->kv_tier = kv_tier;
    s->n_tok = 1u;   /* until a pass runs, the heads read token 0's x */
}

int flm_state_init(flm_state *s, const flm_model *m, uint8_t *arena, size_t cap, uint32_t kv_tier) {
    if (flm_state_bytes(m) > cap) { memset(s, 0, sizeof *s); return -1; }
    uint8_t *base[FLM_N_REGIONS];
    base[FLM_REG_SCRATCH] = arena;
    base[FLM_REG_LOGITS] = arena + flm_state_region_bytes(m, FLM_REG_SCRATCH);
    base[FLM_REG_KV] = base[FLM_REG_LOGITS] + flm_state_region_bytes(m, FLM_REG_LOGITS);
    flm_state_init_regions(s, m, base, kv_tier);
    return 0;
}

/* RMSNorm of up to NORM_BLOCK vectors at once: n vectors x + t * stride (each of n_dim) into
 * o + t * stride (o may be x), vector t's scale inv[t]. Their squares, sums and scaling each one
 * hal_parallel for all of them: a pass's sums on both cores too, a share of its tokens each. */
#define NORM_BLOCK 8u
typedef struct {
    float *o;
    const float *x, *g;
    uint32_t stride, n, n_dim;
    float eps, inv[NORM_BLOCK];
} norm_job;

/* o[i] = (x[i] * inv) * g[i] for i in [i0, i1) of every vector (hal_parallel). */
static void norm_scale(void *ctx, uint32_t i0, uint32_t i1) {
    const norm_job *j = ctx;
    for (uint32_t t = 0; t < j->n; t++) {
        float *o = j->o + (size_t)t * j->stride;
        const float *x = j->x + (size_t)t * j->stride, *g = j->g, inv = j->inv[t];
        for (uint32_t i = i0; i < i1; i++) o[i] = (x[i] * inv) * g[i];
    }
}

/* o[i] = x[i] * x[i] for i in [i0, i1) of every vector (hal_parallel). */
static void squares(void *ctx, uint32_t i0, uint32_t i1) {
    const norm_job *j = ctx;
    for (uint32_t t = 0; t < j->n; t++) {
        float *o = j->o + (size_t)t * j->stride;
        const float *x = j->x + (size_t)t * j->stride;
        for (uint32_t i = i0; i < i1; i++) o[i] = x[i] * x[i];
    }
}

/* inv[t] = 1 / sqrt(the mean of vector t's squares + eps) for vectors [t0, t1) (hal_parallel: a
 * vector's sum on one core, in its one order: flm_dot_f32's, the first square, then + each next),
 * the squares in o where o is not x. */
static void norm_sums(void *ctx, uint32_t t0, uint32_t t1) {
    norm_job *j = ctx;
    const uint32_t n_dim = j->n_dim;   /* (held across the float calls) */
    for (uint32_t t = t0; t < t1; t++) {
        const float *xt = j->x + (size_t)t * j->stride, *ot = j->o + (size_t)t * j->stride;
        float ss;
        if (ot != xt) {
            ss = ot[0];
            for (uint32_t i = 1; i < n_dim; i++) ss = ss + ot[i];
        } else {
            ss = flm_dot_f32(xt, xt, n_dim);
        }
        ss = ss / (float)n_dim + j->eps;
        j->inv[t] = 1.0f / flm_sqrtf(ss);
    }
}

/* RMSNorm of n vectors x + t * stride (each of n_dim) into o + t * stride (o may be x), NORM_BLOCK
 * at a time: their squares made on the board's cores into o first where o is not x (squared: o
 * holds them already, made with the residual before it: add_sq_rows), each vector's sum of squares
 * on one core (one vector: the calling one), the scaling element-wise on the board's cores
 * (hal_parallel). The weights, a few hundred bytes, are read once per vector. */
static PROFILED void rmsnorm(float *o, const float *x, uint32_t stride, const flm_tensor *w, uint32_t n_dim, uint32_t n,
                             int squared, float eps, flm_step_stats *st) {
    for (uint32_t t0 = 0; t0 < n; t0 += NORM_BLOCK) {
        norm_job j;   /* field by field: inv is filled by norm_sums */
        j.o = o + (size_t)t0 * stride;
        j.x = x + (size_t)t0 * stride;
        j.g = (const float *)(const void *)w->data;
        j.stride = stride;
        j.n = n - t0 < NORM_BLOCK ? n - t0 : NORM_BLOCK;
        j.n_dim = n_dim;
        j.eps = eps;
        if (o != x && !squared) hal_parallel(squares, &j, n_dim);
        if (j.n == 1u) norm_sums(&j, 0u, 1u);
        else hal_parallel(norm_sums, &j, j.n);
        hal_parallel(norm_scale, &j, n_dim);
    }
    st->bytes[w->tier] += n * n_dim * 4u;
}

/* Element-wise work on elements [r0, r1) of n vectors, vector t at x + t * stride (and y + t *
 * stride): hal_parallel's ranges, or a product's output rows (hal_matmul_each). */
typedef struct { float *x, *y; uint32_t stride, n; } rows_job;

/* x = x + y: a residual connection. */
static void add_rows(void *ctx, uint32_t r0, uint32_t r1) {
    const rows_job *j = ctx;
    for (uint32_t t = 0; t < j->n; t++)
        for (uint32_t i = r0 + t * j->stride; i < r1 + t * j->stride; i++) j->x[i] = j->x[i] + j->y[i];
}

/* x = x + y, then y = x * x: a residual connection and the squares of the RMSNorm after it (the
 * squares job's products). */
static void add_sq_rows(void *ctx, uint32_t r0, uint32_t r1) {
    const rows_job *j = ctx;
    for (uint32_t t = 0; t < j->n; t++)
        for (uint32_t i = r0 + t * j->stride; i < r1 + t * j->stride; i++) {
            j->x[i] = j->x[i] + j->y[i];
            j->y[i] = j->x[i] * j->x[i];
        }
}

/* x = silu(x): the FFN's gate. */
static void silu_rows(void *ctx, uint32_t r0, uint32_t r1) {
    const rows_job *j = ctx;
    for (uint32_t t = 0; t < j->n; t++)
        for (uint32_t i = r0 + t * j->stride; i < r1 + t * j->stride; i++) j->x[i] = flm_silu(j->x[i]);
}

/* x = x * y: the gate times the FFN's up projection. */
static void mul_rows(void *ctx, uint32_t r0, uint32_t r1) {
    const rows_job *j = ctx;
    for (uint32_t t = 0; t < j->n; t++)
        for (uint32_t i = r0 + t * j->stride; i < r1 + t * j->stride; i++) j->x[i] = j->x[i] * j->y[i];
}

/* x = silu(x) * y: both in one pass. */
static void silu_mul_rows(void *ctx, uint32_t r0, uint32_t r1) {
    const rows_job *j = ctx;
    for (uint32_t t = 0; t < j->n; t++)
        for (uint32_t i = r0 + t * j->stride; i < r1 + t * j->stride; i++) j->x[i] = flm_silu(j->x[i]) * j->y[i];
}

static void add_into(float *x, float *y, uint32_t n) {
    rows_job j = {x, y, 0u, 1u};
    hal_parallel(add_rows, &j, n);
}

/* Per-row work on a product's output (hal_matmul_each), or none (0). */
typedef struct { flm_range_fn fn; rows_job *job; } rows_after;

/* out + t * out_stride = w times the quantized x + t * x_stride, for the n tokens t whose codes and
 * scales sit in s->xq / s->xs: the matrix read once (hal_matmul). */
static PROFILED void product(flm_state *s, const flm_tensor *w, uint32_t n, float *out, uint32_t out_stride,
                             const rows_after *after, flm_step_stats *st) {
    const flm_batch b = {n, s->xq, s->xs, out, s->xq_stride, s->xs_stride, out_stride};
    const int taken = after && hal_matmul_each(w, after->fn, after->job);
    hal_matmul(w, &b, s->row_buf, s->row_buf_bytes);
    if (after && !taken) hal_parallel(after->fn, after->job, w->rows);
    st->bytes[w->tier] += w->length;
}

/* Tokens [t0, t1) of quantize_all's n (hal_parallel). */
typedef struct { flm_state *s; const flm_tensor *w; const float *x; uint32_t x_stride; } quant_job;

static void quantize_tokens(void *ctx, uint32_t t0, uint32_t t1) {
    const quant_job *j = ctx;
    for (uint32_t t = t0; t < t1; t++)
        flm_quantize_act(j->x + (size_t)t * j->x_stride, j->w->cols, flm_act_group(j->w), flm_act_qmax(j->w),
                         j->s->xq + (size_t)t * j->s->xq_stride, j->s->xs + (size_t)t * j->s->xs_stride);
}

/* The codes and scales of the n tokens' inputs to w, on the board's cores: one token's split within
 * it (flm_quantize_act_parallel), several tokens a share each. */
static PROFILED void quantize_all(flm_state *s, const flm_tensor *w, const float *x, uint32_t x_stride, uint32_t n) {
    if (n == 1u) {
        flm_quantize_act_parallel(x, w->cols, flm_act_group(w), flm_act_qmax(w), s->xq, s->xs);
        return;
    }
    quant_job j = {s, w, x, x_stride};
    hal_parallel(quantize_tokens, &j, n);
}

static void matmul(flm_state *s, const flm_tensor *w, const float *x, uint32_t x_stride, uint32_t n, float *out,
                   uint32_t out_stride, const rows_after *after, flm_step_stats *st) {
    quantize_all(s, w, x, x_stride, n);
    product(s, w, n, out, out_stride, after, st);
}

/* matmul of the same inputs x as the matmul of prev just before: their codes are reused when the
 * activation group and the largest code are the same (the same codes and scales: quantization
 * depends on x and these only). */
static void matmul_same_x(flm_state *s, const flm_tensor *w, const flm_tensor *prev, const float *x, uint32_t x_stride,
                          uint32_t n, float *out, uint32_t out_stride, const rows_after *after, flm_step_stats *st) {
    if (flm_act_group(w) != flm_act_group(prev) || flm_act_qmax(w) != flm_act_qmax(prev)) quantize_all(s, w, x, x_stride, n);
    product(s, w, n, out, out_stride, after, st);
}

/* Pairs [p0, p1) of the heads at v (head_dim / 2 = half pairs a head): pair p is (v[2p], v[2p + 1])
 * rotated by angle p % half of the position's RoPE row. */
static void rope_run(float *v, uint32_t p0, uint32_t p1, uint32_t half, const float *cos, const float *sin) {
    for (uint32_t p = p0, i = p0 % half; p < p1; p++) {
        const float a = v[2 * p], b = v[2 * p + 1];
        v[2 * p] = a * cos[i] - b * sin[i];
        v[2 * p + 1] = a * sin[i] + b * cos[i];
        if (++i == half) i = 0;
    }
}

/* The query's pairs then the key's of n tokens, [u0, u1) of their n * per (hal_parallel): per pairs
 * a token, nq of them the query's; token t's query and key at q and k + t * stride, its RoPE row at
 * cos and sin + t * half. */
typedef struct { float *q, *k; uint32_t nq, per, half, stride; const float *cos, *sin; } rope_job;

static void rope_pairs(void *ctx, uint32_t u0, uint32_t u1) {
    const rope_job *j = ctx;
    for (uint32_t t = u0 < j->per ? 0u : u0 / j->per, b = t * j->per; b < u1; t++, b += j->per) {   /* (a token: no division) */
        const uint32_t a = u0 > b ? u0 - b : 0u, z = u1 - b < j->per ? u1 - b : j->per;
        float *q = j->q + (size_t)t * j->stride, *k = j->k + (size_t)t * j->stride;
        const float *c = j->cos + (size_t)t * j->half, *sn = j->sin + (size_t)t * j->half;
        if (a < j->nq) rope_run(q, a, z < j->nq ? z : j->nq, j->half, c, sn);
        if (z > j->nq) rope_run(k, (a > j->nq ? a : j->nq) - j->nq, z - j->nq, j->half, c, sn);
    }
}

/* RoPE of n tokens' queries (n_heads heads) and keys (n_kv_heads), token t's at q and k + t * dim,
 * every pair independent: on the board's cores, one hand-over for the pass. */
static PROFILED void rope(const flm_model *m, float *q, float *k, const float *cos, const float *sin, uint32_t n) {
    const uint32_t half = m->head_dim / 2u, per = (m->n_heads + m->n_kv_heads) * half;
    rope_job j = {q, k, m->n_heads * half, per, half, m->dim, cos, sin};
    hal_parallel(rope_pairs, &j, n * per);
}

/* Row (layer l, position t, kv head h) of the K or V cache. */
static uint8_t *kv_at(const flm_state *s, uint8_t *base, uint32_t row_bytes, uint32_t l, uint32_t t, uint32_t h) {
    const flm_model *m = s->m;
    return base + (((size_t)l * m->seq_len + t) * m->n_kv_heads + h) * row_bytes;
}

static uint8_t *k_at(const flm_state *s, uint32_t l, uint32_t t, uint32_t h) { return kv_at(s, s->kc, s->k_row, l, t, h); }
static uint8_t *v_at(const flm_state *s, uint32_t l, uint32_t t, uint32_t h) { return kv_at(s, s->vc, s->v_row, l, t, h); }

/* Store one kv head's row x[head_dim] at row: copied (f32) or quantized like an activation with
 * group head_dim: f32 scale, then the codes (int8, or a k12 K row's int16 codes within +-2047). */
static void kv_row_put(const flm_model *m, uint8_t *row, const float *x, int k12) {
    const uint32_t hd = m->head_dim;
    if (m->kv_fmt == FLM_KV_F32) memcpy(row, x, hd * 4u);
    else if (k12) flm_quantize_act(x, hd, hd, FLM_QMAX_12, (flm_act *)(void *)(row + 4), (float *)(void *)row);
    else flm_quantize_i8(x, hd, hd, (int8_t *)(row + 4), (float *)(void *)row);
}

/* Store x[kv_dim] as the K (is_k) or V rows of every kv head at position t of layer l. */
static PROFILED void kv_put(const flm_state *s, uint32_t l, uint32_t t, const float *x, int is_k) {
    const flm_model *m = s->m;
    for (uint32_t h = 0; h < m->n_kv_heads; h++)
        kv_row_put(m, is_k ? k_at(s, l, t, h) : v_at(s, l, t, h), x + h * m->head_dim,
                   is_k && m->kv_fmt == FLM_KV_K12);
}

/* Tokens [t0, t1) of a pass's n: token t's row (x + t * stride) into the cache at position pos + t
 * (hal_parallel: each token's rows its own). */
typedef struct { const flm_state *s; uint32_t l, pos; const float *x; uint32_t stride; int is_k; } kv_job;

static void kv_tokens(void *ctx, uint32_t t0, uint32_t t1) {
    const kv_job *j = ctx;
    for (uint32_t t = t0; t < t1; t++) kv_put(j->s, j->l, j->pos + t, j->x + (size_t)t * j->stride, j->is_k);
}

/* kv_put of the n tokens of a pass whose rows are x + t * stride: a token alone on this core, several
 * on the board's cores. */
static void kv_put_all(const flm_state *s, uint32_t l, uint32_t pos, const float *x, uint32_t stride, uint32_t n,
                       int is_k) {
    if (n == 1u) {
        kv_put(s, l, pos, x, is_k);
        return;
    }
    kv_job j = {s, l, pos, x, stride, is_k};
    hal_parallel(kv_tokens, &j, n);
}

/* The bytes attention reads of one position's K and V rows (the codes, not the padding). */
static uint32_t kv_read_bytes(const flm_model *m) {
    const uint32_t hd = m->head_dim;
    return m->kv_fmt == FLM_KV_F32 ? 2u * hd * 4u : 8u + hd * (m->kv_fmt == FLM_KV_K12 ? 3u : 2u);
}

/* ---- int8 and k12 KV: integer attention (converter/numerics.py attend_int, docs/formats.md 1.2) ---- */

static float rdf32(const uint8_t *p) { return *(const float *)(const void *)p; }   /* a KV row's scale (aligned) */

/* The integer nearest to v (ties away from zero), v clamped to +-2^30, NaN 0: on the float's bits. */
static int32_t to_fixed(float v) {
    const uint32_t b = flm_f32_bits(v), mag = b & 0x7fffffffu;
    int32_t n;
    if (mag > 0x7f800000u || mag < 0x3f000000u) n = 0;          /* NaN, below 0.5 */
    else if (mag >= 0x4e800000u) n = 1 << 30;                   /* 2^30 and up (inf) */
    else n = (int32_t)((((mag << 8 | 0x80000000u) >> (157u - (mag >> 23))) + 1u) >> 1);
    return b >> 31 ? -n : n;
}

/* The integer nearest to w 2^-e (ties away) for a float w >= 0 whose quotient is at most 2^23; 0 for
 * an infinite or NaN w (a broken model's V scale), as the reference. */
static int32_t round_scaled(uint32_t wb, int32_t e) {
    if (wb >= 0x7f800000u) return 0;
    const uint32_t eb = wb >> 23, sig = eb ? (wb & 0x7fffffu) | 0x800000u : wb;
    const int32_t s = (int32_t)(eb ? eb : 1u) - 150 - e;       /* w 2^-e = sig 2^s */
    if (s >= 0) return (int32_t)(sig << s);
    return -s > 24 ? 0 : (int32_t)(((sig >> (-s - 1)) + 1u) >> 1);
}

/* E with 2^E the smallest power of two >= w 2^-k (w > 0 finite): frexp's exponent of w, less one
 * when w is a power of two, less k. */
static int32_t pow2_exp(uint32_t wb, int32_t k) {
    const uint32_t eb = wb >> 23, frac = wb & 0x7fffffu;
    if (eb) return (int32_t)eb - 126 - (frac == 0u) - k;
    int32_t e = -148;                                            /* subnormal: frac 2^-149 */
    for (uint32_t f = frac; f > 1u; f >>= 1) e++;
    return e - ((frac & (frac - 1u)) == 0u) - k;
}

static float pow2_f32(int32_t e) {
    if (e > 127) return flm_f32_from_bits(0x7f800000u);
    if (e >= -126) return flm_f32_from_bits((uint32_t)(e + 127) << 23);
    return e >= -149 ? flm_f32_from_bits(1u << (e + 149)) : 0.0f;
}

#define LOG2E_F 0x1.715476p+0f

/* Head h's output o[hd] from the layer's rows 0..pos of kv head kh. n (the core's scratch) holds
 * each position's score n_t, then w_t, then wc_t; o holds the integer sums until the last line. The
 * query's codes, in qc, are the K rows' kind: within +-127 against int8 K codes, +-2047 against k12's
 * int16 ones. */
static void attend_int_head(const flm_state *s, uint32_t l, uint32_t pos, uint32_t kh, const float *q, float kq,
                            int32_t *n, flm_act *qc, float *o) {
    const flm_model *m = s->m;
    const int k12 = m->kv_fmt == FLM_KV_K12;
    const uint32_t hd = m->head_dim, T = pos + 1u, rk = m->n_kv_heads * s->k_row, rs = m->n_kv_heads * s->v_row;
    const uint8_t *k = k_at(s, l, 0, kh), *v0 = v_at(s, l, 0, kh), *v = v0;   /* rk, rs: row t to t + 1 */
    int32_t *acc = (int32_t *)(void *)o;
    float qs;
    flm_quantize_act(q, hd, hd, k12 ? FLM_QMAX_12 : FLM_QMAX_8, qc, &qs);
    const float c = qs * kq;
    for (uint32_t t = 0; t < T; t += 2u, k += 2u * rk) {   /* two keys a pass: the query's codes read once */
        const int16_t *a = (const int16_t *)(const void *)(k + 4);
        int32_t d[2];
        if (k12 && t + 1u < T) flm_dot2_q12(a, (const int16_t *)(const void *)(k + rk + 4), qc, hd, d);
        else if (k12) d[0] = flm_dot_q12(a, qc, hd);
        else if (t + 1u < T) flm_dot2_q8((const int8_t *)(k + 4), (const int8_t *)(k + rk + 4), qc, hd, d);
        else d[0] = flm_dot_q8((const int8_t *)(k + 4), qc, hd);
        n[t] = to_fixed((float)d[0] * (rdf32(k) * c));
        if (t + 1u < T) n[t + 1u] = to_fixed((float)d[1] * (rdf32(k + rk) * c));
    }
    int32_t nmax = n[0];
    for (uint32_t t = 1; t < T; t++) nmax = n[t] > nmax ? n[t] : nmax;
    uint32_t psum = 0, wmax = 0;
    for (uint32_t t = 0; t < T; t++, v += rs) {   /* p_t = 2^((n_t - max) / 2^16) in Q15; w_t = p_t * vs_t */
        const int32_t dt = n[t] - nmax;
        const uint32_t f = (uint32_t)dt & 0xffffu, sh = 8u - (uint32_t)((dt - (int32_t)f) / 65536);
        const uint32_t p = sh < 24u ? flm_exp2_frac(f) >> sh : 0u;
        psum += p;
        const uint32_t wb = flm_f32_bits((float)p * rdf32(v));
        n[t] = (int32_t)wb;
        if (wb > wmax && wb < 0x7f800000u) wmax = wb;
    }
    if (wmax == 0u) {   /* every weight 0 (V rows of zeros) */
        memset(o, 0, hd * 4u);
        return;
    }
    uint32_t bits = 0;
    for (uint32_t t = T; t; t >>= 1) bits++;
    const int32_t E = pow2_exp(wmax, 24 - (int32_t)bits);      /* sum_t wc_t * 127 < 2^31 */
    memset(acc, 0, hd * 4u);
    v = v0;
    for (uint32_t t = 0; t < T; t++, v += rs) flm_axpy_q8(acc, (const int8_t *)(v + 4), round_scaled((uint32_t)n[t], E), hd);
    const float c2 = (1.0f / (float)psum) * pow2_f32(E);
    for (uint32_t i = 0; i < hd; i++) o[i] = (float)acc[i] * c2;
}

/* Head h's output o[hd] from the layer's f32 rows 0..pos of kv head kh; att (the core's scratch)
 * holds the scores, then the weights. */
static void attend_f32_head(const flm_state *s, uint32_t l, uint32_t pos, uint32_t kh, const float *q, float scale,
                            float *att, float *o) {
    const uint32_t hd = s->m->head_dim;
    float mx = 0.0f;
    for (uint32_t t = 0; t <= pos; t++) {
        const float d = flm_dot_f32(q, (const float *)(const void *)k_at(s, l, t, kh), hd) * scale;
        att[t] = d;
        if (t == 0 || d > mx) mx = d;
    }
    float sum = 0.0f;
    for (uint32_t t = 0; t <= pos; t++) {
        float e = flm_expf(att[t] - mx);
        att[t] = e;
        sum = t == 0 ? e : sum + e;
    }
    float inv = 1.0f / sum;
    for (uint32_t t = 0; t <= pos; t++) att[t] = att[t] * inv;
    for (uint32_t t = 0; t <= pos; t++) {
        const float *v = (const float *)(const void *)v_at(s, l, t, kh);
        const float a = att[t];
        if (t == 0) for (uint32_t i = 0; i < hd; i++) o[i] = a * v[i];
        else flm_axpy_f32(o, a, v, hd);
    }
}

/* Heads [h0, h1) of one token's attention (hal_parallel): the range from head 0 on the first of the
 * two scratch areas at s->att (att_scratch_bytes each), any other on the second. */
typedef struct { const flm_state *s; uint32_t l, pos; const float *qv; float *out; } att_job;

static void attend_heads(void *ctx, uint32_t h0, uint32_t h1) {
    const att_job *j = ctx;
    const flm_model *m = j->s->m;
    const uint32_t hd = m->head_dim, rep = m->n_heads / m->n_kv_heads;
    const float scale = 1.0f / flm_sqrtf((float)hd);
    uint8_t *scratch = (uint8_t *)(void *)j->s->att + (h0 ? att_scratch_bytes(m) : 0u);
    float *att = (float *)(void *)scratch;
    flm_act *qc = (flm_act *)(void *)(scratch + up8((size_t)m->seq_len * 4u));
    for (uint32_t h = h0; h < h1; h++) {
        const float *q = j->qv + h * hd;
        float *o = j->out + h * hd;
        if (m->kv_fmt == FLM_KV_F32) attend_f32_head(j->s, j->l, j->pos, h / rep, q, scale, att, o);
        else attend_int_head(j->s, j->l, j->pos, h / rep, q, (scale * LOG2E_F) * 65536.0f, (int32_t *)(void *)att, qc, o);
    }
}

/* One token's attention: its query qv [n_heads * head_dim] against positions 0..pos, into out; the
 * heads are independent: on the board's cores. */
static PROFILED void attention(flm_state *s, uint32_t l, uint32_t pos, const float *qv, float *out, flm_step_stats *st) {
    const att_job j = {s, l, pos, qv, out};
    hal_parallel(attend_heads, (void *)&j, s->m->n_heads);
    st->bytes[s->kv_tier] += s->m->n_heads * (pos + 1u) * kv_read_bytes(s->m);
}

void flm_slide(flm_state *s, uint32_t n_drop, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t hd = m->head_dim, moved = m->seq_len - 1u - n_drop;
    const int q = m->kv_fmt != FLM_KV_F32, k12 = m->kv_fmt == FLM_KV_K12;
    const uint32_t k_read = q ? 4u + hd * (k12 ? 2u : 1u) : hd * 4u;   /* a K row's scale and codes */
    uint64_t t0 = hal_time_us();
    /* the rotation by -n_drop: RoPE row n_drop, read once */
    memcpy(s->cos, m->rope_cos.data + (size_t)n_drop * hd / 2u * 4u, hd / 2u * 4u);
    memcpy(s->sin, m->rope_sin.data + (size_t)n_drop * hd / 2u * 4u, hd / 2u * 4u);
    st->bytes[m->rope_cos.tier] += hd / 2u * 4u;
    st->bytes[m->rope_sin.tier] += hd / 2u * 4u;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        for (uint32_t t = 1u + n_drop; t < m->seq_len; t++) {   /* ascending: a row moves before it is overwritten */
            for (uint32_t h = 0; h < m->n_kv_heads; h++) {
                const uint8_t *src = k_at(s, l, t, h);
                uint8_t *dst = k_at(s, l, t - n_drop, h);
                float *k = q ? s->xb2 : (float *)(void *)dst;
                const float *from = (const float *)(const void *)src;
                if (q) {   /* dequantize: code * scale */
                    const float sc = rdf32(src);
                    for (uint32_t i = 0; i < hd; i++)
                        k[i] = (float)(k12 ? ((const int16_t *)(const void *)(src + 4))[i] : ((const int8_t *)(src + 4))[i]) * sc;
                    from = k;
                }
                for (uint32_t i = 0; i < hd / 2u; i++) {
                    const float a = from[2 * i], b = from[2 * i + 1], c = s->cos[i], sn = s->sin[i];
                    k[2 * i] = a * c + b * sn;
                    k[2 * i + 1] = b * c - a * sn;
                }
                if (q) kv_row_put(m, dst, k, k12);
            }
        }
        memmove(v_at(s, l, 1u, 0), v_at(s, l, 1u + n_drop, 0), (size_t)moved * m->n_kv_heads * s->v_row);
    }
    st->bytes[s->kv_tier] += m->n_layers * moved * m->n_kv_heads * (k_read + s->v_row);
    st->us[FLM_PH_ATTN] += (uint32_t)(hal_time_us() - t0);
}

/* PLE, before layer 0: u_l = (rmsnorm((ple.proj x) * inv_sqrt_d)[l] + T[t][l] * sqrt_P) * inv_sqrt2
 * for every layer l and every token of the pass (converter/reference.py Reference.ple_inputs). The
 * table rows are read in place from their tier (flash: the firmware never stages ple.table), one row
 * of row_stride bytes per token. */
static void ple_inputs(flm_state *s, const uint32_t *tokens, uint32_t n, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t P = m->ple_dim, lp = m->n_layers * P;
    const float inv_sqrt_d = 1.0f / flm_sqrtf((float)m->dim), sqrt_p = flm_sqrtf((float)P);
    const float inv_sqrt2 = 1.0f / flm_sqrtf(2.0f);
    matmul(s, &m->ple_proj, s->x, m->dim, n, s->pu, lp, 0, st);
    for (uint32_t i = 0; i < n * lp; i++) s->pu[i] = s->pu[i] * inv_sqrt_d;
    for (uint32_t l = 0; l < m->n_layers; l++) rmsnorm(s->pu + l * P, s->pu + l * P, lp, &m->ple_norm, P, n, 0, m->eps, st);
    for (uint32_t t = 0; t < n; t++) {
        flm_dequant_row(&m->ple_table, tokens[t], s->pt);
        st->bytes[m->ple_table.tier] += m->ple_table.stride;
        float *u = s->pu + (size_t)t * lp;
        for (uint32_t i = 0; i < lp; i++) u[i] = (u[i] + s->pt[i] * sqrt_p) * inv_sqrt2;
    }
}

/* PLE, after layer l's FFN: x += rmsnorm(ple.proj (gelu(ple.gate x) * u_l)), for every token. */
static void ple_block(flm_state *s, uint32_t l, uint32_t n, flm_step_stats *st) {
    const flm_model *m = s->m;
    const flm_layer *L = &m->layers[l];
    const uint32_t P = m->ple_dim, lp = m->n_layers * P, dim = m->dim;
    matmul(s, &L->ple_gate, s->x, dim, n, s->pt, P, 0, st);
    for (uint32_t t = 0; t < n; t++) {
        const float *u = s->pu + (size_t)t * lp + l * P;
        float *g = s->pt + (size_t)t * P;
        for (uint32_t i = 0; i < P; i++) g[i] = flm_gelu(g[i]) * u[i];
    }
    matmul(s, &L->ple_proj, s->pt, P, n, s->xb, dim, 0, st);
    rmsnorm(s->xb, s->xb, dim, &L->ple_norm, dim, n, 0, m->eps, st);
    add_into(s->x, s->xb, n * dim);
}

/* The dense FFN, or one expert (f), for the n tokens whose normed inputs are x [n][dim]: w2 (silu(w1 x) *
 * w3 x) into out [n][dim], then tail on out's rows (or 0: none); the gate's SiLU and the product with
 * w3's each on a product's output rows too (hal_matmul_each); after: the product after w2's where it
 * is certain (hal_matmul_then), or 0. */
static void swiglu(flm_state *s, const flm_ffn *f, const float *x, uint32_t n, float *out, const rows_after *tail,
                   const flm_tensor *after, flm_step_stats *st) {
    const flm_model *m = s->m;
    /* one token: the SiLU on w1's rows, its product on w3's; a pass (n > 1), whose products have no
     * wait for the flash to fill, both on w3's rows in one pass */
    rows_job h = {s->hb, s->hb2, m->hidden, n};
    const rows_after silu = {silu_rows, &h}, mul = {n > 1u ? silu_mul_rows : mul_rows, &h};
    hal_matmul_then(&f->w3);
    matmul(s, &f->w1, x, m->dim, n, s->hb, m->hidden, n > 1u ? 0 : &silu, st);
    hal_matmul_then(&f->w2);
    matmul_same_x(s, &f->w3, &f->w1, x, m->dim, n, s->hb2, m->hidden, &mul, st);
    if (after) hal_matmul_then(after);
    matmul(s, &f->w2, s->hb, m->hidden, n, out, m->dim, tail, st);
}

const uint8_t *flm_route(const flm_state *s, uint32_t l, uint32_t i) {
    return s->routes + ((size_t)l * s->m->batch + i) * s->m->top_k;
}

/* Layer l's router for the n tokens of xb (converter/numerics.py route): logits r_e = the f32 dot of
 * router row e and the token's input; the top k, largest first, ties to the lowest index (the float
 * order's comparison: a NaN never wins); their weights, the softmax over the chosen logits
 * e_j = exp(r_j - r_0), w_j = e_j * (1 / (e_0 + e_1 + ...)). The router's f32 rows are read in place,
 * once per token (a few hundred bytes a row: no copy into the row buffer). */
static PROFILED void route(flm_state *s, uint32_t l, uint32_t n, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t E = m->n_experts, k = m->top_k;
    const flm_tensor *R = &m->layers[l].router;
    for (uint32_t t = 0; t < n; t++) {
        uint8_t *c = (uint8_t *)flm_route(s, l, t);
        float *w = s->mweight + t * k;
        for (uint32_t e = 0; e < E; e++)
            s->mlogit[e] = flm_dot_f32((const float *)(const void *)(R->data + (size_t)e * R->stride),
                                       s->xb + (size_t)t * m->dim, m->dim);
        uint64_t used = 0;    /* bit e: expert e is chosen (E <= 64) */
        for (uint32_t j = 0; j < k; j++) {
            uint32_t best = E;
            for (uint32_t e = 0; e < E; e++)
                if (!(used >> e & 1u) && (best == E || flm_f32_gt(s->mlogit[e], s->mlogit[best]))) best = e;
            used |= (uint64_t)1 << best;
            c[j] = (uint8_t)best;
        }
        float sum = 0.0f;
        for (uint32_t j = 0; j < k; j++) {
            w[j] = flm_expf(s->mlogit[c[j]] - s->mlogit[c[0]]);
            sum = j == 0 ? w[j] : sum + w[j];
        }
        const float inv = 1.0f / sum;
        for (uint32_t j = 0; j < k; j++) w[j] = w[j] * inv;
    }
    st->bytes[R->tier] += n * R->length;
}

/* A mixture-of-experts FFN for the pass's n tokens (normed inputs in xb; converter/reference.py
 * Reference.experts): route every token, then expert by expert in index order the tokens routed to it
 * together — their inputs gathered into xb2, the expert's rows read once for all of them (only the
 * chosen experts' rows are read), outputs into q — each token's weighted output added to its sum in
 * macc (the first term alone, then + each next); then x += the sum. */
static void experts(flm_state *s, uint32_t l, uint32_t n, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t dim = m->dim, k = m->top_k;
    uint8_t *sel = s->msel, *rank = s->msel + m->batch;   /* the tokens routed to an expert, its rank in each */
    route(s, l, n, st);
    for (uint32_t e = 0; e < m->n_experts; e++) {
        uint32_t ne = 0;
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < k; j++)
                if (flm_route(s, l, t)[j] == e) { sel[ne] = (uint8_t)t; rank[ne++] = (uint8_t)j; }
        if (!ne) continue;
        for (uint32_t i = 0; i < ne; i++) memcpy(s->xb2 + (size_t)i * dim, s->xb + (size_t)sel[i] * dim, dim * 4u);
        swiglu(s, &m->layers[l].ffn[e], s->xb2, ne, s->q, 0, 0, st);
        for (uint32_t i = 0; i < ne; i++) {
            const uint8_t *c = flm_route(s, l, sel[i]);
            const float w = s->mweight[sel[i] * k + rank[i]], *y = s->q + (size_t)i * dim;
            float *a = s->macc + (size_t)sel[i] * dim;
            uint32_t first = 1;   /* e is the token's lowest expert: its sum starts here */
            for (uint32_t j = 0; j < k; j++) first &= c[j] >= e;
            if (first) for (uint32_t d = 0; d < dim; d++) a[d] = w * y[d];
            else for (uint32_t d = 0; d < dim; d++) a[d] = a[d] + w * y[d];
        }
    }
    add_into(s->x, s->macc, n * dim);
}

void flm_body_many(flm_state *s, const uint32_t *tokens, uint32_t n, uint32_t pos, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t dim = m->dim, hd = m->head_dim, half = hd / 2u;
    uint64_t t0 = hal_time_us();

    s->n_tok = n;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t row = tokens[t];
        if (m->tied && m->n_tiles) {   /* the head's rows are stored in tile order: the token -> row map */
            row = flm_head_map(m, 1, row);
            st->bytes[m->head_tiles.tier] += m->map_bytes;
        }
        flm_dequant_row(&m->tok_emb, row, s->x + (size_t)t * dim);
        st->bytes[m->tok_emb.tier] += m->tok_emb.stride;
    }
    if (m->ple_dim) ple_inputs(s, tokens, n, st);
    uint64_t t1 = hal_time_us();
    st->us[FLM_PH_EMBED] += (uint32_t)(t1 - t0);

    /* these positions' RoPE rows (consecutive in the tables), read once */
    memcpy(s->cos, m->rope_cos.data + (size_t)pos * half * 4u, (size_t)n * half * 4u);
    memcpy(s->sin, m->rope_sin.data + (size_t)pos * half * 4u, (size_t)n * half * 4u);
    st->bytes[m->rope_cos.tier] += n * half * 4u;
    st->bytes[m->rope_sin.tier] += n * half * 4u;

    for (uint32_t l = 0; l < m->n_layers; l++) {
        const flm_layer *L = &m->layers[l];
        /* after a dense FFN (no PLE) xb holds x's squares: made with the residual on w2's rows */
        rmsnorm(s->xb, s->x, dim, &L->attn_norm, dim, n, l && !m->n_experts && !m->ple_dim, m->eps, st);
        hal_matmul_then(&L->wv);
        matmul(s, &L->wq, s->xb, dim, n, s->q, dim, 0, st);
        /* v, then k, pass through scratch into the cache (an integer KV quantizes into its rows, not xq) */
        hal_matmul_then(&L->wk);
        matmul_same_x(s, &L->wv, &L->wq, s->xb, dim, n, s->xb2, dim, 0, st);
        kv_put_all(s, l, pos, s->xb2, dim, n, 0);
        hal_matmul_then(&L->wo);
        matmul_same_x(s, &L->wk, &L->wv, s->xb, dim, n, s->xb2, dim, 0, st);
        rope(m, s->q, s->xb2, s->cos, s->sin, n);
        kv_put_all(s, l, pos, s->xb2, dim, n, 1);   /* read only in attention */
        /* in order, causal: token t reads the rows of positions up to its own (its K row was stored
         * above); its output replaces its K values in xb2, which the cache holds now */
        for (uint32_t t = 0; t < n; t++) attention(s, l, pos + t, s->q + (size_t)t * dim, s->xb2 + (size_t)t * dim, st);
        if (!m->n_experts) hal_matmul_then(&L->ffn[0].w1);   /* the dense FFN's w1 follows wo */
        rows_job res = {s->x, s->xb, dim, n};   /* the residual and the next norm's squares, on wo's output rows */
        rows_after add = {add_sq_rows, &res};
        matmul(s, &L->wo, s->xb2, dim, n, s->xb, dim, &add, st);
        uint64_t t2 = hal_time_us();
        st->us[FLM_PH_ATTN] += (uint32_t)(t2 - t1);

        rmsnorm(s->xb, s->x, dim, &L->ffn_norm, dim, n, 1, m->eps, st);
        if (m->n_experts) {
            experts(s, l, n, st);
        } else {
            /* the next layer's wq follows w2 (PLE's gate would come between), and its norm's squares are
             * made with the residual */
            const int next = l + 1u < m->n_layers && !m->ple_dim;
            add.fn = next ? add_sq_rows : add_rows;
            swiglu(s, &L->ffn[0], s->xb, n, s->xb, &add, next ? &m->layers[l + 1u].wq : 0, st);
        }
        t1 = hal_time_us();
        st->us[FLM_PH_FFN] += (uint32_t)(t1 - t2);

        if (m->ple_dim) {
            ple_block(s, l, n, st);
            t2 = hal_time_us();
            st->us[FLM_PH_PLE] += (uint32_t)(t2 - t1);
            t1 = t2;
        }
    }
}

void flm_body(flm_state *s, uint32_t token, uint32_t pos, flm_step_stats *st) { flm_body_many(s, &token, 1u, pos, st); }

/* The final RMSNorm of the pass's tokens first..first+n-1, quantized for the head: token i's codes
 * and scales at its strides in s->xq / s->xs. */
static void head_input(flm_state *s, uint32_t first, uint32_t n, flm_step_stats *st) {
    const flm_model *m = s->m;
    rmsnorm(s->xb, s->x + (size_t)first * m->dim, m->dim, &m->norm, m->dim, n, 0, m->eps, st);
    quantize_all(s, &m->head, s->xb, m->dim, n);
}

/* Every head row for the n tokens of head_input, each head row read once for all: token i's logits
 * at s->logits + i * n_out, in token order (with a head index the rows are stored in tile order, so
 * each token's go through s->probs and the row -> token map). */
static void whole_head(flm_state *s, uint32_t n, flm_step_stats *st) {
    const flm_model *m = s->m;
    product(s, &m->head, n, s->logits, m->n_out, 0, st);
    if (m->n_tiles) {
        for (uint32_t t = 0; t < n; t++) {
            float *lg = s->logits + (size_t)t * m->n_out;
            memcpy(s->probs, lg, m->n_out * 4u);
            for (uint32_t i = 0; i < m->n_out; i++) lg[flm_head_map(m, 0, i)] = s->probs[i];
        }
        st->bytes[m->head_tiles.tier] += n * m->n_out * m->map_bytes;
    }
    st->head_rows = m->n_out;
}

/* flm_head (the pass's last token) and flm_head_all (every token). */
static const float *head_logits(flm_state *s, uint32_t first, uint32_t n, flm_step_stats *st) {
    uint64_t t0 = hal_time_us();
    head_input(s, first, n, st);
    whole_head(s, n, st);
    st->us[FLM_PH_OUTPUT] += (uint32_t)(hal_time_us() - t0);
    return s->logits;
}

const float *flm_head(flm_state *s, flm_step_stats *st) { return head_logits(s, s->n_tok - 1u, 1u, st); }

const float *flm_head_all(flm_state *s, flm_step_stats *st) { return head_logits(s, 0u, s->n_tok, st); }

/* The first maximum of v[0..n): a NaN first stays (every comparison with it fails), a later NaN
 * never wins. */
static uint32_t first_max(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (flm_f32_gt(v[i], v[best])) best = i;
    return best;
}

/* Rows [a, z) of w: a view of just those rows. */
static flm_tensor rows_view(const flm_tensor *w, uint32_t a, uint32_t z) {
    flm_tensor v = *w;
    v.data = w->data + (size_t)a * w->stride;
    v.rows = z - a;
    v.length = (z - a) * w->stride;
    return v;
}

/* Rows [a, z) of w for the pass's last token into out[a, z): hal_matmul on a view of just those
 * rows, so a board that splits a product's rows across its cores splits a tile too (rows are
 * independent: bit for bit flm_matvec_rows). */
static void tile_rows(flm_state *s, const flm_tensor *w, uint32_t a, uint32_t z, float *out) {
    const flm_tensor v = rows_view(w, a, z);
    const flm_batch b = {1u, s->xq, s->xs, out + a, s->xq_stride, s->xs_stride, 0u};
    hal_matmul(&v, &b, s->row_buf, s->row_buf_bytes);
}

/* Tile t is skipped by the scan once best is known: its bound is finite and below best (best
 * only grows, so a tile skipped now stays skipped). */
static int tile_skipped(const flm_state *s, uint32_t t, float best) {
    return flm_f32_finite(s->probs[t]) && flm_f32_gt(best, s->probs[t]);
}

/* The scan's next product where it is certain before step k's tile c is computed (hal_matmul_then,
 * which reads what it names): the first tile from k on in stored order that is not the first one and
 * not skipped with best as it stands (best only grows; at step 0 it is not known yet), if best cannot
 * grow past that tile's bound U_t: c's logits are at most U_c, so best after c is at most
 * max(best, U_c), and best <= U_t already (not skipped) or is c's (step 0). An unbounded U_t is
 * visited whatever best is; an unbounded U_c bounds nothing. */
static void tile_ahead(const flm_state *s, uint32_t k, uint32_t c, uint32_t first, float best) {
    const flm_model *m = s->m;
    const uint32_t nt = m->n_tiles;
    const float *U = s->probs;
    for (uint32_t t = k; t < nt; t++) {
        if (t == first || (k && tile_skipped(s, t, best))) continue;
        if (flm_f32_finite(U[t]) && (!flm_f32_finite(U[c]) || flm_f32_gt(U[c], U[t]))) return;
        const flm_tensor v = rows_view(&m->head, s->idx[t], t + 1u < nt ? s->idx[t + 1u] : m->n_out);
        hal_matmul_then(&v);
        return;
    }
}

/* The tile scan (docs/formats.md section 3): U_t = C_t + R_t * Xm for every tile (C_t its centre
 * row's logit), then the tile of the largest U, then every other tile in stored order unless
 * U_t < best (U_t finite). A visited tile is a contiguous run of stored rows, computed as one block;
 * its rows' tokens come from the row -> token map, and the best row is the largest logit, the lowest
 * token among equal ones (flm_f32_gt/eq: the float comparisons, on the bits where there is no FPU).
 * Returns the token; head_rows = the rows visited. */
static uint32_t tile_scan(flm_state *s, float xm, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t nt = m->n_tiles, n = m->n_out, mb = m->map_bytes;
    const uint8_t *rec = m->head_tiles.data + 32u, *perm = rec + 8u * nt;
    product(s, &m->head_centroids, 1u, s->probs, 0u, 0, st);
    uint32_t first = 0;
    for (uint32_t t = 0; t < nt; t++) {   /* U into probs, each tile's first row into idx: records read once */
        float r;
        memcpy(&r, rec + 8u * t + 4u, 4);
        s->idx[t] = flm_rd32(rec + 8u * t);
        s->probs[t] = s->probs[t] + r * xm;
        if (flm_f32_gt(s->probs[t], s->probs[first])) first = t;
    }
    st->bytes[m->head_tiles.tier] += 8u * nt;
    float best = 0.0f;
    uint32_t tok = 0, rows = 0;
    for (uint32_t k = 0; k <= nt; k++) {
        const uint32_t t = k ? k - 1u : first;
        /* skipped only on a finite bound (an overflowed one proves nothing) */
        if (k && (t == first || tile_skipped(s, t, best))) continue;
        const uint32_t a = s->idx[t], z = t + 1u < nt ? s->idx[t + 1u] : n;
        tile_ahead(s, k, t, first, best);
        tile_rows(s, &m->head, a, z, s->logits);   /* logits indexed by stored row here */
        for (uint32_t i = a; i < z; i++) {
            const uint8_t *p = perm + mb * i;
            const uint32_t tk = mb == 2u ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : flm_rd32(p);
            const float lg = s->logits[i];
            if ((!rows && i == a) || flm_f32_gt(lg, best) || (flm_f32_eq(lg, best) && tk < tok)) {
                best = lg;
                tok = tk;
            }
        }
        rows += z - a;
    }
    st->head_rows = rows;
    st->bytes[m->head.tier] += rows * m->head.stride;
    st->bytes[m->head_tiles.tier] += rows * mb;
    return tok;
}

uint32_t flm_head_argmax(flm_state *s, flm_step_stats *st) {
    const flm_model *m = s->m;
    const flm_tensor *w = &m->head;
    uint64_t t0 = hal_time_us();
    uint32_t tok;
    head_input(s, s->n_tok - 1u, 1u, st);
    /* X2 = fold over groups of float(sum xq^2) * (xs * xs): ||x||^2 of the quantized input (one group
     * for a row-scaled head) */
    const uint32_t ag = flm_act_group(w);
    float x2 = 0.0f;
    for (uint32_t k = 0, gi = 0; m->n_tiles && k < w->cols; k += ag, gi++) {
        const uint32_t len = w->cols - k < ag ? w->cols - k : ag;
        int64_t sq = 0;   /* 12-bit codes: 2047^2 * cols exceeds an int32 from 513 columns on */
        for (uint32_t i = 0; i < len; i++) sq += (int32_t)s->xq[k + i] * (int32_t)s->xq[k + i];
        const float t = flm_i64_to_f32(sq) * (s->xs[gi] * s->xs[gi]);
        x2 = gi == 0 ? t : x2 + t;
    }
    if (m->n_tiles && x2 >= PRUNE_FLOOR) {
        tok = tile_scan(s, flm_sqrtf(x2) * PRUNE_MARGIN, st);
    } else {   /* no index, or an input too small for the bounds: every row */
        whole_head(s, 1u, st);
        tok = first_max(s->logits, m->n_out);
    }
    st->us[FLM_PH_OUTPUT] += (uint32_t)(hal_time_us() - t0);
    return tok;
}
