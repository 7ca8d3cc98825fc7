/* Integer group kernels: the only code that touches weight bytes per token. */
#ifndef FLM_KERNELS_H
#define FLM_KERNELS_H
#include "blob.h"

/* Quantize x[n] to int8 codes per group of g: scale = amax/127, code = round-half-away(x*127/amax). */
void flm_quantize_act(const float *x, uint32_t n, uint32_t g, int8_t *xq, float *xs);
/* out[r] = fold over groups of float(int32 group dot) * (wscale * xscale); xq/xs from flm_quantize_act
 * with the tensor's group size. */
void flm_matvec(const flm_tensor *w, const int8_t *xq, const float *xs, float *out);
/* Row r of flm_matvec's output, bit for bit (the pruned greedy head computes rows one at a time;
 * the tensor must be row-major). */
float flm_matvec_row(const flm_tensor *w, uint32_t r, const int8_t *xq, const float *xs);
/* Dequantize row r of a q8/q4 tensor into out[cols]: code * scale. */
void flm_dequant_row(const flm_tensor *w, uint32_t r, float *out);
#endif
