/* The forward pass: a few tokens at a time (up to the placement's batch; one is the common case),
 * every buffer carved once from a caller-given arena. */
#ifndef FLM_ENGINE_H
#define FLM_ENGINE_H
#include "blob.h"
#include "kernels.h"

/* Phases, in the protocol's order: embed = everything before layer 0 (embedding row; with PLE the
 * table row, ple.proj and the per-layer inputs), ple = each layer's PLE gate/proj/norm/residual,
 * draft = proposing the drafts a verifying pass checks (the app's; the engine's passes add none). */
enum { FLM_PH_EMBED, FLM_PH_ATTN, FLM_PH_FFN, FLM_PH_PLE, FLM_PH_OUTPUT, FLM_PH_SAMPLE, FLM_PH_DRAFT, FLM_N_PHASES };

typedef struct {
    uint32_t us[FLM_N_PHASES];      /* from hal_time_us */
    uint32_t bytes[FLM_N_TIERS];    /* weights, norms, RoPE rows and KV cache read, per tier */
    uint32_t head_rows;             /* rows of the output layer the step computed */
} flm_step_stats;

typedef struct {
    const flm_model *m;
    /* activations of up to m->batch tokens, token i's at i times one token's length (dim, hidden,
     * L*P, head_dim/2, ...); att (two cores' attention scratch: engine.c att_scratch_bytes) and
     * probs/idx serve one token at a time */
    float *x, *xb, *xb2, *q, *att, *hb, *hb2, *logits, *cos, *sin, *xs, *probs;
    float *pu, *pt;                 /* PLE: per-layer inputs u [L*P] per token; the table row [L*P], then the gates [P] per token */
    /* experts (n_experts > 0): the FFN outputs being summed [dim] per token, a token's router logits
     * [n_experts], this layer's weights [top_k] per token; routes: every layer's chosen experts, largest
     * weight first, of the last flm_body_many ([n_layers][n_tok][top_k], for its TOKEN frames) */
    float *macc, *mlogit, *mweight;
    uint8_t *routes, *msel;         /* msel: the pass's tokens routed to one expert [batch], their ranks [batch] */
    uint8_t *kc, *vc;               /* KV cache: one row per (layer, position, kv head), m->kv_fmt */
    uint32_t k_row, v_row;          /* bytes of a K and a V row: f32 head_dim*4; int8 (int8 K and V, k12's V): f32
                                     * scale + head_dim codes, padded to 4; k12's K: f32 scale + head_dim int16
                                     * codes, padded to 4 bytes */
    size_t kv_bytes;                /* bytes of the KV region, from kc to the end of vc */
    flm_act *xq;                    /* activation codes (kernels.h) */
    uint32_t xq_stride, xs_stride;  /* one token's activation codes (a multiple of 8) and scales (floats) */
    uint8_t *row_buf;               /* batch > 1: weight rows' copies, two rows of the widest (hal.h hal_matmul) */
    size_t row_buf_bytes;
    uint32_t *idx;
    uint32_t kv_tier;               /* where the KV cache lives (the arena's tier) */
    uint32_t n_tok;                 /* tokens of the last flm_body_many */
} flm_state;

/* The state's three RAM regions, each of which may live in its own tier (the blob header's
 * state_tiers field, 4 bits per region in this order): */
enum {
    FLM_REG_KV,        /* KV cache: kc, vc (read every step: counted in bytes_read) */
    FLM_REG_LOGITS,    /* out_vocab-sized buffers: logits (one set per token of a pass), probs, idx */
    FLM_REG_SCRATCH,   /* activations: x, xb, xb2, q, att, hb, hb2, cos, sin, pu, pt, xq, xs, row_buf, the experts' */
    FLM_N_REGIONS
};

/* Bytes of arena flm_state_init needs for model m (KV cache included). */
size_t flm_state_bytes(const flm_model *m);
/* Bytes of one region (FLM_REG_*); the three sum to flm_state_bytes. */
size_t flm_state_region_bytes(const flm_model *m, int region);
/* One arena holding the three regions back to back (scratch, logits, KV). Returns 0, or -1 when
 * cap is too small. kv_tier names the arena's memory tier. */
int flm_state_init(flm_state *s, const flm_model *m, uint8_t *arena, size_t cap, uint32_t kv_tier);
/* Each region at its own 8-aligned base (base[r] holds flm_state_region_bytes(m, r) bytes);
 * kv_tier names the tier of base[FLM_REG_KV]. */
void flm_state_init_regions(flm_state *s, const flm_model *m, uint8_t *const base[FLM_N_REGIONS], uint32_t kv_tier);
/* A forward pass is flm_body_many over n tokens (flm_body: one), then, when an output is used,
 * flm_head or flm_head_argmax (the pass's last token) or flm_head_all (every token); each adds its
 * phases' times and byte counts to st (zeroed by the caller), a head sets head_rows. */
/* Tokens t[0..n) at positions pos..pos+n-1 (n <= m->batch, pos + n <= seq_len) through every layer
 * together: each weight row is read once for the n tokens, each token's arithmetic is the one-token
 * pass's bit for bit (docs/formats.md section 1.5). Token i's K and V rows are stored at pos + i
 * before any token attends; token i attends positions 0..pos+i. */
void flm_body_many(flm_state *s, const uint32_t *t, uint32_t n, uint32_t pos, flm_step_stats *st);
/* The experts token i (< n_tok) of the last flm_body_many read in layer l: top_k indices, largest weight
 * first (a model with experts only). */
const uint8_t *flm_route(const flm_state *s, uint32_t l, uint32_t i);
/* flm_body_many of one token. */
void flm_body(flm_state *s, uint32_t token, uint32_t pos, flm_step_stats *st);
/* Final RMSNorm and the whole output layer for the last token of the pass: its logits[n_out] in token
 * order (with a head index through its row -> token map); head_rows = n_out. */
const float *flm_head(flm_state *s, flm_step_stats *st);
/* ... for every token of the pass, each head row read once for all: token i's logits at
 * return + i * n_out; head_rows = n_out. */
const float *flm_head_all(flm_state *s, flm_step_stats *st);
/* Final RMSNorm and the greedy output layer for the last token of the pass: the full scan's first
 * maximum (for finite logits), by the head index's tile scan (docs/formats.md section 3; head_rows =
 * the rows of the tiles it visited), or without an index by the whole head (head_rows = n_out). */
uint32_t flm_head_argmax(flm_state *s, flm_step_stats *st);
/* Sliding window: keep position 0, drop positions [1, 1 + n_drop), move the cached rows of
 * [1 + n_drop, seq_len) down by n_drop (K rows rotated back by n_drop positions). Timed as attention. */
void flm_slide(flm_state *s, uint32_t n_drop, flm_step_stats *st);
#endif
