/* What a board provides to the engine. Each board's HAL is one small C file. */
#ifndef FLM_HAL_H
#define FLM_HAL_H
#include <stddef.h>
#include <stdint.h>
#include "blob.h"
#include "kernels.h"

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
/* Microseconds from the board's own clock; monotonic. On a board whose clock kind is
 * FLM_CLOCK_INSTRUCTIONS, the instructions run since start instead: no time at all. */
uint64_t hal_time_us(void);
/* Which clock hal_time_us reads: 0 host clock, 1 chip timer, 2 emulated timer, 3 emulated
 * instructions (HELLO field). */
#define FLM_CLOCK_INSTRUCTIONS 3u
uint8_t hal_clock_kind(void);
/* Board name reported in HELLO. */
const char *hal_board_name(void);
/* The main stack's deepest use since boot in bytes, and its size in *size (DONE fields): a board
 * that paints its stack at reset reads back the first word the stack overwrote. Both 0 where the
 * HAL does not measure it (app_frames.c has a weak default). */
uint32_t hal_stack_peak(uint32_t *size);
/* Staging space in a RAM tier (FLM_TIER_PSRAM or FLM_TIER_SRAM, blob.h): the app copies the
 * tensors a layout places in that tier out of flash into it (at boot and on LAYOUT), and carves the
 * state regions placed there from it unless main()'s arena is in that tier (the state's home).
 * Returns the space and its size in *cap, or NULL with *cap = 0 where there is none: then tensors
 * staged in the arena's own tier share main()'s arena. Called once per tier at boot; the memory is
 * the app's from then on. A HAL without staging space need not define it (app_layout.c has a weak
 * default returning NULL). */
uint8_t *hal_tier_arena(uint32_t tier, size_t *cap);
/* w's rows for the n tokens of b (kernels.h flm_matmul_rows; n = 1: flm_matvec), the engine's every
 * matrix product goes through here: a board may split the rows across its cores (rows are
 * independent, so any split is bit for bit the same; when n > 1 each core copies rows into its own
 * half of row_buf, whose row_buf_bytes hold two rows of the widest matrix, a half 8-byte aligned) or
 * use its SIMD unit for the group dots. A HAL need not define it (kernels.c has a weak default
 * running every row on the calling core with the whole of row_buf). */
void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes);
/* A hint: the product after the next hal_matmul is w's (the engine names it where that is certain,
 * within a layer). A HAL that streams a matrix in may read w's first rows while the next product's
 * last rows compute. No effect on any result; kernels.c's weak default ignores it. */
void hal_matmul_then(const flm_tensor *w);
/* fn(ctx, i0, i1) computes elements [i0, i1) of something whose elements are independent (per-
 * element work). hal_parallel has fn cover [0, n): a board with two cores may run [0, n / 2) and
 * [n / 2, n) at once (n >= 2), bit for bit the same; so at most two calls run at once, one with
 * i0 == 0 and one without, and a fn that needs scratch keeps one for each (the engine's attention
 * heads: engine.c att_scratch_bytes). kernels.c's weak default calls fn(ctx, 0, n). */
typedef void (*flm_range_fn)(void *ctx, uint32_t i0, uint32_t i1);
void hal_parallel(flm_range_fn fn, void *ctx, uint32_t n);
/* Per-row work on the next hal_matmul's output (w's): fn(ctx, r0, r1) for output rows [r0, r1) of
 * every token, needing only those rows of the product (and nothing another call changes), so it
 * may run on a share of rows as soon as that share is computed, on the core that computed it: in
 * a product whose reads outrun its rows that work fills the cores' wait. Returns 1 if the HAL
 * takes it (its calls then cover [0, w->rows) once, within the product), 0 if not: the caller runs
 * fn after the product. kernels.c's weak default takes none. On the RP2040 fn and what it calls
 * run while the flash is out of XIP mode: rp2040.ld places them in SRAM. */
int hal_matmul_each(const flm_tensor *w, flm_range_fn fn, void *ctx);

/* For a HAL that splits hal_matmul's rows across two cores: the share of a product the other core
 * computes, and how the rows and row_buf are split. */
typedef struct {
    const flm_tensor *w;
    const flm_batch *b;
    uint8_t *row_buf;
    size_t row_buf_bytes;
    uint32_t r0;          /* the share is rows [r0, w->rows) */
} flm_rows_share;

/* Fills *other with rows [mid, rows) and row_buf's second half; returns mid, the calling core's rows
 * being [0, mid) with the first half (*own_bytes). mid is even (the row-scaled kernels take rows in
 * pairs); a half is whole 8-byte words; no buffer (one token) stays NULL (NULL + n is undefined). */
static inline uint32_t flm_split_rows(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf,
                                      size_t row_buf_bytes, flm_rows_share *other, size_t *own_bytes) {
    const uint32_t mid = (w->rows / 2u) & ~1u;
    const size_t half = (row_buf_bytes / 2u) & ~(size_t)7u;
    other->w = w;
    other->b = b;
    other->row_buf = row_buf ? row_buf + half : 0;
    other->row_buf_bytes = half;
    other->r0 = mid;
    *own_bytes = half;
    return mid;
}

static inline void flm_rows_share_run(const flm_rows_share *s) {
    flm_matmul_rows(s->w, s->r0, s->w->rows, s->b, s->row_buf, s->row_buf_bytes);
}
#endif
