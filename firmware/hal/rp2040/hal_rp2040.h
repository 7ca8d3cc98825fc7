/* RP2040 bare-metal HAL: what the rest of the firmware sees besides hal.h.
 *
 * Force-included (-include) into every translation unit of an RP2040 build, so app_generate.c's optional
 * step hooks report each forward step to whoever watches the chip: on the emulated board the
 * harness (host/emu/harness.mjs) attributes the core's memory reads to steps with them; on a real
 * chip they are a few writes to the watchdog's scratch registers, which nothing else uses. */
#ifndef FLM_HAL_RP2040_H
#define FLM_HAL_RP2040_H
#include <stdint.h>

/* Watchdog scratch registers 0..3 (4..7 belong to the boot ROM) carry the marks. */
#define FLM_MARK_BEGIN 0xF1A5B001u     /* SCRATCH2 = step: a forward step starts */
#define FLM_MARK_END 0xF1A5E0D0u       /* the step's forward pass is over */
#define FLM_MARK_REGION 0xF1A5AE60u    /* SCRATCH0..1 = [lo, hi), SCRATCH2 = tier: reads there count */
#define FLM_MARK_FAULT 0xF1A5DEADu     /* SCRATCH2 = exception number, SCRATCH1 = stacked PC */

/* Code linked to run from SRAM (rp2040.ld: copied there with .data at boot), where no XIP cache
 * miss can stall it. Assembly puts such code in a section named .ramtext or .ramtext.NAME. */
#define FLM_RAMFUNC __attribute__((section(".ramtext"), noinline))

/* state is the engine's flm_state (void * so this header needs no engine header). */
void hal_rp2040_step_begin(uint32_t step, const void *state);
void hal_rp2040_step_end(uint32_t step);

#define FLM_STEP_BEGIN(step, state) hal_rp2040_step_begin((step), (state))
#define FLM_STEP_END(step) hal_rp2040_step_end(step)

/* A matvec group's term (float)isum * (sc * xs), bit for bit, in one call (softfloat_m0.s): the
 * kernels use it instead of the plain expression (kernels.c FLM_GROUP_TERM). */
float flm_group_term(int32_t isum, float sc, float xs);
#define FLM_GROUP_TERM flm_group_term

/* kernels.c row_whole (f32 scales, whole groups of a multiple of 8, word-aligned activations) with
 * the group loop in assembly (softfloat_m0.s): the same dots, terms and adds in the same order. */
float flm_row_q8_m0(const uint8_t *p, const int8_t *x, const float *xs, uint32_t ng, uint32_t code_bytes);
float flm_row_q4_m0(const uint8_t *p, const int8_t *x, const float *xs, uint32_t ng, uint32_t code_bytes);
#define FLM_ROW_WHOLE(p, x, xs, ng, g, q8) \
    ((q8) ? flm_row_q8_m0((p), (x), (xs), (ng), (g)) : flm_row_q4_m0((p), (x), (xs), (ng), (g) / 2u))

/* Row-scaled rows (kernels.c rows_rs; softfloat_m0.s): n rows from row on, each row's integer sum
 * (q8: two rows a pass; q4: two codes a product, x being kernels.c rows_rs_lanes' lanes), then
 * float(acc) * (S * X) inline, bit for bit the plain expression, into out[0, n). geom = n_groups |
 * group << 16. The drivers advance row, n and out as they go. */
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
float flm_rs_scale(int32_t acc, float s, float x);   /* the drivers' float(acc) * (s * x), as a function */
#define FLM_RS_ROWS_Q8 flm_rs_rows_q8_m0
#define FLM_RS_ROWS_Q4 flm_rs_rows_q4_m0

/* The int8 attention's integer loops (kernels.c flm_dot2_q8, flm_axpy_q8; n a multiple of 8, 4). */
void flm_dot2_q8_m0(const int8_t *a, const int8_t *b, const int8_t *x, uint32_t n, int32_t out[2]);
void flm_axpy_q8_m0(int32_t *acc, const int8_t *v, int32_t w, uint32_t n);
#define FLM_DOT2_Q8 flm_dot2_q8_m0
#define FLM_AXPY_Q8 flm_axpy_q8_m0

/* kernels.c flm_quantize_act's codes of a group, x[i] * inv as __aeabi_fmul forms it inline. */
void flm_quant_codes_m0(const float *x, uint32_t n, float inv, int8_t *q);
#define FLM_QUANT_CODES flm_quant_codes_m0
#endif
