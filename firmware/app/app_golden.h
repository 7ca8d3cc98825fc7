/* The golden check against the reference's steps (docs/formats.md section 1.3), and SELFTEST. */
#ifndef FLM_APP_GOLDEN_H
#define FLM_APP_GOLDEN_H
#include <stddef.h>
#include <stdint.h>

/* For the placement in effect: every step (all = 1), else the image's boot steps; the result in
 * flm_dev.golden, a LOG with the details. */
void app_golden_check(int all);
void app_selftest(const uint8_t *p, size_t len);
#endif
