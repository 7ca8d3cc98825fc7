/* Bytes from the host: frames, or lines typed at a serial monitor (the plain-text console).
 *
 * A host frame's first byte is its COBS code byte, below 0x20 (docs/formats.md 2.3), so a line that
 * starts with a byte >= 0x20 and ends in CR or LF, with no other control byte (tab, backspace and
 * DEL aside) and no 0x00 in it, is text typed at a serial monitor. */
#include "app_receive.h"
#include "app_state.h"
#include "hal.h"
#include <string.h>

/* Bytes read from the HAL and not yet fed: pend[pend_i..pend_n). */
static uint8_t pend[64];
static size_t pend_i, pend_n;

enum { IN_START, IN_EOL, IN_TEXT, IN_FRAME };
static uint8_t in_state;      /* IN_START after a delimiter or a line */
static uint8_t in_held;       /* IN_EOL: the CR or LF held back: a blank line or a frame's code byte */
static uint8_t in_skip;       /* the frame being received began with the held byte */
static size_t line_len;       /* the line feed() returned: flm_rxbuf[0..line_len) */
static int line_over;         /* ... longer than flm_rxbuf */

/* Does the COBS block chain of b[from..n) end exactly at n? */
static int cobs_ends(const uint8_t *b, size_t from, size_t n) {
    while (from < n && b[from]) from += b[from];
    return from == n;
}

/* One received byte: into a console line or into the frame receiver. Returns APP_RX_FRAME with a
 * frame ready in flm_dev.rx, APP_RX_LINE with a line ready. A CR or LF outside a line is held back
 * until the next byte shows whether it ended a line (the terminal's CR LF) or is the code byte of a
 * frame whose first zero is 9 or 12 bytes in; at the frame's end the COBS block chain decides. */
static int feed(uint8_t b) {
    int eol = b == '\r' || b == '\n';
    if (in_state == IN_START || in_state == IN_EOL) {
        if (eol) { in_held = b; in_state = IN_EOL; return APP_RX_NOTHING; }
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
            return APP_RX_LINE;
        }
        if (b == 0x08u || b == 0x7Fu) {      /* backspace: drop the last character */
            while (flm_dev.rx.n && (flm_dev.rx.buf[--flm_dev.rx.n] & 0xC0u) == 0x80u) {}
            return APP_RX_NOTHING;
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

/* 1 with bytes waiting in pend (read from the HAL if it was empty), 0 when none have arrived. */
static int pending(void) {
    if (pend_i < pend_n) return 1;
    pend_i = 0;
    pend_n = hal_serial_read(pend, sizeof pend);
    return pend_n != 0;
}

int app_receive(void) {
    while (pending()) {
        while (pend_i < pend_n) {
            int got = feed(pend[pend_i++]);
            if (got) return got;
        }
    }
    return APP_RX_NOTHING;
}

size_t app_line(int *over) {
    *over = line_over;
    return line_len;
}

int app_receive_interrupted(void) {
    while (pending()) {
        uint8_t b = pend[pend_i];
        if ((b != '\r' && b != '\n') || (in_state != IN_START && in_state != IN_EOL)) return 1;
        feed(b);
        pend_i++;
    }
    return 0;
}
