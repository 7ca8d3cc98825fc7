/* What the files of the device app share (app.c: boot and the command loop; app_frames.c: frames
 * and the RESEND ring; app_generate.c: GENERATE; app_console.c: received bytes, text prompts and
 * the console; app_layout.c: placement; app_golden.c: the golden check; app_text.c: message text):
 * the app's state and the functions each file offers the others. Not part of the engine's
 * interface (app.h is). */
#ifndef FLM_APP_STATE_H
#define FLM_APP_STATE_H
#include "engine.h"
#include "protocol.h"
#include "tokenize.h"
#include <stddef.h>
#include <stdint.h>

#ifndef FLM_FW_VERSION
#define FLM_FW_VERSION "0.1.0"
#endif
#ifndef FLM_RX_CAP
#define FLM_RX_CAP 8192
#endif
/* at least room for a full RESEND (8 + 4 * FLM_RESEND_MAX bytes of payload, framed) */
#define FLM_RXBUF_BYTES (FLM_RX_CAP > 192 ? FLM_RX_CAP : 192)

#ifndef FLM_MAX_ENTRIES
/* tensor-table entries a LAYOUT may address: at most 15 outside the layers (tokenizer, tokenizer.stop,
 * tokenizer.enc, rope.cos, rope.sin, tok_embeddings, ple.table, ple.proj, ple.norm, norm, output,
 * head.centroids, head.tiles, draft, golden) */
#define FLM_MAX_ENTRIES (15 + 12 * FLM_MAX_LAYERS)
#endif

typedef struct { uint8_t *base; size_t cap, used; } flm_pool;

/* The golden check's result (app_golden.c; HELLO's last fields, docs/formats.md section 2) */
enum { FLM_GOLDEN_NONE = 0, FLM_GOLDEN_NOT_RUN = 1, FLM_GOLDEN_EXACT = 2, FLM_GOLDEN_DIFFERS = 3 };
typedef struct {
    uint8_t state;                 /* FLM_GOLDEN_*: none (no golden for this image and KV format), ... */
    uint16_t checked, total;       /* steps compared; steps the golden holds for this KV format */
    uint16_t first_diff;           /* the first step that differs, 0xFFFF: none */
} flm_golden;

typedef struct {
    flm_model model;
    flm_state state;
    uint32_t *prompt;
    flm_pool pool[FLM_N_TIERS];    /* [0]: main()'s arena; [psram], [sram]: the HAL's staging space */
    uint32_t arena_tier;           /* tier of the arena main() gave: the state's default home */
    uint8_t tiers[FLM_MAX_ENTRIES];   /* the placement in effect, one tier per table entry */
    uint32_t state_tiers;
    uint32_t staged[FLM_N_TIERS];  /* bytes of tensors copied into each tier */
    int image_ok;
    int kernels_ok;                /* the boot self-check passed (flm_kernels_self_check) */
    flm_golden golden;             /* the last golden check, for the placement in effect */
    char image_err[120];
    flm_tx tx;
    flm_rx rx;
    uint32_t bad_seen;
    /* the draft model of speculative decoding (the image's section "draft", docs/formats.md 1.4) */
    flm_model draft;
    flm_state dstate;
    int draft_open;                /* the section holds a model that fits the main one */
    int draft_ok;                  /* ... and its state has RAM in this placement */
    char draft_why[100];           /* why not */
} flm_app;

extern flm_app flm_dev;
extern uint8_t flm_rxbuf[FLM_RXBUF_BYTES];

/* A forward pass of a generation, as every TOKEN frame of the steps it produced carries it
 * (docs/formats.md section 2.4): prompt steps in chunks, a decode step, or a verification of drafts. */
enum { FLM_PASS_ONE = 0, FLM_PASS_PREFILL = 1, FLM_PASS_VERIFY = 2 };
typedef struct {
    uint32_t first;                    /* the step of its first token */
    uint8_t len, used, kind;           /* tokens it ran, steps it produced, FLM_PASS_* */
    flm_step_stats st;                 /* its µs per phase (proposing its drafts: FLM_PH_DRAFT) and bytes
                                        * per tier, drafting's included (head_rows: per step) */
    uint32_t draft_bytes[FLM_N_TIERS]; /* of which proposing its drafts read (DONE keeps the split) */
} flm_pass;

/* A generation's DONE. */
typedef struct {
    uint32_t steps, generated, passes, verify_passes, drafted, accepted;
    uint8_t reason;
    uint64_t total_us, phase_us[FLM_N_PHASES], bytes[FLM_N_TIERS], draft_bytes[FLM_N_TIERS];
} flm_done;

/* app_text.c: message text without a C library's printf */
size_t app_slen(const char *s);
void app_scopy(char *dst, size_t cap, const char *src);
void app_put_dec(char *buf, size_t *i, size_t cap, uint32_t v);   /* buf[*i..] += decimal(v) */
void app_put_str(char *buf, size_t *i, size_t cap, const char *s);
size_t app_fmt2(char *buf, size_t cap, const char *a, uint32_t x, const char *b, uint32_t y, const char *c);

/* app_frames.c: what the device sends, and the ring of kept TOKEN frames (docs/formats.md 2.1) */
void app_send_error(uint16_t code, const char *text);
void app_send_log(const char *text);
void app_send_hello(void);
uint16_t app_no_model_code(void);      /* why a request needing the model is refused while !flm_dev.image_ok */
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

/* app_generate.c */
void app_generate(const uint8_t *p, size_t len);

/* app_console.c: received bytes become frames or console lines; text prompts */
int app_poll_frame(void);              /* 1: a frame in flm_dev.rx, 2: a console line, 0: nothing yet */
const flm_tokenizer *app_text_encoder(void);
void app_generate_text(void);
void app_text_session(void);
void app_report_console(void);

/* app_speculate.c: proposing drafts (docs/formats.md section 2.4) */
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
/* app_golden.c: the golden check against the reference's steps (all = 1: every step, else the
 * image's boot steps), for the placement in effect; SELFTEST */
void app_golden_check(int all);
void app_selftest(const uint8_t *p, size_t len);

/* app_layout.c */
int app_place(const uint8_t *tiers, uint32_t state_tiers, char *err, size_t en);
void app_log_layout(const char *what);
void app_set_layout(const uint8_t *p, size_t len);
#endif
