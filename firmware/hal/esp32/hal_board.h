/* ESP32 board HAL, board side: what main.c needs beyond hal.h. flm_board.h is generated per
 * board (tier budgets, console, blob partition). */
#ifndef FLM_HAL_BOARD_H
#define FLM_HAL_BOARD_H
#include <stddef.h>
#include <stdint.h>
#include "flm_board.h"

/* n bytes, 8-aligned, in FLM_ARENA_TIER (heap_caps_malloc: SPIRAM or internal); NULL if it cannot. */
uint8_t *hal_board_arena(size_t n);
#endif
