/* FLM_FAULT_TUNED_KERNEL (tests/test_kernels.py only): a build whose q8 kernels are wrong on
 * purpose, which the boot self-check (kernels_check.h) must catch: the hooks kernels.c calls for
 * q8 codes give FLM_DOT_Q8 and FLM_DOT2_Q8's out[0] off by one, FLM_ROW_WHOLE's and FLM_RS_ROWS's
 * q8 rows off by one ulp. kernel_hooks.h includes it last: each wrapper calls the hook as it was
 * defined before it (macros in a function's body expand where the body is written). */
#ifndef FLM_KERNELS_FAULT_H
#define FLM_KERNELS_FAULT_H

static inline __attribute__((always_inline)) float off_by_one_ulp(float v) {
    return flm_f32_from_bits(flm_f32_bits(v) ^ 1u);
}

static inline __attribute__((always_inline)) void fault_dot2_q8(const int8_t *a, const int8_t *b, const flm_act *x,
                                                                uint32_t n, int32_t out[2]) {
    FLM_DOT2_Q8(a, b, x, n, out);
    out[0] ^= 1;
}
#undef FLM_DOT2_Q8
#define FLM_DOT2_Q8 fault_dot2_q8

static inline __attribute__((always_inline)) int32_t fault_dot_q8(const int8_t *w, const flm_act *x, uint32_t n) {
    return FLM_DOT_Q8(w, x, n) ^ 1;
}
#undef FLM_DOT_Q8
#define FLM_DOT_Q8 fault_dot_q8

static inline __attribute__((always_inline)) float fault_row_whole(const uint8_t *p, const flm_act *x, const float *xs,
                                                                   uint32_t ng, uint32_t g, int q8) {
    const float v = FLM_ROW_WHOLE(p, x, xs, ng, g, q8);
    return q8 ? off_by_one_ulp(v) : v;
}
#undef FLM_ROW_WHOLE
#define FLM_ROW_WHOLE fault_row_whole

static inline __attribute__((always_inline)) int fault_rs_rows(const flm_tensor *w, uint32_t r0, uint32_t r1,
                                                               const flm_act *xq, const float *xs, float *out) {
    (void)xq, (void)xs;   /* (the fallback hook takes none of its arguments) */
    if (!FLM_RS_ROWS(w, r0, r1, xq, xs, out)) return 0;
    for (uint32_t i = 0; i < r1 - r0 && w->fmt == FLM_Q8; i++) out[i] = off_by_one_ulp(out[i]);
    return 1;
}
#undef FLM_RS_ROWS
#define FLM_RS_ROWS fault_rs_rows
#endif
