/* Every per-architecture override hook of the kernels, each with its bit-exact contract and its
 * fallback. kernels.c, the kernels' one translation unit, includes this file and calls the hooks
 * by these names only.
 *
 * Where a hook is defined (once):
 * - by the vectorised kernels of cores with SIMD (kernels_vec.h, when kernels.h sets FLM_VECTOR);
 * - by a core's own kernels: a header named kernels_arch.h in its HAL directory, which every build
 *   of that HAL copies into src/hal (on the include path; e.g. firmware/hal/rp2040/kernels_arch.h,
 *   the Cortex-M0+). It defines the hooks it has faster kernels for, and nothing else (on a core
 *   with SIMD, only hooks kernels_vec.h leaves to their fallbacks);
 * - else by the fallbacks below: the reference kernels (kernels_ref.h) or portable C.
 * Adding an instruction set is a kernels_arch.h under its HAL (kernels_ref.h's helpers are in
 * scope); a HAL that serves two (hal/esp32: the ESP32-S3's Xtensa, the ESP32-C3's rv32imc) picks
 * by the compiler's macros inside it. The boot self-check (kernels_check.h) then compares its
 * kernels with the reference.
 *
 * "Bit for bit" means every output bit equal to the reference's for every input the engine passes
 * (integer sums are exact in any order; float steps must be the reference's, in its order).
 * A hook named as a function may be a function-like macro, and vice versa, except the dots
 * FLM_DOT_Q8, FLM_DOT_Q4 and FLM_DOT_Q4O: the rows take them as arguments, so they name functions. */
#ifndef FLM_KERNEL_HOOKS_H
#define FLM_KERNEL_HOOKS_H
#include "kernels_ref.h"

/* What the drop-ins share with kernels.c. A row kernel computes a block of up to ISUM_BLOCK groups'
 * integer dots (isums, kind: 1 q8, 0 q4, KIND_Q4O row-scaled q4 offset by 8), then scales and folds
 * them by its weight format's rule in the reference's order. */
#define ISUM_BLOCK 32u
#define KIND_Q4O 2
#define FLM_CHECK_TOKENS 5u   /* the boot self-check's pass (FLM_PASS_ROWS_AGREE) */
static inline __attribute__((always_inline)) void isums(const uint8_t *codes, size_t step, const flm_act *x, uint32_t g,
                                                        uint32_t ng, int kind, int32_t *isum);
typedef void (*isums_fn)(const uint8_t *codes, size_t step, const flm_act *x, uint32_t ng, int32_t *isum);
typedef void (*rows_fn)(const uint8_t *data, size_t stride, uint32_t r0, uint32_t r1, const flm_act *xq,
                        const float *xs, uint32_t ng, float *out);

#ifdef FLM_VECTOR
#include "kernels_vec.h"
#endif
#if defined(__has_include)
#if __has_include("kernels_arch.h")
#include "kernels_arch.h"
#endif
#endif

/* ---- the activations' quantizer (flm_quantize_act, flm_quantize_i8) ------------------------ */

/* FLM_AMAX_BITS(x, len) -> uint32_t: the bits of the largest |x[i]| that is not NaN (0 if none).
 * Fallback: amax_bits_of (kernels_ref.h), a loop on the floats' bits. */
#ifndef FLM_AMAX_BITS
#define FLM_AMAX_BITS amax_bits_of
#endif

/* FLM_QUANT_CODES(x, n, inv, q): q[i] = act_code(x[i], inv) (kernels_ref.h: clamped to +-127,
 * rounded half away from zero, NaN 0) for int8_t q[n]; a statement. Fallback: act_codes. */
#ifndef FLM_QUANT_CODES
#define FLM_QUANT_CODES act_codes
#endif

/* FLM_ACT_CODES_Q(x, n, inv, qmax, q): the codes clamped to +-qmax (127 or 2047; act_codes_q) into
 * flm_act (int16) q[n]; a statement. Fallback: act_codes_q (kernels_ref.h). */
#ifndef FLM_ACT_CODES_Q
#define FLM_ACT_CODES_Q act_codes_q
#endif

/* ---- group dot products --------------------------------------------------------------------- */

/* FLM_DOT_Q8(w, x, n) -> int32_t: the exact dot of n int8 codes with n activation codes, any n and
 * alignment. Fallback: dot_q8_scalar (kernels_ref.h). */
#ifndef FLM_DOT_Q8
#define FLM_DOT_Q8 dot_q8_scalar
#endif

/* FLM_DOT_Q4X(w, x, n, o) -> int32_t: the same for int4 codes two per byte, low nibble first, each
 * code lo4/hi4's with offset o: two's complement (o = 8, q4; dot_q4_scalar) or offset by 8 (o = 0,
 * row-scaled q4; dot_q4o_scalar). Fallback: dot_q4x, a pair of codes a turn, each code byte read
 * once. FLM_DOT_Q4(w, x, n) and FLM_DOT_Q4O(w, x, n): the two as functions of their own (a core
 * may have its own for either); fallback: FLM_DOT_Q4X with o = 8, and o = 0. */
static inline __attribute__((always_inline)) int32_t dot_q4x(const uint8_t *restrict w, const flm_act *restrict x,
                                                             uint32_t n, uint32_t o) {
    int32_t s = 0;
    for (uint32_t j = 0; j < n / 2u; j++) s += lo4(w[j], o) * (int32_t)x[2u * j] + hi4(w[j], o) * (int32_t)x[2u * j + 1u];
    if (n & 1u) s += lo4(w[n / 2u], o) * (int32_t)x[n - 1u];
    return s;
}
#ifndef FLM_DOT_Q4X
#define FLM_DOT_Q4X dot_q4x
#endif
#if !defined(FLM_DOT_Q4) || !defined(FLM_DOT_Q4O)
static inline __attribute__((always_inline)) int32_t dot_q4(const uint8_t *restrict w, const flm_act *restrict x,
                                                            uint32_t n) {
    return FLM_DOT_Q4X(w, x, n, 8u);
}
static inline __attribute__((always_inline)) int32_t dot_q4o(const uint8_t *restrict w, const flm_act *restrict x,
                                                             uint32_t n) {
    return FLM_DOT_Q4X(w, x, n, 0u);
}
#endif
#ifndef FLM_DOT_Q4
#define FLM_DOT_Q4 dot_q4
#endif
#ifndef FLM_DOT_Q4O
#define FLM_DOT_Q4O dot_q4o
#endif

/* FLM_DOT2_Q8(a, b, x, n, out): the int8 attention's two dots sharing x, out[0] = a.x and out[1] =
 * b.x as FLM_DOT_Q8's (dot2_scalar); a, b and x word aligned, any n. Fallback: two FLM_DOT_Q8. */
#ifndef FLM_DOT2_Q8
#define FLM_DOT2_Q8(a, b, x, n, out) ((out)[0] = FLM_DOT_Q8(a, x, n), (out)[1] = FLM_DOT_Q8(b, x, n))
#endif

/* FLM_DOT2_Q12(a, b, x, n, out): the k12 attention's two dots sharing x, out[0] = a.x and out[1] =
 * b.x for int16 K codes a, b and query codes x (all |c| <= 2047, n <= 512: int32 sums;
 * dot2_q12_scalar); a, b and x word aligned, any n. Fallback: dot2_q12_scalar (kernels_ref.h). */
#ifndef FLM_DOT2_Q12
#define FLM_DOT2_Q12 dot2_q12_scalar
#endif

/* FLM_AXPY_Q8(acc, v, w, n): acc[i] += w * v[i] for n int8 codes v (axpy_scalar; int32 sums, which
 * the attention keeps from overflowing), v word aligned, any n. Fallback: axpy_scalar. */
#ifndef FLM_AXPY_Q8
#define FLM_AXPY_Q8 axpy_scalar
#endif

/* ---- rows -------------------------------------------------------------------------------------- */

/* FLM_ISUMS_FOR(g, q8) -> isums_fn or 0: isums of q8 (1) or q4 (0) codes for group size g compiled
 * for that size, or 0 to take the loops of the general length. Fallback: 0. */
#ifndef FLM_ISUMS_FOR
#define FLM_ISUMS_FOR(g, q8) ((isums_fn)0)
#endif

/* FLM_ROWS_FOR(w) -> rows_fn or 0: rows of w's shape compiled for it (f32 scales or row-scaled,
 * whole groups of a common size), bit for bit the reference's rows, or 0 for the general rows.
 * Fallback: 0. */
#ifndef FLM_ROWS_FOR
#define FLM_ROWS_FOR(w) ((rows_fn)0)
#endif

/* FLM_SCALAR_ROWS: 1 where rows take one group at a time (the group term, the whole-row loop and
 * the row-scaled rows below; cores without SIMD, where a group's bookkeeping costs more than its
 * dot), 0 where they take the integer dots of a block of groups first (isums), which vectorise.
 * Fallback: 0. */
#ifndef FLM_SCALAR_ROWS
#define FLM_SCALAR_ROWS 0
#endif

/* FLM_GROUP_TERM(isum, sc, xs) -> float: group_term's (float)isum * (sc * xs), bit for bit, for the
 * one-group-at-a-time rows. Fallback: group_term (kernels_ref.h). */
#ifndef FLM_GROUP_TERM
#define FLM_GROUP_TERM group_term
#endif

/* FLM_ROW_WHOLE(p, x, xs, ng, g, q8) -> float: row_with's value for a row at p of ng whole groups
 * of g codes (g a multiple of 8) with f32 scales, q8 or q4 (q8 = 0), x word aligned: the same dots,
 * terms and adds in the same order. Fallback: row_whole, one lean loop without the per-group
 * format tests and length arithmetic. */
#ifndef FLM_ROW_WHOLE
static inline __attribute__((always_inline)) float row_whole(const uint8_t *p, const flm_act *x, const float *xs,
                                                             uint32_t ng, uint32_t g, int q8) {
    const uint32_t step = 4u + (q8 ? g : g / 2u);   /* scale + codes, no padding */
    float acc = FLM_GROUP_TERM(q8 ? FLM_DOT_Q8((const int8_t *)(p + 4), x, g) : FLM_DOT_Q4(p + 4, x, g), rdf(p), xs[0]);
    for (uint32_t gi = 1; gi < ng; gi++) {
        p += step;
        x += g;
        acc = acc + FLM_GROUP_TERM(q8 ? FLM_DOT_Q8((const int8_t *)(p + 4), x, g) : FLM_DOT_Q4(p + 4, x, g), rdf(p),
                                   xs[gi]);
    }
    return acc;
}
#define FLM_ROW_WHOLE row_whole
#endif

/* FLM_RS_ROWS(w, r0, r1, xq, xs, out) -> int: rows [r0, r1) of the row-scaled w into out[0..), each
 * row_rs's bit for bit, returning 1; or 0, computing nothing, for a shape it does not take. For
 * the one-group-at-a-time rows. Fallback: 0 (row_rs per row). */
#ifndef FLM_RS_ROWS
#define FLM_RS_ROWS(w, r0, r1, xq, xs, out) 0
#endif

/* hal_matmul (hal.h) is the board's hook for a whole matrix product: it may split rows across its
 * cores; kernels.c's weak default runs them all on the calling core. */

/* FLM_PASS_ROWS_AGREE(w, x, stride, xs) -> int, for the boot self-check only: a HAL's own rows for
 * several tokens at once (a pass's product outside kernels.c, e.g. the RP2040's staged rows) on the
 * row-scaled w against row_rs token by token, FLM_CHECK_TOKENS tokens (codes at x + t * stride, X
 * at xs[t]): 1 when bit for bit the same or when it has none for w's shape. No fallback: without
 * it the check has nothing more to compare. */

#ifdef FLM_FAULT_TUNED_KERNEL
#include "kernels_fault.h"
#endif
#endif
