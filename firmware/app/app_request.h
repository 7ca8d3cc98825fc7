/* GENERATE and GENERATE_TEXT (docs/formats.md section 2): either payload becomes one request,
 * checked, then generated with TOKEN, LOGITS and DONE frames as its output. */
#ifndef FLM_APP_REQUEST_H
#define FLM_APP_REQUEST_H
#include <stddef.h>
#include <stdint.h>

void app_generate_ids(const uint8_t *p, size_t len);    /* GENERATE: the prompt as token ids */
void app_generate_text(const uint8_t *p, size_t len);   /* GENERATE_TEXT: the prompt as text */
#endif
