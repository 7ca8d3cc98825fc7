/* A generation: the prompt in chunks of up to the batch, then generated tokens, each step reported
 * with the forward pass it belongs to, then its totals (docs/formats.md section 2, 2.4). */
#ifndef FLM_APP_GENERATE_H
#define FLM_APP_GENERATE_H
#include "app_state.h"

/* GENERATE flags and where a speculative pass's drafts come from (docs/formats.md section 2) */
enum { GEN_LOGITS = 1u, GEN_SLIDE = 2u, GEN_ALL_LOGITS = 4u, GEN_FLAGS = 7u };
enum { SPEC_NONE = 0u, SPEC_LOOKUP = 1u, SPEC_DRAFT = 2u };

/* What a generation is asked for: GENERATE's fields (or GENERATE_TEXT's), checked (app_request.c). */
typedef struct {
    uint32_t max_new, flags;     /* tokens to generate at most; GEN_* */
    uint32_t batch;              /* tokens per prompt pass, 1..the placement's batch */
    uint32_t speculate, draft_k; /* SPEC_*; drafts per verifying pass */
    float temperature, top_p;
    uint64_t seed;
    uint32_t n;                  /* the prompt: ids flm_dev.prompt[0..n) */
} app_request;

/* Where a generation's steps go, as they are produced. */
typedef struct {
    /* step, its cache position, its input id, its output id (FLM_NONE: a prompt step's unused
     * output), the head rows it computed, its logits' CRC-32 (0: none), and its pass */
    void (*token)(uint32_t step, uint32_t pos, uint32_t in, uint32_t out, uint32_t head_rows, uint32_t crc,
                  const flm_pass *ps);
    void (*logits)(uint32_t step, const float *logits);   /* with GEN_LOGITS: the step's n_out logits */
    int (*stop)(void);                                    /* between passes: 1 ends the generation */
} app_output;

/* Run the request r, each step to sink; its totals into *d (DONE). */
void app_generate(const app_request *r, const app_output *sink, flm_done *d);
#endif
