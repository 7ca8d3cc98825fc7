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
#define N_LAYER_TENSORS 12   /* the first 9 always; the 3 PLE ones when ple_dim > 0 */
static const char *const LAYER_NAMES[N_LAYER_TENSORS] = {"attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo",
                                                         "ffn_norm", "ffn.w1", "ffn.w2", "ffn.w3",
                                                         "ple.gate", "ple.proj", "ple.norm"};

static flm_tensor *layer_slot(flm_layer *L, int k) {
    flm_tensor *ts[N_LAYER_TENSORS] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_norm,
                                       &L->w1, &L->w2, &L->w3, &L->ple_gate, &L->ple_proj, &L->ple_norm};
    return ts[k];
}

static int layer_tensors(const flm_model *m) { return m->ple_dim ? N_LAYER_TENSORS : 9; }

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
    uint32_t l = 0;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9' && l < 100000u) l = l * 10u + (uint32_t)(*p++ - '0');
    if (*p++ != '.' || l >= m->n_layers) return 0;
    for (int k = 0; k < layer_tensors(m); k++) {
        if (strcmp(p, LAYER_NAMES[k]) != 0) continue;
        static const uint8_t is_norm[N_LAYER_TENSORS] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1};
        uint32_t r[N_LAYER_TENSORS] = {1, m->dim, m->kv_dim, m->kv_dim, m->dim, 1, m->hidden, m->dim, m->hidden,
                                       m->ple_dim, m->dim, 1};
        uint32_t c[N_LAYER_TENSORS] = {m->dim, m->dim, m->dim, m->dim, m->dim, m->dim, m->dim, m->hidden, m->dim,
                                       m->dim, m->ple_dim, m->dim};
        *fmts = is_norm[k] ? F32 : Q; *rows = r[k]; *cols = c[k];
        return layer_slot(&m->layers[l], k);
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
    if (flm_rd32(b + 4) < 3u)
        return fail(err, en, "image written by an older flashlm; re-run flashlm convert: format version", 0,
                    flm_rd32(b + 4), 1);
    if (flm_rd32(b + 4) != 3u) return fail(err, en, "unsupported image format version", 0, flm_rd32(b + 4), 1);
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
    if (!m->dim || !m->n_heads || !m->n_kv_heads || !m->vocab || !m->seq_len || !m->hidden ||
        m->dim % m->n_heads || m->n_heads % m->n_kv_heads || (m->dim / m->n_heads) % 2u ||
        m->dim > 65536u || m->hidden > 262144u || m->vocab > (1u << 20) || m->seq_len > 65536u ||
        !m->n_out || m->n_out > m->vocab || m->ple_dim > 65536u)
        return fail(err, en, "bad model config in image", 0, 0, 0);
    if (m->n_layers == 0 || m->n_layers > FLM_MAX_LAYERS)
        return fail(err, en, "layer count unsupported by this build:", 0, m->n_layers, 1);
    if (m->n_layers * m->ple_dim > 262144u) return fail(err, en, "bad model config in image: ple_dim", 0, 0, 0);
    m->head_dim = m->dim / m->n_heads;
    m->kv_dim = m->n_kv_heads * m->head_dim;
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
        for (int k = 0; k < layer_tensors(m); k++)
            if (!layer_slot(&m->layers[l], k)->data)
                return fail(err, en, "image lacks a layer tensor: ", LAYER_NAMES[k], l, 1);
    flm_blob_tie_head(m);
    if (check_index(m, err, en) != 0) return -1;
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
        if (r < 3u ? t != 0u && t != FLM_TIER_PSRAM && t != FLM_TIER_SRAM : t > FLM_KV_INT8) return 0;
    }
    return st >> 24 == 0u;
}

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
    uint32_t k = (uint32_t)layer_tensors(m), l = (i - n) / k;
    return l < m->n_layers ? layer_slot(&m->layers[l], (int)((i - n) % k)) : 0;
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
