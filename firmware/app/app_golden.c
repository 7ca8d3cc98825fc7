/* The golden check (docs/formats.md section 1.3): the board repeats a few forward steps the NumPy
 * reference computed (the image's golden section: per KV cache format, each step's input id, greedy
 * output id and logits CRC-32) with the placement it runs, and HELLO says whether every step was
 * bit-exact and, if not, the first that was not. It runs the section's boot steps at boot and after
 * every LAYOUT (a placement names the KV format, which changes the numerics), all steps on SELFTEST.
 *
 * It runs the forward pass a GENERATE runs (flm_body, the whole head, the greedy choice, and the
 * pruned scan greedy steps use), and leaves nothing a generation depends on: every GENERATE starts
 * at position 0 and writes each cache row before it reads it, and the RESEND ring is untouched. */
#include "app_golden.h"
#include "app_frames.h"
#include "app_text.h"
#include "crc32.h"
#include "hal.h"
#include "sampler.h"
#include <string.h>

#ifndef FLM_GOLDEN_AT_BOOT
#define FLM_GOLDEN_AT_BOOT 1   /* 0: a build that leaves the check to SELFTEST (HELLO says "not run") */
#endif

enum { HEAD = 16u, BLOCK = 8u, RECORD = 12u, VERSION = 1u };

typedef struct {
    const uint8_t *rec;        /* the KV format's first record (u32 in_id, out_id, logits_crc) */
    uint32_t n, boot;          /* its steps; how many to run at boot and after a LAYOUT */
} golden_block;

/* The block for the KV format in effect, after the same checks as converter/golden.py decode.
 * Returns 0, or -1 with *why set (NULL: the image has no golden section). */
static int find_block(golden_block *b, const char **why) {
    const flm_model *m = &flm_dev.model;
    uint32_t len;
    const uint8_t *p = flm_blob_section(m, "golden", &len);
    *why = 0;
    if (!p) return -1;
    *why = "the image's golden section is malformed; re-run flashlm convert";
    if (len < HEAD || flm_rd32(p) != VERSION) return -1;
    uint32_t n_prompt = flm_rd32(p + 4), n_blocks = flm_rd32(p + 12), off = HEAD;
    for (uint32_t k = 0; k < n_blocks; k++) {
        if (len - off < BLOCK) return -1;
        uint32_t kv = flm_rd32(p + off), n = flm_rd32(p + off + 4);
        off += BLOCK;
        if (n < n_prompt || n > m->seq_len || n > 0xFFFEu || (len - off) / RECORD < n) return -1;
        for (uint32_t s = 0; s < n; s++) {
            uint32_t in = flm_rd32(p + off + s * RECORD), out = flm_rd32(p + off + s * RECORD + 4);
            if (in >= m->vocab || (out == FLM_NONE) != (s + 1u < n_prompt) || (out != FLM_NONE && out >= m->n_out))
                return -1;
        }
        if (kv == m->kv_fmt) {
            b->rec = p + off;
            b->n = n;
            b->boot = flm_rd32(p + 8) < n ? flm_rd32(p + 8) : n;
            return 0;
        }
        off += n * RECORD;
    }
    *why = "the image's golden section has no steps for this KV cache format";
    return -1;
}

static void put_hex(char *t, size_t *i, size_t cap, uint32_t v) {
    app_put_str(t, i, cap, "0x");
    for (int k = 28; k >= 0; k -= 4) {
        char c[2] = {"0123456789abcdef"[(v >> k) & 15u], 0};
        app_put_str(t, i, cap, c);
    }
}

static const char *kv_name(void) { return flm_kv_name(flm_dev.model.kv_fmt); }

/* Run the first n steps of block b; the result in flm_dev.golden, a LOG with the details. */
static void run_steps(const golden_block *b, uint32_t n) {
    flm_golden *g = &flm_dev.golden;
    flm_state *s = &flm_dev.state;
    const uint32_t n_out = flm_dev.model.n_out;
    uint32_t crc = 0, out = FLM_NONE, pruned = FLM_NONE;
    uint64_t t0 = hal_time_us();
    g->total = (uint16_t)b->n;
    g->first_diff = 0xFFFFu;
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *r = b->rec + k * RECORD;
        const uint32_t want_out = flm_rd32(r + 4);
        flm_step_stats st;
        memset(&st, 0, sizeof st);
        flm_body(s, flm_rd32(r), k, &st);
        if (want_out != FLM_NONE) pruned = flm_head_argmax(s, &st);     /* what a greedy GENERATE step computes */
        const float *logits = flm_head(s, &st);
        crc = flm_crc32_update(0, logits, (size_t)n_out * 4u);
        /* greedy (temperature 0): the first maximum; no RNG or scratch is touched */
        out = want_out == FLM_NONE ? FLM_NONE : flm_sample(logits, n_out, 0.0f, 0.0f, 0, 0, 0);
        g->checked = (uint16_t)(k + 1u);
        if (crc != flm_rd32(r + 8) || out != want_out || (want_out != FLM_NONE && pruned != want_out)) {
            g->first_diff = (uint16_t)k;
            break;
        }
    }
    g->state = g->first_diff == 0xFFFFu ? FLM_GOLDEN_EXACT : FLM_GOLDEN_DIFFERS;
    char t[200];
    size_t i = 0;
    app_put_str(t, &i, sizeof t, "golden check, KV cache ");
    app_put_str(t, &i, sizeof t, kv_name());
    if (g->state == FLM_GOLDEN_EXACT) {
        app_put_str(t, &i, sizeof t, ": steps 0-");
        app_put_dec(t, &i, sizeof t, n - 1u);
        app_put_str(t, &i, sizeof t, " of ");
        app_put_dec(t, &i, sizeof t, b->n);
        app_put_str(t, &i, sizeof t, " bit-exact with the reference");
    } else {
        const uint8_t *r = b->rec + g->first_diff * RECORD;
        app_put_str(t, &i, sizeof t, ": step ");
        app_put_dec(t, &i, sizeof t, g->first_diff);
        app_put_str(t, &i, sizeof t, " differs from the reference: logits CRC ");
        put_hex(t, &i, sizeof t, crc);
        app_put_str(t, &i, sizeof t, " (reference ");
        put_hex(t, &i, sizeof t, flm_rd32(r + 8));
        if (flm_rd32(r + 4) != FLM_NONE) {
            app_put_str(t, &i, sizeof t, "), token ");
            app_put_dec(t, &i, sizeof t, out);
            app_put_str(t, &i, sizeof t, ", pruned scan ");
            app_put_dec(t, &i, sizeof t, pruned);
            app_put_str(t, &i, sizeof t, " (reference ");
            app_put_dec(t, &i, sizeof t, flm_rd32(r + 4));
        }
        app_put_str(t, &i, sizeof t, ")");
    }
    app_put_str(t, &i, sizeof t, "; ");
    app_put_elapsed(t, &i, sizeof t, hal_time_us() - t0, 1);
    app_send_log(t);
}

void app_golden_check(int all) {
    golden_block b;
    const char *why;
    flm_dev.golden = (flm_golden){FLM_GOLDEN_NONE, 0, 0, 0xFFFFu};
    if (!flm_dev.image_ok) return;
    if (find_block(&b, &why) != 0) {
        if (why || all) app_send_log(why ? why : "the image has no golden check; re-run flashlm convert");
        return;
    }
    flm_dev.golden.state = FLM_GOLDEN_NOT_RUN;
    flm_dev.golden.total = (uint16_t)b.n;
    if (all) run_steps(&b, b.n);
    else if (FLM_GOLDEN_AT_BOOT && b.boot) run_steps(&b, b.boot);
}

/* SELFTEST (empty payload): every golden step, then HELLO with the result. */
void app_selftest(const uint8_t *p, size_t len) {
    (void)p;
    if (!flm_dev.image_ok) { app_send_error(app_no_model_code(), flm_dev.image_err); return; }
    if (len != 0u) { app_send_error(FLM_E_BAD_MESSAGE, "SELFTEST has no payload"); return; }
    app_golden_check(1);
    app_send_hello();
}
