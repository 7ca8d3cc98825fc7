/* The bottom of the app: bytes from the host become frames, or lines typed at a serial monitor
 * (the plain-text console; docs/formats.md 2.3). */
#ifndef FLM_APP_RECEIVE_H
#define FLM_APP_RECEIVE_H
#include <stddef.h>

enum { APP_RX_NOTHING = 0, APP_RX_FRAME = 1, APP_RX_LINE = 2 };
/* Feed received bytes into the receiver: APP_RX_FRAME with a frame ready in flm_dev.rx, APP_RX_LINE
 * with a console line ready (app_line), APP_RX_NOTHING when the bytes received so far make neither.
 * Bytes read past the end of that frame or line wait for the next call. */
int app_receive(void);
/* The console line app_receive returned: flm_rxbuf[0..return); *over: the line was longer than
 * flm_rxbuf (its bytes are lost). */
size_t app_line(int *over);
/* While the console answers a line: 1 when the host sent a byte other than the rest of the
 * terminal's CR LF (which it takes in); that byte waits for app_receive. */
int app_receive_interrupted(void);
#endif
