/* Bytes from the host: frames, or lines typed at a serial monitor (the plain-text console); text
 * prompts (GENERATE_TEXT and console lines, encoded by the device tokenizer). docs/formats.md 1.1, 2.3. */
#include "app_state.h"
#include "hal.h"
#include <string.h>

static int feed(uint8_t b);

/* Feed received bytes into the receiver; returns 1 with a frame ready in flm_dev.rx, 2 with a console
 * text line (feed()). Bytes read past the end of that frame or line wait in pend for the next call. */
static uint8_t pend[64];
static size_t pend_i, pend_n;

int app_poll_frame(void) {
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

/* Encode text into flm_dev.prompt, BOS first (as the host's encode_prompt), in the KV cache's memory: it
 * is idle between generations and every generation starts it afresh. Returns 0 with the ids'
 * count in *n and the time taken in *us, or an error code with its one-line reason in err. */
static uint16_t encode_text(const uint8_t *text, size_t len, uint32_t *n, uint32_t *us, char *err, size_t en) {
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

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* GENERATE_TEXT payload: the GENERATE fields before n_prompt (28 bytes), then s16 text. Encoded, it
 * becomes the GENERATE of those ids (rewritten in place) and runs exactly as one. */
void app_generate_text(void) {
    uint8_t *p = flm_rxbuf + (flm_dev.rx.payload - flm_rxbuf);    /* the payload, writable */
    size_t len = flm_dev.rx.len, i = 0;
    uint32_t n, us;
    char t[120];
    if (len < 30u || len != 30u + (size_t)flm_get_u16(p + 28)) {
        app_send_error(FLM_E_BAD_MESSAGE, "GENERATE_TEXT payload has the wrong length");
        return;
    }
    uint16_t code = encode_text(p + 30, len - 30u, &n, &us, t, sizeof t);
    if (!code && 32u + 4u * (size_t)n > sizeof flm_rxbuf - (size_t)(p - flm_rxbuf)) {
        app_scopy(t, sizeof t, "prompt does not fit this build's receive buffer as ids");
        code = FLM_E_PROMPT_TOO_LONG;
    }
    if (code) { app_send_error(code, t); return; }
    app_put_str(t, &i, sizeof t, "text prompt: ");
    app_put_dec(t, &i, sizeof t, (uint32_t)(len - 30u));
    app_put_str(t, &i, sizeof t, " bytes, ");
    app_put_dec(t, &i, sizeof t, n);
    app_put_str(t, &i, sizeof t, " tokens, encoded in ");
    app_put_dec(t, &i, sizeof t, us);
    app_put_str(t, &i, sizeof t, " us");
    app_send_log(t);
    put_le32(p + 28, n);
    for (uint32_t k = 0; k < n; k++) put_le32(p + 32 + 4u * k, flm_dev.prompt[k]);
    app_generate(p, 32u + 4u * (size_t)n);
}

/* The console. A host frame's first byte is its COBS code byte, below 0x20 (docs/formats.md 2.3),
 * so a line that starts with a byte >= 0x20 and ends in CR or LF, with no other control byte
 * (tab, backspace and DEL aside) and no 0x00 in it, is text typed at a serial monitor: a prompt.
 * Its answer is plain text: the prompt, the greedy continuation, a summary line; no frames. */
enum { IN_START, IN_EOL, IN_TEXT, IN_FRAME };
static uint8_t in_state;      /* IN_START after a delimiter or a line */
static uint8_t in_held;       /* IN_EOL: the CR or LF held back: a blank line or a frame's code byte */
static uint8_t in_skip;       /* the frame being received began with the held byte */
static size_t line_len;       /* the line feed() returned: flm_rxbuf[0..line_len) */
static int line_over;         /* ... longer than flm_rxbuf */
static uint32_t console_lines;   /* answered since the last frame */

/* Does the COBS block chain of b[from..n) end exactly at n? */
static int cobs_ends(const uint8_t *b, size_t from, size_t n) {
    while (from < n && b[from]) from += b[from];
    return from == n;
}

/* One received byte: into a console line or into the frame receiver. Returns 1 with a frame ready
 * in flm_dev.rx, 2 with a line ready. A CR or LF outside a line is held back until the next byte shows
 * whether it ended a line (the terminal's CR LF) or is the code byte of a frame whose first zero
 * is 9 or 12 bytes in; at the frame's end the COBS block chain decides. */
static int feed(uint8_t b) {
    int eol = b == '\r' || b == '\n';
    if (in_state == IN_START || in_state == IN_EOL) {
        if (eol) { in_held = b; in_state = IN_EOL; return 0; }
        if (b >= 0x20u) { in_state = IN_TEXT; return feed(b); }
        in_skip = in_state == IN_EOL && b;
        if (in_skip) flm_rx_feed(&flm_dev.rx, in_held);
        in_state = IN_FRAME;
    } else if (in_state == IN_TEXT) {
        if (eol) {
            line_len = flm_dev.rx.n;
            line_over = flm_dev.rx.overflow;
            flm_dev.rx.n = 0;
            flm_dev.rx.overflow = 0;
            in_held = b;
            in_state = IN_EOL;
            return 2;
        }
        if (b == 0x08u || b == 0x7Fu) {      /* backspace: drop the last character */
            while (flm_dev.rx.n && (flm_dev.rx.buf[--flm_dev.rx.n] & 0xC0u) == 0x80u) {}
            return 0;
        }
        if (b >= 0x20u || b == '\t') return flm_rx_feed(&flm_dev.rx, b);
        in_state = IN_FRAME;                 /* not text: junk before a frame, as without the console */
        in_skip = 0;
    }
    if (b == 0) {
        if (in_skip && !cobs_ends(flm_dev.rx.buf, 0, flm_dev.rx.n) && cobs_ends(flm_dev.rx.buf, 1, flm_dev.rx.n))
            memmove(flm_dev.rx.buf, flm_dev.rx.buf + 1, --flm_dev.rx.n);   /* the held byte was a blank line after all */
        in_state = IN_START;
        in_skip = 0;
    }
    return flm_rx_feed(&flm_dev.rx, b);
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

static void console_str(const char *s) { console_put((const uint8_t *)s, app_slen(s)); }

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

/* Answer the console line flm_rxbuf[0..line_len): greedy continuation to the end of text or of the
 * context, then "[prompt + generated tokens in ms, tok/s (clock); encode time; why it ended]". */
void app_text_session(void) {
    static const char *const CLOCK[3] = {"host clock", "chip timer", "emulated timer"};
    const flm_model *m = &flm_dev.model;
    char t[160];
    uint32_t n = 0, us = 0, generated = 0;
    size_t i = 0;
    console_lines++;
    if (line_over) {
        app_put_str(t, &i, sizeof t, "flashlm: error: a line holds at most ");
        app_put_dec(t, &i, sizeof t, (uint32_t)sizeof flm_rxbuf);
        app_put_str(t, &i, sizeof t, " bytes here\n");
        console_str(t);
        return;
    }
    if (!line_len) return;
    console_put(flm_rxbuf, line_len);
    uint16_t code = encode_text(flm_rxbuf, line_len, &n, &us, t, sizeof t);
    if (code) {
        console_str("\nflashlm: error: ");
        console_str(t);
        console_str("\n");
        return;
    }
    const char *end = "context full";
    uint32_t *ctx = flm_dev.prompt, tok, pos, len;
    uint64_t t0 = hal_time_us();
    for (pos = 0; pos < m->seq_len; pos += len) {
        if (console_interrupted()) { end = "stopped by a key"; break; }
        flm_step_stats st;
        memset(&st, 0, sizeof st);
        /* the prompt in chunks of up to the batch, ending with its last token; then one at a time */
        len = pos + 1u < n ? n - pos : 1u;
        if (len > m->batch) len = m->batch;
        flm_body_many(&flm_dev.state, ctx + pos, len, pos, &st);
        if (pos + len < n) continue;                                      /* prefill: no output layer */
        tok = flm_head_argmax(&flm_dev.state, &st);                       /* greedy: the tile scan */
        if (pos + len < m->seq_len) ctx[pos + len] = tok;
        generated++;
        if (flm_is_stop(m, tok)) { end = "end of text"; break; }
        uint32_t plen;
        const uint8_t *piece = flm_piece(m, tok, &plen);
        console_put(piece, plen);
    }
    uint64_t total = hal_time_us() - t0, rate = total ? (uint64_t)generated * 10000000u / total : 0u;
    app_put_str(t, &i, sizeof t, "\n[");
    app_put_dec(t, &i, sizeof t, n);
    app_put_str(t, &i, sizeof t, " prompt + ");
    app_put_dec(t, &i, sizeof t, generated);
    app_put_str(t, &i, sizeof t, " generated tokens in ");
    app_put_dec(t, &i, sizeof t, (uint32_t)(total / 1000u));
    app_put_str(t, &i, sizeof t, " ms, ");
    app_put_dec(t, &i, sizeof t, (uint32_t)(rate / 10u));
    app_put_str(t, &i, sizeof t, ".");
    app_put_dec(t, &i, sizeof t, (uint32_t)(rate % 10u));
    app_put_str(t, &i, sizeof t, " tok/s (");
    app_put_str(t, &i, sizeof t, CLOCK[hal_clock_kind() < 3u ? hal_clock_kind() : 0u]);
    app_put_str(t, &i, sizeof t, "); text encoded in ");
    app_put_dec(t, &i, sizeof t, us);
    app_put_str(t, &i, sizeof t, " us; ");
    app_put_str(t, &i, sizeof t, end);
    app_put_str(t, &i, sizeof t, "]\n");
    console_str(t);
}

/* A frame after console lines: say so once, in the protocol (a line no one typed was line noise). */
void app_report_console(void) {
    char t[120];
    size_t i = 0;
    if (!console_lines) return;
    app_put_str(t, &i, sizeof t, "text console: answered ");
    app_put_dec(t, &i, sizeof t, console_lines);
    app_put_str(t, &i, sizeof t, " line(s) sent outside any frame (if no one typed them: line noise)");
    console_lines = 0;
    app_send_log(t);
}
