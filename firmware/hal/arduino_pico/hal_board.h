/* RP2040 / RP2350 board HAL on the Arduino-Pico core, board side: what main.c needs beyond
 * hal.h. flm_board.h is generated per board (blob offset, tier budgets). */
#ifndef FLM_HAL_BOARD_H
#define FLM_HAL_BOARD_H
#include <stddef.h>
#include <stdint.h>
#include "flm_board.h"

/* n bytes, 8-aligned, for the arena in *tier = FLM_ARENA_TIER (SRAM heap, or the PSRAM heap on
 * RP2350 boards that have PSRAM); NULL if it cannot. */
uint8_t *hal_board_arena(size_t n, uint32_t *tier);
/* main.c's entry; the core's setup() calls it and it never returns. */
void flm_main(void);
#endif
