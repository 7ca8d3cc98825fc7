/* The device side of the serial protocol: boot checks, HELLO, GENERATE -> TOKEN... DONE. */
#ifndef FLM_APP_H
#define FLM_APP_H
#include <stddef.h>
#include <stdint.h>

/* Validate the blob the HAL maps, then serve the host forever. The arena (in tier arena_tier)
 * holds the KV cache and every scratch buffer. */
void flm_app_run(uint8_t *arena, size_t cap, uint32_t arena_tier);
#endif
