/* Core 1's jobs (cores_rp2040.c), for stream_rp2040.c's hal_matmul. */
#ifndef FLM_CORES_RP2040_H
#define FLM_CORES_RP2040_H
#include "hal.h"

/* w's rows for b split across both cores once core 1 is up (on core 0 alone before, or with few
 * rows): hal_matmul's products it does not stream, and each streamed chunk. */
void hal_rp2040_matmul_cores(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes);
/* Has core 1 run fn(arg) (fn in SRAM: it may run while the SSI is out of XIP mode) and returns at
 * once; 0 when core 1 is not up (nothing runs). hal_rp2040_core1_join waits for a started fn. */
int hal_rp2040_core1_start(void (*fn)(void *), void *arg);
void hal_rp2040_core1_join(void);
#endif
