/* What a board provides to the engine. Each board's HAL is one small C file. */
#ifndef FLM_HAL_H
#define FLM_HAL_H
#include <stddef.h>
#include <stdint.h>

/* Board start-up (clocks, UART, where the blob is); argc/argv only on the native board.
 * Returns 0, or non-zero when the board cannot run at all. */
int hal_init(int argc, char **argv);
/* The weights blob as the core sees it in the flash tier (memory-mapped / XIP). */
const uint8_t *hal_blob(size_t *len);
/* Non-blocking read of up to max bytes from the serial link; returns the count (0: none yet). */
size_t hal_serial_read(uint8_t *buf, size_t max);
/* Blocking write of all bytes (a link nobody listens to may drop them, as a UART would). */
void hal_serial_write(const uint8_t *buf, size_t len);
/* Called when there is nothing to do; may sleep briefly. */
void hal_idle(void);
/* Microseconds from the board's own clock; monotonic. */
uint64_t hal_time_us(void);
/* Which clock hal_time_us reads: 0 host clock, 1 chip timer, 2 emulated timer (HELLO field). */
uint8_t hal_clock_kind(void);
/* Board name reported in HELLO. */
const char *hal_board_name(void);
#endif
