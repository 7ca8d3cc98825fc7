/* Runs the firmware's text encoder (firmware/engine/tokenize.c) on the tokenizer.enc section of a
 * blob, for texts read from stdin (each: u32 little-endian length, bytes), with BOS and a context
 * of the model's max_seq_len, as GENERATE_TEXT does. Prints one line per text:
 * "status n at byte id id ..." (the ids kept, at most max_seq_len), or "open: reason" once. */
#include <stdio.h>
#include <stdlib.h>

#include "blob.h"
#include "tokenize.h"

static uint8_t *read_all(FILE *f, size_t *n) {
    size_t cap = 1u << 16, len = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    *n = len;
    return buf;
}

int main(int argc, char **argv) {
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : 0;
    if (!f) return 2;
    size_t blob_len, in_len;
    uint8_t *blob = read_all(f, &blob_len);
    fclose(f);
    uint8_t *in = read_all(stdin, &in_len);
    static flm_model m;
    flm_tokenizer t;
    char err[160];
    if (!blob || !in || flm_blob_open(&m, blob, blob_len, err, sizeof err) != 0) return 2;
    if (flm_tok_open(&t, &m, err, sizeof err) != 0) {
        printf("open: %s\n", err);
        return 0;
    }
    uint32_t *ids = malloc(4u * m.seq_len);
    void *scratch = malloc(flm_tok_scratch_bytes(&t, m.seq_len));
    for (size_t pos = 0; pos + 4u <= in_len;) {
        uint32_t n = flm_rd32(in + pos);
        pos += 4u;
        if (n > in_len - pos) return 2;
        flm_tok_result r;
        int rc = flm_tok_encode(&t, in + pos, n, m.bos, ids, m.seq_len, scratch, &r);
        pos += n;
        printf("%d %u %u %u", rc, r.n, r.at, r.byte);
        for (uint32_t i = 0; rc == FLM_TOK_OK && i < r.n && i < m.seq_len; i++) printf(" %u", ids[i]);
        putchar('\n');
    }
    free(ids);
    free(scratch);
    free(in);
    free(blob);
    return 0;
}
