/* hal_matmul on the RP2040: a product on a matrix in flash (any number of tokens) streams its rows
 * into SRAM while both cores compute, any other runs on both cores as it stands (cores_rp2040.c).
 *
 * Through the XIP cache the two cores wait on flash one 8-byte line at a time (59 cycles a line at
 * SCKDV 2); the SSI in a quad read it was told to run itself moves a 32-bit word every 16 cycles
 * once the address is sent (datasheet 4.10 SSI; host/emu/ssidirect.mjs). So the product takes the
 * SSI out of XIP mode and has DMA channel 0 (datasheet 2.5, paced by DREQ_XIP_SSIRX) carry the rows
 * chunk by chunk (whole rows, up to STREAM_CHUNK_BYTES) into a ring of STREAM_SLOTS SRAM buffers;
 * then the SSI goes back to XIP mode. The cores take chunks in turn, whole (a pass of two quads or
 * more: each in two halves of its tokens), and each computes its chunk's rows for its tokens from
 * the buffer, through a view tensor (its data the buffer): no hand-over per chunk, only one per
 * product. A read starts as soon as the last one ended (the DMA's
 * completion interrupt, or a core looking) and the chunk's buffer is free again. The rows' bytes
 * are the flash's and a row's value does not depend on which core computes it, so the logits are
 * bit for bit those of the XIP path.
 *
 * While the SSI is out of XIP mode nothing may miss in the XIP cache: this file, the row loops, the
 * kernels, the soft-float and core 1's loop run from SRAM (rp2040.ld), the activations and outputs
 * are in SRAM, and the one interrupt enabled during a product is the DMA's, whose vector the core
 * reads from the table's SRAM copy (startup_rp2040.c; UART0's is only unmasked in hal_idle). The
 * SSI's other settings stay what xip_setup wrote (quad, 32-bit frames, EEPROM read, continuous-read
 * mode bits 0xA0, no instruction), so a read is NDF (CTRLR1) and one address word; the flash stays
 * in continuous-read mode, and XIP resumes with NDF 0. FLM_RP2040_STREAM=0 builds without it. */
#include "cores_rp2040.h"
#include "hal_rp2040.h"
#include "rs_lanes_rp2040.h"

#ifndef FLM_RP2040_STREAM
#define FLM_RP2040_STREAM 1
#endif
#define STREAM_CHUNK_BYTES 1024u   /* each buffer: a 1 KB read takes ~4,100 cycles */
#define STREAM_SLOTS 4u             /* buffers: a chunk on each core and two reads ahead */

#define REG(addr) (*(volatile uint32_t *)(addr))
#define SSI_CTRLR1 0x18000004u
#define SSI_SSIENR 0x18000008u
#define SSI_DMACR 0x1800004cu
#define SSI_DMARDLR 0x18000054u
#define SSI_DR0 0x18000060u
#define DMA_READ 0x50000000u        /* channel 0 */
#define DMA_WRITE 0x50000004u
#define DMA_COUNT 0x50000008u
#define DMA_CTRL_TRIG 0x5000000cu
#define DMA_INTR 0x50000400u         /* raw interrupt status, write 1 to clear */
#define DMA_INTE0 0x50000404u        /* channel 0's completion raises DMA_IRQ_0 */
#define DMA_INTS0 0x5000040cu
#define DMA_IRQ_0 11u
#define NVIC_ICPR 0xe000e280u
#define DREQ_XIP_SSIRX 39u
/* EN, DATA_SIZE word, INCR_WRITE, CHAIN_TO itself (none), TREQ_SEL the SSI's RX request */
#define DMA_CTRL (1u | (2u << 2) | (1u << 5) | (0u << 11) | (DREQ_XIP_SSIRX << 15))
#define XIP_BASE 0x10000000u
#define XIP_END 0x11000000u         /* the cached, allocating alias: where the blob is addressed */
#define MODE_BITS 0xa0u             /* continuous read: the flash expects no command next time */

#if FLM_RP2040_STREAM
#define SIO_CPUID 0xd0000000u
#define SIO_LOCK 0xd000017cu        /* spinlock 31: a read claims it (non-zero: got it), a write frees it */

static uint32_t stream_buf[STREAM_SLOTS][STREAM_CHUNK_BYTES / 4u];

/* A streamed product, shared by the two cores: chunk j (rows [j * per, +per)) is read into buffer
 * j % STREAM_SLOTS once the chunk STREAM_SLOTS before it is done; reads run in order, one at a
 * time (one DMA channel, one SSI); a core takes the next chunk not taken. issued and taken change
 * under the spinlock; free[s] is written by the core that computed the chunk in buffer s. */
typedef struct {
    const flm_tensor *w;
    const flm_batch *b;
    uint32_t per, chunks;
    const uint8_t *next;                    /* the flash of chunk issued (its reads run in order) */
    uint32_t chunk_words, last_words;       /* a chunk's words, the last chunk's */
    uint32_t lanes;                         /* 1: a q4 product of one token (take_chunks_lanes) */
    const uint32_t *stage;                  /* tokens [0, staged) of a pass, their activations staged */
    uint32_t staged;
    uint32_t split;                         /* a pass of two quads staged or more: each chunk taken
                                               twice, its staged tokens [0, split) and then the rest
                                               (the product's last chunk shared: the cores end
                                               closer together); 0: once, whole */
    uint32_t base;                          /* chunk j's buffer: (base + j) % STREAM_SLOTS */
    flm_range_fn each;                      /* per-row work on the output (hal_matmul_each), 0: none */
    void *each_ctx;
    const uint8_t *ahead;                   /* the next product's matrix (hal_matmul_then), 0: none */
    uint32_t ahead_words;                   /* its first chunk's words */
    volatile uint32_t issued;               /* chunks whose read has started (chunks + 1: and the
                                               next product's first) */
    volatile uint32_t taken;                /* chunks (split: halves) a core has taken */
    volatile uint32_t free[STREAM_SLOTS];   /* per buffer: the chunk that may be read into it next */
    uint32_t halves[STREAM_SLOTS];          /* split: per buffer, its chunk's halves done (under the lock) */
    flm_tensor view[2];                     /* per core: its chunk, the data its buffer (set up in
                                               place, no struct copy: memcpy runs from flash) */
} stream_job;

static stream_job job;

/* The rows of w's chunk j, chunks of per rows (the last may hold fewer). */
FLM_RAMFUNC static uint32_t chunk_rows(const flm_tensor *w, uint32_t per, uint32_t j) {
    const uint32_t left = w->rows - j * per;
    return left < per ? left : per;
}

/* The next product's matrix (hal_matmul_then), taken by the product before it (job.ahead). */
static const uint8_t *then_data;
static uint32_t then_words;
/* The next product's per-row work (hal_matmul_each). */
static flm_range_fn each_fn;
static void *each_ctx;
/* A chunk read ahead: the first of the matrix at data, whole (its read over before XIP resumed), in
 * buffer slot; 0: none. */
static const uint8_t *ready_data;
static uint32_t ready_words, ready_slot;

/* Interrupts masked while a core holds the lock: core 0's DMA interrupt takes it too. Inlined into
 * the SRAM code that takes it (the interrupt's path between two reads the shortest). */
static inline __attribute__((always_inline)) void lock(void) {
    __asm volatile("cpsid i" ::: "memory");
    while (!REG(SIO_LOCK)) {}
    __asm volatile("dmb" ::: "memory");
}

static inline __attribute__((always_inline)) void unlock(void) {
    __asm volatile("dmb" ::: "memory");
    REG(SIO_LOCK) = 1u;
    __asm volatile("cpsie i" ::: "memory");
}

/* The frames a read takes as the SSI stands (CTRLR1 + 1, written only while the SSI is off), 0: the
 * SSI is off (a product's set-up). */
static uint32_t ssi_frames;

/* A read of words words from the flash at src into dst (the DMA idle): the address first, the DMA
 * set up while the flash sends the header (the first word waits in the RX FIFO, DREQ raised), so
 * the bus idles the least between two reads. */
FLM_RAMFUNC static void start_read(const uint8_t *src, uint32_t words, uint32_t *dst) {
    if (ssi_frames != words) {
        REG(SSI_SSIENR) = 0u;
        REG(SSI_CTRLR1) = words - 1u;
        REG(SSI_SSIENR) = 1u;
        ssi_frames = words;
    }
    REG(SSI_DR0) = ((uint32_t)(uintptr_t)src - XIP_BASE) << 8 | MODE_BITS;
    REG(DMA_READ) = SSI_DR0;
    REG(DMA_WRITE) = (uint32_t)(uintptr_t)dst;
    REG(DMA_COUNT) = words;
    REG(DMA_CTRL_TRIG) = DMA_CTRL;
}

/* Under the lock: starts the next chunk's read when the last one is over and its buffer is free;
 * after the last chunk's, the next product's first chunk into the buffer that follows. */
FLM_RAMFUNC static void pump(stream_job *s) {
    const uint32_t j = s->issued;
    const uint32_t slot = (s->base + j) % STREAM_SLOTS;
    if (j > s->chunks || REG(DMA_COUNT) || s->free[slot] != j) return;
    if (j < s->chunks) {
        const uint32_t words = j + 1u < s->chunks ? s->chunk_words : s->last_words;
        start_read(s->next, words, stream_buf[slot]);
        s->next += words * 4u;
    } else if (s->ahead) {
        start_read(s->ahead, s->ahead_words, stream_buf[slot]);
        ready_data = s->ahead;
        ready_words = s->ahead_words;
        ready_slot = slot;
    } else {
        return;
    }
    s->issued = j + 1u;
}

/* DMA_IRQ_0 (core 0; enabled only during a streamed product): a read is over, start the next one
 * now rather than when a core next takes a chunk or waits for one. */
FLM_RAMFUNC void flm_dma0_irq(void) {
    REG(DMA_INTS0) = 1u;
    lock();
    pump(&job);
    unlock();
}

/* chunk j is in its buffer: its read started and is not the one under way (issued read before the
 * count: a read started between the two makes the answer "not yet", never a wrong "yes") */
FLM_RAMFUNC static int arrived(const stream_job *s, uint32_t j) {
    const uint32_t issued = s->issued;
    __asm volatile("dmb" ::: "memory");
    return j + 1u < issued || (j + 1u == issued && !REG(DMA_COUNT));
}

/* Each core's loop: take a chunk (split: a half of one), wait for it (starting the next read if the
 * DMA is idle), compute its rows for every token of the batch (split: the half's), free its buffer
 * (split: once both halves are done). */
FLM_RAMFUNC static void take_chunks(stream_job *s) {
    flm_tensor *v = &s->view[REG(SIO_CPUID) & 1u];
    const flm_batch *b = s->b;
    const uint32_t sh = s->split != 0u, items = s->chunks << sh;
    for (;;) {
        lock();
        pump(s);
        const uint32_t i = s->taken;
        if (i < items) s->taken = i + 1u;
        unlock();
        if (i >= items) return;
        const uint32_t j = i >> sh, second = i & sh;
        while (!arrived(s, j)) {
            lock();
            pump(s);
            unlock();
        }
        const uint32_t r = j * s->per;
        const uint32_t slot = (s->base + j) % STREAM_SLOTS;
        v->data = (const uint8_t *)stream_buf[slot];
        v->rows = chunk_rows(s->w, s->per, j);
        v->length = v->rows * v->stride;
        const uint32_t t0 = second ? s->split : 0u, t1 = sh && !second ? s->split : s->staged;
        if (t1 > t0) flm_rs_staged_rows(v, b, t0, t1, s->stage, r);
        for (uint32_t t = sh && !second ? b->n : s->staged; t < b->n; t++)
            flm_matvec_rows(v, 0, v->rows, b->xq + (size_t)t * b->xq_stride, b->xs + (size_t)t * b->xs_stride,
                            b->out + (size_t)t * b->out_stride + r);
        __asm volatile("dmb" ::: "memory");   /* the rows read before the buffer is handed back */
        uint32_t done = 1u;
        if (sh) {   /* the second half done frees the buffer */
            lock();
            done = ++s->halves[slot] == 2u;
            if (done) {
                s->halves[slot] = 0u;
                s->free[slot] = j + STREAM_SLOTS;
                pump(s);
            }
            unlock();
        } else {
            s->free[slot] = j + STREAM_SLOTS;
        }
        if (s->each && done) {   /* the buffer's next read first: the work needs only the outputs */
            lock();
            pump(s);
            unlock();
            s->each(s->each_ctx, r, r + v->rows);
        }
    }
}

/* One token's q4 product: the core builds its lanes once, while the first read runs, on its own
 * stack (in place of the frame the rows would build them in per chunk; noinline keeps them off
 * the other products' stack). */
FLM_RAMFUNC static void take_chunks_lanes(stream_job *s) {
    uint32_t lanes[FLM_RS_LANE_WORDS];
    lock();
    pump(s);
    unlock();
    flm_rs_lanes_m0(s->w, s->b->xq, lanes);
    take_chunks(s);
    flm_rs_lanes_m0(0, 0, 0);
}

FLM_RAMFUNC static void stream_work(void *arg) {
    stream_job *s = arg;
    if (s->lanes) take_chunks_lanes(s);
    else take_chunks(s);
}

FLM_RAMFUNC static void streamed(const flm_tensor *w, const flm_batch *b, const uint32_t *stage, uint32_t staged) {
    stream_job *s = &job;
    s->w = w;
    s->b = b;
    s->stage = stage;
    s->staged = staged;
    s->split = staged / 8u * 4u;
    s->per = STREAM_CHUNK_BYTES / w->stride;
    s->chunks = (w->rows + s->per - 1u) / s->per;
    /* its first chunk read ahead by the product before it, or read first */
    const uint32_t have = ready_data == w->data && ready_words == chunk_rows(w, s->per, 0u) * w->stride / 4u;
    s->base = have ? ready_slot : 0u;
    s->issued = have;
    s->chunk_words = s->per * w->stride / 4u;
    s->last_words = chunk_rows(w, s->per, s->chunks - 1u) * w->stride / 4u;
    s->next = w->data + (have ? s->chunk_words * 4u : 0u);
    s->taken = 0u;
    ready_data = 0;
    s->ahead = then_data;
    s->ahead_words = then_words;
    then_data = 0;
    s->each = each_fn;
    s->each_ctx = each_ctx;
    each_fn = 0;
    s->lanes = b->n == 1u && flm_rs_lanes_fit(w, b->xq);
    for (uint32_t i = 0; i < STREAM_SLOTS; i++) {
        s->free[(s->base + i) % STREAM_SLOTS] = i;
        s->halves[i] = 0u;
    }
    s->view[0] = s->view[1] = *w;   /* copied here, while XIP still runs (memcpy) */
    REG(SSI_SSIENR) = 0u;
    ssi_frames = 0u;
    REG(SSI_DMARDLR) = 0u;          /* a request while the RX FIFO holds a word */
    REG(SSI_DMACR) = 1u;            /* RDMAE */
    REG(DMA_INTR) = 1u;
    REG(DMA_INTE0) = 1u;
    const int both = hal_rp2040_core1_start(stream_work, s);
    stream_work(s);
    if (both) hal_rp2040_core1_join();
    lock();   /* the next product's first chunk, if no core started it, and its read over */
    pump(s);
    unlock();
    while (REG(DMA_COUNT)) {}
    REG(DMA_INTE0) = 0u;
    REG(DMA_INTR) = 1u;
    REG(NVIC_ICPR) = 1u << DMA_IRQ_0;
    REG(SSI_SSIENR) = 0u;
    REG(SSI_DMACR) = 0u;
    REG(SSI_CTRLR1) = 0u;           /* XIP: one frame a request */
    REG(SSI_SSIENR) = 1u;
}

typedef struct {
    const flm_tensor *w;
    const flm_batch *b;
    uint32_t *stage;
    uint32_t t0, t1;
} stage_part;

static void stage_run(void *arg) {
    const stage_part *p = arg;
    flm_rs_stage(p->w, p->b, p->stage, p->t0, p->t1);
}

/* A pass's product: its tokens' activations staged once, half by each core (with XIP on: core 1
 * joins before the product streams), on this frame only (a token's product builds its q4 lanes on
 * the stack instead: take_chunks_lanes). */
static __attribute__((noinline)) void streamed_staged(const flm_tensor *w, const flm_batch *b) {
    uint32_t stage[FLM_RS_STAGE_WORDS];
    const uint32_t n = flm_rs_staged(w, b), half = n / 8u * 4u;   /* core 1: whole quads */
    stage_part hi = {w, b, stage, half, n};
    const int both = half && hal_rp2040_core1_start(stage_run, &hi);
    flm_rs_stage(w, b, stage, 0u, both ? half : n);
    if (both) hal_rp2040_core1_join();
    streamed(w, b, stage, n);
}

/* A matrix the streamed products take: in flash, word-aligned rows that fit a chunk. */
static int streams(const flm_tensor *w) {
    const uintptr_t a = (uintptr_t)w->data;
    return a >= XIP_BASE && a < XIP_END && !(a & 3u) && !(w->stride & 3u) && w->stride &&
           w->stride <= STREAM_CHUNK_BYTES;
}

/* The next streamed product reads w's first chunk once its own reads are all started: while its
 * last chunks compute rather than after them. Its read is over before the product returns, so
 * whatever runs between the two runs with XIP on. */
void hal_matmul_then(const flm_tensor *w) {
    if (!streams(w)) return;
    then_data = w->data;
    then_words = chunk_rows(w, STREAM_CHUNK_BYTES / w->stride, 0u) * w->stride / 4u;
}

/* A streamed product of one token runs fn on each chunk's rows, on the core that computed them, once
 * the chunk's buffer is free again (fn in SRAM: rp2040.ld); one of a pass after it (hal_matmul). */
int hal_matmul_each(const flm_tensor *w, flm_range_fn fn, void *ctx) {
    if (!streams(w)) return 0;
    each_fn = fn;
    each_ctx = ctx;
    return 1;
}
#endif

void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
#if FLM_RP2040_STREAM
    if (streams(w)) {
        /* a pass's products are compute-bound, with no wait to fill: there the per-row work follows
         * the product on both cores by halves, not a chunk's on one core at its end */
        const flm_range_fn fn = b->n > 1u ? each_fn : 0;
        if (fn) each_fn = 0;
        if (flm_rs_stage_fit(w, b)) streamed_staged(w, b);
        else streamed(w, b, 0, 0u);
        if (fn) hal_parallel(fn, each_ctx, w->rows);
        return;
    }
    then_data = 0;
    each_fn = 0;
#endif
    hal_rp2040_matmul_cores(w, b, row_buf, row_buf_bytes);
}
