/* The Cortex-M0+ soft-float's kernel entry points (softfloat_m0.s), for kernels.c: force-included
 * (-include) into the engine wherever softfloat.c and softfloat_m0.s are linked, which is every
 * RP2040 build: the bare-metal one (through hal_rp2040.h) and the Arduino-Pico one for the real Pico
 * (firmware/exact_float.py), so both run the same float arithmetic and the same kernels. Plain
 * declarations: C++ sources of the Arduino build see it too, assembler sources nothing. */
#ifndef FLM_SOFTFLOAT_M0_H
#define FLM_SOFTFLOAT_M0_H
#ifndef __ASSEMBLER__   /* an assembler run through the preprocessor sees nothing of it */
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* A matvec group's term (float)isum * (sc * xs), bit for bit, in one call: the kernels use it
 * instead of the plain expression (kernels.c FLM_GROUP_TERM). */
float flm_group_term(int32_t isum, float sc, float xs);
#define FLM_GROUP_TERM flm_group_term

/* kernels.c row_whole (f32 scales, whole groups of a multiple of 8, word-aligned activations) with
 * the group loop in assembly: the same dots, terms and adds in the same order. */
float flm_row_q8_m0(const uint8_t *p, const int8_t *x, const float *xs, uint32_t ng, uint32_t code_bytes);
float flm_row_q4_m0(const uint8_t *p, const int8_t *x, const float *xs, uint32_t ng, uint32_t code_bytes);
#define FLM_ROW_WHOLE(p, x, xs, ng, g, q8) \
    ((q8) ? flm_row_q8_m0((p), (x), (xs), (ng), (g)) : flm_row_q4_m0((p), (x), (xs), (ng), (g) / 2u))

#ifdef __cplusplus
}
#endif
#endif
#endif
