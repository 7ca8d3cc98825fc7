/* Test driver for firmware/app/protocol.c (used by tests/test_protocol.py).
 *
 * Reads a byte stream from stdin and feeds it to flm_rx; every good frame is sent back on stdout
 * with flm_tx (same type and payload, the driver's own seq).  At EOF it sends one LOG frame with
 * the text "good=N bad=M".  Optional argv[1]: receive buffer capacity in bytes (default 70000). */
#include <stdio.h>
#include <stdlib.h>

#include "protocol.h"

static uint8_t rx_buf[70000];

static void write_stdout(const uint8_t *buf, size_t len) {
    if (fwrite(buf, 1, len, stdout) != len) exit(2);
}

int main(int argc, char **argv) {
    flm_rx rx;
    flm_tx tx;
    size_t cap = sizeof rx_buf;
    uint8_t in[4096];
    size_t got, i;
    char text[64];
    int n;

    if (argc > 1) {
        long c = strtol(argv[1], NULL, 10);
        if (c > 0 && (size_t)c < cap) cap = (size_t)c;
    }
    flm_rx_init(&rx, rx_buf, cap);
    flm_tx_init(&tx, write_stdout);

    while ((got = fread(in, 1, sizeof in, stdin)) > 0) {
        for (i = 0; i < got; i++) {
            if (flm_rx_feed(&rx, in[i])) {
                flm_tx_begin(&tx, rx.type);
                flm_tx_put(&tx, rx.payload, rx.len);
                flm_tx_end(&tx);
            }
        }
    }
    n = sprintf(text, "good=%lu bad=%lu", (unsigned long)rx.good_frames,
                (unsigned long)rx.bad_frames);
    flm_tx_begin(&tx, FLM_LOG);
    flm_tx_s16(&tx, text, (size_t)n);
    flm_tx_end(&tx);
    return fflush(stdout) == 0 ? 0 : 1;
}
