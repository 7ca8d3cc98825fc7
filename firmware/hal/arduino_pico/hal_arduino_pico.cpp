/* RP2040 / RP2350 boards on the Arduino-Pico core (earlephilhower/arduino-pico, through
 * PlatformIO). NOT COMPILED HERE: it needs the core, which PlatformIO brings on the user's
 * machine ('flashlm flash'); the engine beside it is cross-compiled here.
 *
 * Flash: the blob sits in XIP flash at the fixed offset FLM_BLOB_OFFSET, inside the region the
 * core reserves as its filesystem (board_build.filesystem_size), written there by model.uf2.
 * Serial: USB CDC (the core's Serial). Time: time_us_64(), the chip's 64-bit µs timer.
 * RAM tiers: SRAM = the heap; PSRAM (RP2350 boards with PSRAM) = the core's pmalloc heap.
 * Matmul: hal_matmul hands the second half of each product's rows to core 1 (the core's setup1 /
 * loop1) through the inter-core FIFO (rp2040.fifo), as firmware/hal/rp2040/cores_rp2040.c does on
 * the bare-metal build: rows are independent, so the split is bit for bit the one-core result. */
#include <Arduino.h>
#include <hardware/sync.h>
#include <pico/time.h>
#include <stdlib.h>

extern "C" {
#include "blob.h"
#include "hal.h"
#include "hal_board.h"
}

#define SRAM_RESERVE (16u * 1024u)   /* heap left to the core's USB stack and newlib */
#define SPLIT_MIN_ROWS 8u             /* fewer rows: the hand-over costs more than half the rows */

void setup() { flm_main(); }
void loop() {}

/* the share core 1 runs next: written by core 0 before its FIFO word, read by core 1 after it */
static flm_rows_share job;
static volatile bool core1_up;

void setup1() { core1_up = true; }

void loop1() {
    (void)rp2040.fifo.pop();
    __dmb();
    flm_rows_share_run(&job);
    __dmb();
    rp2040.fifo.push(1u);
}

static void *alloc_in(uint32_t tier, size_t n) {
    if (tier == FLM_TIER_SRAM) return malloc(n);
#if defined(RP2350_PSRAM_CS)
    if (tier == FLM_TIER_PSRAM) return pmalloc(n);
#endif
    return NULL;
}

extern "C" {

int hal_init(int argc, char **argv) {
    (void)argc;
    (void)argv;
    Serial.begin(FLM_BAUD);   /* USB CDC: the baud rate is nominal */
    return 0;
}

const uint8_t *hal_blob(size_t *len) {
    *len = FLM_BLOB_REGION;   /* the header's total_size says how much of it is the blob */
    return (const uint8_t *)(uintptr_t)(FLM_XIP_BASE + FLM_BLOB_OFFSET);
}

size_t hal_serial_read(uint8_t *buf, size_t max) {
    size_t n = 0;
    while (n < max && Serial.available() > 0) {
        int c = Serial.read();
        if (c < 0) break;
        buf[n++] = (uint8_t)c;
    }
    return n;
}

void hal_serial_write(const uint8_t *buf, size_t len) {
    uint64_t since = time_us_64();
    while (len) {   /* nobody reading for 2 s: drop the rest, as a UART would */
        size_t n = Serial.write(buf, len);
        if (n) {
            buf += n;
            len -= n;
            since = time_us_64();
        } else if (time_us_64() - since > 2000000u) {
            return;
        }
    }
}

void hal_idle(void) { delay(1); }

uint64_t hal_time_us(void) { return time_us_64(); }

uint8_t hal_clock_kind(void) { return 1; }

const char *hal_board_name(void) { return FLM_BOARD_NAME; }

void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
    if (!core1_up || w->rows < SPLIT_MIN_ROWS) {
        flm_matmul_rows(w, 0, w->rows, b, row_buf, row_buf_bytes);
        return;
    }
    size_t half;
    const uint32_t mid = flm_split_rows(w, b, row_buf, row_buf_bytes, &job, &half);
    __dmb();
    rp2040.fifo.push(1u);
    flm_matmul_rows(w, 0, mid, b, row_buf, half);
    (void)rp2040.fifo.pop();
    __dmb();
}

uint8_t *hal_board_arena(size_t n, uint32_t *tier) {
    *tier = FLM_ARENA_TIER;
    return (uint8_t *)alloc_in(FLM_ARENA_TIER, n);
}

uint8_t *hal_tier_arena(uint32_t tier, size_t *cap) {
    *cap = 0;
    /* the arena was sized for everything the layout puts in its tier; a second pool there would
     * take the staged tensors away from it (the app stages into the HAL's pool first) */
    if (tier == FLM_ARENA_TIER) return NULL;
    size_t budget = tier == FLM_TIER_PSRAM ? FLM_PSRAM_BUDGET : tier == FLM_TIER_SRAM ? FLM_SRAM_BUDGET : 0;
    size_t n = 0;
    if (tier == FLM_TIER_SRAM) {
        size_t free_now = (size_t)rp2040.getFreeHeap();
        n = free_now > SRAM_RESERVE ? free_now - SRAM_RESERVE : 0;
    }
#if defined(RP2350_PSRAM_CS)
    if (tier == FLM_TIER_PSRAM) n = (size_t)rp2040.getFreePSRAMHeap();
#endif
    if (n > budget) n = budget;
    /* the free total may be in pieces: halve until an allocation succeeds */
    for (n &= ~(size_t)7; n >= 4096; n = (n / 2) & ~(size_t)7) {
        uint8_t *p = (uint8_t *)alloc_in(tier, n);
        if (p) {
            *cap = n;
            return p;
        }
    }
    return NULL;
}

}  /* extern "C" */
