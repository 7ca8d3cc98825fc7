/* Integer group kernels: the only code that touches weight bytes per token. kernels.c implements
 * them on each core's tuned kernels (kernel_hooks.h), kernels_ref.h is their reference form, and
 * kernels_check.h the boot self-check between the two. */
#ifndef FLM_KERNELS_H
#define FLM_KERNELS_H
#include "blob.h"

/* Activation codes as the kernels read them: int16 on every target (docs/formats.md section 1.1).
 * The codes entering a q8 tensor's product are 12-bit (|code| <= 2047), a q4 tensor's 8-bit (<= 127:
 * the Cortex-M0+ q4 kernel packs two into 16-bit lanes); flm_act_qmax says which. The engine's
 * buffer holds 2 bytes a code (one state layout, converter/footprint.py). FLM_VECTOR: cores with
 * SIMD (x86 SSE2, Arm NEON), whose vectorisers form the 16-bit multiply-add (SSE2 PMADDWD, NEON
 * SMLAL) from these int16 operands (kernels_vec.h). */
#if !defined(__ARM_ARCH_6M__) && (defined(__SSE2__) || defined(__ARM_NEON) || defined(__ARM_NEON__))
#define FLM_VECTOR 1
#endif
typedef int16_t flm_act;
#define FLM_QMAX_12 2047
#define FLM_QMAX_8 127
/* The largest |code| of the activations a product of w takes: 2047 for q8, 127 for q4. */
static inline int32_t flm_act_qmax(const flm_tensor *w) { return w->fmt == FLM_Q8 ? FLM_QMAX_12 : FLM_QMAX_8; }

/* Quantize x[n] to codes per group of g with the largest code qmax (127 or 2047): scale =
 * amax/qmax, code = round-half-away(clamp(x * (qmax/amax), +-qmax)), NaN 0, into flm_act codes
 * (the input of a matvec, attention's query, a k12 KV cache's K rows) */
void flm_quantize_act(const float *x, uint32_t n, uint32_t g, int32_t qmax, flm_act *xq, float *xs);
/* or, with qmax 127, into int8_t codes (the int8 KV cache's rows, k12's V rows): the same codes. */
void flm_quantize_i8(const float *x, uint32_t n, uint32_t g, int8_t *q, float *xs);
/* flm_quantize_act's scales and codes, computed on the board's cores (hal.h hal_parallel). */
void flm_quantize_act_parallel(const float *x, uint32_t n, uint32_t g, int32_t qmax, flm_act *xq, float *xs);
/* The group of the activation quantization a tensor's matvec takes (flm_quantize_act's g): its group
 * size, or for a row-scaled tensor its columns (one scale for the whole input). */
uint32_t flm_act_group(const flm_tensor *w);
/* out[r] = fold over groups of float(int32 group dot) * (wscale * xscale), or row-scaled
 * float(sum over groups of k * group dot) * (row scale * xscale); xq/xs from flm_quantize_act with
 * flm_act_group(w). All rows on the calling core (the engine calls hal_matmul). */
void flm_matvec(const flm_tensor *w, const flm_act *xq, const float *xs, float *out);
/* Rows [r0, r1) of flm_matvec's output, bit for bit (for a hal_matmul that splits the rows, and the
 * greedy head's tile scan: a tile is a run of rows). */
void flm_matvec_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, const float *xs, float *out);
/* The quantized inputs of n tokens for one matrix, and where their outputs go: token t's codes at
 * xq + t * xq_stride (codes; a multiple of 4, so every token's codes stay word aligned), its group
 * scales at xs + t * xs_stride, its output row r at out[t * out_stride + r]. */
typedef struct {
    uint32_t n;
    const flm_act *xq;
    const float *xs;
    float *out;
    uint32_t xq_stride, xs_stride, out_stride;
} flm_batch;
/* Rows [r0, r1) of w for every token of b, each token's values flm_matvec_rows' bit for bit. One
 * token reads the rows in place; more than one read each row once: as many whole rows as row_buf
 * holds (an SRAM buffer of buf_bytes, at least the row's stride, word aligned) are copied into it,
 * and every token's rows read the copy, a block of rows a kernel call, as a one-token matvec's
 * (docs/formats.md section 2: a forward pass reads each weight byte once, whatever its tokens). */
void flm_matmul_rows(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_batch *b, uint8_t *row_buf,
                     size_t buf_bytes);
/* Row r of flm_matvec's output, bit for bit (the boot self-check compares rows one at a time; the
 * tensor must be row-major). */
float flm_matvec_row(const flm_tensor *w, uint32_t r, const flm_act *xq, const float *xs);
/* v rounded once to binary32 (to nearest, ties to even) with integer operations only (kernels_ref.h
 * i64_to_f32): no soft-float library's conversion through a double on cores without an FPU. */
float flm_i64_to_f32(int64_t v);
/* Dequantize row r of a q8/q4 tensor into out[cols]: code * scale, row-scaled float(code * k) * S. */
void flm_dequant_row(const flm_tensor *w, uint32_t r, float *out);
/* One group's exact dot product of n codes (int8, or int4 two per byte, low nibble first) with n
 * activation codes: the tuned kernel of this core (kernel_hooks.h FLM_DOT_Q8, FLM_DOT_Q4). */
int32_t flm_dot_q8(const int8_t *w, const flm_act *x, uint32_t n);
int32_t flm_dot_q4(const uint8_t *w, const flm_act *x, uint32_t n);
/* The int8 attention's loops: two dots sharing x (out[0] = a.x, out[1] = b.x), and acc[i] += w *
 * v[i]; word-aligned int8 codes, n of any size (the tuned ones take whole words). */
void flm_dot2_q8(const int8_t *a, const int8_t *b, const flm_act *x, uint32_t n, int32_t out[2]);
void flm_axpy_q8(int32_t *acc, const int8_t *v, int32_t w, uint32_t n);
/* The k12 attention's scores: the exact dot of n int16 K codes (|c| <= 2047) with n query codes
 * (|c| <= 2047; n <= 512, so every sum is an int32), one row or two sharing x (kernel_hooks.h
 * FLM_DOT2_Q12); word-aligned codes, n of any size. */
int32_t flm_dot_q12(const int16_t *a, const flm_act *x, uint32_t n);
void flm_dot2_q12(const int16_t *a, const int16_t *b, const flm_act *x, uint32_t n, int32_t out[2]);
/* The integer part of a row: isum[k] = the exact dot of group k's g codes (at codes + k * step; q8, or
 * q4 as in flm_dot_q4) with xq[k*g .. k*g + g), for k < ng, with this core's tuned dots (on cores
 * with SIMD vectorised, loops of a constant length for g = 32, 64, 128). A row kernel computes a
 * block of its groups' dots this way, then scales and folds them by its weight format's rule in the
 * reference's order (the general rows call these; the rows of the common shapes inline the same
 * loops). */
void flm_isums_q8(const uint8_t *codes, size_t step, const flm_act *xq, uint32_t g, uint32_t ng, int32_t *isum);
void flm_isums_q4(const uint8_t *codes, size_t step, const flm_act *xq, uint32_t g, uint32_t ng, int32_t *isum);
/* Boot-time check (kernels_check.h): the tuned rows against the scalar kernels on built-in tensors
 * (q8 and q4, f32, fp16 and row scales, whole and short last groups, every group size with its own
 * row kernel, activations up to +-2047), the int8 and k12 attention's loops and the activation codes
 * (qmax 127 and 2047), bit for bit. 0 when they agree, -1 when not
 * (the firmware then refuses to generate). */
int flm_kernels_self_check(void);
#endif
