/* What the device sends (ERROR, LOG, HELLO, TOKEN, LOGITS, DONE), the TOKEN frames it keeps for
 * RESEND (docs/formats.md section 2.1), and the host's frames between a generation's steps. */
#ifndef FLM_APP_FRAMES_H
#define FLM_APP_FRAMES_H
#include "app_state.h"

void app_send_error(uint16_t code, const char *text);
void app_send_log(const char *text);
void app_send_hello(void);
void app_report_bad_frames(void);
void app_resend(const uint8_t *p, size_t len);
void app_ring_reset(void);             /* at boot: no generation yet */
void app_ring_begin(void);             /* a GENERATE was accepted: a new generation, the ring starts empty */
/* Send a TOKEN of pass ps and keep it in the ring (steps of one generation are sent in order from 0). */
void app_send_token(uint32_t step, uint32_t pos, uint32_t in, uint32_t out, uint32_t head_rows, uint32_t crc,
                    const flm_pass *ps);
void app_send_logits(uint32_t step, const float *logits);
/* The generation ended: keep its DONE and send it. */
void app_ring_end(const flm_done *d);
int app_stop_requested(void);          /* between steps: answer PING and RESEND, honour STOP (returns 1) */
#endif
