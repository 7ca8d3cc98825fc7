/* The device app's state (one instance, flm_dev) and the types its files share. Each file's
 * functions are in its own header; the files call each other in layers, each only the ones below
 * it (bottom up):
 *   app_text.c       message text without printf      protocol.c     the frame codec
 *   app_receive.c    received bytes become frames or console lines
 *   app_prompt.c     text prompts: the image's encoder
 *   app_frames.c     what the device sends, the RESEND ring, the host's frames between steps
 *   app_speculate.c  proposing drafts
 *   app_generate.c   a generation, reporting its steps through an output it is given
 *   app_request.c    GENERATE and GENERATE_TEXT: one request, generated into frames
 *   app_golden.c     the golden check, SELFTEST
 *   app_layout.c     placement, LAYOUT
 *   app_console.c    the plain-text console
 *   app.c            boot and the command loop (app.h: the app's one entry point)
 * Not part of the engine's interface. */
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
/* tensor-table entries a LAYOUT may address: at most 16 outside the layers (tokenizer, tokenizer.stop,
 * tokenizer.enc, rope.cos, rope.sin, tok_embeddings, ple.table, ple.proj, ple.norm, norm, output,
 * head.centroids, head.tiles, moe.use, draft, golden) and per layer 6, the FFN's (3, or a router and 3
 * per expert) and PLE's 3 */
#define FLM_MAX_ENTRIES (16 + (10 + 3 * FLM_MAX_EXPERTS) * FLM_MAX_LAYERS)
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

/* Why a request needing the model is refused while !flm_dev.image_ok (protocol.h FLM_E_*). */
static inline uint16_t app_no_model_code(void) { return flm_dev.kernels_ok ? FLM_E_NO_MODEL : FLM_E_SELF_CHECK; }

#define FLM_EXPERT_MASK ((FLM_MAX_EXPERTS + 7) / 8)   /* bytes of a layer's bitmask of experts */

/* A forward pass of a generation, as every TOKEN frame of the steps it produced carries it
 * (docs/formats.md section 2.4): prompt steps in chunks, a decode step, or a verification of drafts. */
enum { FLM_PASS_ONE = 0, FLM_PASS_PREFILL = 1, FLM_PASS_VERIFY = 2 };
typedef struct {
    uint32_t first;                    /* the step of its first token */
    uint8_t len, used, kind;           /* tokens it ran, steps it produced, FLM_PASS_* */
    flm_step_stats st;                 /* its µs per phase (proposing its drafts: FLM_PH_DRAFT) and bytes
                                        * per tier, drafting's included (head_rows: per step) */
    uint32_t draft_bytes[FLM_N_TIERS]; /* of which proposing its drafts read (DONE keeps the split) */
    uint8_t experts[FLM_MAX_LAYERS][FLM_EXPERT_MASK];   /* per layer, bit e: expert e ran for a token of it */
} flm_pass;

/* A generation's DONE. */
typedef struct {
    uint32_t steps, generated, passes, verify_passes, drafted, accepted;
    uint8_t reason;
    uint64_t total_us, phase_us[FLM_N_PHASES], bytes[FLM_N_TIERS], draft_bytes[FLM_N_TIERS];
    uint32_t stack_peak, stack_size;   /* hal_stack_peak when the generation ended */
} flm_done;

#endif
