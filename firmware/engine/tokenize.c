/* The device tokenizer (docs/formats.md section 1.1): text -> ids, equal to the host's.
 *
 * ByteLevel BPE, as the `tokenizers` library encodes with add_special_tokens=False: split the text
 * at its added tokens (leftmost, then longest match), cut each piece between them with the GPT-2
 * pre-tokenizer regex
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (classes from the section's code-point runs), map each byte of a piece to its symbol and merge.
 * llama2.c (and SentencePiece-style tokenizer.json): split the text at its added tokens (none for a
 * tokenizer.bin) as above; each stretch between them gets the dummy prefix " " by the section's
 * prefix rule, one symbol per UTF-8 character that is a piece (else one per byte, byte fallback),
 * and merges whole.
 * Merging is the same for both: while some adjacent pair has a merge, merge the pair of lowest
 * rank, the leftmost of equal ranks (the section turned llama2.c's scores into ranks).
 *
 * Symbols live in the caller's scratch: sym[i] and rank[i] (the rank of pair i, i+1), compacted
 * after each merge, so a text of n bytes costs O(n^2) steps at worst and 8 bytes per symbol. */
#include "tokenize.h"

#include <string.h>

enum { KIND_BPE = 1, KIND_LLAMA2C = 2 };
enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 };
#define HEADER 64u
#define MAX_SPAN 4096u

static int fail(char *err, size_t n, const char *why) {
    static const char pre[] = "tokenizer.enc: ";
    size_t i = 0;
    for (const char *s = pre; *s && i + 1 < n; s++) err[i++] = *s;
    for (const char *s = why; *s && i + 1 < n; s++) err[i++] = *s;
    if (n) err[i] = 0;
    return -1;
}

/* A table of count entries of size bytes at the offset in header field at: inside the section. */
static const uint8_t *table(const uint8_t *sec, uint32_t len, uint32_t at, uint32_t count, uint32_t size) {
    uint32_t off = flm_rd32(sec + at);
    if (off < HEADER || (uint64_t)off + (uint64_t)count * size > len) return 0;
    return sec + off;
}

int flm_tok_open(flm_tokenizer *t, const flm_model *m, char *err, size_t en) {
    uint32_t len = 0;
    const uint8_t *s = flm_blob_section(m, "tokenizer.enc", &len);
    memset(t, 0, sizeof *t);
    if (!s) return fail(err, en, "the image has no text encoder (its tokenizer is not one the device can reproduce)");
    if (len < HEADER || flm_rd32(s) != 1u) return fail(err, en, "unknown section version");
    t->sec = s;
    t->vocab = m->vocab;
    t->kind = flm_rd32(s + 4);
    t->span = flm_rd32(s + 8);
    t->prefix_id = flm_rd32(s + 16);
    t->n_pairs = flm_rd32(s + 20);
    t->n_runs = flm_rd32(s + 28);
    t->n_added = flm_rd32(s + 36);
    t->n_chars = flm_rd32(s + 44);
    t->prefix_rule = flm_rd32(s + 56);
    if ((t->kind != KIND_BPE && t->kind != KIND_LLAMA2C) || t->span == 0 || t->span > MAX_SPAN ||
        t->prefix_rule > FLM_PREFIX_FIRST)
        return fail(err, en, "bad kind, span or prefix rule");
    t->pairs = table(s, len, 24, t->n_pairs, 16);
    t->runs = table(s, len, 32, t->n_runs, 4);
    t->added = table(s, len, 40, t->n_added, 12);
    t->chars = table(s, len, 48, t->n_chars, 8);
    t->byte_ids = table(s, len, 52, 256, 4);
    if (!t->pairs || !t->runs || !t->added || !t->chars || !t->byte_ids) return fail(err, en, "a table is out of bounds");
    if (t->prefix_id != FLM_NONE && t->prefix_id >= m->vocab) return fail(err, en, "bad prefix id");
    uint64_t prev = 0;
    for (uint32_t i = 0; i < t->n_pairs; i++) {
        const uint8_t *p = t->pairs + 16u * i;
        uint64_t key = (uint64_t)flm_rd32(p) << 32 | flm_rd32(p + 4);
        if (flm_rd32(p) >= m->vocab || flm_rd32(p + 4) >= m->vocab || flm_rd32(p + 12) >= m->vocab ||
            flm_rd32(p + 8) == FLM_NONE || (i && key <= prev))
            return fail(err, en, "bad or unsorted merge pair");
        prev = key;
    }
    if (t->kind == KIND_BPE && (t->n_runs == 0 || flm_rd32(t->runs) != 0u))
        return fail(err, en, "the Unicode classes must start at code point 0");
    for (uint32_t i = 1; i < t->n_runs; i++)
        if (flm_rd32(t->runs + 4u * i) >> 2 <= flm_rd32(t->runs + 4u * i - 4u) >> 2 ||
            flm_rd32(t->runs + 4u * i) >> 2 > 0x10FFFFu)
            return fail(err, en, "unsorted Unicode class runs");
    for (uint32_t i = 0; i < t->n_added; i++) {
        const uint8_t *a = t->added + 12u * i;
        uint32_t off = flm_rd32(a + 4), n = flm_rd32(a + 8);
        if (flm_rd32(a) >= m->vocab || n == 0 || off < HEADER || (uint64_t)off + n > len)
            return fail(err, en, "bad added token");
    }
    for (uint32_t i = 0; i < t->n_chars; i++)
        if (flm_rd32(t->chars + 8u * i + 4u) >= m->vocab || (i && flm_rd32(t->chars + 8u * i) <= flm_rd32(t->chars + 8u * i - 8u)))
            return fail(err, en, "bad or unsorted character pieces");
    for (uint32_t b = 0; b < 256u; b++) {
        uint32_t id = flm_rd32(t->byte_ids + 4u * b);
        if (id >= m->vocab && !(id == FLM_NONE && t->kind == KIND_LLAMA2C)) return fail(err, en, "bad byte symbol");
    }
    return 0;
}

size_t flm_tok_scratch_bytes(const flm_tokenizer *t, uint32_t seq_len) {
    return 8u * ((size_t)seq_len * t->span + 1u);
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

/* Offset of the first byte that does not start a well-formed UTF-8 sequence (no overlongs,
 * surrogates or code points past U+10FFFF), or n. */
static size_t utf8_check(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k = c < 0x80u ? 1u : c >= 0xC2u && c <= 0xDFu ? 2u : c >= 0xE0u && c <= 0xEFu ? 3u
                 : c >= 0xF0u && c <= 0xF4u ? 4u : 0u;
        if (k == 0 || k > n - i) return i;
        uint8_t lo = 0x80u, hi = 0xBFu;   /* the second byte's range excludes overlongs, surrogates, > U+10FFFF */
        if (c == 0xE0u) lo = 0xA0u;
        else if (c == 0xEDu) hi = 0x9Fu;
        else if (c == 0xF0u) lo = 0x90u;
        else if (c == 0xF4u) hi = 0x8Fu;
        if (k > 1u && (s[i + 1] < lo || s[i + 1] > hi)) return i;
        for (size_t j = 2; j < k; j++)
            if ((s[i + j] & 0xC0u) != 0x80u) return i;
        i += k;
    }
    return n;
}

/* The code point at s[*i] (well-formed UTF-8); advances *i past it. */
static uint32_t next_cp(const uint8_t *s, size_t *i) {
    uint32_t c = s[(*i)++];
    if (c < 0x80u) return c;
    uint32_t extra = c >= 0xF0u ? 3u : c >= 0xE0u ? 2u : 1u;
    c &= 0x3Fu >> extra;
    while (extra--) c = c << 6 | (s[(*i)++] & 0x3Fu);
    return c;
}

/* ---- the GPT-2 pre-tokenizer ----------------------------------------------------------------- */

static uint32_t cp_class(const flm_tokenizer *t, uint32_t cp) {
    uint32_t lo = 0, hi = t->n_runs - 1u;   /* the last run starting at or before cp */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1u) / 2u;
        if (flm_rd32(t->runs + 4u * mid) >> 2 <= cp) lo = mid;
        else hi = mid - 1u;
    }
    return flm_rd32(t->runs + 4u * lo) & 3u;
}

static uint32_t class_at(const flm_tokenizer *t, const uint8_t *s, size_t *i) { return cp_class(t, next_cp(s, i)); }

/* End of the regex match that starts at s[i] (i < n; the regex matches every non-empty text). */
static size_t gpt2_piece(const flm_tokenizer *t, const uint8_t *s, size_t i, size_t n) {
    size_t j = i, run;
    uint32_t c = next_cp(s, &j), k = cp_class(t, c);
    if (c == '\'' && j < n) {                            /* 's 't 're 've 'm 'll 'd */
        uint8_t a = s[j], b = j + 1u < n ? s[j + 1u] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return j + 1u;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return j + 2u;
    }
    run = j;
    if (c == ' ' && j < n) {                             /* " ?X+": one space leads a letter, number or other run */
        size_t j2 = j;
        uint32_t k2 = class_at(t, s, &j2);
        if (k2 != C_SPACE) { k = k2; run = j2; }
    }
    if (k != C_SPACE) {
        for (size_t nx = run; run < n && class_at(t, s, &nx) == k; nx = run) run = nx;
        return run;
    }
    size_t last = i;                                     /* where the white-space run's last character starts */
    for (size_t nx = run; run < n && class_at(t, s, &nx) == C_SPACE; nx = run) { last = run; run = nx; }
    /* "\s+(?!\S)": before more text the run gives up its last character (which then leads the next
     * piece), unless it is that one character ("\s+") */
    return run < n && last > i ? last : run;
}

/* ---- merging ------------------------------------------------------------------------------- */

typedef struct {
    const flm_tokenizer *t;
    uint32_t *ids, cap, n;     /* the output: first cap ids kept, all counted */
    uint32_t *sym, *rank;      /* scratch: seq_len * span + 1 symbols each, which any text */
} enc;                         /* flm_tok_encode goes on to encode needs */

static void emit(enc *e, uint32_t id) {
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
}

/* Rank of the pair (a, b), or FLM_NONE; its merged id in *merged. */
static uint32_t pair_rank(const flm_tokenizer *t, uint32_t a, uint32_t b, uint32_t *merged) {
    uint32_t lo = 0, hi = t->n_pairs;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u;
        const uint8_t *p = t->pairs + 16u * mid;
        uint32_t l = flm_rd32(p), r = flm_rd32(p + 4);
        if (l == a && r == b) {
            *merged = flm_rd32(p + 12);
            return flm_rd32(p + 8);
        }
        if (l < a || (l == a && r < b)) lo = mid + 1u;
        else hi = mid;
    }
    return FLM_NONE;
}

static void set_rank(enc *e, size_t i) {
    uint32_t unused;
    e->rank[i] = pair_rank(e->t, e->sym[i], e->sym[i + 1], &unused);
}

/* Merge sym[0..n) as far as the merges go, then emit it. */
static void merge_emit(enc *e, size_t n) {
    for (size_t i = 0; i + 1u < n; i++) set_rank(e, i);
    for (;;) {
        size_t at = 0;
        uint32_t best = FLM_NONE, merged = 0;
        for (size_t i = 0; i + 1u < n; i++)
            if (e->rank[i] < best) { best = e->rank[i]; at = i; }
        if (best == FLM_NONE) break;
        pair_rank(e->t, e->sym[at], e->sym[at + 1u], &merged);
        e->sym[at] = merged;
        memmove(e->sym + at + 1u, e->sym + at + 2u, (n - at - 2u) * sizeof *e->sym);
        if (n - at > 3u) memmove(e->rank + at + 1u, e->rank + at + 2u, (n - at - 3u) * sizeof *e->rank);
        n--;
        if (at + 1u < n) set_rank(e, at);
        if (at > 0u) set_rank(e, at - 1u);
    }
    for (size_t i = 0; i < n; i++) emit(e, e->sym[i]);
}

static void bpe_word(enc *e, const uint8_t *w, size_t n) {
    for (size_t i = 0; i < n; i++) e->sym[i] = flm_rd32(e->t->byte_ids + 4u * w[i]);
    merge_emit(e, n);
}

/* The added token matching s[i..n) longest (its index), or FLM_NONE. */
static uint32_t added_at(const flm_tokenizer *t, const uint8_t *s, size_t i, size_t n, uint32_t *mlen) {
    uint32_t best = FLM_NONE;
    *mlen = 0;
    for (uint32_t k = 0; k < t->n_added; k++) {
        const uint8_t *a = t->added + 12u * k;
        uint32_t len = flm_rd32(a + 8);
        if (len > *mlen && len <= n - i && !memcmp(s + i, t->sec + flm_rd32(a + 4), len)) { best = k; *mlen = len; }
    }
    return best;
}

static void encode_bpe(enc *e, const uint8_t *s, size_t n) {
    const flm_tokenizer *t = e->t;
    size_t pos = 0;
    while (pos < n) {
        size_t at = pos;
        uint32_t k = FLM_NONE, mlen = 0;
        for (; at < n && (k = added_at(t, s, at, n, &mlen)) == FLM_NONE; at++) {}
        for (size_t i = pos; i < at;) {          /* the text before it, piece by piece */
            size_t j = gpt2_piece(t, s, i, at);
            bpe_word(e, s + i, j - i);
            i = j;
        }
        if (k == FLM_NONE) break;
        emit(e, flm_rd32(t->added + 12u * k));
        pos = at + mlen;
    }
}

/* The piece spelled by the 1-4 bytes of one character, or FLM_NONE. */
static uint32_t char_piece(const flm_tokenizer *t, const uint8_t *c, size_t len) {
    uint32_t key = 0;
    for (size_t i = 0; i < 4u; i++) key = key << 8 | (i < len ? c[i] : 0u);
    uint32_t lo = 0, hi = t->n_chars;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2u, k = flm_rd32(t->chars + 8u * mid);
        if (k == key) return flm_rd32(t->chars + 8u * mid + 4u);
        if (k < key) lo = mid + 1u;
        else hi = mid;
    }
    return FLM_NONE;
}

/* Whether the stretch s[start..start+n) of the text gets the dummy prefix: a space is " " or "\u2581". */
static int gets_prefix(const flm_tokenizer *t, const uint8_t *s, size_t start, size_t n) {
    const uint8_t *c = s + start;
    int space = n && (c[0] == ' ' || (n >= 3u && c[0] == 0xE2u && c[1] == 0x96u && c[2] == 0x81u));
    if (!n || t->prefix_id == FLM_NONE) return 0;
    return t->prefix_rule == FLM_PREFIX_ALWAYS || (!space && (t->prefix_rule == FLM_PREFIX_UNLESS_SPACE || start == 0));
}

static int encode_stretch(enc *e, const uint8_t *text, size_t start, size_t n, flm_tok_result *r) {
    const flm_tokenizer *t = e->t;
    const uint8_t *s = text + start;
    size_t m = 0;
    if (gets_prefix(t, text, start, n)) e->sym[m++] = t->prefix_id;   /* sentencepiece's dummy prefix */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        next_cp(s, &j);
        uint32_t id = char_piece(t, s + i, j - i);
        if (id != FLM_NONE) {
            e->sym[m++] = id;
        } else {
            for (size_t b = i; b < j; b++) {
                id = flm_rd32(t->byte_ids + 4u * s[b]);
                if (id == FLM_NONE) { r->at = (uint32_t)(start + b); r->byte = s[b]; return FLM_TOK_NO_PIECE; }
                e->sym[m++] = id;
            }
        }
        i = j;
    }
    merge_emit(e, m);
    return FLM_TOK_OK;
}

static int encode_llama2c(enc *e, const uint8_t *s, size_t n, flm_tok_result *r) {
    size_t pos = 0;
    for (;;) {
        size_t at = pos;
        uint32_t k = FLM_NONE, mlen = 0;
        for (; at < n && (k = added_at(e->t, s, at, n, &mlen)) == FLM_NONE; at++) {}
        int rc = encode_stretch(e, s, pos, at - pos, r);
        if (rc != FLM_TOK_OK || k == FLM_NONE) return rc;
        emit(e, flm_rd32(e->t->added + 12u * k));
        pos = at + mlen;
    }
}

int flm_tok_encode(const flm_tokenizer *t, const uint8_t *text, size_t len, uint32_t bos, uint32_t *ids,
                   uint32_t seq_len, void *scratch, flm_tok_result *r) {
    size_t room = (size_t)seq_len * t->span + 1u;
    enc e = {t, ids, seq_len, 0, (uint32_t *)scratch, (uint32_t *)scratch + room};
    memset(r, 0, sizeof *r);
    size_t bad = utf8_check(text, len);
    if (bad < len) { r->at = (uint32_t)bad; return FLM_TOK_BAD_UTF8; }
    if (bos != FLM_NONE) emit(&e, bos);
    if (len > (size_t)seq_len * t->span) {     /* more than seq_len tokens: no need to look closer */
        r->n = e.n + (uint32_t)((len + t->span - 1u) / t->span);
        return FLM_TOK_TOO_LONG;
    }
    int rc = t->kind == KIND_BPE ? (encode_bpe(&e, text, len), FLM_TOK_OK) : encode_llama2c(&e, text, len, r);
    r->n = e.n;
    return rc;
}
