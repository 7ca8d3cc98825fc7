/* GENERATE: the prompt's steps, then generated ones, each a TOKEN frame, then DONE
 * (docs/formats.md section 2). */
#include "app_state.h"
#include "crc32.h"
#include "hal.h"
#include "sampler.h"
#include <string.h>

/* Optional board hooks around each forward pass (the emulated RP2040's harness attributes the
 * core's memory reads to steps with them; see firmware/hal/rp2040/hal_rp2040.h). */
#ifndef FLM_STEP_BEGIN
#define FLM_STEP_BEGIN(step, state) ((void)0)
#define FLM_STEP_END(step) ((void)0)
#endif

enum { REASON_MAX_TOKENS = 0, REASON_EOS = 1, REASON_CONTEXT = 2, REASON_STOPPED = 3 };
/* GENERATE flags (docs/formats.md section 2) */
enum { GEN_LOGITS = 1u, GEN_SLIDE = 2u, GEN_ALL_LOGITS = 4u, GEN_FLAGS = 7u };

void app_generate(const uint8_t *p, size_t len) {
    const flm_model *m = &flm_dev.model;
    char t[96];
    if (!flm_dev.image_ok) { app_send_error(app_no_model_code(), flm_dev.image_err); return; }
    if (len < 28u || len != 28u + 4u * (size_t)flm_get_u32(p + 24)) {
        app_send_error(FLM_E_BAD_MESSAGE, "GENERATE payload has the wrong length");
        return;
    }
    uint32_t max_new = flm_get_u32(p), flags = flm_get_u32(p + 20), n = flm_get_u32(p + 24);
    float temperature = flm_get_f32(p + 4), top_p = flm_get_f32(p + 8);
    if (n == 0) { app_send_error(FLM_E_BAD_MESSAGE, "empty prompt"); return; }
    if (flags & ~GEN_FLAGS) {
        size_t i = 0;
        app_put_str(t, &i, sizeof t, "GENERATE flags ");
        app_put_dec(t, &i, sizeof t, flags);
        app_put_str(t, &i, sizeof t, " has unknown bits (known: 1 logits, 2 slide, 4 all logits)");
        app_send_error(FLM_E_BAD_MESSAGE, t);
        return;
    }
    if (temperature != temperature || temperature - temperature != 0.0f || top_p != top_p) {
        app_send_error(FLM_E_BAD_MESSAGE, "temperature must be a finite number and top_p a number");
        return;
    }
    if (n > m->seq_len) {
        app_fmt2(t, sizeof t, "prompt of ", n, " tokens exceeds the context of ", m->seq_len, " tokens");
        app_send_error(FLM_E_PROMPT_TOO_LONG, t);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        flm_dev.prompt[i] = flm_get_u32(p + 28 + 4u * i);
        if (flm_dev.prompt[i] >= m->vocab) {
            app_fmt2(t, sizeof t, "prompt token ", flm_dev.prompt[i], " is outside the vocabulary of ", m->vocab, "");
            app_send_error(FLM_E_BAD_TOKEN, t);
            return;
        }
    }
    app_ring_begin();                   /* accepted: a new generation, the ring starts empty */
    flm_rng rng;
    flm_rng_seed(&rng, flm_get_u64(p + 12));
    /* LOGITS implies ALL_LOGITS: every step computes the whole head, never pruned or skipped */
    const int every = (flags & (GEN_LOGITS | GEN_ALL_LOGITS)) != 0, greedy = !(temperature > 0.0f);
    uint64_t tot[FLM_N_PHASES] = {0}, t_start = hal_time_us();
    uint32_t tok = flm_dev.prompt[0], pos = 0, generated = 0, step = 0, reason = REASON_MAX_TOKENS;
    for (;;) {
        if (generated >= max_new) { reason = REASON_MAX_TOKENS; break; }
        uint32_t n_drop = 0;
        if (pos >= m->seq_len) {
            if (!(flags & GEN_SLIDE) || m->seq_len < 3u) { reason = REASON_CONTEXT; break; }
            n_drop = (m->seq_len - 1u) / 2u;   /* position 0 stays: the attention sink */
            pos = m->seq_len - n_drop;
        }
        flm_step_stats st;
        memset(&st, 0, sizeof st);
        FLM_STEP_BEGIN(step, &flm_dev.state);
        if (n_drop) flm_slide(&flm_dev.state, n_drop, &st);
        flm_body(&flm_dev.state, tok, pos, &st);
        const int prompt_step = step + 1u < n;
        const float *logits = every || (!prompt_step && !greedy) ? flm_head(&flm_dev.state, &st) : 0;
        uint32_t out = FLM_NONE, next = prompt_step ? flm_dev.prompt[step + 1u] : 0u;
        if (!prompt_step && !logits) out = flm_head_argmax(&flm_dev.state, &st);   /* sampling 0 µs: the scan chose */
        FLM_STEP_END(step);
        if (!prompt_step && logits) {
            uint64_t ts = hal_time_us();
            out = flm_sample(logits, m->n_out, temperature, top_p, &rng, flm_dev.state.probs, flm_dev.state.idx);
            st.us[FLM_PH_SAMPLE] = (uint32_t)(hal_time_us() - ts);
        }
        if (!prompt_step) { next = out; generated++; }
        app_send_token(step, pos, tok, out, &st, logits ? flm_crc32_update(0, logits, (size_t)m->n_out * 4u) : 0u);
        if (flags & GEN_LOGITS) app_send_logits(step, logits);
        for (int i = 0; i < FLM_N_PHASES; i++) tot[i] += st.us[i];
        step++;
        if (out != FLM_NONE && flm_is_stop(m, out)) { reason = REASON_EOS; break; }
        if (app_stop_requested()) { reason = REASON_STOPPED; break; }
        tok = next;
        pos++;
    }
    app_ring_end(step, generated, (uint8_t)reason, hal_time_us() - t_start, tot);
}
