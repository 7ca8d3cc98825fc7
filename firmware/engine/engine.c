#include "engine.h"
#include "flm_math.h"
#include "hal.h"
#include "kernels.h"
#include <string.h>

static size_t up8(size_t n) { return (n + 7u) & ~(size_t)7u; }

typedef struct { uint8_t *p; size_t used, cap; } carver;

static void *carve(carver *c, size_t bytes) {
    void *r = c->p ? c->p + c->used : 0;
    c->used += up8(bytes);
    return r;
}

/* Carves the regions; base[r] == 0 only measures. Returns region r's size in *size[r]. */
static void layout(flm_state *s, const flm_model *m, uint8_t *const base[FLM_N_REGIONS], size_t size[FLM_N_REGIONS]) {
    carver sc = {base[FLM_REG_SCRATCH], 0, 0}, lg = {base[FLM_REG_LOGITS], 0, 0}, kc = {base[FLM_REG_KV], 0, 0};
    uint32_t wide = m->dim > m->hidden ? m->dim : m->hidden;   /* longest matmul input */
    if (m->ple_dim > wide) wide = m->ple_dim;
    size_t kv = (size_t)m->n_layers * m->seq_len * m->kv_dim * sizeof(float);
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
    s->xq = carve(&sc, wide);
    s->xs = carve(&sc, (wide / m->min_group + 1u) * 4u);   /* activation scales: one per group */
    s->logits = carve(&lg, m->n_out * 4u);
    s->probs = carve(&lg, m->n_out * 4u);
    s->idx = carve(&lg, m->n_out * 4u);
    s->kc = carve(&kc, kv);
    s->vc = carve(&kc, kv);
    size[FLM_REG_SCRATCH] = sc.used;
    size[FLM_REG_LOGITS] = lg.used;
    size[FLM_REG_KV] = kc.used;
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
    float ss = x[0] * x[0];
    for (uint32_t i = 1; i < n; i++) ss = ss + x[i] * x[i];
    ss = ss / (float)n + eps;
    float inv = 1.0f / flm_sqrtf(ss);
    for (uint32_t i = 0; i < n; i++) o[i] = (x[i] * inv) * g[i];
    st->bytes[w->tier] += n * 4u;
}

static void matvec(flm_state *s, const flm_tensor *w, const float *x, float *out, flm_step_stats *st) {
    flm_quantize_act(x, w->cols, w->group, s->xq, s->xs);
    flm_matvec(w, s->xq, s->xs, out);
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

static void attention(flm_state *s, uint32_t l, uint32_t pos, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t hd = m->head_dim, kvd = m->kv_dim, rep = m->n_heads / m->n_kv_heads;
    const float scale = 1.0f / flm_sqrtf((float)hd);
    const float *kc = s->kc + (size_t)l * m->seq_len * kvd, *vc = s->vc + (size_t)l * m->seq_len * kvd;
    for (uint32_t h = 0; h < m->n_heads; h++) {
        const float *q = s->q + h * hd;
        const uint32_t koff = (h / rep) * hd;
        float mx = 0.0f;
        for (uint32_t t = 0; t <= pos; t++) {
            const float *k = kc + (size_t)t * kvd + koff;
            float d = q[0] * k[0];
            for (uint32_t i = 1; i < hd; i++) d = d + q[i] * k[i];
            d = d * scale;
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
        float *o = s->xb2 + h * hd;
        for (uint32_t t = 0; t <= pos; t++) {
            const float *v = vc + (size_t)t * kvd + koff;
            const float a = s->att[t];
            if (t == 0) for (uint32_t i = 0; i < hd; i++) o[i] = a * v[i];
            else for (uint32_t i = 0; i < hd; i++) o[i] = o[i] + a * v[i];
        }
        st->bytes[s->kv_tier] += 2u * (pos + 1u) * hd * 4u;
    }
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

const float *flm_forward(flm_state *s, uint32_t token, uint32_t pos, flm_step_stats *st) {
    const flm_model *m = s->m;
    const uint32_t dim = m->dim, hd = m->head_dim, kvd = m->kv_dim;
    memset(st, 0, sizeof *st);
    uint64_t t0 = hal_time_us();

    flm_dequant_row(&m->tok_emb, token, s->x);
    st->bytes[m->tok_emb.tier] += m->tok_emb.stride;
    if (m->ple_dim) ple_inputs(s, token, st);
    uint64_t t1 = hal_time_us();
    st->us[FLM_PH_EMBED] = (uint32_t)(t1 - t0);

    /* this position's RoPE rows, read once */
    memcpy(s->cos, m->rope_cos.data + (size_t)pos * hd / 2u * 4u, hd / 2u * 4u);
    memcpy(s->sin, m->rope_sin.data + (size_t)pos * hd / 2u * 4u, hd / 2u * 4u);
    st->bytes[m->rope_cos.tier] += hd / 2u * 4u;
    st->bytes[m->rope_sin.tier] += hd / 2u * 4u;

    for (uint32_t l = 0; l < m->n_layers; l++) {
        const flm_layer *L = &m->layers[l];
        float *kpos = s->kc + ((size_t)l * m->seq_len + pos) * kvd;
        float *vpos = s->vc + ((size_t)l * m->seq_len + pos) * kvd;
        rmsnorm(s->xb, s->x, &L->attn_norm, dim, m->eps, st);
        matvec(s, &L->wq, s->xb, s->q, st);
        matvec(s, &L->wk, s->xb, s->xb2, st);   /* k is rotated in scratch, then stored: */
        matvec(s, &L->wv, s->xb, vpos, st);
        rope(s->q, m->n_heads, hd, s->cos, s->sin);
        rope(s->xb2, m->n_kv_heads, hd, s->cos, s->sin);
        memcpy(kpos, s->xb2, kvd * 4u);            /* the step reads the KV cache only in attention */
        attention(s, l, pos, st);
        matvec(s, &L->wo, s->xb2, s->xb, st);
        for (uint32_t i = 0; i < dim; i++) s->x[i] = s->x[i] + s->xb[i];
        uint64_t t2 = hal_time_us();
        st->us[FLM_PH_ATTN] += (uint32_t)(t2 - t1);

        rmsnorm(s->xb, s->x, &L->ffn_norm, dim, m->eps, st);
        matvec(s, &L->w1, s->xb, s->hb, st);
        matvec(s, &L->w3, s->xb, s->hb2, st);
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
    rmsnorm(s->xb, s->x, &m->norm, dim, m->eps, st);
    matvec(s, &m->head, s->xb, s->logits, st);
    st->head_rows = m->head.rows;
    st->us[FLM_PH_OUTPUT] = (uint32_t)(hal_time_us() - t1);
    return s->logits;
}
