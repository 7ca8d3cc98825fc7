/* Text prompts (GENERATE_TEXT and console lines, docs/formats.md 1.1, 2.3): the image's encoder
 * (tokenize.c) turns them into the prompt's ids. */
#include "app_prompt.h"
#include "app_state.h"
#include "app_text.h"
#include "hal.h"

/* The image's text encoder (its tokenizer.enc section), or why there is none. */
static struct {
    const uint8_t *blob;   /* the image this describes */
    uint32_t kv_fmt;       /* ... with its KV cache in this format (the scratch it borrows: LAYOUT) */
    int ok;
    flm_tokenizer t;
    char why[120];
} T;

const flm_tokenizer *app_text_encoder(void) {
    const flm_model *m = &flm_dev.model;
    if (!flm_dev.image_ok) return 0;
    if (T.blob != m->blob || T.kv_fmt != m->kv_fmt) {
        T.blob = m->blob;
        T.kv_fmt = m->kv_fmt;
        T.ok = flm_tok_open(&T.t, m, T.why, sizeof T.why) == 0;
        size_t need = T.ok ? flm_tok_scratch_bytes(&T.t, m->seq_len) : 0u, kv = flm_state_region_bytes(m, FLM_REG_KV);
        size_t frame = 37u + (size_t)m->seq_len * T.t.span;   /* GENERATE_TEXT of the longest text that can fit */
        if (T.ok && need > kv) {
            T.ok = 0;
            app_fmt2(T.why, sizeof T.why, "the text encoder needs ", (uint32_t)need,
                 " bytes of scratch but the KV cache it borrows has ", (uint32_t)kv, "");
        } else if (T.ok && frame + frame / 254u + 1u > sizeof flm_rxbuf) {
            T.ok = 0;
            app_fmt2(T.why, sizeof T.why, "text prompts need a receive buffer of ", (uint32_t)(frame + frame / 254u + 1u),
                 " bytes; this build has ", (uint32_t)sizeof flm_rxbuf, "");
        }
    }
    return T.ok ? &T.t : 0;
}

/* (the encoder's scratch is the KV cache's memory: it is idle between generations and every
 * generation starts it afresh) */
uint16_t app_encode_text(const uint8_t *text, size_t len, uint32_t *n, uint32_t *us, char *err, size_t en) {
    const flm_model *m = &flm_dev.model;
    const flm_tokenizer *t = app_text_encoder();
    if (!flm_dev.image_ok) { app_scopy(err, en, flm_dev.image_err); return app_no_model_code(); }
    if (!t) { app_scopy(err, en, T.why); return FLM_E_CANNOT_ENCODE; }
    if (m->bos != FLM_NONE && m->bos >= m->vocab) {     /* the header's BOS is not checked at boot */
        app_fmt2(err, en, "the image's BOS id ", m->bos, " is outside the vocabulary of ", m->vocab, "");
        return FLM_E_BAD_TOKEN;
    }
    flm_tok_result r;
    uint64_t t0 = hal_time_us();
    int rc = flm_tok_encode(t, text, len, m->bos, flm_dev.prompt, m->seq_len, flm_dev.state.kc, &r);
    *us = (uint32_t)(hal_time_us() - t0);
    *n = r.n;
    if (rc == FLM_TOK_BAD_UTF8) {
        app_fmt2(err, en, "the text prompt is not UTF-8: bad byte at offset ", r.at, " of ", (uint32_t)len, "");
        return FLM_E_BAD_MESSAGE;
    }
    if (rc == FLM_TOK_NO_PIECE) {
        app_fmt2(err, en, "cannot encode byte ", r.byte, " at offset ", r.at, ": no piece and no byte fallback for it");
        return FLM_E_CANNOT_ENCODE;
    }
    if (rc == FLM_TOK_TOO_LONG || r.n > m->seq_len) {
        app_fmt2(err, en, rc == FLM_TOK_TOO_LONG ? "prompt of at least " : "prompt of ", r.n,
             " tokens exceeds the context of ", m->seq_len, " tokens");
        return FLM_E_PROMPT_TOO_LONG;
    }
    return 0;
}
