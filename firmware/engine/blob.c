#include "blob.h"
#include "crc32.h"
#include <string.h>

#define HEADER_SIZE 112u
#define ENTRY_SIZE 64u

uint32_t flm_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static float rdf(const uint8_t *p) { uint32_t u = flm_rd32(p); float f; memcpy(&f, &u, 4); return f; }

/* Small formatter: err = a + decimal(v) + b (no stdio on bare-metal boards). */
static int fail(char *err, size_t n, const char *a, const char *name, uint32_t v, int with_v) {
    size_t i = 0;
    const char *parts[2] = {a, name};
    for (int k = 0; k < 2; k++)   /* names come from the image: printable ASCII only */
        for (const char *s = parts[k]; s && *s && i + 1 < n; s++) err[i++] = (*s >= ' ' && *s <= '~') ? *s : '?';
    if (with_v) {
        char d[10]; int nd = 0;
        do { d[nd++] = (char)('0' + v % 10); v /= 10; } while (v && nd < 10);
        if (i + 1 < n) err[i++] = ' ';
        while (nd && i + 1 < n) err[i++] = d[--nd];
    }
    if (n) err[i < n ? i : n - 1] = 0;
    return -1;
}

/* "made for numerics N, this firmware is M: re-run flashlm convert" (converter/blob.py says the same). */
#define STR_(x) #x
#define STR(x) STR_(x)
static int numerics_fail(char *err, size_t n, uint32_t v) {
    static const char tail[] = ", this firmware is " STR(FLM_NUMERICS) ": re-run flashlm convert";
    fail(err, n, "made for numerics", 0, v, 1);
    size_t i = strlen(err);
    for (const char *s = tail; *s && i + 1 < n; s++) err[i++] = *s;
    if (n) err[i < n ? i : n - 1] = 0;
    return -1;
}

static uint32_t pad4(uint32_t n) { return (n + 3u) & ~3u; }

/* Bytes of one row (docs/formats.md section 1): per group its codes padded to 4, plus a 4-byte f32
 * scale each or, with fp16 scales, the row's scales up front padded to 4, or row-scaled the f32 row
 * scale and a byte per group padded to 4. 64-bit: a hostile column count cannot wrap it into a
 * plausible value. */
static uint64_t stride_of(uint32_t fmt, uint32_t cols, uint32_t g, uint32_t scale16, uint32_t rowscale) {
    uint64_t full = cols / g, last = cols - full * g, ng = full + (last ? 1u : 0u);
    uint64_t cg = fmt == FLM_Q8 ? pad4(g) : pad4((g + 1u) / 2u);
    uint64_t cl = !last ? 0u : fmt == FLM_Q8 ? pad4((uint32_t)last) : pad4(((uint32_t)last + 1u) / 2u);
    uint64_t scales = rowscale ? 4u + ((ng + 3u) & ~(uint64_t)3u) : scale16 ? (2u * ng + 3u) & ~(uint64_t)3u : 4u * ng;
    return full * cg + cl + scales;
}

#define ANY_ROWS 0xFFFFFFFFu   /* slot(): a row count checked later (head.centroids: one per tile) */
/* A layer's tensors, in the order flm_tensor_at lists them: the attention's and the FFN norm, then the
 * dense FFN (ffn.w1, w2, w3) or the router and each expert's w1, w2, w3, then PLE's (ple_dim > 0). */
#define N_FIXED 6
static const char *const FIXED_NAMES[N_FIXED] = {"attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn_norm"};
static const char *const FFN_NAMES[3] = {"w1", "w2", "w3"};
static const char *const PLE_NAMES[3] = {"ple.gate", "ple.proj", "ple.norm"};

static uint32_t ffn_tensors(const flm_model *m) { return m->n_experts ? 1u + 3u * m->n_experts : 3u; }

static uint32_t layer_tensors(const flm_model *m) { return N_FIXED + ffn_tensors(m) + (m->ple_dim ? 3u : 0u); }

static flm_tensor *ffn_slot(flm_layer *L, uint32_t e, uint32_t w) {
    flm_ffn *f = &L->ffn[e];
    return w == 0 ? &f->w1 : w == 1 ? &f->w2 : &f->w3;
}

/* Tensor k (< layer_tensors) of layer L, in the order above. */
static flm_tensor *layer_slot(const flm_model *m, flm_layer *L, uint32_t k) {
    flm_tensor *fixed[N_FIXED] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_norm};
    if (k < N_FIXED) return fixed[k];
    k -= N_FIXED;
    if (k < ffn_tensors(m)) {
        if (!m->n_experts) return ffn_slot(L, 0, k);
        return k == 0 ? &L->router : ffn_slot(L, (k - 1u) / 3u, (k - 1u) % 3u);
    }
    k -= ffn_tensors(m);
    return k == 0 ? &L->ple_gate : k == 1 ? &L->ple_proj : &L->ple_norm;
}

/* The name of layer tensor k after "layers.N." (for messages), into buf. */
static const char *layer_name(const flm_model *m, uint32_t k, char *buf) {
    if (k < N_FIXED) return FIXED_NAMES[k];
    k -= N_FIXED;
    if (k >= ffn_tensors(m)) return PLE_NAMES[k - ffn_tensors(m)];
    if (!m->n_experts) { memcpy(buf, "ffn.", 4); memcpy(buf + 4, FFN_NAMES[k], 3); return buf; }
    if (k == 0) return "ffn.router";
    uint32_t e = (k - 1u) / 3u, i = 12;
    memcpy(buf, "ffn.experts.", 12);
    if (e >= 10u) buf[i++] = (char)('0' + e / 10u);
    buf[i++] = (char)('0' + e % 10u);
    buf[i++] = '.';
    memcpy(buf + i, FFN_NAMES[(k - 1u) % 3u], 3);
    return buf;
}

/* A decimal number of at most 5 digits at *p (no leading zero but "0"), advancing *p; FLM_NONE if none. */
static uint32_t number(const char **p) {
    const char *q = *p;
    uint32_t v = 0;
    if (*q < '0' || *q > '9' || (q[0] == '0' && q[1] >= '0' && q[1] <= '9')) return FLM_NONE;
    while (*q >= '0' && *q <= '9' && q - *p < 5) v = v * 10u + (uint32_t)(*q++ - '0');
    *p = q;
    return v;
}

/* Where a layer tensor's table entry goes (name = what follows "layers.N."), its formats and shape. */
static flm_tensor *layer_entry(const flm_model *m, flm_layer *L, const char *name, uint32_t *fmts, uint32_t *rows,
                               uint32_t *cols) {
    const uint32_t F32 = 1u << FLM_F32, Q = (1u << FLM_Q8) | (1u << FLM_Q4);
    static const uint8_t is_norm[N_FIXED] = {1, 0, 0, 0, 0, 1};
    const uint32_t r[N_FIXED] = {1, m->dim, m->kv_dim, m->kv_dim, m->dim, 1};
    for (uint32_t k = 0; k < N_FIXED; k++)
        if (!strcmp(name, FIXED_NAMES[k])) { *fmts = is_norm[k] ? F32 : Q; *rows = r[k]; return layer_slot(m, L, k); }
    const uint32_t ffn_rows[3] = {m->hidden, m->dim, m->hidden}, ffn_cols[3] = {m->dim, m->hidden, m->dim};
    uint32_t e = 0;
    const char *w = 0;
    if (!m->n_experts && !strncmp(name, "ffn.", 4)) {
        w = name + 4;
    } else if (m->n_experts && !strcmp(name, "ffn.router")) {
        *fmts = F32; *rows = m->n_experts;
        return &L->router;
    } else if (m->n_experts && !strncmp(name, "ffn.experts.", 12)) {
        const char *p = name + 12;
        e = number(&p);
        if (e >= m->n_experts || *p != '.') return 0;
        w = p + 1;
    }
    for (uint32_t i = 0; w && i < 3u; i++)
        if (!strcmp(w, FFN_NAMES[i])) { *fmts = Q; *rows = ffn_rows[i]; *cols = ffn_cols[i]; return ffn_slot(L, e, i); }
    for (uint32_t i = 0; m->ple_dim && i < 3u; i++) {
        if (strcmp(name, PLE_NAMES[i]) != 0) continue;
        const uint32_t pr[3] = {m->ple_dim, m->dim, 1}, pc[3] = {m->dim, m->ple_dim, m->dim};
        *fmts = i == 2 ? F32 : Q; *rows = pr[i]; *cols = pc[i];
        return i == 0 ? &L->ple_gate : i == 1 ? &L->ple_proj : &L->ple_norm;
    }
    return 0;
}

/* Where a table entry goes and what it must look like; NULL for names the engine does not use. */
static flm_tensor *slot(flm_model *m, flm_tensor *tokenizer, const char *name, uint32_t *fmts,
                        uint32_t *rows, uint32_t *cols) {
    const uint32_t F32 = 1u << FLM_F32, Q = (1u << FLM_Q8) | (1u << FLM_Q4);
    *rows = 1; *cols = m->dim; *fmts = F32;
    if (!strcmp(name, "norm")) return &m->norm;
    if (!strcmp(name, "tokenizer")) { *fmts = 1u << FLM_BYTES; *cols = 0; return tokenizer; }
    if (!strcmp(name, "head.tiles")) { *fmts = 1u << FLM_BYTES; *cols = 0; return &m->head_tiles; }
    if (!strcmp(name, "head.centroids")) { *fmts = 1u << FLM_Q8; *rows = ANY_ROWS; return &m->head_centroids; }
    if (!strcmp(name, "rope.cos") || !strcmp(name, "rope.sin")) {
        *rows = m->seq_len; *cols = m->head_dim / 2u;
        return name[5] == 'c' ? &m->rope_cos : &m->rope_sin;
    }
    if (m->ple_dim && !strcmp(name, "ple.norm")) { *cols = m->ple_dim; return &m->ple_norm; }
    *fmts = Q; *rows = m->vocab;
    if (!strcmp(name, "tok_embeddings")) return &m->tok_emb;
    if (!strcmp(name, "output")) { *rows = m->n_out; return m->tied ? 0 : &m->head; }
    if (m->ple_dim && !strcmp(name, "ple.table")) { *cols = m->n_layers * m->ple_dim; return &m->ple_table; }
    if (m->ple_dim && !strcmp(name, "ple.proj")) { *rows = m->n_layers * m->ple_dim; return &m->ple_proj; }
    if (strncmp(name, "layers.", 7) != 0) return 0;
    const char *p = name + 7;
    uint32_t l = number(&p);
    if (l >= m->n_layers || *p++ != '.') return 0;
    return layer_entry(m, &m->layers[l], p, fmts, rows, cols);
}

/* The experts' calibrated use (section moe.use, docs/formats.md section 1; the planner's, the engine
 * does not read it): when present, counts for this model's layers and experts that sum to k per token. */
static int check_expert_use(const flm_model *m, char *err, size_t en) {
    uint32_t len = 0;
    const uint8_t *u = flm_blob_section(m, "moe.use", &len);
    if (!u) return 0;
    if (!m->n_experts || len < 20u || flm_rd32(u) != 1u || flm_rd32(u + 4) != m->n_layers ||
        flm_rd32(u + 8) != m->n_experts || flm_rd32(u + 12) != m->top_k || !flm_rd32(u + 16) ||
        len != 20u + 4u * m->n_layers * m->n_experts)
        return fail(err, en, "moe.use does not fit the model's experts", 0, 0, 0);
    const uint32_t tokens = flm_rd32(u + 16);
    for (uint32_t l = 0; l < m->n_layers; l++) {
        uint64_t sum = 0;
        for (uint32_t e = 0; e < m->n_experts; e++) {
            const uint32_t c = flm_rd32(u + 20u + 4u * (l * m->n_experts + e));
            if (c > tokens) sum = ~(uint64_t)0;
            else if (sum != ~(uint64_t)0) sum += c;
        }
        if (sum != (uint64_t)m->top_k * tokens)
            return fail(err, en, "moe.use: counts that do not sum to top_k x tokens in layer", 0, l, 1);
    }
    return 0;
}

/* The head index (docs/formats.md section 1): both its entries or neither; centre rows of the head's
 * shape and groups, one per tile; tiles that start at stored row 0 and ascend, each non-empty;
 * radii in +0..+inf (the scan's test is then sound); maps that are inverse permutations of
 * 0..n_out-1, a tied head's token -> row map covering every embedding row (those past n_out map to
 * themselves): every token's row is read through them. */
static int check_index(flm_model *m, char *err, size_t en) {
    const flm_tensor *c = &m->head_centroids, *t = &m->head_tiles;
    if (!c->data && !t->data) return 0;
    if (!c->data || !t->data) return fail(err, en, "image has half a head index: head.centroids and head.tiles come together", 0, 0, 0);
    if (t->length < 32u) return fail(err, en, "head.tiles is too short", 0, 0, 0);
    const uint32_t nt = flm_rd32(t->data), mb = flm_rd32(t->data + 4), n = m->n_out;
    const uint32_t rows = m->tied ? m->vocab : n;   /* the token -> row map covers the head's tensor */
    const uint64_t maps = (((uint64_t)mb * n + 3u) & ~(uint64_t)3u) + (((uint64_t)mb * rows + 3u) & ~(uint64_t)3u);
    if (!nt || nt > n || mb != (n <= 65536u ? 2u : 4u) || t->length != 32u + 8u * (uint64_t)nt + maps ||
        c->rows != nt || c->cols != m->dim || c->group != m->head.group || c->scale16 != m->head.scale16 ||
        c->rowscale != m->head.rowscale)
        return fail(err, en, "head index does not fit the output layer", 0, 0, 0);
    m->n_tiles = nt;
    m->map_bytes = mb;
    for (uint32_t i = 0; i < nt; i++) {
        const uint8_t *r = t->data + 32u + 8u * i;
        uint32_t a = flm_rd32(r), z = i + 1u < nt ? flm_rd32(r + 8) : n;
        if ((i == 0 && a != 0) || a >= z || flm_rd32(r + 4) > 0x7f800000u)
            return fail(err, en, "head.tiles: tiles must ascend from row 0, each non-empty, radii +0..+inf: tile", 0, i, 1);
    }
    for (uint32_t i = 0; i < rows; i++) {   /* rows past n_out (a tied head's) map to themselves */
        uint32_t tok = i < n ? flm_head_map(m, 0, i) : i;
        if (tok >= (i < n ? n : rows) || flm_head_map(m, 1, tok) != i)
            return fail(err, en, "head.tiles: the row and token maps are not inverse permutations: row", 0, i, 1);
    }
    return 0;
}

uint32_t flm_head_map(const flm_model *m, int inverse, uint32_t i) {
    const uint32_t mb = m->map_bytes;
    const uint8_t *p = m->head_tiles.data + 32u + 8u * m->n_tiles;
    if (inverse) p += (mb * m->n_out + 3u) & ~3u;
    p += mb * i;
    return mb == 2u ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : flm_rd32(p);
}

size_t flm_blob_span(const uint8_t *b, size_t window) {
    if (window < HEADER_SIZE || memcmp(b, "FLMB", 4) != 0) return window;
    const uint32_t total = flm_rd32(b + 8);
    return total <= window ? total : window;
}

int flm_blob_open(flm_model *m, const uint8_t *b, size_t len, char *err, size_t en) {
    memset(m, 0, sizeof *m);
    if (len < HEADER_SIZE) return fail(err, en, "image too short for a header:", 0, (uint32_t)len, 1);
    if (memcmp(b, "FLMB", 4) != 0) return fail(err, en, "bad magic: no flashlm image in flash", 0, 0, 0);
    if (flm_rd32(b + 4) != FLM_NUMERICS) return numerics_fail(err, en, flm_rd32(b + 4));
    uint32_t total = flm_rd32(b + 8);
    if (total != len) return fail(err, en, "image size mismatch (truncated or wrong partition), header says", 0, total, 1);
    if (flm_crc32_update(0, b + 16, len - 16) != flm_rd32(b + 12))
        return fail(err, en, "CRC mismatch: image corrupted", 0, 0, 0);
    memcpy(m->model_hash, b + 16, 16);
    m->layout_id = flm_rd32(b + 32);
    uint32_t n = flm_rd32(b + 36), table = flm_rd32(b + 40);
    m->state_tiers = flm_rd32(b + 44);
    if (!flm_state_tiers_ok(m->state_tiers)) return fail(err, en, "bad state_tiers in image header", 0, 0, 0);
    m->kv_fmt = (m->state_tiers >> FLM_KV_SHIFT) & 15u;
    m->batch = flm_batch_of(m->state_tiers);
    m->blob = b;
    m->n_entries = n;
    m->table = table;
    const uint8_t *c = b + 48;
    m->dim = flm_rd32(c); m->n_layers = flm_rd32(c + 4); m->n_heads = flm_rd32(c + 8);
    m->n_kv_heads = flm_rd32(c + 12); m->hidden = flm_rd32(c + 16); m->vocab = flm_rd32(c + 20);
    m->seq_len = flm_rd32(c + 24); m->tied = flm_rd32(c + 28) & 1u; m->bos = flm_rd32(c + 32);
    m->eos = flm_rd32(c + 36); m->eps = rdf(c + 40);
    m->ple_dim = flm_rd32(c + 48); m->n_out = flm_rd32(c + 52);
    m->n_experts = flm_rd32(c + 56); m->top_k = flm_rd32(c + 60);
    if (!m->dim || !m->n_heads || !m->n_kv_heads || !m->vocab || !m->seq_len || !m->hidden ||
        m->dim % m->n_heads || m->n_heads % m->n_kv_heads || (m->dim / m->n_heads) % 2u ||
        m->dim > 65536u || m->hidden > 262144u || m->vocab > (1u << 20) || m->seq_len > 65536u ||
        !m->n_out || m->n_out > m->vocab || m->ple_dim > 65536u)
        return fail(err, en, "bad model config in image", 0, 0, 0);
    if (m->n_layers == 0 || m->n_layers > FLM_MAX_LAYERS)
        return fail(err, en, "layer count unsupported by this build:", 0, m->n_layers, 1);
    if (m->n_layers * m->ple_dim > 262144u) return fail(err, en, "bad model config in image: ple_dim", 0, 0, 0);
    if (m->n_experts > 64u || (m->n_experts ? !m->top_k || m->top_k > m->n_experts : m->top_k != 0))
        return fail(err, en, "bad model config in image: experts", 0, 0, 0);
    if (m->n_experts > FLM_MAX_EXPERTS || m->top_k > FLM_MAX_TOP_K)
        return fail(err, en, "experts per layer (or read per token) unsupported by this build:", 0,
                    m->n_experts > FLM_MAX_EXPERTS ? m->n_experts : m->top_k, 1);
    m->head_dim = m->dim / m->n_heads;
    m->kv_dim = m->n_kv_heads * m->head_dim;
    const char *kv_why = flm_kv_refusal(m, m->kv_fmt);
    if (kv_why) return fail(err, en, kv_why, 0, 0, 0);
    /* K and V caches, f32: sized in 64 bits, so the engine's size_t sums cannot wrap on a 32-bit core */
    if (2u * (uint64_t)m->n_layers * m->seq_len * m->kv_dim * 4u > 0x40000000u)
        return fail(err, en, "bad model config in image: KV cache over 1 GiB", 0, 0, 0);
    if (n > 100000u || table < HEADER_SIZE || (uint64_t)table + (uint64_t)n * ENTRY_SIZE > len)
        return fail(err, en, "tensor table out of bounds", 0, 0, 0);

    flm_tensor tokenizer = {0};
    uint32_t data_min = table + n * ENTRY_SIZE;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = b + table + i * ENTRY_SIZE;
        char name[33];
        memcpy(name, e, 32);
        name[32] = 0;
        uint32_t fmt = flm_rd32(e + 32), rows = flm_rd32(e + 36), cols = flm_rd32(e + 40);
        uint32_t g = flm_rd32(e + 44), tier = flm_rd32(e + 48), off = flm_rd32(e + 52);
        uint32_t length = flm_rd32(e + 56), stride = flm_rd32(e + 60);
        uint32_t s16 = (fmt & FLM_FMT_SCALE16) ? 1u : 0u, rs = (fmt & FLM_FMT_ROWSCALE) ? 1u : 0u;
        fmt &= ~(FLM_FMT_SCALE16 | FLM_FMT_ROWSCALE);
        if (fmt > FLM_BYTES || ((s16 || rs) && fmt != FLM_Q8 && fmt != FLM_Q4) || (s16 && rs) || tier >= FLM_N_TIERS ||
            off % 64u || off < data_min || (uint64_t)off + length > len)
            return fail(err, en, "tensor out of bounds or bad format: ", name, 0, 0);
        uint32_t fmts, wr, wc;
        flm_tensor *t = slot(m, &tokenizer, name, &fmts, &wr, &wc);
        if (!t) continue;
        if (!((fmts >> fmt) & 1u) || (wr != ANY_ROWS && rows != wr) || (wc && cols != wc))
            return fail(err, en, "tensor has the wrong shape or format: ", name, 0, 0);
        if (fmt == FLM_Q8 || fmt == FLM_Q4) {
            if (g == 0 || g > (rs ? FLM_MAX_GROUP_ROW : FLM_MAX_GROUP) || stride != stride_of(fmt, cols, g, s16, rs) ||
                (uint64_t)rows * stride != length)
                return fail(err, en, "tensor has an inconsistent quantized layout: ", name, 0, 0);
        } else if ((fmt == FLM_F32 && (uint64_t)rows * cols * 4u != length) || (fmt == FLM_BYTES && wc && cols != length)) {
            return fail(err, en, "tensor has the wrong length: ", name, 0, 0);
        }
        *t = (flm_tensor){b + off, fmt, rows, cols, g, stride, tier, length, (uint8_t)s16, (uint8_t)rs};
    }
    const char *missing = !tokenizer.data ? "tokenizer" : !m->tok_emb.data ? "tok_embeddings"
                        : !m->norm.data ? "norm" : !m->rope_cos.data ? "rope.cos"
                        : !m->rope_sin.data ? "rope.sin" : (!m->tied && !m->head.data) ? "output"
                        : !m->ple_dim ? 0 : !m->ple_table.data ? "ple.table" : !m->ple_proj.data ? "ple.proj"
                        : !m->ple_norm.data ? "ple.norm" : 0;
    if (missing) return fail(err, en, "image lacks tensor ", missing, 0, 0);
    for (uint32_t l = 0; l < m->n_layers; l++)
        for (uint32_t k = 0; k < layer_tensors(m); k++) {
            char name[24];
            if (!layer_slot(m, &m->layers[l], k)->data)
                return fail(err, en, "image lacks a layer tensor: ", layer_name(m, k, name), l, 1);
        }
    flm_blob_tie_head(m);
    if (check_index(m, err, en) != 0 || check_expert_use(m, err, en) != 0) return -1;
    m->min_group = 1024u;
    for (uint32_t i = 0; flm_tensor_at(m, i); i++) {
        const flm_tensor *t = flm_tensor_at(m, i);
        if ((t->fmt == FLM_Q8 || t->fmt == FLM_Q4) && t->group < m->min_group) m->min_group = t->group;
    }
    /* tokenizer.stop: u32 n, u32 ids[n] (the table loop checked its bounds) */
    uint32_t slen = 0;
    const uint8_t *stop = flm_blob_section(m, "tokenizer.stop", &slen);
    if (!stop) return fail(err, en, "image lacks tensor ", "tokenizer.stop", 0, 0);
    m->n_stop = slen >= 4u ? flm_rd32(stop) : FLM_MAX_STOP + 1u;
    if (m->n_stop > FLM_MAX_STOP || slen != 4u + 4u * m->n_stop)
        return fail(err, en, "tokenizer.stop is not a count of at most 16 and the ids", 0, 0, 0);
    for (uint32_t i = 0; i < m->n_stop; i++)
        if ((m->stop[i] = flm_rd32(stop + 4u + 4u * i)) >= m->vocab)
            return fail(err, en, "a stop id is outside the vocabulary:", 0, m->stop[i], 1);
    /* tokenizer section: u32 n, u32 maxlen, u32 off[n+1], bytes */
    if (tokenizer.length < 8u || flm_rd32(tokenizer.data) != m->vocab ||
        8u + 4u * ((uint64_t)m->vocab + 1u) > tokenizer.length)
        return fail(err, en, "tokenizer section does not match the vocabulary", 0, 0, 0);
    m->tok_off = tokenizer.data + 8;
    m->tok_data = m->tok_off + 4u * (m->vocab + 1u);
    uint32_t room = tokenizer.length - 8u - 4u * (m->vocab + 1u), prev = 0;
    for (uint32_t i = 0; i <= m->vocab; i++) {
        uint32_t o = flm_rd32(m->tok_off + 4u * i);
        if (o < prev || o > room || (i == 0 && o != 0))
            return fail(err, en, "tokenizer offsets are corrupt", 0, 0, 0);
        prev = o;
    }
    return 0;
}

int flm_state_tiers_ok(uint32_t st) {
    for (uint32_t r = 0; r < 4u; r++) {   /* bits 16-23, the batch, may hold any value */
        uint32_t t = (st >> (4u * r)) & 15u;
        if (r < 3u ? t != 0u && t != FLM_TIER_PSRAM && t != FLM_TIER_SRAM : t > FLM_KV_K12) return 0;
    }
    return st >> 24 == 0u;
}

const char *flm_kv_refusal(const flm_model *m, uint32_t kv_fmt) {
    return kv_fmt == FLM_KV_K12 && m->head_dim > FLM_K12_MAX_HEAD_DIM
               ? "a k12 KV cache needs a head of at most 512 (flashlm convert --kv int8)" : 0;
}

const char *flm_kv_name(uint32_t kv_fmt) { return kv_fmt == FLM_KV_K12 ? "k12" : kv_fmt == FLM_KV_INT8 ? "int8" : "f32"; }

uint32_t flm_batch_of(uint32_t st) {
    uint32_t b = (st >> FLM_BATCH_SHIFT) & 255u;
    return b ? b : 1u;
}

void flm_blob_retier(flm_model *m, const uint8_t *tiers) {
    flm_tensor tokenizer = {0};
    for (uint32_t i = 0; i < m->n_entries; i++) {
        const uint8_t *e = m->blob + m->table + i * ENTRY_SIZE;
        char name[33];
        memcpy(name, e, 32);
        name[32] = 0;
        uint32_t fmts, wr, wc;
        flm_tensor *t = slot(m, &tokenizer, name, &fmts, &wr, &wc);
        if (!t) continue;
        t->data = m->blob + flm_rd32(e + 52);
        t->tier = tiers ? tiers[i] : flm_rd32(e + 48);
    }
    flm_blob_tie_head(m);
}

void flm_blob_tie_head(flm_model *m) {
    if (!m->tied) return;
    m->head = m->tok_emb;
    m->head.rows = m->n_out;
    m->head.length = m->n_out * m->tok_emb.stride;
}

flm_tensor *flm_tensor_at(const flm_model *cm, uint32_t i) {
    flm_model *m = (flm_model *)(uintptr_t)cm;   /* like strchr: the caller decides what it may change */
    flm_tensor *top[10];
    uint32_t n = 0;
    top[n++] = &m->tok_emb;
    if (!m->tied) top[n++] = &m->head;
    top[n++] = &m->norm;
    top[n++] = &m->rope_cos;
    top[n++] = &m->rope_sin;
    if (m->n_tiles) {
        top[n++] = &m->head_centroids;
        top[n++] = &m->head_tiles;
    }
    if (m->ple_dim) {
        top[n++] = &m->ple_table;
        top[n++] = &m->ple_proj;
        top[n++] = &m->ple_norm;
    }
    if (i < n) return top[i];
    uint32_t k = layer_tensors(m), l = (i - n) / k;
    return l < m->n_layers ? layer_slot(m, &m->layers[l], (i - n) % k) : 0;
}

const uint8_t *flm_blob_section(const flm_model *m, const char *name, uint32_t *len) {
    for (uint32_t i = 0; i < m->n_entries; i++) {
        const uint8_t *e = m->blob + m->table + i * ENTRY_SIZE;
        if (strncmp((const char *)e, name, 32) == 0 && flm_rd32(e + 32) == FLM_BYTES) {
            *len = flm_rd32(e + 56);
            return m->blob + flm_rd32(e + 52);
        }
    }
    *len = 0;
    return 0;
}

int flm_is_stop(const flm_model *m, uint32_t id) {
    for (uint32_t i = 0; i < m->n_stop; i++)
        if (m->stop[i] == id) return 1;
    return 0;
}

const uint8_t *flm_piece(const flm_model *m, uint32_t id, uint32_t *len) {
    uint32_t a = flm_rd32(m->tok_off + 4u * id), z = flm_rd32(m->tok_off + 4u * id + 4u);
    *len = z - a;
    return m->tok_data + a;
}
