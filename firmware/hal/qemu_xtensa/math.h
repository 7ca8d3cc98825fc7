/* The bare-metal Xtensa build's <math.h>: the engine includes it but takes nothing from it on a
 * core without SIMD (kernels.c uses isless only in its FLM_VECTOR path); no libm is linked: the
 * engine's transcendentals are its own (flm_math.c). */
#ifndef FLM_XTENSA_MATH_H
#define FLM_XTENSA_MATH_H
#endif
