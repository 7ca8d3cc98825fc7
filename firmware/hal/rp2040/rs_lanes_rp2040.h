/* A streamed product's row-scaled q4 lanes (kernels_arch.h rows_rs_lanes' table of the activations,
 * defined there, in kernels.c), for stream_rp2040.c. */
#ifndef FLM_RS_LANES_RP2040_H
#define FLM_RS_LANES_RP2040_H
#include "hal.h"

#define FLM_RS_LANE_WORDS 544u   /* the lanes of up to 1,024 columns: 17 words per 32 */

/* 1 if the row-scaled rows of w against xq take lanes (q4, the assembly's shape), else 0. */
int flm_rs_lanes_fit(const flm_tensor *w, const flm_act *xq);
/* For such a w: builds the lanes of xq into lanes[0, FLM_RS_LANE_WORDS) (the caller's, kept until
 * the product is over), which the rows of w the calling core computes from then on take instead of
 * building their own. w 0: the core's lanes dropped, at the product's end. */
void flm_rs_lanes_m0(const flm_tensor *w, const flm_act *xq, uint32_t *lanes);
#endif
