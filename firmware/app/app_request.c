/* GENERATE and GENERATE_TEXT (docs/formats.md section 2): the same fixed fields, then the prompt as
 * token ids or as text. Either becomes one request, checked in one place, then generated with the
 * framed protocol as its output. */
#include "app_request.h"
#include "app_frames.h"
#include "app_generate.h"
#include "app_prompt.h"
#include "app_text.h"

/* The fixed fields: u32 max_new_tokens, f32 temperature, f32 top_p, u64 seed, u32 flags, u8 batch,
 * u8 speculate, u8 draft_k, u8 0; then GENERATE's u32 n_prompt and ids, GENERATE_TEXT's s16 text. */
#define HEAD 28u

static app_request parse_head(const uint8_t *p) {
    app_request r;
    r.max_new = flm_get_u32(p);
    r.temperature = flm_get_f32(p + 4);
    r.top_p = flm_get_f32(p + 8);
    r.seed = flm_get_u64(p + 12);
    r.flags = flm_get_u32(p + 20);
    r.batch = p[24];                                              /* 0: the placement's */
    r.speculate = p[25];
    r.draft_k = p[26] ? p[26] : flm_dev.model.batch - 1u;        /* 0: as many as a pass holds */
    r.n = 0;
    return r;
}

/* Check r (with head byte 27, which must be 0), the prompt ids into flm_dev.prompt from ids when
 * given (GENERATE; GENERATE_TEXT's are there, encoded). Returns 1, or sends the ERROR and returns 0. */
static int accepted(app_request *r, uint8_t reserved, const uint8_t *ids) {
    const flm_model *m = &flm_dev.model;
    char t[120];
    if (r->n == 0) { app_send_error(FLM_E_BAD_MESSAGE, "empty prompt"); return 0; }
    if (r->flags & ~GEN_FLAGS) {
        size_t i = 0;
        app_put_str(t, &i, sizeof t, "GENERATE flags ");
        app_put_dec(t, &i, sizeof t, r->flags);
        app_put_str(t, &i, sizeof t, " has unknown bits (known: 1 logits, 2 slide, 4 all logits)");
        app_send_error(FLM_E_BAD_MESSAGE, t);
        return 0;
    }
    if (r->speculate > SPEC_DRAFT || reserved) {
        app_send_error(FLM_E_BAD_MESSAGE, "GENERATE: speculate must be 0 (none), 1 (prompt lookup) or 2 (the draft "
                                          "model), the byte after draft_k 0");
        return 0;
    }
    if (r->temperature != r->temperature || r->temperature - r->temperature != 0.0f || r->top_p != r->top_p) {
        app_send_error(FLM_E_BAD_MESSAGE, "temperature must be a finite number and top_p a number");
        return 0;
    }
    if (r->batch > m->batch) {
        app_fmt2(t, sizeof t, "GENERATE asks for passes of ", r->batch, " tokens; this placement runs at most ", m->batch,
                 "");
        app_send_error(FLM_E_BAD_MESSAGE, t);
        return 0;
    }
    if (r->speculate && r->temperature > 0.0f) {
        app_send_error(FLM_E_BAD_MESSAGE, "speculative decoding verifies greedy tokens only: use temperature 0 "
                                          "(exact speculative sampling is not implemented)");
        return 0;
    }
    if (r->speculate && (r->draft_k < 1u || r->draft_k + 1u > m->batch)) {
        app_fmt2(t, sizeof t, "speculative decoding: ", r->draft_k, " draft(s) need a batch of one more; this placement's is ",
                 m->batch, "");
        app_send_error(FLM_E_BAD_MESSAGE, t);
        return 0;
    }
    if (r->speculate == SPEC_DRAFT && !flm_dev.draft_ok) {
        app_send_error(FLM_E_BAD_MESSAGE, flm_dev.draft_why);
        return 0;
    }
    if (r->n > m->seq_len) {
        app_fmt2(t, sizeof t, "prompt of ", r->n, " tokens exceeds the context of ", m->seq_len, " tokens");
        app_send_error(FLM_E_PROMPT_TOO_LONG, t);
        return 0;
    }
    for (uint32_t i = 0; i < r->n; i++) {
        if (ids) flm_dev.prompt[i] = flm_get_u32(ids + 4u * i);
        if (flm_dev.prompt[i] >= m->vocab) {
            app_fmt2(t, sizeof t, "prompt token ", flm_dev.prompt[i], " is outside the vocabulary of ", m->vocab, "");
            app_send_error(FLM_E_BAD_TOKEN, t);
            return 0;
        }
    }
    if (!r->batch) r->batch = m->batch;
    return 1;
}

/* The framed protocol as a generation's output: TOKEN and LOGITS frames; between passes, the host's
 * PING, RESEND and STOP. */
static const app_output FRAMES = {app_send_token, app_send_logits, app_stop_requested};

static void run(const app_request *r) {
    flm_done d;
    app_ring_begin();                   /* accepted: a new generation, the ring starts empty */
    app_generate(r, &FRAMES, &d);
    app_ring_end(&d);
}

/* GENERATE payload: the fixed fields, u32 n_prompt, u32 ids[n_prompt]. */
void app_generate_ids(const uint8_t *p, size_t len) {
    if (!flm_dev.image_ok) { app_send_error(app_no_model_code(), flm_dev.image_err); return; }
    if (len < HEAD + 4u || len != HEAD + 4u + 4u * (size_t)flm_get_u32(p + HEAD)) {
        app_send_error(FLM_E_BAD_MESSAGE, "GENERATE payload has the wrong length");
        return;
    }
    app_request r = parse_head(p);
    r.n = flm_get_u32(p + HEAD);
    if (accepted(&r, p[27], p + HEAD + 4u)) run(&r);
}

/* GENERATE_TEXT payload: the fixed fields, then s16 text, encoded by the device (app_prompt.c). */
void app_generate_text(const uint8_t *p, size_t len) {
    uint32_t us;
    char t[120];
    size_t i = 0;
    if (len < HEAD + 2u || len != HEAD + 2u + (size_t)flm_get_u16(p + HEAD)) {
        app_send_error(FLM_E_BAD_MESSAGE, "GENERATE_TEXT payload has the wrong length");
        return;
    }
    app_request r = parse_head(p);
    uint16_t code = app_encode_text(p + HEAD + 2u, len - HEAD - 2u, &r.n, &us, t, sizeof t);
    if (code) { app_send_error(code, t); return; }
    app_put_str(t, &i, sizeof t, "text prompt: ");
    app_put_dec(t, &i, sizeof t, (uint32_t)(len - HEAD - 2u));
    app_put_str(t, &i, sizeof t, " bytes, ");
    app_put_dec(t, &i, sizeof t, r.n);
    app_put_str(t, &i, sizeof t, " tokens, encoded in ");
    app_put_elapsed(t, &i, sizeof t, us, 0);
    app_send_log(t);
    if (accepted(&r, p[27], 0)) run(&r);
}
