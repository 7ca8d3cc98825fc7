#include "engine.h"
#include "flm_math.h"
#include "hal.h"
#include "kernels.h"
#include <string.h>

static size_t up8(size_t n) { return (n + 7u) & ~(size_t)7u; }

/* Exact pruning of the greedy head by its tiles (docs/formats.md section 3; converter/headprune.py). */
#define PRUNE_MARGIN 0x1.02p+0f      /* 1 + 2^-7: Xm >= ||x|| (1 + 2^-8) after every rounding */
#define PRUNE_FLOOR 0x1p-64f         /* below it no tile is skipped: no underflow can matter */

static uint32_t kv_row_bytes(const flm_model *m) {
    return m->kv_fmt == FLM_KV_INT8 ? 4u + ((m->head_dim + 3u) & ~3u) : m->head_dim * 4u;
}

typedef struct { uint8_t *p; size_t used, cap; } carver;

static void *carve(carver *c, size_t bytes) {
    void *r = c->p ? c->p + c->used : 0;
    c->used += up8(bytes);
    return r;
}

/* Carves the regions; base[r] == 0 only measures. Returns region r's size in *size[r]. */
static void layout(flm_state *s, const flm_model *m, uint8_t *const base[FLM_N_REGIONS], size_t size[FLM_N_REGIONS]) {
    carver sc = {base[FLM_REG_SCRATCH], 0, 0}, lg = {base[FLM_REG_LOGITS], 0, 0}, kvc = {base[FLM_REG_KV], 0, 0};
    uint32_t wide = m->dim > m->hidden ? m->dim : m->hidden;   /* longest matmul input */
    if (m->ple_dim > wide) wide = m->ple_dim;
    size_t kv = (size_t)m->n_layers * m->seq_len * m->n_kv_heads * kv_row_bytes(m);
    size_t ple = (size_t)m->n_layers * m->ple_dim * 4u;
    s->x = carve(&sc, m->dim * 4u);
    s->xb = carve(&sc, m->dim * 4u);
    s->xb2 = carve(&sc, m->dim * 4u);
    s->q = carve(&sc, m->dim * 4u);
    s->att = carve(&sc, m->seq_len * 4u);
    s->hb = carve(&sc, m->hidden * 4u);
    s->hb2 = carve(&sc, m->hidden * 4u);
    s->cos = carve(&sc, m->head_dim / 2u * 4u);
    s->sin = carve(&sc, m->head_dim / 2u * 4u);
    s->pu = carve(&sc, ple);
    s->pt = carve(&sc, ple);
    s->xq = carve(&sc, wide * 2u);   /* flm_act codes: 2 bytes on SIMD cores, room for them everywhere */
    s->xs = carve(&sc, (wide / m->min_group + 1u) * 4u);   /* activation scales: one per group */
    s->logits = carve(&lg, m->n_out * 4u);
    s->probs = carve(&lg, m->n_out * 4u);
    s->idx = carve(&lg, m->n_out * 4u);
    s->kc = carve(&kvc, kv);
    s->vc = carve(&kvc, kv);
    s->kv_row = kv_row_bytes(m);
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

static void rmsnorm(float *o, const float *x, const flm_tensor *w, uint32_t n, float eps, flm_step_stats *st) {
    const float *g = (const float *)(const void *)w->data;
    float ss = flm_dot_f32(x, x, n);
    ss = ss / (float)n + eps;
    float inv = 1.0f / flm_sqrtf(ss);
    for (uint32_t i = 0; i < n; i++) o[i] = (x[i] * inv) * g[i];
    st->bytes[w->tier] += n * 4u;
}

static void matvec(flm_state *s, const flm_tensor *w, const float *x, float *out, flm_step_stats *st) {
    flm_quantize_act(x, w->cols, flm_act_group(w), s->xq, s->xs);
    hal_matvec(w, s->xq, s->xs, out);
    st->bytes[w->tier] += w->length;
}

/* matvec of the same input x as the matvec of prev just before: its codes are reused when the
 * activation group is the same (the same codes and scales: quantization depends on x and it only). */
static void matvec_same_x(flm_state *s, const flm_tensor *w, const flm_tensor *prev, const float *x, float *out,
                          flm_step_stats *st) {
    if (flm_act_group(w) != flm_act_group(prev)) flm_quantize_act(x, w->cols, flm_act_group(w), s->xq, s->xs);
    hal_matvec(w, s->xq, s->xs, out);
    st->bytes[w->tier] += w->length;
}

static void rope(float *v, uint32_t n_heads, uint32_t hd, const float *cos, const float *sin) {
    for (uint32_t h = 0; h < n_heads; h++) {
        float *p = v + h * hd;
        for (uint32_t i = 0; i < hd / 2u; i++) {
            float a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = a * cos[i] - b * sin[i];
            p[2 * i + 1] = a * sin[i] + b * cos[i];
        }
    }
}

/* Row (layer l, position t, kv head h) of the K (base = kc) or V (base = vc) cache. */
static uint8_t *kv_at(const flm_state *s, uint8_t *base, uint32_t l, uint32_t t, uint32_t h) {
    const flm_model *m = s->m;
    return base + (((size_t)l * m->seq_len + t) * m->n_kv_heads + h) * s->kv_row;
}

/* Store v[kv_dim] as the rows of every kv head at row0: copied (f32) or quantized like an
 * activation with group head_dim: f32 scale, then the codes (int8). */
static void kv_put(const flm_state *s, uint8_t *row0, const float *v) {
    const flm_model *m = s->m;
    const uint32_t hd = m->head_dim;
    for (uint32_t h = 0; h < m->n_kv_heads; h++) {
        uint8_t *row = row0 + h * s->kv_row;
        if (m->kv_fmt == FLM_KV_INT8) flm_quantize_i8(v + h * hd, hd, hd, (int8_t *)(row + 4), (float *)(void *)row);
        else memcpy(row, v + h * hd, hd * 4u);
    }
}

/* ---- int8 KV: integer attention (converter/reference.py attend_int8, docs/formats.md 1.2) ---- */

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

/* Head h's output o[hd] from the layer's rows 0..pos of kv head kh. s->att holds each position's
 * score n_t, then w_t, then wc_t; o holds the integer sums until the last line. */
static void attend_int8_head(flm_state *s, uint32_t l, uint32_t pos, uint32_t kh, const float *q, float kq, float *o) {
    const flm_model *m = s->m;
    const uint32_t hd = m->head_dim, T = pos + 1u, rs = m->n_kv_heads * s->kv_row;   /* row t to t + 1 */
    const uint8_t *k0 = kv_at(s, s->kc, l, 0, kh), *v0 = kv_at(s, s->vc, l, 0, kh), *k = k0, *v = v0;
    int32_t *n = (int32_t *)(void *)s->att, *acc = (int32_t *)(void *)o;
    float qs;
    flm_quantize_act(q, hd, hd, s->xq, &qs);
    const float c = qs * kq;
    for (uint32_t t = 0; t < T; t += 2u, k += 2u * rs) {   /* two keys a pass: the query's codes read once */
        int32_t d[2];
        if (t + 1u < T) flm_dot2_q8((const int8_t *)(k + 4), (const int8_t *)(k + rs + 4), s->xq, hd, d);
        else d[0] = flm_dot_q8((const int8_t *)(k + 4), s->xq, hd);
        n[t] = to_fixed((float)d[0] * (rdf32(k) * c));
        if (t + 1u < T) n[t + 1u] = to_fixed((float)d[1] * (rdf32(k + rs) * c));
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

static void attention(flm_state *s, uint32_t l, uint32_t pos, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t hd = m->head_dim, rep = m->n_heads / m->n_kv_heads;
    const int i8 = m->kv_fmt == FLM_KV_INT8;
    const float scale = 1.0f / flm_sqrtf((float)hd);
    for (uint32_t h = 0; h < m->n_heads; h++) {
        const float *q = s->q + h * hd;
        const uint32_t kh = h / rep;
        float *o = s->xb2 + h * hd;
        /* per row the engine reads: f32 the values; int8 the scale and the codes (not the padding) */
        st->bytes[s->kv_tier] += 2u * (pos + 1u) * (i8 ? 4u + hd : hd * 4u);
        if (i8) {
            attend_int8_head(s, l, pos, kh, q, (scale * LOG2E_F) * 65536.0f, o);
            continue;
        }
        float mx = 0.0f;
        for (uint32_t t = 0; t <= pos; t++) {
            const float d = flm_dot_f32(q, (const float *)(const void *)kv_at(s, s->kc, l, t, kh), hd) * scale;
            s->att[t] = d;
            if (t == 0 || d > mx) mx = d;
        }
        float sum = 0.0f;
        for (uint32_t t = 0; t <= pos; t++) {
            float e = flm_expf(s->att[t] - mx);
            s->att[t] = e;
            sum = t == 0 ? e : sum + e;
        }
        float inv = 1.0f / sum;
        for (uint32_t t = 0; t <= pos; t++) s->att[t] = s->att[t] * inv;
        for (uint32_t t = 0; t <= pos; t++) {
            const float *v = (const float *)(const void *)kv_at(s, s->vc, l, t, kh);
            const float a = s->att[t];
            if (t == 0) for (uint32_t i = 0; i < hd; i++) o[i] = a * v[i];
            else flm_axpy_f32(o, a, v, hd);
        }
    }
}

void flm_slide(flm_state *s, uint32_t n_drop, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t hd = m->head_dim, moved = m->seq_len - 1u - n_drop;
    const int i8 = m->kv_fmt == FLM_KV_INT8;
    uint64_t t0 = hal_time_us();
    /* the rotation by -n_drop: RoPE row n_drop, read once */
    memcpy(s->cos, m->rope_cos.data + (size_t)n_drop * hd / 2u * 4u, hd / 2u * 4u);
    memcpy(s->sin, m->rope_sin.data + (size_t)n_drop * hd / 2u * 4u, hd / 2u * 4u);
    st->bytes[m->rope_cos.tier] += hd / 2u * 4u;
    st->bytes[m->rope_sin.tier] += hd / 2u * 4u;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        for (uint32_t t = 1u + n_drop; t < m->seq_len; t++) {   /* ascending: a row moves before it is overwritten */
            for (uint32_t h = 0; h < m->n_kv_heads; h++) {
                const uint8_t *src = kv_at(s, s->kc, l, t, h);
                uint8_t *dst = kv_at(s, s->kc, l, t - n_drop, h);
                float *k = i8 ? s->xb2 : (float *)(void *)dst;
                const float *from = (const float *)(const void *)src;
                if (i8) {   /* dequantize: code * scale */
                    const float sc = *(const float *)(const void *)src;
                    for (uint32_t i = 0; i < hd; i++) k[i] = (float)((const int8_t *)(src + 4))[i] * sc;
                    from = k;
                }
                for (uint32_t i = 0; i < hd / 2u; i++) {
                    const float a = from[2 * i], b = from[2 * i + 1], c = s->cos[i], sn = s->sin[i];
                    k[2 * i] = a * c + b * sn;
                    k[2 * i + 1] = b * c - a * sn;
                }
                if (i8) flm_quantize_i8(k, hd, hd, (int8_t *)(dst + 4), (float *)(void *)dst);
            }
        }
        memmove(kv_at(s, s->vc, l, 1u, 0), kv_at(s, s->vc, l, 1u + n_drop, 0), (size_t)moved * m->n_kv_heads * s->kv_row);
    }
    st->bytes[s->kv_tier] += m->n_layers * moved * m->n_kv_heads * ((i8 ? 4u + hd : hd * 4u) + s->kv_row);
    st->us[FLM_PH_ATTN] += (uint32_t)(hal_time_us() - t0);
}

/* PLE, before layer 0: u_l = (rmsnorm((ple.proj x) * inv_sqrt_d)[l] + T[t][l] * sqrt_P) * inv_sqrt2
 * for every layer l (converter/reference.py Reference.ple_inputs). The table row is read in place
 * from its tier (flash: the firmware never stages ple.table), one row of row_stride bytes. */
static void ple_inputs(flm_state *s, uint32_t token, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t P = m->ple_dim, n = m->n_layers * P;
    const float inv_sqrt_d = 1.0f / flm_sqrtf((float)m->dim), sqrt_p = flm_sqrtf((float)P);
    const float inv_sqrt2 = 1.0f / flm_sqrtf(2.0f);
    matvec(s, &m->ple_proj, s->x, s->pu, st);
    for (uint32_t i = 0; i < n; i++) s->pu[i] = s->pu[i] * inv_sqrt_d;
    flm_dequant_row(&m->ple_table, token, s->pt);
    st->bytes[m->ple_table.tier] += m->ple_table.stride;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        float *u = s->pu + l * P;
        const float *t = s->pt + l * P;
        rmsnorm(u, u, &m->ple_norm, P, m->eps, st);
        for (uint32_t i = 0; i < P; i++) u[i] = (u[i] + t[i] * sqrt_p) * inv_sqrt2;
    }
}

/* PLE, after layer l's FFN: x += rmsnorm(ple.proj (gelu(ple.gate x) * u_l)). */
static void ple_block(flm_state *s, uint32_t l, flm_step_stats *st) {
    const flm_model *m = s->m;
    const flm_layer *L = &m->layers[l];
    const float *u = s->pu + l * m->ple_dim;
    matvec(s, &L->ple_gate, s->x, s->pt, st);
    for (uint32_t i = 0; i < m->ple_dim; i++) s->pt[i] = flm_gelu(s->pt[i]) * u[i];
    matvec(s, &L->ple_proj, s->pt, s->xb, st);
    rmsnorm(s->xb, s->xb, &L->ple_norm, m->dim, m->eps, st);
    for (uint32_t i = 0; i < m->dim; i++) s->x[i] = s->x[i] + s->xb[i];
}

void flm_body(flm_state *s, uint32_t token, uint32_t pos, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t dim = m->dim, hd = m->head_dim;
    uint64_t t0 = hal_time_us();

    uint32_t row = token;
    if (m->tied && m->n_tiles) {   /* the head's rows are stored in tile order: the token -> row map */
        row = flm_head_map(m, 1, token);
        st->bytes[m->head_tiles.tier] += m->map_bytes;
    }
    flm_dequant_row(&m->tok_emb, row, s->x);
    st->bytes[m->tok_emb.tier] += m->tok_emb.stride;
    if (m->ple_dim) ple_inputs(s, token, st);
    uint64_t t1 = hal_time_us();
    st->us[FLM_PH_EMBED] += (uint32_t)(t1 - t0);

    /* this position's RoPE rows, read once */
    memcpy(s->cos, m->rope_cos.data + (size_t)pos * hd / 2u * 4u, hd / 2u * 4u);
    memcpy(s->sin, m->rope_sin.data + (size_t)pos * hd / 2u * 4u, hd / 2u * 4u);
    st->bytes[m->rope_cos.tier] += hd / 2u * 4u;
    st->bytes[m->rope_sin.tier] += hd / 2u * 4u;

    for (uint32_t l = 0; l < m->n_layers; l++) {
        const flm_layer *L = &m->layers[l];
        rmsnorm(s->xb, s->x, &L->attn_norm, dim, m->eps, st);
        matvec(s, &L->wq, s->xb, s->q, st);
        matvec_same_x(s, &L->wv, &L->wq, s->xb, s->xb2, st);   /* v, then k, pass through scratch into the cache */
        kv_put(s, kv_at(s, s->vc, l, pos, 0), s->xb2);          /* (int8 KV quantizes into its rows, not xq) */
        matvec_same_x(s, &L->wk, &L->wv, s->xb, s->xb2, st);
        rope(s->q, m->n_heads, hd, s->cos, s->sin);
        rope(s->xb2, m->n_kv_heads, hd, s->cos, s->sin);
        kv_put(s, kv_at(s, s->kc, l, pos, 0), s->xb2);   /* the step reads the KV cache only in attention */
        attention(s, l, pos, st);
        matvec(s, &L->wo, s->xb2, s->xb, st);
        for (uint32_t i = 0; i < dim; i++) s->x[i] = s->x[i] + s->xb[i];
        uint64_t t2 = hal_time_us();
        st->us[FLM_PH_ATTN] += (uint32_t)(t2 - t1);

        rmsnorm(s->xb, s->x, &L->ffn_norm, dim, m->eps, st);
        matvec(s, &L->w1, s->xb, s->hb, st);
        matvec_same_x(s, &L->w3, &L->w1, s->xb, s->hb2, st);
        for (uint32_t i = 0; i < m->hidden; i++) s->hb[i] = flm_silu(s->hb[i]) * s->hb2[i];
        matvec(s, &L->w2, s->hb, s->xb, st);
        for (uint32_t i = 0; i < dim; i++) s->x[i] = s->x[i] + s->xb[i];
        t1 = hal_time_us();
        st->us[FLM_PH_FFN] += (uint32_t)(t1 - t2);

        if (m->ple_dim) {
            ple_block(s, l, st);
            t2 = hal_time_us();
            st->us[FLM_PH_PLE] += (uint32_t)(t2 - t1);
            t1 = t2;
        }
    }
}

/* The final RMSNorm, quantized for the head: codes s->xq, scales s->xs. */
static void head_input(flm_state *s, flm_step_stats *st) {
    const flm_model *m = s->m;
    rmsnorm(s->xb, s->x, &m->norm, m->dim, m->eps, st);
    flm_quantize_act(s->xb, m->head.cols, flm_act_group(&m->head), s->xq, s->xs);
}

/* Every head row into s->logits in token order: with a head index the rows are stored in tile
 * order, so they go through s->probs and the row -> token map. */
static void whole_head(flm_state *s, flm_step_stats *st) {
    const flm_model *m = s->m;
    hal_matvec(&m->head, s->xq, s->xs, m->n_tiles ? s->probs : s->logits);
    st->bytes[m->head.tier] += m->head.length;
    if (m->n_tiles) {
        for (uint32_t i = 0; i < m->n_out; i++) s->logits[flm_head_map(m, 0, i)] = s->probs[i];
        st->bytes[m->head_tiles.tier] += m->n_out * m->map_bytes;
    }
    st->head_rows = m->n_out;
}

const float *flm_head(flm_state *s, flm_step_stats *st) {
    uint64_t t0 = hal_time_us();
    head_input(s, st);
    whole_head(s, st);
    st->us[FLM_PH_OUTPUT] += (uint32_t)(hal_time_us() - t0);
    return s->logits;
}

/* The first maximum of v[0..n): a NaN first stays (every comparison with it fails), a later NaN
 * never wins. */
static uint32_t first_max(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (flm_f32_gt(v[i], v[best])) best = i;
    return best;
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
    hal_matvec(&m->head_centroids, s->xq, s->xs, s->probs);
    st->bytes[m->head_centroids.tier] += m->head_centroids.length;
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
        if (k && (t == first || (flm_f32_finite(s->probs[t]) && flm_f32_gt(best, s->probs[t])))) continue;
        const uint32_t a = s->idx[t], z = t + 1u < nt ? s->idx[t + 1u] : n;
        flm_matvec_rows(&m->head, a, z, s->xq, s->xs, s->logits);   /* logits indexed by stored row here */
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
    head_input(s, st);
    /* X2 = fold over groups of float(sum xq^2) * (xs * xs): ||x||^2 of the quantized input (one group
     * for a row-scaled head) */
    const uint32_t ag = flm_act_group(w);
    float x2 = 0.0f;
    for (uint32_t k = 0, gi = 0; m->n_tiles && k < w->cols; k += ag, gi++) {
        const uint32_t len = w->cols - k < ag ? w->cols - k : ag;
        int32_t sq = 0;
        for (uint32_t i = 0; i < len; i++) sq += (int32_t)s->xq[k + i] * (int32_t)s->xq[k + i];
        const float t = (float)sq * (s->xs[gi] * s->xs[gi]);
        x2 = gi == 0 ? t : x2 + t;
    }
    if (m->n_tiles && x2 >= PRUNE_FLOOR) {
        tok = tile_scan(s, flm_sqrtf(x2) * PRUNE_MARGIN, st);
    } else {   /* no index, or an input too small for the bounds: every row */
        whole_head(s, st);
        tok = first_max(s->logits, m->n_out);
    }
    st->us[FLM_PH_OUTPUT] += (uint32_t)(hal_time_us() - t0);
    return tok;
}
