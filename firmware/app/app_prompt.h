/* Text prompts (GENERATE_TEXT and console lines): the image's encoder (tokenize.c, its
 * tokenizer.enc section) turns them into the prompt's ids. */
#ifndef FLM_APP_PROMPT_H
#define FLM_APP_PROMPT_H
#include "tokenize.h"
#include <stddef.h>
#include <stdint.h>

/* The image's text encoder, or NULL when it has none that fits this build (app_encode_text says why). */
const flm_tokenizer *app_text_encoder(void);
/* Encode text into flm_dev.prompt, BOS first (as the host's encode_prompt). Returns 0 with the ids'
 * count in *n and the time taken in *us, or an error code (protocol.h FLM_E_*) with its one-line
 * reason in err. */
uint16_t app_encode_text(const uint8_t *text, size_t len, uint32_t *n, uint32_t *us, char *err, size_t en);
#endif
