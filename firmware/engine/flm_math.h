/* Deterministic float functions mirrored exactly by converter/reference.py (no libm). */
#ifndef FLM_MATH_H
#define FLM_MATH_H
float flm_expf(float x);   /* range reduction to [-ln2/2, ln2/2] + degree-6 polynomial */
float flm_sqrtf(float x);  /* correctly rounded, like IEEE sqrt, for x >= 0 */
float flm_silu(float x);   /* x / (1 + exp(-x)) */
float flm_gelu(float x);   /* tanh-approximation GELU: x / (1 + exp(-2u)), u = K0 x + K1 x^3 */
#endif
