#include "app.h"
#include "crc32.h"
#include "engine.h"
#include "hal.h"
#include "kernels.h"
#include "protocol.h"
#include "sampler.h"
#include "tokenize.h"
#include <string.h>

#ifndef FLM_FW_VERSION
#define FLM_FW_VERSION "0.1.0"
#endif
#ifndef FLM_RX_CAP
#define FLM_RX_CAP 8192
#endif

/* Optional board hooks around each forward pass (the emulated RP2040's harness attributes the
 * core's memory reads to steps with them; see firmware/hal/rp2040/hal_rp2040.h). */
#ifndef FLM_STEP_BEGIN
#define FLM_STEP_BEGIN(step, state) ((void)0)
#define FLM_STEP_END(step) ((void)0)
#endif

enum { REASON_MAX_TOKENS = 0, REASON_EOS = 1, REASON_CONTEXT = 2, REASON_STOPPED = 3 };
/* GENERATE flags (docs/formats.md section 2) */
enum { GEN_LOGITS = 1u, GEN_SLIDE = 2u, GEN_ALL_LOGITS = 4u, GEN_FLAGS = 7u };

#ifndef FLM_MAX_ENTRIES
/* tensor-table entries a LAYOUT may address: at most 11 outside the layers (tokenizer, tokenizer.enc,
 * rope.cos, rope.sin, tok_embeddings, ple.table, ple.proj, ple.norm, norm, output, head.prune) */
#define FLM_MAX_ENTRIES (11 + 12 * FLM_MAX_LAYERS)
#endif

typedef struct { uint8_t *base; size_t cap, used; } flm_pool;

typedef struct {
    flm_model model;
    flm_state state;
    uint32_t *prompt;
    flm_pool pool[FLM_N_TIERS];    /* [0]: main()'s arena; [psram], [sram]: the HAL's staging space */
    uint32_t arena_tier;           /* tier of the arena main() gave: the state's default home */
    uint8_t tiers[FLM_MAX_ENTRIES];   /* the placement in effect, one tier per table entry */
    uint32_t state_tiers;
    uint32_t staged[FLM_N_TIERS];  /* bytes of tensors copied into each tier */
    int image_ok;
    int kernels_ok;                /* the boot self-check passed (flm_kernels_self_check) */
    char image_err[120];
    flm_tx tx;
    flm_rx rx;
    uint32_t bad_seen;
} flm_app;

static flm_app A;
/* at least room for a full RESEND (8 + 4 * FLM_RESEND_MAX bytes of payload, framed) */
static uint8_t rxbuf[FLM_RX_CAP > 192 ? FLM_RX_CAP : 192];

static int feed(uint8_t b);                        /* text prompts and the console: below generate() */
static const flm_tokenizer *text_encoder(void);

/* ---- kept frames for RESEND (docs/formats.md section 2.1) ---- */
#ifndef FLM_TOKEN_RING
#define FLM_TOKEN_RING 32u               /* TOKEN frames kept for re-sending */
#endif
#define FLM_RESEND_MAX 32u               /* steps one RESEND may name */
enum { GEN_NONE = 0, GEN_RUNNING = 1, GEN_ENDED = 2 };

typedef struct {
    uint32_t step, pos, in, out, crc;
    flm_step_stats st;
} flm_kept_token;

static struct {
    flm_kept_token ring[FLM_TOKEN_RING];   /* step s lives at ring[s % FLM_TOKEN_RING] */
    uint32_t generation;                   /* GENERATEs accepted since boot */
    uint32_t steps;                        /* TOKEN steps the current/last generation sent */
    uint8_t state;                         /* GEN_* */
    uint32_t done_steps, done_generated;   /* the DONE of the last generation */
    uint8_t done_reason;
    uint64_t done_total, done_phase[FLM_N_PHASES];
} K;

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

/* buf[*i..] += s (always NUL-terminated) */
static void put_str(char *buf, size_t *i, size_t cap, const char *s) {
    while (*s && *i + 1 < cap) buf[(*i)++] = *s++;
    buf[*i] = 0;
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
    flm_tx_u16(&A.tx, (uint16_t)((A.image_ok ? 1u : 0u) | 2u        /* bit1: answers RESEND */
                                 | (text_encoder() ? 4u : 0u)));     /* bit2: encodes text */
    flm_tx_put(&A.tx, A.image_ok ? A.model.model_hash : zero, 16);
    flm_tx_u32(&A.tx, A.image_ok ? A.model.layout_id : 0u);
    flm_tx_u32(&A.tx, A.image_ok ? A.model.vocab : 0u);
    flm_tx_u32(&A.tx, A.image_ok ? A.model.n_out : 0u);
    flm_tx_u32(&A.tx, A.image_ok ? A.model.seq_len : 0u);
    flm_tx_u8(&A.tx, hal_clock_kind());
    flm_tx_s8(&A.tx, FLM_FW_VERSION, slen(FLM_FW_VERSION));
    flm_tx_s8(&A.tx, board, slen(board));
    flm_tx_end(&A.tx);
    if (!A.image_ok) send_error(A.kernels_ok ? FLM_E_BAD_IMAGE : FLM_E_SELF_CHECK, A.image_err);
}

/* Why a request needing the model is refused while !A.image_ok. */
static uint16_t no_model_code(void) { return A.kernels_ok ? FLM_E_NO_MODEL : FLM_E_SELF_CHECK; }

/* Feed received bytes into the receiver; returns 1 with a frame ready in A.rx, 2 with a console
 * text line (feed()). Bytes read past the end of that frame or line wait in pend for the next call. */
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
            int got = feed(pend[pend_i++]);
            if (got) return got;
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

static void tx_token(const flm_kept_token *k) {
    flm_tx_begin(&A.tx, FLM_TOKEN);
    flm_tx_u32(&A.tx, k->step);
    flm_tx_u32(&A.tx, k->pos);
    flm_tx_u32(&A.tx, k->in);
    flm_tx_u32(&A.tx, k->out);
    for (int i = 0; i < FLM_N_PHASES; i++) flm_tx_u32(&A.tx, k->st.us[i]);
    for (int i = 0; i < FLM_N_TIERS; i++) flm_tx_u32(&A.tx, k->st.bytes[i]);
    flm_tx_u32(&A.tx, k->st.head_rows);
    flm_tx_u32(&A.tx, k->crc);
    uint32_t plen = 0;
    const uint8_t *piece = k->out == FLM_NONE ? (const uint8_t *)"" : flm_piece(&A.model, k->out, &plen);
    flm_tx_s8(&A.tx, (const char *)piece, plen);
    flm_tx_end(&A.tx);
}

/* Send a TOKEN and keep it in the ring (steps of one generation are sent in order from 0). */
static void send_token(uint32_t step, uint32_t pos, uint32_t in, uint32_t out, const flm_step_stats *st,
                       uint32_t crc) {
    flm_kept_token *k = &K.ring[step % FLM_TOKEN_RING];
    k->step = step; k->pos = pos; k->in = in; k->out = out; k->crc = crc; k->st = *st;
    K.steps = step + 1u;
    tx_token(k);
}

static void send_done(void) {
    flm_tx_begin(&A.tx, FLM_DONE);
    flm_tx_u32(&A.tx, K.done_steps);
    flm_tx_u32(&A.tx, K.done_generated);
    flm_tx_u8(&A.tx, K.done_reason);
    flm_tx_u64(&A.tx, K.done_total);
    for (int i = 0; i < FLM_N_PHASES; i++) flm_tx_u64(&A.tx, K.done_phase[i]);
    flm_tx_end(&A.tx);
}

/* RESEND payload: u32 generation, u32 n, u32 step[n]; answered with the kept TOKEN frames (and
 * the DONE for step FLM_NONE) of that generation, then RESENT listing what was not sent. */
static void resend(const uint8_t *p, size_t len) {
    uint32_t n = len >= 8u ? flm_get_u32(p + 4) : 0u;
    if (len < 8u || n > FLM_RESEND_MAX || len != 8u + 4u * (size_t)n) {
        send_error(FLM_E_BAD_MESSAGE, "RESEND payload has the wrong length (at most 32 steps)");
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
    flm_tx_begin(&A.tx, FLM_RESENT);
    flm_tx_u8(&A.tx, K.state);
    flm_tx_u32(&A.tx, K.generation);
    flm_tx_u32(&A.tx, K.steps);
    flm_tx_u32(&A.tx, first);
    flm_tx_u32(&A.tx, n_miss);
    for (uint32_t i = 0; i < n_miss; i++) flm_tx_u32(&A.tx, miss[i]);
    flm_tx_end(&A.tx);
}

static void send_logits(uint32_t step, const float *logits) {
    flm_tx_begin(&A.tx, FLM_LOGITS);
    flm_tx_u32(&A.tx, step);
    for (uint32_t i = 0; i < A.model.n_out; i++) flm_tx_f32(&A.tx, logits[i]);
    flm_tx_end(&A.tx);
}

/* Between steps: answer PING and RESEND, refuse a second GENERATE, honour STOP. Returns 1 on STOP. */
static int stop_requested(void) {
    int stop = 0, got;
    while ((got = poll_frame())) {
        if (got == 2) A.rx.bad_frames++;    /* a text line while a host generates: line noise */
        else if (A.rx.type == FLM_STOP) stop = 1;
        else if (A.rx.type == FLM_PING) send_hello();
        else if (A.rx.type == FLM_RESEND) resend(A.rx.payload, A.rx.len);
        else send_error(FLM_E_BUSY, "busy generating; send STOP first");
    }
    report_bad_frames();
    return stop;
}

static void generate(const uint8_t *p, size_t len) {
    const flm_model *m = &A.model;
    char t[96];
    if (!A.image_ok) { send_error(no_model_code(), A.image_err); return; }
    if (len < 28u || len != 28u + 4u * (size_t)flm_get_u32(p + 24)) {
        send_error(FLM_E_BAD_MESSAGE, "GENERATE payload has the wrong length");
        return;
    }
    uint32_t max_new = flm_get_u32(p), flags = flm_get_u32(p + 20), n = flm_get_u32(p + 24);
    float temperature = flm_get_f32(p + 4), top_p = flm_get_f32(p + 8);
    if (n == 0) { send_error(FLM_E_BAD_MESSAGE, "empty prompt"); return; }
    if (flags & ~GEN_FLAGS) {
        size_t i = 0;
        put_str(t, &i, sizeof t, "GENERATE flags ");
        put_dec(t, &i, sizeof t, flags);
        put_str(t, &i, sizeof t, " has unknown bits (known: 1 logits, 2 slide, 4 all logits)");
        send_error(FLM_E_BAD_MESSAGE, t);
        return;
    }
    if (temperature != temperature || temperature - temperature != 0.0f || top_p != top_p) {
        send_error(FLM_E_BAD_MESSAGE, "temperature must be a finite number and top_p a number");
        return;
    }
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
    K.generation++;                 /* accepted: a new generation, the ring starts empty */
    K.state = GEN_RUNNING;
    K.steps = 0;
    flm_rng rng;
    flm_rng_seed(&rng, flm_get_u64(p + 12));
    /* LOGITS implies ALL_LOGITS: every step computes the whole head, never pruned or skipped */
    const int every = (flags & (GEN_LOGITS | GEN_ALL_LOGITS)) != 0, greedy = !(temperature > 0.0f);
    uint64_t tot[FLM_N_PHASES] = {0}, t_start = hal_time_us();
    uint32_t tok = A.prompt[0], pos = 0, generated = 0, step = 0, reason = REASON_MAX_TOKENS;
    for (;;) {
        if (generated >= max_new) { reason = REASON_MAX_TOKENS; break; }
        uint32_t n_drop = 0;
        if (pos >= m->seq_len) {
            if (!(flags & GEN_SLIDE) || m->seq_len < 3u) { reason = REASON_CONTEXT; break; }
            n_drop = (m->seq_len - 1u) / 2u;   /* position 0 stays: the attention sink */
            pos = m->seq_len - n_drop;
        }
        flm_step_stats st;
        memset(&st, 0, sizeof st);
        FLM_STEP_BEGIN(step, &A.state);
        if (n_drop) flm_slide(&A.state, n_drop, &st);
        flm_body(&A.state, tok, pos, &st);
        const int prompt_step = step + 1u < n;
        const float *logits = every || (!prompt_step && !greedy) ? flm_head(&A.state, &st) : 0;
        uint32_t out = FLM_NONE, next = prompt_step ? A.prompt[step + 1u] : 0u;
        if (!prompt_step && !logits) out = flm_head_argmax(&A.state, &st);   /* sampling 0 µs: the scan chose */
        FLM_STEP_END(step);
        if (!prompt_step && logits) {
            uint64_t ts = hal_time_us();
            out = flm_sample(logits, m->n_out, temperature, top_p, &rng, A.state.probs, A.state.idx);
            st.us[FLM_PH_SAMPLE] = (uint32_t)(hal_time_us() - ts);
        }
        if (!prompt_step) { next = out; generated++; }
        send_token(step, pos, tok, out, &st, logits ? flm_crc32_update(0, logits, (size_t)m->n_out * 4u) : 0u);
        if (flags & GEN_LOGITS) send_logits(step, logits);
        for (int i = 0; i < FLM_N_PHASES; i++) tot[i] += st.us[i];
        step++;
        if (out != FLM_NONE && flm_is_stop(m, out)) { reason = REASON_EOS; break; }
        if (stop_requested()) { reason = REASON_STOPPED; break; }
        tok = next;
        pos++;
    }
    K.done_steps = step;
    K.done_generated = generated;
    K.done_reason = (uint8_t)reason;
    K.done_total = hal_time_us() - t_start;
    for (int i = 0; i < FLM_N_PHASES; i++) K.done_phase[i] = tot[i];
    K.state = GEN_ENDED;
    send_done();
}

/* ---- text prompts: GENERATE_TEXT and the plain-text console (docs/formats.md 1.1, 2.3) ---- */

/* The image's text encoder (its tokenizer.enc section), or why there is none. */
static struct {
    const uint8_t *blob;   /* the image this describes */
    uint32_t kv_fmt;       /* ... with its KV cache in this format (the scratch it borrows: LAYOUT) */
    int ok;
    flm_tokenizer t;
    char why[120];
} T;

static const flm_tokenizer *text_encoder(void) {
    const flm_model *m = &A.model;
    if (!A.image_ok) return 0;
    if (T.blob != m->blob || T.kv_fmt != m->kv_fmt) {
        T.blob = m->blob;
        T.kv_fmt = m->kv_fmt;
        T.ok = flm_tok_open(&T.t, m, T.why, sizeof T.why) == 0;
        size_t need = T.ok ? flm_tok_scratch_bytes(&T.t, m->seq_len) : 0u, kv = flm_state_region_bytes(m, FLM_REG_KV);
        size_t frame = 33u + (size_t)m->seq_len * T.t.span;   /* GENERATE_TEXT of the longest text that can fit */
        if (T.ok && need > kv) {
            T.ok = 0;
            fmt2(T.why, sizeof T.why, "the text encoder needs ", (uint32_t)need,
                 " bytes of scratch but the KV cache it borrows has ", (uint32_t)kv, "");
        } else if (T.ok && frame + frame / 254u + 1u > sizeof rxbuf) {
            T.ok = 0;
            fmt2(T.why, sizeof T.why, "text prompts need a receive buffer of ", (uint32_t)(frame + frame / 254u + 1u),
                 " bytes; this build has ", (uint32_t)sizeof rxbuf, "");
        }
    }
    return T.ok ? &T.t : 0;
}

/* Encode text into A.prompt, BOS first (as the host's encode_prompt), in the KV cache's memory: it
 * is idle between generations and every generation starts it afresh. Returns 0 with the ids'
 * count in *n and the time taken in *us, or an error code with its one-line reason in err. */
static uint16_t encode_text(const uint8_t *text, size_t len, uint32_t *n, uint32_t *us, char *err, size_t en) {
    const flm_model *m = &A.model;
    const flm_tokenizer *t = text_encoder();
    if (!A.image_ok) { scopy(err, en, A.image_err); return no_model_code(); }
    if (!t) { scopy(err, en, T.why); return FLM_E_CANNOT_ENCODE; }
    if (m->bos != FLM_NONE && m->bos >= m->vocab) {     /* the header's BOS is not checked at boot */
        fmt2(err, en, "the image's BOS id ", m->bos, " is outside the vocabulary of ", m->vocab, "");
        return FLM_E_BAD_TOKEN;
    }
    flm_tok_result r;
    uint64_t t0 = hal_time_us();
    int rc = flm_tok_encode(t, text, len, m->bos, A.prompt, m->seq_len, A.state.kc, &r);
    *us = (uint32_t)(hal_time_us() - t0);
    *n = r.n;
    if (rc == FLM_TOK_BAD_UTF8) {
        fmt2(err, en, "the text prompt is not UTF-8: bad byte at offset ", r.at, " of ", (uint32_t)len, "");
        return FLM_E_BAD_MESSAGE;
    }
    if (rc == FLM_TOK_NO_PIECE) {
        fmt2(err, en, "cannot encode byte ", r.byte, " at offset ", r.at, ": no piece and no byte fallback for it");
        return FLM_E_CANNOT_ENCODE;
    }
    if (rc == FLM_TOK_TOO_LONG || r.n > m->seq_len) {
        fmt2(err, en, rc == FLM_TOK_TOO_LONG ? "prompt of at least " : "prompt of ", r.n,
             " tokens exceeds the context of ", m->seq_len, " tokens");
        return FLM_E_PROMPT_TOO_LONG;
    }
    return 0;
}

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* GENERATE_TEXT payload: the GENERATE fields up to flags (24 bytes), then s16 text. Encoded, it
 * becomes the GENERATE of those ids (rewritten in place) and runs exactly as one. */
static void generate_text(void) {
    uint8_t *p = rxbuf + (A.rx.payload - rxbuf);    /* the payload, writable */
    size_t len = A.rx.len, i = 0;
    uint32_t n, us;
    char t[120];
    if (len < 26u || len != 26u + (size_t)flm_get_u16(p + 24)) {
        send_error(FLM_E_BAD_MESSAGE, "GENERATE_TEXT payload has the wrong length");
        return;
    }
    uint16_t code = encode_text(p + 26, len - 26u, &n, &us, t, sizeof t);
    if (!code && 28u + 4u * (size_t)n > sizeof rxbuf - (size_t)(p - rxbuf)) {
        scopy(t, sizeof t, "prompt does not fit this build's receive buffer as ids");
        code = FLM_E_PROMPT_TOO_LONG;
    }
    if (code) { send_error(code, t); return; }
    put_str(t, &i, sizeof t, "text prompt: ");
    put_dec(t, &i, sizeof t, (uint32_t)(len - 26u));
    put_str(t, &i, sizeof t, " bytes, ");
    put_dec(t, &i, sizeof t, n);
    put_str(t, &i, sizeof t, " tokens, encoded in ");
    put_dec(t, &i, sizeof t, us);
    put_str(t, &i, sizeof t, " us");
    send_log(t);
    put_le32(p + 24, n);
    for (uint32_t k = 0; k < n; k++) put_le32(p + 28 + 4u * k, A.prompt[k]);
    generate(p, 28u + 4u * (size_t)n);
}

/* The console. A host frame's first byte is its COBS code byte, below 0x20 (docs/formats.md 2.3),
 * so a line that starts with a byte >= 0x20 and ends in CR or LF, with no other control byte
 * (tab, backspace and DEL aside) and no 0x00 in it, is text typed at a serial monitor: a prompt.
 * Its answer is plain text: the prompt, the greedy continuation, a summary line; no frames. */
enum { IN_START, IN_EOL, IN_TEXT, IN_FRAME };
static uint8_t in_state;      /* IN_START after a delimiter or a line */
static uint8_t in_held;       /* IN_EOL: the CR or LF held back: a blank line or a frame's code byte */
static uint8_t in_skip;       /* the frame being received began with the held byte */
static size_t line_len;       /* the line feed() returned: rxbuf[0..line_len) */
static int line_over;         /* ... longer than rxbuf */
static uint32_t console_lines;   /* answered since the last frame */

/* Does the COBS block chain of b[from..n) end exactly at n? */
static int cobs_ends(const uint8_t *b, size_t from, size_t n) {
    while (from < n && b[from]) from += b[from];
    return from == n;
}

/* One received byte: into a console line or into the frame receiver. Returns 1 with a frame ready
 * in A.rx, 2 with a line ready. A CR or LF outside a line is held back until the next byte shows
 * whether it ended a line (the terminal's CR LF) or is the code byte of a frame whose first zero
 * is 9 or 12 bytes in; at the frame's end the COBS block chain decides. */
static int feed(uint8_t b) {
    int eol = b == '\r' || b == '\n';
    if (in_state == IN_START || in_state == IN_EOL) {
        if (eol) { in_held = b; in_state = IN_EOL; return 0; }
        if (b >= 0x20u) { in_state = IN_TEXT; return feed(b); }
        in_skip = in_state == IN_EOL && b;
        if (in_skip) flm_rx_feed(&A.rx, in_held);
        in_state = IN_FRAME;
    } else if (in_state == IN_TEXT) {
        if (eol) {
            line_len = A.rx.n;
            line_over = A.rx.overflow;
            A.rx.n = 0;
            A.rx.overflow = 0;
            in_held = b;
            in_state = IN_EOL;
            return 2;
        }
        if (b == 0x08u || b == 0x7Fu) {      /* backspace: drop the last character */
            while (A.rx.n && (A.rx.buf[--A.rx.n] & 0xC0u) == 0x80u) {}
            return 0;
        }
        if (b >= 0x20u || b == '\t') return flm_rx_feed(&A.rx, b);
        in_state = IN_FRAME;                 /* not text: junk before a frame, as without the console */
        in_skip = 0;
    }
    if (b == 0) {
        if (in_skip && !cobs_ends(A.rx.buf, 0, A.rx.n) && cobs_ends(A.rx.buf, 1, A.rx.n))
            memmove(A.rx.buf, A.rx.buf + 1, --A.rx.n);   /* the held byte was a blank line after all */
        in_state = IN_START;
        in_skip = 0;
    }
    return flm_rx_feed(&A.rx, b);
}

/* Console output: the bytes of pieces and prompts, with LF as CR LF and no other control bytes
 * (a model's output must not drive the terminal, and must hold no frame delimiter). */
static void console_put(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && (s[j] >= 0x20u || s[j] == '\t') && s[j] != 0x7Fu) j++;
        if (j > i) hal_serial_write(s + i, j - i);
        if (j < n && s[j] == '\n') hal_serial_write((const uint8_t *)"\r\n", 2);
        i = j + 1u;
    }
}

static void console_str(const char *s) { console_put((const uint8_t *)s, slen(s)); }

/* While a story is told: a CR or LF outside a line (the rest of the terminal's CR LF) is taken in;
 * any other byte stops the story and waits in pend, for the console or the framed protocol. */
static int console_interrupted(void) {
    for (;;) {
        if (pend_i == pend_n) {
            pend_i = 0;
            pend_n = hal_serial_read(pend, sizeof pend);
            if (!pend_n) return 0;
        }
        uint8_t b = pend[pend_i];
        if ((b != '\r' && b != '\n') || (in_state != IN_START && in_state != IN_EOL)) return 1;
        feed(b);
        pend_i++;
    }
}

/* Answer the console line rxbuf[0..line_len): greedy continuation to the end of text or of the
 * context, then "[prompt + generated tokens in ms, tok/s (clock); encode time; why it ended]". */
static void text_session(void) {
    static const char *const CLOCK[3] = {"host clock", "chip timer", "emulated timer"};
    const flm_model *m = &A.model;
    char t[160];
    uint32_t n = 0, us = 0, generated = 0;
    size_t i = 0;
    console_lines++;
    if (line_over) {
        put_str(t, &i, sizeof t, "flashlm: error: a line holds at most ");
        put_dec(t, &i, sizeof t, (uint32_t)sizeof rxbuf);
        put_str(t, &i, sizeof t, " bytes here\n");
        console_str(t);
        return;
    }
    if (!line_len) return;
    console_put(rxbuf, line_len);
    uint16_t code = encode_text(rxbuf, line_len, &n, &us, t, sizeof t);
    if (code) {
        console_str("\nflashlm: error: ");
        console_str(t);
        console_str("\n");
        return;
    }
    const char *end = "context full";
    uint32_t tok = A.prompt[0], pos;
    uint64_t t0 = hal_time_us();
    for (pos = 0; pos < m->seq_len; pos++) {
        if (console_interrupted()) { end = "stopped by a key"; break; }
        flm_step_stats st;
        memset(&st, 0, sizeof st);
        flm_body(&A.state, tok, pos, &st);
        if (pos + 1u < n) { tok = A.prompt[pos + 1u]; continue; }   /* prefill: no output layer */
        tok = flm_head_argmax(&A.state, &st);                       /* greedy: the pruned scan */
        generated++;
        if (flm_is_stop(m, tok)) { end = "end of text"; break; }
        uint32_t plen;
        const uint8_t *piece = flm_piece(m, tok, &plen);
        console_put(piece, plen);
    }
    uint64_t total = hal_time_us() - t0, rate = total ? (uint64_t)generated * 10000000u / total : 0u;
    put_str(t, &i, sizeof t, "\n[");
    put_dec(t, &i, sizeof t, n);
    put_str(t, &i, sizeof t, " prompt + ");
    put_dec(t, &i, sizeof t, generated);
    put_str(t, &i, sizeof t, " generated tokens in ");
    put_dec(t, &i, sizeof t, (uint32_t)(total / 1000u));
    put_str(t, &i, sizeof t, " ms, ");
    put_dec(t, &i, sizeof t, (uint32_t)(rate / 10u));
    put_str(t, &i, sizeof t, ".");
    put_dec(t, &i, sizeof t, (uint32_t)(rate % 10u));
    put_str(t, &i, sizeof t, " tok/s (");
    put_str(t, &i, sizeof t, CLOCK[hal_clock_kind() < 3u ? hal_clock_kind() : 0u]);
    put_str(t, &i, sizeof t, "); text encoded in ");
    put_dec(t, &i, sizeof t, us);
    put_str(t, &i, sizeof t, " us; ");
    put_str(t, &i, sizeof t, end);
    put_str(t, &i, sizeof t, "]\n");
    console_str(t);
}

/* A frame after console lines: say so once, in the protocol (a line no one typed was line noise). */
static void report_console(void) {
    char t[120];
    size_t i = 0;
    if (!console_lines) return;
    put_str(t, &i, sizeof t, "text console: answered ");
    put_dec(t, &i, sizeof t, console_lines);
    put_str(t, &i, sizeof t, " line(s) sent outside any frame (if no one typed them: line noise)");
    console_lines = 0;
    send_log(t);
}

/* ---- placement: stage tensors out of flash into PSRAM/SRAM, carve the state regions ---- */

/* A board without staging space need not define hal_tier_arena. */
#if defined(__GNUC__)
__attribute__((weak)) uint8_t *hal_tier_arena(uint32_t tier, size_t *cap) {
    (void)tier;
    *cap = 0;
    return 0;
}
#endif

static const char *const TIER_NAME[FLM_N_TIERS] = {"flash", "PSRAM", "SRAM"};

static size_t up64(size_t n) { return (n + 63u) & ~(size_t)63u; }

static uint8_t *take(flm_pool *p, size_t n, size_t align) {
    size_t off = (p->used + align - 1u) & ~(align - 1u);
    uint8_t *r = p->base + off;
    p->used = off + n;
    return r;
}

/* Where a tensor staged in tier t goes: the HAL's space for t, else main()'s arena when that is
 * in t. The state regions of tier t: main()'s arena when it is in t, else the HAL's space. */
static uint32_t tensor_pool(uint32_t t) { return A.pool[t].cap || t != A.arena_tier ? t : 0u; }
static uint32_t state_pool(uint32_t t) { return t == A.arena_tier ? 0u : t; }

static uint32_t region_tier(uint32_t state_tiers, int r) {
    uint32_t t = (state_tiers >> (4u * (uint32_t)r)) & 15u;
    return t ? t : A.arena_tier;
}

/* The layout id: crc32 of one tier byte per table entry, then u32 state_tiers when non-zero. */
static uint32_t layout_crc(const flm_model *m, const uint8_t *tiers, uint32_t state_tiers) {
    uint32_t crc = flm_crc32_update(0, tiers, m->n_entries);
    if (state_tiers) {
        uint8_t le[4] = {(uint8_t)state_tiers, (uint8_t)(state_tiers >> 8), (uint8_t)(state_tiers >> 16),
                         (uint8_t)(state_tiers >> 24)};
        crc = flm_crc32_update(crc, le, 4);
    }
    return crc;
}

/* Apply a placement: every tensor at tiers[i] (one per table entry; NULL: the table's own), the
 * state regions at state_tiers. Returns 0, or -1 with the reason in err when it does not fit (the
 * model is then left half-placed: the caller places a layout that fits). */
static int place(const uint8_t *tiers, uint32_t state_tiers, char *err, size_t en) {
    flm_model *m = &A.model;
    flm_tensor *x;
    flm_blob_retier(m, tiers);
    m->kv_fmt = (state_tiers >> FLM_KV_SHIFT) & 15u;   /* before the region sizes: they depend on it */
    m->ple_table.tier = FLM_TIER_FLASH;   /* a gather of one row per token: read in place, never staged */
    /* bytes per pool: tensors 64-aligned (cache lines), then the regions (multiples of 8), then the
     * prompt buffer last, so an arena of exactly state + prompt holds the default placement */
    size_t need[FLM_N_TIERS] = {0, 0, 0};
    for (uint32_t i = 0; (x = flm_tensor_at(m, i)) != 0; i++)
        if (x->tier != FLM_TIER_FLASH) need[tensor_pool(x->tier)] += up64(x->length);
    for (int r = 0; r < FLM_N_REGIONS; r++) need[state_pool(region_tier(state_tiers, r))] += flm_state_region_bytes(m, r);
    need[state_pool(region_tier(state_tiers, FLM_REG_SCRATCH))] += (size_t)m->seq_len * 4u;
    for (uint32_t p = 0; p < FLM_N_TIERS; p++) {
        if (need[p] <= A.pool[p].cap) continue;
        size_t i = 0;
        put_str(err, &i, en, "layout needs ");
        put_dec(err, &i, en, (uint32_t)need[p]);
        put_str(err, &i, en, " bytes of ");
        put_str(err, &i, en, TIER_NAME[p ? p : A.arena_tier]);
        if (A.pool[p].cap) {
            put_str(err, &i, en, p ? "; this build has " : " in the engine's arena; this build has ");
            put_dec(err, &i, en, (uint32_t)A.pool[p].cap);
        } else {
            put_str(err, &i, en, "; this board has no staging space there");
        }
        err[i] = 0;
        return -1;
    }
    for (uint32_t t = 0; t < FLM_N_TIERS; t++) { A.pool[t].used = 0; A.staged[t] = 0; }
    for (uint32_t i = 0; (x = flm_tensor_at(m, i)) != 0; i++) {
        if (x->tier == FLM_TIER_FLASH) continue;
        uint8_t *dst = take(&A.pool[tensor_pool(x->tier)], x->length, 64u);
        memcpy(dst, x->data, x->length);
        x->data = dst;
        A.staged[x->tier] += x->length;
    }
    flm_blob_tie_head(m);
    uint8_t *base[FLM_N_REGIONS];
    for (int r = 0; r < FLM_N_REGIONS; r++)
        base[r] = take(&A.pool[state_pool(region_tier(state_tiers, r))], flm_state_region_bytes(m, r), 8u);
    A.prompt = (uint32_t *)(void *)take(&A.pool[state_pool(region_tier(state_tiers, FLM_REG_SCRATCH))],
                                        (size_t)m->seq_len * 4u, 8u);
    flm_state_init_regions(&A.state, m, base, region_tier(state_tiers, FLM_REG_KV));
    for (uint32_t i = 0; i < m->n_entries && i < FLM_MAX_ENTRIES; i++)
        A.tiers[i] = tiers ? tiers[i] : (uint8_t)flm_rd32(m->blob + m->table + i * 64u + 48u);
    uint32_t crc = layout_crc(m, A.tiers, state_tiers);
    m->layout_id = crc;
    A.state_tiers = state_tiers;
    return 0;
}

static void log_layout(const char *what) {
    char t[120];
    size_t i = 0;
    put_str(t, &i, sizeof t, what);
    put_str(t, &i, sizeof t, " layout ");
    put_dec(t, &i, sizeof t, A.model.layout_id);
    put_str(t, &i, sizeof t, ": staged ");
    put_dec(t, &i, sizeof t, A.staged[FLM_TIER_PSRAM]);
    put_str(t, &i, sizeof t, " bytes in PSRAM, ");
    put_dec(t, &i, sizeof t, A.staged[FLM_TIER_SRAM]);
    put_str(t, &i, sizeof t, " in SRAM; KV cache ");
    put_str(t, &i, sizeof t, A.model.kv_fmt == FLM_KV_INT8 ? "int8" : "f32");
    put_str(t, &i, sizeof t, " in ");
    put_str(t, &i, sizeof t, TIER_NAME[A.state.kv_tier]);
    send_log(t);
}

/* LAYOUT payload: u32 layout_id, u32 state_tiers, u32 n, u8 tier[n] (docs/formats.md). */
static void set_layout(const uint8_t *p, size_t len) {
    char err[120];
    const flm_model *m = &A.model;
    if (!A.image_ok) { send_error(no_model_code(), A.image_err); return; }
    if (len < 12u || len != 12u + (size_t)flm_get_u32(p + 8)) {
        send_error(FLM_E_BAD_MESSAGE, "LAYOUT payload has the wrong length");
        return;
    }
    uint32_t want_id = flm_get_u32(p), st = flm_get_u32(p + 4), n = flm_get_u32(p + 8);
    const uint8_t *tiers = p + 12;
    if (n != m->n_entries || n > FLM_MAX_ENTRIES) {
        fmt2(err, sizeof err, "LAYOUT gives ", n, " tiers; the image has ", m->n_entries, " table entries");
        send_error(FLM_E_BAD_LAYOUT, err);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (tiers[i] >= FLM_N_TIERS) {
            fmt2(err, sizeof err, "LAYOUT: entry ", i, " has tier ", tiers[i], ", expected 0 (flash), 1 (psram) or 2 (sram)");
            send_error(FLM_E_BAD_LAYOUT, err);
            return;
        }
        if (tiers[i] != FLM_TIER_FLASH && memcmp(m->blob + m->table + i * 64u, "ple.table", 10) == 0) {
            fmt2(err, sizeof err, "LAYOUT: entry ", i, " (ple.table) has tier ", tiers[i],
                 "; the PLE table is read from flash only, one row per token (tier 0)");
            send_error(FLM_E_BAD_LAYOUT, err);
            return;
        }
    }
    if (!flm_state_tiers_ok(st)) {
        send_error(FLM_E_BAD_LAYOUT, "LAYOUT: bad state_tiers (each region: 0 default, 1 psram, 2 sram; "
                                     "bits 12-15 KV format: 0 f32, 1 int8)");
        return;
    }
    if (layout_crc(m, tiers, st) != want_id) {
        fmt2(err, sizeof err, "LAYOUT: layout_id ", want_id, " does not match its tiers (device computes ",
             layout_crc(m, tiers, st), ")");
        send_error(FLM_E_BAD_LAYOUT, err);
        return;
    }
    uint8_t prev[FLM_MAX_ENTRIES];
    memcpy(prev, A.tiers, n);
    uint32_t prev_state = A.state_tiers;
    if (place(tiers, st, err, sizeof err) != 0) {
        char ignored[8];
        place(prev, prev_state, ignored, sizeof ignored);   /* fitted before, fits again */
        send_error(FLM_E_BAD_LAYOUT, err);
        return;
    }
    log_layout("switched to");
    send_hello();
}

static void boot(uint8_t *arena, size_t cap, uint32_t arena_tier) {
    size_t len = 0;
    const uint8_t *blob = hal_blob(&len);
    memset(&K, 0, sizeof K);
    A.image_ok = 0;
    A.arena_tier = arena_tier;
    A.pool[0] = (flm_pool){arena, arena ? cap : 0, 0};
    for (uint32_t t = FLM_TIER_PSRAM; t < FLM_N_TIERS; t++) {
        size_t c = 0;
        uint8_t *b = hal_tier_arena(t, &c);
        A.pool[t] = (flm_pool){b, b ? c : 0, 0};
    }
    char t[120];
    A.kernels_ok = flm_kernels_self_check() == 0;
    if (!A.kernels_ok) {
        scopy(A.image_err, sizeof A.image_err,
              "kernel self-check failed: the tuned q8/q4 group dots disagree with the scalar ones; not generating");
    } else if (!blob) {
        scopy(A.image_err, sizeof A.image_err, "no image in flash");
    } else if (flm_blob_open(&A.model, blob, len, A.image_err, sizeof A.image_err) == 0) {
        size_t need = flm_state_bytes(&A.model) + (size_t)A.model.seq_len * 4u;
        if (A.model.n_entries > FLM_MAX_ENTRIES) {
            fmt2(A.image_err, sizeof A.image_err, "image has ", A.model.n_entries,
                 " tensor-table entries; this build handles ", FLM_MAX_ENTRIES, "");
        } else if (place(0, A.model.state_tiers, t, sizeof t) == 0) {
            A.image_ok = 1;
        } else {
            send_log(t);   /* the image's own placement does not fit this build: run it from flash */
            static const uint8_t flash_only[FLM_MAX_ENTRIES];
            if (place(flash_only, 0, t, sizeof t) == 0) {
                A.image_ok = 1;
                send_log("the image's layout does not fit; every tensor is read from flash instead");
            } else {
                fmt2(A.image_err, sizeof A.image_err, "model needs ", (uint32_t)need,
                     " bytes of RAM for KV cache and buffers; this build has ", (uint32_t)cap, "");
            }
        }
    }
    if (A.image_ok) {
        fmt2(t, sizeof t, "flashlm " FLM_FW_VERSION ": image ok, ", (uint32_t)len, " bytes; arena ",
             (uint32_t)(flm_state_bytes(&A.model) + A.model.seq_len * 4u), " bytes used");
        send_log(t);
        log_layout("boot");
    } else {
        scopy(t, sizeof t, "flashlm " FLM_FW_VERSION ": image refused");
        send_log(t);
    }
    send_hello();
}

void flm_app_run(uint8_t *arena, size_t cap, uint32_t arena_tier) {
    flm_tx_init(&A.tx, hal_serial_write);
    flm_rx_init(&A.rx, rxbuf, sizeof rxbuf);
    boot(arena, cap, arena_tier);
    for (;;) {
        int got = poll_frame();
        if (!got) {
            report_bad_frames();
            hal_idle();
            continue;
        }
        if (got == 2) { text_session(); continue; }
        report_console();
        switch (A.rx.type) {
        case FLM_PING: send_hello(); break;
        case FLM_GENERATE: generate(A.rx.payload, A.rx.len); break;
        case FLM_LAYOUT: set_layout(A.rx.payload, A.rx.len); break;
        case FLM_STOP: break;   /* nothing running */
        case FLM_RESEND: resend(A.rx.payload, A.rx.len); break;
        case FLM_GENERATE_TEXT: generate_text(); break;
        default: send_error(FLM_E_BAD_MESSAGE, "unknown message type"); break;
        }
    }
}
