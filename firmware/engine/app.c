#include "app.h"
#include "crc32.h"
#include "engine.h"
#include "hal.h"
#include "protocol.h"
#include "sampler.h"
#include <string.h>

#ifndef FLM_FW_VERSION
#define FLM_FW_VERSION "0.1.0"
#endif
#ifndef FLM_RX_CAP
#define FLM_RX_CAP 8192
#endif

enum { REASON_MAX_TOKENS = 0, REASON_EOS = 1, REASON_CONTEXT = 2, REASON_STOPPED = 3 };

typedef struct {
    flm_model model;
    flm_state state;
    uint32_t *prompt;
    int image_ok;
    char image_err[120];
    flm_tx tx;
    flm_rx rx;
    uint32_t bad_seen;
} flm_app;

static flm_app A;
static uint8_t rxbuf[FLM_RX_CAP];

static size_t slen(const char *s) { size_t n = 0; while (s[n]) n++; return n; }

static void scopy(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    while (src[i] && i + 1 < cap) { dst[i] = src[i]; i++; }
    dst[i] = 0;
}

static void put_dec(char *buf, size_t *i, size_t cap, uint32_t v) {
    char d[10]; int n = 0;
    do { d[n++] = (char)('0' + v % 10u); v /= 10u; } while (v);
    while (n && *i + 1 < cap) buf[(*i)++] = d[--n];
}

/* text = a + decimal(x) + b + decimal(y) + c */
static size_t fmt2(char *buf, size_t cap, const char *a, uint32_t x, const char *b, uint32_t y, const char *c) {
    size_t i = 0;
    for (const char *s = a; *s && i + 1 < cap; s++) buf[i++] = *s;
    put_dec(buf, &i, cap, x);
    for (const char *s = b; *s && i + 1 < cap; s++) buf[i++] = *s;
    put_dec(buf, &i, cap, y);
    for (const char *s = c; *s && i + 1 < cap; s++) buf[i++] = *s;
    buf[i] = 0;
    return i;
}

static void send_error(uint16_t code, const char *text) {
    flm_tx_begin(&A.tx, FLM_ERROR);
    flm_tx_u16(&A.tx, code);
    flm_tx_s16(&A.tx, text, slen(text));
    flm_tx_end(&A.tx);
}

static void send_log(const char *text) {
    flm_tx_begin(&A.tx, FLM_LOG);
    flm_tx_s16(&A.tx, text, slen(text));
    flm_tx_end(&A.tx);
}

static void send_hello(void) {
    static const uint8_t zero[16];
    const char *board = hal_board_name();
    flm_tx_begin(&A.tx, FLM_HELLO);
    flm_tx_u16(&A.tx, FLM_PROTO_VERSION);
    flm_tx_u16(&A.tx, A.image_ok ? 1u : 0u);
    flm_tx_put(&A.tx, A.image_ok ? A.model.model_hash : zero, 16);
    flm_tx_u32(&A.tx, A.image_ok ? A.model.layout_id : 0u);
    flm_tx_u32(&A.tx, A.image_ok ? A.model.vocab : 0u);
    flm_tx_u32(&A.tx, A.image_ok ? A.model.seq_len : 0u);
    flm_tx_u8(&A.tx, hal_clock_kind());
    flm_tx_s8(&A.tx, FLM_FW_VERSION, slen(FLM_FW_VERSION));
    flm_tx_s8(&A.tx, board, slen(board));
    flm_tx_end(&A.tx);
    if (!A.image_ok) send_error(FLM_E_BAD_IMAGE, A.image_err);
}

/* Feed received bytes into the receiver; returns 1 with a frame ready in A.rx. Bytes read
 * past the end of that frame wait in pend for the next call. */
static uint8_t pend[64];
static size_t pend_i, pend_n;

static int poll_frame(void) {
    for (;;) {
        if (pend_i == pend_n) {
            pend_i = 0;
            pend_n = hal_serial_read(pend, sizeof pend);
            if (!pend_n) return 0;
        }
        while (pend_i < pend_n) {
            if (flm_rx_feed(&A.rx, pend[pend_i++])) return 1;
        }
    }
}

static void report_bad_frames(void) {
    if (A.rx.bad_frames != A.bad_seen) {
        char t[64];
        fmt2(t, sizeof t, "dropped ", A.rx.bad_frames - A.bad_seen, " corrupt frame(s), total ",
             A.rx.bad_frames, "");
        A.bad_seen = A.rx.bad_frames;
        send_error(FLM_E_BAD_FRAME, t);
    }
}

static void send_token(uint32_t step, uint32_t pos, uint32_t in, uint32_t out, const flm_step_stats *st,
                       uint32_t crc) {
    flm_tx_begin(&A.tx, FLM_TOKEN);
    flm_tx_u32(&A.tx, step);
    flm_tx_u32(&A.tx, pos);
    flm_tx_u32(&A.tx, in);
    flm_tx_u32(&A.tx, out);
    for (int i = 0; i < FLM_N_PHASES; i++) flm_tx_u32(&A.tx, st->us[i]);
    for (int i = 0; i < FLM_N_TIERS; i++) flm_tx_u32(&A.tx, st->bytes[i]);
    flm_tx_u32(&A.tx, crc);
    uint32_t plen = 0;
    const uint8_t *piece = out == FLM_NONE ? (const uint8_t *)"" : flm_piece(&A.model, out, &plen);
    flm_tx_s8(&A.tx, (const char *)piece, plen);
    flm_tx_end(&A.tx);
}

static void send_logits(uint32_t step, const float *logits) {
    flm_tx_begin(&A.tx, FLM_LOGITS);
    flm_tx_u32(&A.tx, step);
    for (uint32_t i = 0; i < A.model.vocab; i++) flm_tx_f32(&A.tx, logits[i]);
    flm_tx_end(&A.tx);
}

/* Between steps: answer PING, refuse a second GENERATE, honour STOP. Returns 1 on STOP. */
static int stop_requested(void) {
    int stop = 0;
    while (poll_frame()) {
        if (A.rx.type == FLM_STOP) stop = 1;
        else if (A.rx.type == FLM_PING) send_hello();
        else send_error(FLM_E_BUSY, "busy generating; send STOP first");
    }
    report_bad_frames();
    return stop;
}

static void generate(const uint8_t *p, size_t len) {
    const flm_model *m = &A.model;
    char t[96];
    if (!A.image_ok) { send_error(FLM_E_NO_MODEL, A.image_err); return; }
    if (len < 28u || len != 28u + 4u * (size_t)flm_get_u32(p + 24)) {
        send_error(FLM_E_BAD_MESSAGE, "GENERATE payload has the wrong length");
        return;
    }
    uint32_t max_new = flm_get_u32(p), flags = flm_get_u32(p + 20), n = flm_get_u32(p + 24);
    float temperature = flm_get_f32(p + 4), top_p = flm_get_f32(p + 8);
    if (n == 0) { send_error(FLM_E_BAD_MESSAGE, "empty prompt"); return; }
    if (n > m->seq_len) {
        fmt2(t, sizeof t, "prompt of ", n, " tokens exceeds the context of ", m->seq_len, " tokens");
        send_error(FLM_E_PROMPT_TOO_LONG, t);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        A.prompt[i] = flm_get_u32(p + 28 + 4u * i);
        if (A.prompt[i] >= m->vocab) {
            fmt2(t, sizeof t, "prompt token ", A.prompt[i], " is outside the vocabulary of ", m->vocab, "");
            send_error(FLM_E_BAD_TOKEN, t);
            return;
        }
    }
    flm_rng rng;
    flm_rng_seed(&rng, flm_get_u64(p + 12));
    uint64_t tot[FLM_N_PHASES] = {0}, t_start = hal_time_us();
    uint32_t tok = A.prompt[0], pos = 0, generated = 0, step = 0, reason = REASON_MAX_TOKENS;
    for (;;) {
        if (generated >= max_new) { reason = REASON_MAX_TOKENS; break; }
        if (pos >= m->seq_len) { reason = REASON_CONTEXT; break; }
        flm_step_stats st;
        const float *logits = flm_forward(&A.state, tok, pos, &st);
        uint32_t out = FLM_NONE, next;
        if (pos + 1u < n) {
            next = A.prompt[pos + 1u];
        } else {
            uint64_t ts = hal_time_us();
            out = next = flm_sample(logits, m->vocab, temperature, top_p, &rng, A.state.probs, A.state.idx);
            st.us[FLM_PH_SAMPLE] = (uint32_t)(hal_time_us() - ts);
            generated++;
        }
        send_token(step, pos, tok, out, &st, flm_crc32_update(0, logits, (size_t)m->vocab * 4u));
        if (flags & 1u) send_logits(step, logits);
        for (int i = 0; i < FLM_N_PHASES; i++) tot[i] += st.us[i];
        step++;
        if (out != FLM_NONE && out == m->eos) { reason = REASON_EOS; break; }
        if (stop_requested()) { reason = REASON_STOPPED; break; }
        tok = next;
        pos++;
    }
    flm_tx_begin(&A.tx, FLM_DONE);
    flm_tx_u32(&A.tx, step);
    flm_tx_u32(&A.tx, generated);
    flm_tx_u8(&A.tx, (uint8_t)reason);
    flm_tx_u64(&A.tx, hal_time_us() - t_start);
    for (int i = 0; i < FLM_N_PHASES; i++) flm_tx_u64(&A.tx, tot[i]);
    flm_tx_end(&A.tx);
}

static void boot(uint8_t *arena, size_t cap, uint32_t arena_tier) {
    size_t len = 0;
    const uint8_t *blob = hal_blob(&len);
    A.image_ok = 0;
    if (!blob) {
        scopy(A.image_err, sizeof A.image_err, "no image in flash");
    } else if (flm_blob_open(&A.model, blob, len, A.image_err, sizeof A.image_err) == 0) {
        size_t need = flm_state_bytes(&A.model) + (size_t)A.model.seq_len * 4u;
        if (need > cap) {
            fmt2(A.image_err, sizeof A.image_err, "model needs ", (uint32_t)need,
                 " bytes of RAM for KV cache and buffers; this build has ", (uint32_t)cap, "");
        } else {
            flm_state_init(&A.state, &A.model, arena, cap - (size_t)A.model.seq_len * 4u, arena_tier);
            A.prompt = (uint32_t *)(void *)(arena + cap - (size_t)A.model.seq_len * 4u);
            A.image_ok = 1;
        }
    }
    char t[120];
    if (A.image_ok)
        fmt2(t, sizeof t, "flashlm " FLM_FW_VERSION ": image ok, ", (uint32_t)len, " bytes; arena ",
             (uint32_t)(flm_state_bytes(&A.model) + A.model.seq_len * 4u), " bytes used");
    else
        scopy(t, sizeof t, "flashlm " FLM_FW_VERSION ": image refused");
    send_log(t);
    send_hello();
}

void flm_app_run(uint8_t *arena, size_t cap, uint32_t arena_tier) {
    flm_tx_init(&A.tx, hal_serial_write);
    flm_rx_init(&A.rx, rxbuf, sizeof rxbuf);
    boot(arena, cap, arena_tier);
    for (;;) {
        if (!poll_frame()) {
            report_bad_frames();
            hal_idle();
            continue;
        }
        switch (A.rx.type) {
        case FLM_PING: send_hello(); break;
        case FLM_GENERATE: generate(A.rx.payload, A.rx.len); break;
        case FLM_STOP: break;   /* nothing running */
        default: send_error(FLM_E_BAD_MESSAGE, "unknown message type"); break;
        }
    }
}
