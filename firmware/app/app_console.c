/* The plain-text console (docs/formats.md 2.3): a line typed at a serial monitor is a prompt. Its
 * answer is plain text: the prompt, the greedy continuation, a summary line; no frames. */
#include "app_console.h"
#include "app_frames.h"
#include "app_prompt.h"
#include "app_receive.h"
#include "app_text.h"
#include "hal.h"
#include <string.h>

static uint32_t console_lines;   /* answered since the last frame */

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

/* Answer the console line flm_rxbuf[0..line_len): greedy continuation to the end of text or of the
 * context, then "[prompt + generated tokens in ms, tok/s (clock); encode time; why it ended]" (on
 * the instruction clock: instructions, no rate). While
 * the story is told, a CR or LF outside a line (the rest of the terminal's CR LF) is taken in; any
 * other byte stops it and waits for the console or the framed protocol. */
void app_console_line(void) {
    static const char *const CLOCK[4] = {"host clock", "chip timer", "emulated timer", "emulated instructions"};
    const flm_model *m = &flm_dev.model;
    char t[160];
    uint32_t n = 0, us = 0, generated = 0;
    size_t i = 0;
    int line_over;
    const size_t line_len = app_line(&line_over);
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
    uint16_t code = app_encode_text(flm_rxbuf, line_len, &n, &us, t, sizeof t);
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
        if (app_receive_interrupted()) { end = "stopped by a key"; break; }
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
    app_put_elapsed(t, &i, sizeof t, total, 1);
    if (hal_clock_kind() != FLM_CLOCK_INSTRUCTIONS) {   /* a rate needs a time */
        app_put_str(t, &i, sizeof t, ", ");
        app_put_dec(t, &i, sizeof t, (uint32_t)(rate / 10u));
        app_put_str(t, &i, sizeof t, ".");
        app_put_dec(t, &i, sizeof t, (uint32_t)(rate % 10u));
        app_put_str(t, &i, sizeof t, " tok/s");
    }
    app_put_str(t, &i, sizeof t, " (");
    app_put_str(t, &i, sizeof t, CLOCK[hal_clock_kind() <= FLM_CLOCK_INSTRUCTIONS ? hal_clock_kind() : 0u]);
    app_put_str(t, &i, sizeof t, "); text encoded in ");
    app_put_elapsed(t, &i, sizeof t, us, 0);
    app_put_str(t, &i, sizeof t, "; ");
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
