/* Proposing drafts for speculative decoding (docs/formats.md section 2.4). */
#ifndef FLM_APP_SPECULATE_H
#define FLM_APP_SPECULATE_H
#include "app_state.h"

/* Prompt lookup: k drafts into ctx[pos+1..pos+k] from the most recent earlier occurrence of the
 * context's last 3, 2 or 1 tokens ctx[..pos]; returns k, or 0 when nothing matches. */
uint32_t app_lookup_drafts(uint32_t *ctx, uint32_t pos, uint32_t k);
/* At boot: open the image's draft model (sets draft_open, or draft_why). */
void app_draft_open(void);
/* In a placement: carve the draft's state from pool p (in tier t) if it fits (sets draft_ok, draft_why). */
void app_draft_place(flm_pool *p, uint32_t t);
/* A generation begins: the draft's cache holds nothing. */
void app_draft_reset(void);
/* The draft model's k greedy tokens after ctx[..pos] into ctx[pos+1..pos+k] (its cache first catches
 * up with the context); the bytes it read added to st and to bytes. Returns k. */
uint32_t app_draft_propose(uint32_t *ctx, uint32_t pos, uint32_t k, flm_step_stats *st, uint32_t bytes[FLM_N_TIERS]);
/* A verifying pass at pos produced `used` steps: the draft's rows after them are not the context's. */
void app_draft_accepted(uint32_t pos, uint32_t used);
/* The main window slid by n_drop: the draft's does too (its bytes added likewise). */
void app_draft_slide(uint32_t n_drop, flm_step_stats *st, uint32_t bytes[FLM_N_TIERS]);
#endif
