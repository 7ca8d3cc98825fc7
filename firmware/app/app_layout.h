/* Placement: tensors staged out of flash into PSRAM/SRAM, the state regions carved (at boot and on
 * LAYOUT; docs/formats.md section 1). */
#ifndef FLM_APP_LAYOUT_H
#define FLM_APP_LAYOUT_H
#include <stddef.h>
#include <stdint.h>

/* Apply a placement: every tensor at tiers[i] (one per table entry; NULL: the table's own), the
 * state regions at state_tiers. Returns 0, or -1 with the reason in err when it does not fit (the
 * model is then left half-placed: the caller places a layout that fits). */
int app_place(const uint8_t *tiers, uint32_t state_tiers, char *err, size_t en);
void app_log_layout(const char *what);
void app_set_layout(const uint8_t *p, size_t len);
#endif
