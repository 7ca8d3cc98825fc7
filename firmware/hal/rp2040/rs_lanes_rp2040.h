/* A streamed product's row-scaled q4 lanes (kernels_arch.h rows_rs_lanes' table of the activations)
 * and a pass's staged activations, defined in kernels_arch.h (in kernels.c), for stream_rp2040.c. */
#ifndef FLM_RS_LANES_RP2040_H
#define FLM_RS_LANES_RP2040_H
#include "hal.h"

#define FLM_RS_LANE_WORDS 544u   /* the lanes of up to 1,024 columns: 17 words per 32 (groups of 16: 960, 9 per 16) */

/* 1 if the row-scaled rows of w against xq take lanes (q4, the assembly's shape), else 0. */
int flm_rs_lanes_fit(const flm_tensor *w, const flm_act *xq);
/* For such a w: builds the lanes of xq into lanes[0, FLM_RS_LANE_WORDS) (the caller's, kept until
 * the product is over), which the rows of w the calling core computes from then on take instead of
 * building their own. w 0: the core's lanes dropped, at the product's end. */
void flm_rs_lanes_m0(const flm_tensor *w, const flm_act *xq, uint32_t *lanes);

/* A pass's products (several tokens) on staged activations, built once per product, not per
 * chunk and token, four tokens at a time: q8's (softfloat_m0.s flm_rs_rows4_q8_m0: a code loaded
 * and sign-extended once for four tokens) from their activation codes interleaved per column, q4's
 * (flm_rs_rows4_q4_m0: a code word's nibble pairs masked once for four tokens) from their lanes
 * interleaved word by word; the rest of the pass one token at a time (q4: each token's lanes). */
#define FLM_RS_STAGE_WORDS 1536u   /* 6 KB of the streaming core's stack: q8, 2 quads of 352
                                      columns; q4, the lanes of 8 tokens of 352 */
/* 1 if the rows of w against b's tokens take staged activations (row-scaled, the assembly's shape;
 * q8 four tokens or more, q4 two or more), else 0. */
int flm_rs_stage_fit(const flm_tensor *w, const flm_batch *b);
/* For such a w: how many of b's first tokens the stage holds (q8: a multiple of 4). */
uint32_t flm_rs_staged(const flm_tensor *w, const flm_batch *b);
/* Stages tokens [t0, t1) of those (q8: t0 and t1 multiples of 4) into stage[0, FLM_RS_STAGE_WORDS). */
void flm_rs_stage(const flm_tensor *w, const flm_batch *b, uint32_t *stage, uint32_t t0, uint32_t t1);
/* Rows [0, w->rows) of w (a chunk's view) for b's tokens [t0, t1) staged in stage (t0 a multiple of
 * 4, q8's t1 too), into their outputs' rows from r on. */
void flm_rs_staged_rows(const flm_tensor *w, const flm_batch *b, uint32_t t0, uint32_t t1, const uint32_t *stage,
                        uint32_t r);
#endif
