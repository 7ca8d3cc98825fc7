/* The RP2040's second core: launched from the boot ROM at start-up, it waits for matrix products
 * and computes its half of their rows while core 0 computes the other half (and likewise half of
 * hal_parallel's elements).
 *
 * The rows of a product are independent and each core runs the same row kernels on its own rows,
 * so any split is bit for bit the one-core result (hal.h hal_matmul). The two cores talk through the
 * SIO's inter-core FIFOs (datasheet 2.3.1.5): core 0 pushes a word when the job is written, core 1
 * pushes one when its rows are done; each push is followed by SEV, and a core with nothing to read
 * sleeps in WFE. The launch is the boot ROM's handshake (datasheet 2.8.2): the words 0, 0, 1, vector
 * table, stack pointer, entry, each echoed back by core 1, the sequence restarted on a wrong echo
 * and the FIFO from core 1 drained before each 0. */
#include "cores_rp2040.h"
#include "hal_rp2040.h"

#define REG(addr) (*(volatile uint32_t *)(addr))
#define SIO_FIFO_ST 0xd0000050u
#define SIO_FIFO_WR 0xd0000054u
#define SIO_FIFO_RD 0xd0000058u
#define FIFO_VLD 1u   /* this core's RX FIFO holds a word */
#define FIFO_RDY 2u   /* its TX FIFO has room */

#define SPLIT_MIN_ROWS 8u           /* fewer rows: the hand-over costs more than half the rows */
#define CORE1_STACK_WORDS 768u      /* 3 KB: the row kernels need 2.6 KB (the q4 lanes of kernels_arch.h 2,240 B) */

extern const uint32_t __vectors_start[];

static uint32_t core1_stack[CORE1_STACK_WORDS] __attribute__((aligned(8)));
static int core1_up;

/* what core 1 runs next: written by core 0 before its FIFO word, read by core 1 after it */
static void (*job_fn)(void *);
static void *job_arg;
static flm_rows_share share;

/* core 1's loop and the FIFO code run from SRAM: a streamed product (stream_rp2040.c) may have
 * the SSI out of XIP mode while they run */
FLM_RAMFUNC static void fifo_push(uint32_t v) {
    while (!(REG(SIO_FIFO_ST) & FIFO_RDY)) {}
    __asm volatile("dmb" ::: "memory");   /* the job's writes before the word that announces it */
    REG(SIO_FIFO_WR) = v;
    __asm volatile("sev");
}

FLM_RAMFUNC static uint32_t fifo_pop(void) {
    while (!(REG(SIO_FIFO_ST) & FIFO_VLD)) __asm volatile("wfe");
    uint32_t v = REG(SIO_FIFO_RD);
    __asm volatile("dmb" ::: "memory");
    return v;
}

static void core1_main(void) __attribute__((noreturn));
FLM_RAMFUNC static void core1_main(void) {
    for (;;) {
        (void)fifo_pop();
        job_fn(job_arg);
        fifo_push(1u);
    }
}

void hal_rp2040_cores_launch(void) {
    const uint32_t words[6] = {0u, 0u, 1u, (uint32_t)(uintptr_t)__vectors_start,
                               (uint32_t)(uintptr_t)(core1_stack + CORE1_STACK_WORDS),
                               (uint32_t)(uintptr_t)core1_main};
    for (uint32_t i = 0; i < 6u;) {
        if (words[i] == 0u) {
            while (REG(SIO_FIFO_ST) & FIFO_VLD) (void)REG(SIO_FIFO_RD);
            __asm volatile("sev");   /* core 1 may sleep waiting for room in its FIFO */
        }
        fifo_push(words[i]);
        i = fifo_pop() == words[i] ? i + 1u : 0u;
    }
    core1_up = 1;
}

FLM_RAMFUNC int hal_rp2040_core1_start(void (*fn)(void *), void *arg) {
    if (!core1_up) return 0;
    job_fn = fn;
    job_arg = arg;
    fifo_push(1u);
    return 1;
}

FLM_RAMFUNC void hal_rp2040_core1_join(void) {
    (void)fifo_pop();
}

FLM_RAMFUNC static void share_run(void *s) {
    flm_rows_share_run((const flm_rows_share *)s);
}

void hal_rp2040_matmul_cores(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
    if (!core1_up || w->rows < SPLIT_MIN_ROWS) {
        flm_matmul_rows(w, 0, w->rows, b, row_buf, row_buf_bytes);
        return;
    }
    size_t half;
    const uint32_t mid = flm_split_rows(w, b, row_buf, row_buf_bytes, &share, &half);
    hal_rp2040_core1_start(share_run, &share);
    flm_matmul_rows(w, 0, mid, b, row_buf, half);
    hal_rp2040_core1_join();
}

/* hal_parallel's second half, for core 1 (fn may be in flash: XIP is on outside the streamed
 * products) */
typedef struct {
    flm_range_fn fn;
    void *ctx;
    uint32_t i0, i1;
} range_job;

static range_job range;

static void range_run(void *r) {
    const range_job *j = r;
    j->fn(j->ctx, j->i0, j->i1);
}

void hal_parallel(flm_range_fn fn, void *ctx, uint32_t n) {
    if (!core1_up || n < 2u) {   /* the engine's every call is worth a hand-over (~100 cycles) */
        fn(ctx, 0, n);
        return;
    }
    range = (range_job){fn, ctx, n / 2u, n};
    hal_rp2040_core1_start(range_run, &range);
    fn(ctx, 0, n / 2u);
    hal_rp2040_core1_join();
}
