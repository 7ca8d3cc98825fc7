/* libFuzzer target: the firmware's blob reader (firmware/engine/blob.c), and the engine running
 * whatever it accepts. Built by tests/fuzz/run.py with ASan + UBSan.
 *
 * Input: byte 0 selects the mode, the rest is the image (in a buffer of exactly its size, so any
 * read past the end is an ASan report).
 *   bit0: write the real size into total_size, bit1: write the right CRC-32 (so mutations get
 *   past the header checks to the table, section and tokenizer checks);
 *   bit2: when the image is accepted, run a few forward steps and the sampler on it (bit3: sample
 *   the whole head, else the pruned greedy scan; bit4: top-p; bit5: slide the window at the end;
 *   bit6: then a multi-token pass of the placement's batch with every token's head).
 * Oracle, beyond the sanitizers: a refusal is one NUL-terminated printable line; an accepted
 * image's pieces and tensors lie inside the image. An image with a tokenizer.enc section the
 * encoder accepts encodes a few texts (firmware/engine/tokenize.c) into ids inside the vocabulary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "crc32.h"
#include "engine.h"
#include "hal.h"
#include "sampler.h"
#include "tokenize.h"

static uint64_t now_us;
uint64_t hal_time_us(void) { return now_us += 3u; }

static size_t bounded_len(const char *s, size_t cap) {
    size_t n = 0;
    while (n < cap && s[n]) n++;
    return n;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void refusal_is_one_line(const char *err, size_t cap) {
    size_t len = bounded_len(err, cap);
    if (len == cap || len == 0) { fprintf(stderr, "oracle: refusal text not terminated\n"); abort(); }
    for (size_t i = 0; i < len; i++)
        if (err[i] < ' ' || err[i] > '~') { fprintf(stderr, "oracle: refusal text not printable\n"); abort(); }
}

/* The device tokenizer on the image's tokenizer.enc, when it has one the encoder accepts. */
static void encode_texts(const flm_model *m) {
    static const char *const texts[] = {"", "Once upon a time", "ab  c\n\n d'll 12 \xc3\xa9\xf0\x9f\x98\x80",
                                        "<|bos|>x<|eos|>", "\xff bad", "                                        "};
    flm_tokenizer t;
    char err[120];
    memset(err, 0x55, sizeof err);
    if (flm_tok_open(&t, m, err, sizeof err) != 0) { refusal_is_one_line(err, sizeof err); return; }
    size_t need = flm_tok_scratch_bytes(&t, m->seq_len);
    uint32_t *ids = malloc(4u * m->seq_len);
    void *scratch = need <= (64u << 20) ? malloc(need) : 0;
    for (size_t k = 0; ids && scratch && k < sizeof texts / sizeof *texts; k++) {
        flm_tok_result r;
        size_t len = bounded_len(texts[k], 64);
        int rc = flm_tok_encode(&t, (const uint8_t *)texts[k], len, m->bos, ids, m->seq_len, scratch, &r);
        for (uint32_t i = 0; rc == FLM_TOK_OK && i < r.n && i < m->seq_len; i++)
            if (ids[i] >= m->vocab && ids[i] != m->bos) { fprintf(stderr, "oracle: encoded id outside the vocabulary\n"); abort(); }
        if ((rc == FLM_TOK_BAD_UTF8 || rc == FLM_TOK_NO_PIECE) && r.at >= len) { fprintf(stderr, "oracle: bad offset\n"); abort(); }
    }
    free(ids);
    free(scratch);
}

static void inside(const flm_model *m, const flm_tensor *t, const uint8_t *b, size_t n) {
    if (!t->data) return;
    if (t->data < b || t->data + t->length > b + n) {
        fprintf(stderr, "oracle: an accepted tensor lies outside the image\n");
        abort();
    }
    (void)m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return 0;
    memcpy(b, data + 1, n);
    if ((mode & 1) && n >= 12) put32(b + 8, (uint32_t)n);
    if ((mode & 2) && n >= 16) put32(b + 12, flm_crc32_update(0, b + 16, n - 16));

    static flm_model m;
    char err[120];
    memset(err, 0x55, sizeof err);
    if (flm_blob_open(&m, b, n, err, sizeof err) != 0) {
        refusal_is_one_line(err, sizeof err);
        free(b);
        return 0;
    }
    for (uint32_t i = 0; i < m.vocab; i++) {
        uint32_t len;
        const uint8_t *p = flm_piece(&m, i, &len);
        if (p < b || p + len > b + n) { fprintf(stderr, "oracle: piece outside the image\n"); abort(); }
    }
    inside(&m, &m.head, b, n);
    for (uint32_t i = 0; flm_tensor_at(&m, i); i++) inside(&m, flm_tensor_at(&m, i), b, n);
    encode_texts(&m);
    flm_blob_retier(&m, NULL);
    size_t need = flm_state_bytes(&m);
    if ((mode & 4) && need <= (8u << 20)) {
        uint8_t *arena = malloc(need ? need : 1);
        flm_state s;
        if (arena && flm_state_init(&s, &m, arena, need, FLM_TIER_SRAM) == 0) {
            flm_rng rng;
            flm_rng_seed(&rng, mode);
            /* bit5: start at the last position, so the second step slides the window (as GENERATE
             * with SLIDE does); the head is the whole one (then sampled) or the pruned greedy scan */
            uint32_t tok = 0, pos = (mode & 32) && m.seq_len >= 3u ? m.seq_len - 1u : 0u;
            for (uint32_t k = 0; k < 3u; k++, pos++) {
                flm_step_stats st;
                memset(&st, 0, sizeof st);
                if (pos >= m.seq_len) {
                    if (m.seq_len < 3u) break;
                    uint32_t n_drop = (m.seq_len - 1u) / 2u;
                    flm_slide(&s, n_drop, &st);
                    pos = m.seq_len - n_drop;
                }
                flm_body(&s, tok, pos, &st);
                if (mode & 8) tok = flm_sample(flm_head(&s, &st), m.n_out, 0.8f, (mode & 16) ? 0.9f : 0.0f, &rng,
                                               s.probs, s.idx);
                else tok = flm_head_argmax(&s, &st);
                if (tok >= m.n_out || st.head_rows > m.n_out) {
                    fprintf(stderr, "oracle: token or head rows outside the output vocabulary\n");
                    abort();
                }
            }
            /* bit6: a multi-token pass of the placement's batch (fresh from position 0), every head */
            if (mode & 64) {
                uint32_t ids[255], n = m.batch < m.seq_len ? m.batch : m.seq_len;
                flm_step_stats st;
                memset(&st, 0, sizeof st);
                for (uint32_t i = 0; i < n; i++) ids[i] = (tok + i) % m.vocab;
                flm_body_many(&s, ids, n, 0, &st);
                const float *lg = flm_head_all(&s, &st);
                if (flm_sample(lg + (size_t)(n - 1u) * m.n_out, m.n_out, 0.0f, 0.0f, &rng, s.probs, s.idx) >= m.n_out) abort();
            }
        }
        free(arena);
    }
    free(b);
    return 0;
}
