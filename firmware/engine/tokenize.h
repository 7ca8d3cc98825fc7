/* The device tokenizer: a UTF-8 text prompt -> token ids, with the tables of the blob's
 * tokenizer.enc section (docs/formats.md section 1.1). The ids equal the host's
 * (converter/tokenizer.py encode(), i.e. the `tokenizers` library or llama2.c's algorithm).
 * No allocation: the caller lends a scratch buffer; time is bounded by the text's length. */
#ifndef FLM_TOKENIZE_H
#define FLM_TOKENIZE_H
#include "blob.h"

typedef struct {
    uint32_t kind, span, vocab, prefix_id, n_pairs, n_runs, n_added, n_chars;
    uint32_t prefix_rule;   /* kind 2: which stretch between added tokens gets the prefix (FLM_PREFIX_*) */
    const uint8_t *sec, *pairs, *runs, *added, *chars, *byte_ids;
} flm_tokenizer;

enum { FLM_PREFIX_ALWAYS = 0, FLM_PREFIX_UNLESS_SPACE = 1, FLM_PREFIX_FIRST = 2 };
enum { FLM_TOK_OK = 0, FLM_TOK_BAD_UTF8, FLM_TOK_NO_PIECE, FLM_TOK_TOO_LONG };

typedef struct {
    uint32_t n;      /* ids of the text, BOS included (FLM_TOK_TOO_LONG: a lower bound) */
    uint32_t at;     /* FLM_TOK_BAD_UTF8, FLM_TOK_NO_PIECE: byte offset in the text */
    uint8_t byte;    /* FLM_TOK_NO_PIECE: the byte no piece encodes */
} flm_tok_result;

/* Find and check the image's tokenizer.enc section. Returns 0, or -1 with the reason in err
 * (no section, or one that does not match this model). For an m that flm_blob_open accepted. */
int flm_tok_open(flm_tokenizer *t, const flm_model *m, char *err, size_t errlen);
/* Scratch bytes flm_tok_encode needs for texts that can fit a context of seq_len ids. */
size_t flm_tok_scratch_bytes(const flm_tokenizer *t, uint32_t seq_len);
/* Encode text[0..len): BOS first when bos != FLM_NONE. Writes the first seq_len ids to ids and
 * counts them all in r->n; a text longer than seq_len * span bytes is FLM_TOK_TOO_LONG at once
 * (every token covers at most span bytes). scratch holds flm_tok_scratch_bytes(t, seq_len) bytes,
 * 4-aligned. Returns FLM_TOK_*; the caller compares r->n with seq_len. */
int flm_tok_encode(const flm_tokenizer *t, const uint8_t *text, size_t len, uint32_t bos, uint32_t *ids,
                   uint32_t seq_len, void *scratch, flm_tok_result *r);
#endif
