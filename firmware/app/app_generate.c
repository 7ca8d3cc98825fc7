/* A generation: the prompt in chunks of up to the batch, then generated tokens, each step reported
 * to its output with the forward pass it belongs to, then its totals (docs/formats.md section 2,
 * 2.4). */
#include "app_generate.h"
#include "app_speculate.h"
#include "crc32.h"
#include "hal.h"
#include "sampler.h"
#include <string.h>

/* Optional board hooks around each forward pass (the emulated RP2040's harness attributes the
 * core's memory reads to passes with them; see firmware/hal/rp2040/hal_rp2040.h). */
#ifndef FLM_STEP_BEGIN
#define FLM_STEP_BEGIN(step, state) ((void)0)
#define FLM_STEP_END(step) ((void)0)
#endif
#ifndef FLM_STEP_STATE   /* another state's cache a pass reads (the draft model's) */
#define FLM_STEP_STATE(state) ((void)0)
#endif

enum { REASON_MAX_TOKENS = 0, REASON_EOS = 1, REASON_CONTEXT = 2, REASON_STOPPED = 3 };

/* The generation running: its request (a copy: the forward passes read its fields as the globals
 * they are, one load each), output and running totals. */
static struct {
    app_request r;
    const app_output *out;
    int every, greedy;        /* every step computes the whole head (LOGITS, ALL_LOGITS); temperature <= 0 */
    flm_rng rng;
    flm_done d;
} G;

static void add_pass(const flm_pass *ps) {
    G.d.passes++;
    for (int i = 0; i < FLM_N_PHASES; i++) G.d.phase_us[i] += ps->st.us[i];
    for (int i = 0; i < FLM_N_TIERS; i++) G.d.bytes[i] += ps->st.bytes[i];
    for (int i = 0; i < FLM_N_TIERS; i++) G.d.draft_bytes[i] += ps->draft_bytes[i];
    if (ps->kind == FLM_PASS_VERIFY) {
        G.d.verify_passes++;
        G.d.drafted += ps->len - 1u;
        G.d.accepted += ps->used - 1u;
    }
}

/* One forward pass over the n tokens ctx[pos..pos+n) as steps G.d.steps.., then its steps to the
 * output: prompt steps, and the output of every token whose output is used. ps holds what
 * proposing its drafts cost (n - 1 drafts at ctx[pos+1..], verified: every token's head, each
 * token's argmax, steps produced while each equals the next draft). Returns the steps produced,
 * the last one's output in *last (FLM_NONE: a prompt step). */
static uint32_t run_pass(uint32_t *ctx, uint32_t pos, uint32_t n, uint32_t n_drop, flm_pass *ps, uint32_t *last) {
    const flm_model *m = &flm_dev.model;
    flm_state *s = &flm_dev.state;
    const uint32_t step = G.d.steps;
    const int verify = ps->kind == FLM_PASS_VERIFY;
    const int used = step + n >= G.r.n;          /* the last token's output is used: the prompt's last, or generated */
    ps->first = step;
    ps->len = ps->used = (uint8_t)n;
    if (n_drop) flm_slide(s, n_drop, &ps->st);
    flm_body_many(s, ctx + pos, n, pos, &ps->st);
    for (uint32_t l = 0; l < m->n_layers && m->n_experts; l++)   /* the experts the pass read */
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < m->top_k; j++) {
                const uint8_t e = flm_route(s, l, i)[j];
                ps->experts[l][e >> 3] |= (uint8_t)(1u << (e & 7u));
            }
    /* every token's logits (a verification; LOGITS, ALL_LOGITS), or the last token's when it
     * samples, or the pruned scan */
    const int all = G.every || verify;
    const float *logits = all ? flm_head_all(s, &ps->st) : used && !G.greedy ? flm_head(s, &ps->st) : 0;
    uint32_t out = FLM_NONE;
    if (used && !logits) out = flm_head_argmax(s, &ps->st);   /* sampling 0 µs: the scan chose */
    FLM_STEP_END(step);
    const float *lg_last = logits && all ? logits + (size_t)(n - 1u) * m->n_out : logits;
    uint64_t ts = hal_time_us();
    if (verify) {   /* the greedy tokens; produced while each is the next draft (and not a stop id) */
        uint32_t k = 1;
        out = flm_sample(logits, m->n_out, 0.0f, 0.0f, &G.rng, s->probs, s->idx);
        while (k < n && out == ctx[pos + k] && !flm_is_stop(m, out))
            out = flm_sample(logits + (size_t)k++ * m->n_out, m->n_out, 0.0f, 0.0f, &G.rng, s->probs, s->idx);
        ps->used = (uint8_t)k;
        ps->st.us[FLM_PH_SAMPLE] = (uint32_t)(hal_time_us() - ts);
    } else if (used && lg_last) {
        out = flm_sample(lg_last, m->n_out, G.r.temperature, G.r.top_p, &G.rng, s->probs, s->idx);
        ps->st.us[FLM_PH_SAMPLE] = (uint32_t)(hal_time_us() - ts);
    }
    add_pass(ps);
    for (uint32_t i = 0; i < ps->used; i++) {
        const int mine = all || i + 1u == n;      /* the head this token's step computed */
        const float *lg = all ? logits + (size_t)i * m->n_out : i + 1u == n ? logits : 0;
        /* a verification's step i produced ctx[pos+i+1] (an accepted draft), its last step out */
        const uint32_t o = i + 1u == ps->used ? out : verify ? ctx[pos + i + 1u] : FLM_NONE;
        G.out->token(step + i, pos + i, ctx[pos + i], o, mine ? ps->st.head_rows : 0u,
                     lg ? flm_crc32_update(0, lg, (size_t)m->n_out * 4u) : 0u, ps);
        if (G.r.flags & GEN_LOGITS) G.out->logits(step + i, lg);
    }
    G.d.steps += ps->used;
    if (out != FLM_NONE) G.d.generated += verify ? ps->used : 1u;
    *last = out;
    return ps->used;
}

void app_generate(const app_request *r, const app_output *sink, flm_done *d) {
    const flm_model *m = &flm_dev.model;
    const uint32_t n = r->n, max_new = r->max_new, flags = r->flags;
    memset(&G, 0, sizeof G);
    G.r = *r;
    G.out = sink;
    flm_rng_seed(&G.rng, r->seed);
    /* LOGITS implies ALL_LOGITS: every step computes the whole head, never pruned or skipped */
    G.every = (flags & (GEN_LOGITS | GEN_ALL_LOGITS)) != 0;
    G.greedy = !(r->temperature > 0.0f);
    app_draft_reset();
    /* the prompt buffer holds the context from here on: ctx[q] = the id at cache position q (and a
     * verification's drafts after the last known one) */
    uint32_t *ctx = flm_dev.prompt;
    uint64_t t_start = hal_time_us();
    uint32_t pos = 0, tok = 0, reason = REASON_MAX_TOKENS;   /* tok: the last generated token */
    for (;;) {
        if (G.d.generated >= max_new) { reason = REASON_MAX_TOKENS; break; }
        uint32_t n_drop = 0;
        if (pos >= m->seq_len) {
            if (!(flags & GEN_SLIDE) || m->seq_len < 3u) { reason = REASON_CONTEXT; break; }
            n_drop = (m->seq_len - 1u) / 2u;   /* position 0 stays: the attention sink */
            pos = m->seq_len - n_drop;
            memmove(ctx + 1, ctx + 1 + n_drop, (size_t)(pos - 1u) * 4u);
        }
        flm_pass ps;
        memset(&ps, 0, sizeof ps);
        if (G.d.steps >= n) ctx[pos] = tok;   /* a generated token's pass (ctx holds the prompt's) */
        if (G.r.speculate == SPEC_DRAFT) FLM_STEP_STATE(&flm_dev.dstate);
        FLM_STEP_BEGIN(G.d.steps, &flm_dev.state);   /* the mark covers proposing drafts and the pass */
        if (n_drop && G.r.speculate == SPEC_DRAFT) {
            uint64_t td = hal_time_us();
            app_draft_slide(n_drop, &ps.st, ps.draft_bytes);
            ps.st.us[FLM_PH_DRAFT] += (uint32_t)(hal_time_us() - td);
        }
        /* prompt steps whose output is unused run in chunks (up to the prompt's last token); after
         * them a pass runs the last token and the drafts proposed for it, if any; a pass never
         * crosses the context's end */
        uint32_t len = 1;
        if (G.d.steps + 1u < n) {
            len = n - G.d.steps < G.r.batch ? n - G.d.steps : G.r.batch;
            if (len > m->seq_len - pos) len = m->seq_len - pos;
            ps.kind = len > 1u ? FLM_PASS_PREFILL : FLM_PASS_ONE;
        } else if (G.r.speculate) {
            uint32_t k = G.r.draft_k, left = max_new - G.d.generated - 1u, room = m->seq_len - 1u - pos;
            if (k > left) k = left;
            if (k > room) k = room;
            uint64_t td = hal_time_us();
            if (k) k = G.r.speculate == SPEC_DRAFT ? app_draft_propose(ctx, pos, k, &ps.st, ps.draft_bytes)
                                                 : app_lookup_drafts(ctx, pos, k);
            ps.st.us[FLM_PH_DRAFT] += (uint32_t)(hal_time_us() - td);
            len += k;
            ps.kind = k ? FLM_PASS_VERIFY : FLM_PASS_ONE;
        }
        uint32_t out, steps = run_pass(ctx, pos, len, n_drop, &ps, &out);
        if (G.r.speculate == SPEC_DRAFT) app_draft_accepted(pos, steps);
        pos += steps;
        if (out != FLM_NONE) tok = out;
        if (out != FLM_NONE && flm_is_stop(m, out)) { reason = REASON_EOS; break; }
        if (sink->stop()) { reason = REASON_STOPPED; break; }
    }
    G.d.reason = (uint8_t)reason;
    G.d.total_us = hal_time_us() - t_start;
    *d = G.d;
}
