/* The Cortex-M0+ soft-float's entry points in C, beside softfloat_m0.s (add, multiply, divide,
 * int-to-float, comparisons, kernels) and ../softfloat.c (the complete portable arithmetic). */
#include <stdint.h>

int32_t flm_sf_f2iz(uint32_t a);
int32_t __aeabi_f2iz(uint32_t a);
float flm_group_term_slow(int32_t isum, float sc, float xs);

/* float-to-int, truncating (run-time ABI name; the engine converts only values it has clamped) */
int32_t __aeabi_f2iz(uint32_t a) { return flm_sf_f2iz(a); }

/* flm_group_term's every case off its fast path (softfloat_m0.s): the two products as the plain
 * expression computes them. Floats here are compiled calls to the entry points of this soft-float. */
float flm_group_term_slow(int32_t isum, float sc, float xs) { return (float)isum * (sc * xs); }
