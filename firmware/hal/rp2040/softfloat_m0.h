/* The Cortex-M0+ soft-float's kernel entry points (softfloat_m0.s), which kernels_arch.h maps the
 * kernels' hooks to: force-included (-include) into the engine wherever softfloat.c and
 * softfloat_m0.s are linked, which is every RP2040 build: the bare-metal one (through hal_rp2040.h)
 * and the Arduino-Pico one for the real Pico (firmware/exact_float.py), so both run the same float
 * arithmetic and the same kernels. Plain declarations: C++ sources of the Arduino build see it too,
 * assembler sources nothing. */
#ifndef FLM_SOFTFLOAT_M0_H
#define FLM_SOFTFLOAT_M0_H
#ifndef __ASSEMBLER__   /* an assembler run through the preprocessor sees nothing of it */
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* A matvec group's term (float)isum * (sc * xs), bit for bit, in one call (kernel_hooks.h
 * FLM_GROUP_TERM). */
float flm_group_term(int32_t isum, float sc, float xs);

/* kernel_hooks.h row_whole (f32 scales, whole groups of a multiple of 8, word-aligned int16
 * activation codes) with the group loop in assembly: the same dots, terms and adds in the same
 * order (FLM_ROW_WHOLE). */
float flm_row_q8_m0(const uint8_t *p, const int16_t *x, const float *xs, uint32_t ng, uint32_t code_bytes);
float flm_row_q4_m0(const uint8_t *p, const int16_t *x, const float *xs, uint32_t ng, uint32_t code_bytes);

/* Row-scaled rows (kernel_hooks.h FLM_RS_ROWS): n rows from row on, each row's integer sum (q8: two
 * rows a pass, x the int16 codes, an int64 sum; q4: two codes a product, x being kernels_arch.h
 * rows_rs_lanes' lanes), then float(acc) * (S * X) inline, bit for bit kernels_ref.h row_rs, into
 * out[0, n). geom = n_groups | group << 16. The drivers advance row, n and out as they go. */
typedef struct {
    const uint8_t *row;
    uint32_t stride, n;
    const void *x;
    uint32_t geom;
    float xs;
    float *out;
} flm_rs_job;
void flm_rs_rows_q8_m0(flm_rs_job *j);
void flm_rs_rows_q4_m0(flm_rs_job *j);
void flm_rs_rows_q4h_m0(flm_rs_job *j);   /* groups of 16: lanes in sub-blocks of 16 columns */
/* Four tokens' q8 rows at once (a pass of several tokens): x their activation codes staged per
 * column as two words (tokens 0 | 1 << 16, 2 | 3 << 16: kernels_arch.h), or for the w form as four
 * int32; xs[t] and out[t] each token's X and outputs, out[t] advanced; each token's out[] bit for bit
 * flm_rs_rows_q8_m0's. Groups of 16 or 32 codes. */
typedef struct {
    const uint8_t *row;
    uint32_t stride, n;
    const uint32_t *x;
    uint32_t geom;
    float xs[4];
    float *out[4];
} flm_rs_job4;
void flm_rs_rows4_q8_m0(flm_rs_job4 *j);
void flm_rs_rows4w_q8_m0(flm_rs_job4 *j);
/* The same for q4 (groups of a multiple of 32 codes, at most 1,024 columns; q4h: groups of 16): x the
 * four tokens' lanes interleaved word by word (kernels_arch.h flm_rs_stage), their start values biased
 * by 2^15; each token's out[] bit for bit flm_rs_rows_q4_m0's (q4h_m0's). */
void flm_rs_rows4_q4_m0(flm_rs_job4 *j);
void flm_rs_rows4_q4h_m0(flm_rs_job4 *j);
float flm_rs_scale(int32_t acc, float s, float x);   /* the drivers' float(acc) * (s * x) of an int32 acc */

/* The attention's integer loops (kernel_hooks.h FLM_DOT2_Q8, FLM_DOT2_Q12, FLM_AXPY_Q8; n a multiple
 * of 8, 4, 4): int8 or (k12) int16 keys against the query's int16 codes, int8 values. */
void flm_dot2_q8_m0(const int8_t *a, const int8_t *b, const int16_t *x, uint32_t n, int32_t out[2]);
void flm_dot2_q12_m0(const int16_t *a, const int16_t *b, const int16_t *x, uint32_t n, int32_t out[2]);
void flm_axpy_q8_m0(int32_t *acc, const int8_t *v, int32_t w, uint32_t n);

/* The activation codes of a group, x[i] * inv as __aeabi_fmul forms it inline: int8 with qmax 127
 * (FLM_QUANT_CODES), int16 with qmax 127 or 2047 (FLM_ACT_CODES_Q). */
void flm_quant_codes_m0(const float *x, uint32_t n, float inv, int8_t *q);
void flm_act_codes_m0(const float *x, uint32_t n, float inv, int16_t *q, int32_t qmax);

#ifdef __cplusplus
}
#endif
#endif
#endif
