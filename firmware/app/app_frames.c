/* What the device sends (ERROR, LOG, HELLO, TOKEN, LOGITS, DONE), the frames it keeps for RESEND
 * (docs/formats.md section 2.1), and the host's frames between a generation's steps. */
#include "app_frames.h"
#include "app_prompt.h"
#include "app_receive.h"
#include "app_text.h"
#include "hal.h"
#include <string.h>

#ifndef FLM_TOKEN_RING
#define FLM_TOKEN_RING 32u               /* TOKEN frames kept for re-sending */
#endif
#define FLM_RESEND_MAX 32u               /* steps one RESEND may name */
enum { GEN_NONE = 0, GEN_RUNNING = 1, GEN_ENDED = 2 };

typedef struct {   /* a TOKEN frame's fields: the step's, then its pass's */
    uint32_t step, pos, in, out, head_rows, crc;
    uint32_t us[FLM_N_PHASES], bytes[FLM_N_TIERS];
    uint8_t index, len, used, kind;
    uint8_t route[FLM_MAX_LAYERS][FLM_MAX_TOP_K];       /* the step's token's experts per layer */
    uint8_t experts[FLM_MAX_LAYERS][FLM_EXPERT_MASK];   /* its pass's, per layer a bitmask */
} flm_kept_token;

static struct {
    flm_kept_token ring[FLM_TOKEN_RING];   /* step s lives at ring[s % FLM_TOKEN_RING] */
    uint32_t generation;                   /* GENERATEs accepted since boot */
    uint32_t steps;                        /* TOKEN steps the current/last generation sent */
    uint8_t state;                         /* GEN_* */
    flm_done done;                         /* the DONE of the last generation */
} K;

void app_send_error(uint16_t code, const char *text) {
    flm_tx_begin(&flm_dev.tx, FLM_ERROR);
    flm_tx_u16(&flm_dev.tx, code);
    flm_tx_s16(&flm_dev.tx, text, app_slen(text));
    flm_tx_end(&flm_dev.tx);
}

void app_send_log(const char *text) {
    flm_tx_begin(&flm_dev.tx, FLM_LOG);
    flm_tx_s16(&flm_dev.tx, text, app_slen(text));
    flm_tx_end(&flm_dev.tx);
}

void app_send_hello(void) {
    static const uint8_t zero[16];
    const char *board = hal_board_name();
    flm_tx_begin(&flm_dev.tx, FLM_HELLO);
    flm_tx_u16(&flm_dev.tx, FLM_PROTO_VERSION);
    flm_tx_u16(&flm_dev.tx, (uint16_t)((flm_dev.image_ok ? 1u : 0u) | 2u        /* bit1: answers RESEND */
                                 | (app_text_encoder() ? 4u : 0u)        /* bit2: encodes text */
                                 | (flm_dev.image_ok && flm_dev.draft_ok ? 8u : 0u)));   /* bit3: a draft model */
    flm_tx_put(&flm_dev.tx, flm_dev.image_ok ? flm_dev.model.model_hash : zero, 16);
    flm_tx_u32(&flm_dev.tx, flm_dev.image_ok ? flm_dev.model.layout_id : 0u);
    flm_tx_u32(&flm_dev.tx, flm_dev.image_ok ? flm_dev.model.vocab : 0u);
    flm_tx_u32(&flm_dev.tx, flm_dev.image_ok ? flm_dev.model.n_out : 0u);
    flm_tx_u32(&flm_dev.tx, flm_dev.image_ok ? flm_dev.model.seq_len : 0u);
    flm_tx_u8(&flm_dev.tx, hal_clock_kind());
    flm_tx_s8(&flm_dev.tx, FLM_FW_VERSION, app_slen(FLM_FW_VERSION));
    flm_tx_s8(&flm_dev.tx, board, app_slen(board));
    flm_tx_u8(&flm_dev.tx, (uint8_t)(flm_dev.image_ok ? flm_dev.model.batch : 0u));   /* tokens per forward pass */
    flm_tx_u8(&flm_dev.tx, flm_dev.golden.state);           /* the golden check (app_golden.c) */
    flm_tx_u16(&flm_dev.tx, flm_dev.golden.checked);
    flm_tx_u16(&flm_dev.tx, flm_dev.golden.total);
    flm_tx_u16(&flm_dev.tx, flm_dev.golden.first_diff);
    flm_tx_end(&flm_dev.tx);
    if (!flm_dev.image_ok) app_send_error(flm_dev.kernels_ok ? FLM_E_BAD_IMAGE : FLM_E_SELF_CHECK, flm_dev.image_err);
}

void app_report_bad_frames(void) {
    if (flm_dev.rx.bad_frames != flm_dev.bad_seen) {
        char t[64];
        app_fmt2(t, sizeof t, "dropped ", flm_dev.rx.bad_frames - flm_dev.bad_seen, " corrupt frame(s), total ",
             flm_dev.rx.bad_frames, "");
        flm_dev.bad_seen = flm_dev.rx.bad_frames;
        app_send_error(FLM_E_BAD_FRAME, t);
    }
}

static void tx_token(const flm_kept_token *k) {
    flm_tx_begin(&flm_dev.tx, FLM_TOKEN);
    flm_tx_u32(&flm_dev.tx, k->step);
    flm_tx_u32(&flm_dev.tx, k->pos);
    flm_tx_u32(&flm_dev.tx, k->in);
    flm_tx_u32(&flm_dev.tx, k->out);
    for (int i = 0; i < FLM_N_PHASES; i++) flm_tx_u32(&flm_dev.tx, k->us[i]);
    for (int i = 0; i < FLM_N_TIERS; i++) flm_tx_u32(&flm_dev.tx, k->bytes[i]);
    flm_tx_u32(&flm_dev.tx, k->head_rows);
    flm_tx_u32(&flm_dev.tx, k->crc);
    flm_tx_u8(&flm_dev.tx, k->index);
    flm_tx_u8(&flm_dev.tx, k->len);
    flm_tx_u8(&flm_dev.tx, k->used);
    flm_tx_u8(&flm_dev.tx, k->kind);
    uint32_t plen = 0;
    const uint8_t *piece = k->out == FLM_NONE ? (const uint8_t *)"" : flm_piece(&flm_dev.model, k->out, &plen);
    flm_tx_s8(&flm_dev.tx, (const char *)piece, plen);
    const flm_model *m = &flm_dev.model;   /* the experts: layers, top_k, n_experts, then per layer the rest */
    const uint32_t L = m->n_experts ? m->n_layers : 0u, mb = (m->n_experts + 7u) / 8u;
    flm_tx_u8(&flm_dev.tx, (uint8_t)L);
    flm_tx_u8(&flm_dev.tx, (uint8_t)m->top_k);
    flm_tx_u8(&flm_dev.tx, (uint8_t)m->n_experts);
    for (uint32_t l = 0; l < L; l++) flm_tx_put(&flm_dev.tx, k->route[l], m->top_k);
    for (uint32_t l = 0; l < L; l++) flm_tx_put(&flm_dev.tx, k->experts[l], mb);
    flm_tx_end(&flm_dev.tx);
}

void app_send_token(uint32_t step, uint32_t pos, uint32_t in, uint32_t out, uint32_t head_rows, uint32_t crc,
                    const flm_pass *ps) {
    flm_kept_token *k = &K.ring[step % FLM_TOKEN_RING];
    k->step = step; k->pos = pos; k->in = in; k->out = out; k->head_rows = head_rows; k->crc = crc;
    memcpy(k->us, ps->st.us, sizeof k->us);
    memcpy(k->bytes, ps->st.bytes, sizeof k->bytes);
    k->index = (uint8_t)(step - ps->first);   /* the step's place in its pass */
    k->len = ps->len; k->used = ps->used; k->kind = ps->kind;
    for (uint32_t l = 0; l < flm_dev.model.n_layers && flm_dev.model.n_experts; l++)
        memcpy(k->route[l], flm_route(&flm_dev.state, l, k->index), flm_dev.model.top_k);
    memcpy(k->experts, ps->experts, sizeof k->experts);
    K.steps = step + 1u;
    tx_token(k);
}

static void send_done(void) {
    const flm_done *d = &K.done;
    flm_tx_begin(&flm_dev.tx, FLM_DONE);
    flm_tx_u32(&flm_dev.tx, d->steps);
    flm_tx_u32(&flm_dev.tx, d->generated);
    flm_tx_u8(&flm_dev.tx, d->reason);
    flm_tx_u64(&flm_dev.tx, d->total_us);
    for (int i = 0; i < FLM_N_PHASES; i++) flm_tx_u64(&flm_dev.tx, d->phase_us[i]);
    flm_tx_u32(&flm_dev.tx, d->passes);
    flm_tx_u32(&flm_dev.tx, d->verify_passes);
    flm_tx_u32(&flm_dev.tx, d->drafted);
    flm_tx_u32(&flm_dev.tx, d->accepted);
    for (int i = 0; i < FLM_N_TIERS; i++) flm_tx_u64(&flm_dev.tx, d->bytes[i]);
    for (int i = 0; i < FLM_N_TIERS; i++) flm_tx_u64(&flm_dev.tx, d->draft_bytes[i]);
    flm_tx_u32(&flm_dev.tx, d->stack_peak);
    flm_tx_u32(&flm_dev.tx, d->stack_size);
    flm_tx_end(&flm_dev.tx);
}

/* RESEND payload: u32 generation, u32 n, u32 step[n]; answered with the kept TOKEN frames (and
 * the DONE for step FLM_NONE) of that generation, then RESENT listing what was not sent. */
void app_resend(const uint8_t *p, size_t len) {
    uint32_t n = len >= 8u ? flm_get_u32(p + 4) : 0u;
    if (len < 8u || n > FLM_RESEND_MAX || len != 8u + 4u * (size_t)n) {
        app_send_error(FLM_E_BAD_MESSAGE, "RESEND payload has the wrong length (at most 32 steps)");
        return;
    }
    uint32_t gen = flm_get_u32(p), first = K.steps > FLM_TOKEN_RING ? K.steps - FLM_TOKEN_RING : 0u;
    uint32_t miss[FLM_RESEND_MAX], n_miss = 0;
    int ours = K.state != GEN_NONE && gen == K.generation;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = flm_get_u32(p + 8u + 4u * i);
        if (ours && s == FLM_NONE && K.state == GEN_ENDED) send_done();
        else if (ours && s != FLM_NONE && s >= first && s < K.steps) tx_token(&K.ring[s % FLM_TOKEN_RING]);
        else miss[n_miss++] = s;
    }
    flm_tx_begin(&flm_dev.tx, FLM_RESENT);
    flm_tx_u8(&flm_dev.tx, K.state);
    flm_tx_u32(&flm_dev.tx, K.generation);
    flm_tx_u32(&flm_dev.tx, K.steps);
    flm_tx_u32(&flm_dev.tx, first);
    flm_tx_u32(&flm_dev.tx, n_miss);
    for (uint32_t i = 0; i < n_miss; i++) flm_tx_u32(&flm_dev.tx, miss[i]);
    flm_tx_end(&flm_dev.tx);
}

void app_send_logits(uint32_t step, const float *logits) {
    flm_tx_begin(&flm_dev.tx, FLM_LOGITS);
    flm_tx_u32(&flm_dev.tx, step);
    for (uint32_t i = 0; i < flm_dev.model.n_out; i++) flm_tx_f32(&flm_dev.tx, logits[i]);
    flm_tx_end(&flm_dev.tx);
}

/* Between steps: answer PING and RESEND, refuse a second GENERATE, honour STOP. Returns 1 on STOP. */
int app_stop_requested(void) {
    int stop = 0, got;
    while ((got = app_receive())) {
        if (got == APP_RX_LINE) flm_dev.rx.bad_frames++;    /* a text line while a host generates: line noise */
        else if (flm_dev.rx.type == FLM_STOP) stop = 1;
        else if (flm_dev.rx.type == FLM_PING) app_send_hello();
        else if (flm_dev.rx.type == FLM_RESEND) app_resend(flm_dev.rx.payload, flm_dev.rx.len);
        else app_send_error(FLM_E_BUSY, "busy generating; send STOP first");
    }
    app_report_bad_frames();
    return stop;
}

void app_ring_reset(void) { memset(&K, 0, sizeof K); }

void app_ring_begin(void) {
    K.generation++;
    K.state = GEN_RUNNING;
    K.steps = 0;
}

__attribute__((weak)) uint32_t hal_stack_peak(uint32_t *size) {
    *size = 0;
    return 0;
}

void app_ring_end(const flm_done *d) {
    K.done = *d;
    K.done.stack_peak = hal_stack_peak(&K.done.stack_size);
    K.state = GEN_ENDED;
    send_done();
}
