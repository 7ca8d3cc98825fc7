/* Proposing drafts for speculative decoding (docs/formats.md section 2.4): prompt lookup, and the
 * draft model (section 1.4). The verifying pass (app_generate.c) keeps the tokens greedy decoding
 * gives whatever is proposed; a proposer only decides how many it can skip. converter/reference.py
 * mirrors each one. */
#include "app_speculate.h"
#include "app_text.h"
#include "hal.h"
#include <string.h>

#define NGRAM_MAX 3u   /* prompt lookup matches the context's last 3, 2, then 1 tokens */

uint32_t app_lookup_drafts(uint32_t *ctx, uint32_t pos, uint32_t k) {
    for (uint32_t n = NGRAM_MAX; n >= 1u; n--) {
        if (pos < n) continue;
        for (uint32_t j = pos; j-- > n - 1u;) {   /* the most recent earlier occurrence first */
            uint32_t i = 0;
            while (i < n && ctx[j - i] == ctx[pos - i]) i++;
            if (i < n) continue;
            /* draft i is the token i places after j; copied forward, so the drafts extend the
             * context they are read from (a repeating stretch shorter than k repeats) */
            for (i = 1; i <= k; i++) ctx[pos + i] = ctx[j + i];
            return k;
        }
    }
    return 0;
}

/* ---- the draft model ---------------------------------------------------------------------- */

static uint32_t dpos;   /* the draft's cache holds the context's positions [0, dpos) */

void app_draft_open(void) {
    const flm_model *m = &flm_dev.model;
    flm_model *d = &flm_dev.draft;
    uint32_t len = 0;
    const uint8_t *sec = flm_blob_section(m, "draft", &len);
    char err[80];
    flm_dev.draft_open = flm_dev.draft_ok = 0;
    flm_dev.draft_why[0] = 0;
    if (!sec) {
        app_scopy(flm_dev.draft_why, sizeof flm_dev.draft_why, "the image has no draft model (flashlm convert --draft)");
        return;
    }
    if (flm_blob_open(d, sec, len, err, sizeof err) != 0) {
        size_t i = 0;
        app_put_str(flm_dev.draft_why, &i, sizeof flm_dev.draft_why, "draft model refused: ");
        app_put_str(flm_dev.draft_why, &i, sizeof flm_dev.draft_why, err);
        return;
    }
    /* its tokens must be the model's, its positions the model's (both windows slide alike) */
    if (d->vocab != m->vocab || d->seq_len != m->seq_len || d->bos != m->bos || d->eos != m->eos) {
        app_scopy(flm_dev.draft_why, sizeof flm_dev.draft_why,
                  "draft model refused: its vocabulary, context or BOS/EOS differ from the model's");
        return;
    }
    flm_dev.draft_open = 1;
}

void app_draft_place(flm_pool *p, uint32_t t) {
    if (!flm_dev.draft_open) return;
    size_t need = flm_state_bytes(&flm_dev.draft), off = (p->used + 7u) & ~(size_t)7u;
    flm_dev.draft_ok = off + need <= p->cap;
    if (!flm_dev.draft_ok) {
        app_fmt2(flm_dev.draft_why, sizeof flm_dev.draft_why, "draft model off: its state needs ", (uint32_t)need,
                 " bytes of RAM; this placement leaves ", (uint32_t)(p->cap > off ? p->cap - off : 0u), "");
        return;
    }
    flm_state_init(&flm_dev.dstate, &flm_dev.draft, p->base + off, need, t);
    p->used = off + need;
}

void app_draft_reset(void) { dpos = 0; }

/* The draft's bytes are the pass's (its caller times the drafting as the phase FLM_PH_DRAFT). */
static void add_draft(flm_step_stats *st, uint32_t bytes[FLM_N_TIERS], const flm_step_stats *d) {
    for (int i = 0; i < FLM_N_TIERS; i++) { st->bytes[i] += d->bytes[i]; bytes[i] += d->bytes[i]; }
}

uint32_t app_draft_propose(uint32_t *ctx, uint32_t pos, uint32_t k, flm_step_stats *st, uint32_t bytes[FLM_N_TIERS]) {
    flm_state *s = &flm_dev.dstate;
    const uint32_t batch = flm_dev.draft.batch;
    flm_step_stats d;
    memset(&d, 0, sizeof d);
    while (dpos <= pos) {   /* catch up with the context, in passes of its batch; the last one's head */
        uint32_t n = pos + 1u - dpos < batch ? pos + 1u - dpos : batch;
        flm_body_many(s, ctx + dpos, n, dpos, &d);
        dpos += n;
    }
    ctx[pos + 1u] = flm_head_argmax(s, &d);
    for (uint32_t i = 2; i <= k; i++) {
        flm_body(s, ctx[pos + i - 1u], pos + i - 1u, &d);
        dpos = pos + i;
        ctx[pos + i] = flm_head_argmax(s, &d);
    }
    add_draft(st, bytes, &d);
    return k;
}

void app_draft_accepted(uint32_t pos, uint32_t used) {
    if (dpos > pos + used) dpos = pos + used;
}

void app_draft_slide(uint32_t n_drop, flm_step_stats *st, uint32_t bytes[FLM_N_TIERS]) {
    flm_step_stats d;
    memset(&d, 0, sizeof d);
    flm_slide(&flm_dev.dstate, n_drop, &d);
    dpos = dpos > 1u + n_drop ? dpos - n_drop : dpos ? 1u : 0u;   /* position 0 stays */
    add_draft(st, bytes, &d);
}
