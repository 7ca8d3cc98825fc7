/* Integer group kernels: the only code that touches weight bytes per token. */
#ifndef FLM_KERNELS_H
#define FLM_KERNELS_H
#include "blob.h"

/* Quantize x[n] to int8 codes per group of g: scale = amax/127, code = round-half-away(x*127/amax). */
void flm_quantize_act(const float *x, uint32_t n, uint32_t g, int8_t *xq, float *xs);
/* out[r] = fold over groups of float(int32 group dot) * (wscale * xscale); xq/xs from flm_quantize_act
 * with the tensor's group size. All rows on the calling core (the engine calls hal_matvec). */
void flm_matvec(const flm_tensor *w, const int8_t *xq, const float *xs, float *out);
/* Rows [r0, r1) of flm_matvec's output, bit for bit (for a hal_matvec that splits the rows). */
void flm_matvec_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq, const float *xs, float *out);
/* The quantized inputs of n tokens for one matrix, and where their outputs go: token t's codes at
 * xq + t * xq_stride (a multiple of 4, so every token's codes stay word aligned), its group scales at
 * xs + t * xs_stride, its output row r at out[t * out_stride + r]. */
typedef struct {
    uint32_t n;
    const int8_t *xq;
    const float *xs;
    float *out;
    uint32_t xq_stride, xs_stride, out_stride;
} flm_batch;
/* Rows [r0, r1) of w for every token of b, each token's values flm_matvec_rows' bit for bit. One
 * token reads the rows in place; more than one read each row once: it is copied into row_buf (an
 * SRAM buffer of at least the row's stride, word aligned), and every token's group dots read the copy
 * (docs/formats.md section 2: a forward pass reads each weight byte once, whatever its tokens). */
void flm_matmul_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_batch *b, uint8_t *row_buf);
/* Row r of flm_matvec's output, bit for bit (the pruned greedy head computes rows one at a time;
 * the tensor must be row-major). */
float flm_matvec_row(const flm_tensor *w, uint32_t r, const int8_t *xq, const float *xs);
/* Dequantize row r of a q8/q4 tensor into out[cols]: code * scale. */
void flm_dequant_row(const flm_tensor *w, uint32_t r, float *out);
/* One group's exact dot product of n codes (int8, or int4 two per byte, low nibble first) with n
 * activation codes: the tuned kernel of this core (Cortex-M0+ assembly, else portable C). */
int32_t flm_dot_q8(const int8_t *w, const int8_t *x, uint32_t n);
int32_t flm_dot_q4(const uint8_t *w, const int8_t *x, uint32_t n);
/* Boot-time check: the tuned kernels against the scalar ones on a built-in tensor (q8 and q4, f32
 * and fp16 scales), bit for bit. 0 when they agree, -1 when not (the firmware then refuses to
 * generate). */
int flm_kernels_self_check(void);
#endif
