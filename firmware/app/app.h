/* The device side of the serial protocol: boot checks, HELLO, GENERATE -> TOKEN... DONE. */
#ifndef FLM_APP_H
#define FLM_APP_H
#include <stddef.h>
#include <stdint.h>

/* Validate the blob the HAL maps, then serve the host forever: flm_app_boot, then flm_app_serve.
 * The arena (in tier arena_tier) holds the KV cache and every scratch buffer. */
void flm_app_run(uint8_t *arena, size_t cap, uint32_t arena_tier);
/* Boot: the kernels' self-check, the image's checks and placement, the golden check, HELLO. Its
 * result depends on the image only (it reads nothing from the host). */
void flm_app_boot(uint8_t *arena, size_t cap, uint32_t arena_tier);
/* Serve the host's commands forever. */
void flm_app_serve(void);
#endif
