/* ESP32 board HAL, board side: what main.c needs beyond hal.h. flm_board.h is generated per
 * board (tier budgets, console, blob partition). */
#ifndef FLM_HAL_BOARD_H
#define FLM_HAL_BOARD_H
#include <stddef.h>
#include <stdint.h>
#include "flm_board.h"

/* n bytes, 8-aligned, for the arena: in *tier (FLM_ARENA_TIER) when a block that large is free
 * there, else in PSRAM when the board has it (*tier says which); NULL when neither can. */
uint8_t *hal_board_arena(size_t n, uint32_t *tier);
#endif
