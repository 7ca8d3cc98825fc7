/* The Xtensa LX7 kernels (the ESP32-S3's core without its PIE SIMD): this ISA's kernel_hooks.h hooks,
 * copied into a project as its src/hal/kernels_arch.h for the boards whose profile says
 * kernels = "xtensa" (the real S3 boards and their instruction set in QEMU).
 *
 * The floor of an int8 group dot here (docs/kernels.md): no load sign-extends a byte, so a code is
 * L8UI + SEXT; an activation code (int16, flm_act) is one L16SI; then MAC16's MULA.AA.LL (the 40-bit
 * ACC += the signed low halves of two registers): four instructions, in a zero-overhead LOOP whose
 * two pointer steps a turn of 16 weights share. An int4 code byte of a row-scaled tensor (two
 * weights, offset by 8) is L8UI, two EXTUI, two L16SI and two MULA.AA.LL: 3.5 a weight, the -8 of
 * each code folded out of the dot (sum (u - 8) x = sum u x - 8 sum x, sum x once per activation
 * group for all rows). The dots are that code in inline assembly: clang emits a plain
 * rolled loop of ten instructions a weight, no LOOP and no MAC16.
 *
 * The rows take one group at a time (FLM_SCALAR_ROWS). The row-scaled rows (the default format) are
 * kernels_rs_scalar.h's over these dots, NSAU finding float(acc)'s top bit, the FPU's two products. */
#ifndef FLM_KERNELS_ARCH_H
#define FLM_KERNELS_ARCH_H

/* The loops below read activation codes with L16SI, two bytes a code: flm_act is int16 (kernels.h),
 * so MULA.AA.LL's low halves hold a code and an activation whole. */
typedef char flm_xt_act_is_int16[sizeof(flm_act) == 2u ? 1 : -1];

/* One weight at offset o: code loaded and sign-extended, activation loaded, their product into ACC.
 * Each load is an instruction away from its use: on the LX7's pipeline a loaded value used by the
 * next instruction stalls a cycle (the instruction count is the same either way). */
#define XT_Q8(o)                                                                                          \
    "l8ui %[a], %[w], " #o "\n\tl16si %[b], %[x], 2*" #o "\n\tsext %[a], %[a], 7\n\tmula.aa.ll %[a], %[b]\n\t"
#define XT_Q8_4(o0, o1, o2, o3) XT_Q8(o0) XT_Q8(o1) XT_Q8(o2) XT_Q8(o3)

/* dot_q8_scalar's value for n a nonzero multiple of 8 (|sum| <= 127 * 2047 * n < 2^31 for n up to
 * 8,260, beyond any group: ACC's low word holds the sum):
 * 16 weights a LOOP turn when n allows, else 8. */
static inline __attribute__((always_inline)) int32_t dot8n_q8_xt(const int8_t *w, const flm_act *x, uint32_t n) {
    int32_t s, a, b;
    uint32_t turns = n & 15u ? n / 8u : n / 16u;
    if (n & 15u) {
        __asm volatile("movi %[a], 0\n\twsr %[a], acclo\n\twsr %[a], acchi\n\tloop %[t], 1f\n\t"
                       XT_Q8_4(0, 1, 2, 3) XT_Q8_4(4, 5, 6, 7) "addi %[w], %[w], 8\n\taddi %[x], %[x], 16\n"
                       "1:\n\trsr %[s], acclo"
                       : [s] "=r"(s), [a] "=&r"(a), [b] "=&r"(b), [w] "+r"(w), [x] "+r"(x), [t] "+r"(turns)
                       :
                       : "memory");
    } else {
        __asm volatile("movi %[a], 0\n\twsr %[a], acclo\n\twsr %[a], acchi\n\tloop %[t], 1f\n\t"
                       XT_Q8_4(0, 1, 2, 3) XT_Q8_4(4, 5, 6, 7) XT_Q8_4(8, 9, 10, 11) XT_Q8_4(12, 13, 14, 15)
                       "addi %[w], %[w], 16\n\taddi %[x], %[x], 32\n"
                       "1:\n\trsr %[s], acclo"
                       : [s] "=r"(s), [a] "=&r"(a), [b] "=&r"(b), [w] "+r"(w), [x] "+r"(x), [t] "+r"(turns)
                       :
                       : "memory");
    }
    return s;
}

/* dot_q8_scalar's value, any n: the multiple of 8 above, then one weight at a time. */
static inline __attribute__((always_inline)) int32_t dot_q8_xt(const int8_t *w, const flm_act *x, uint32_t n) {
    const uint32_t n8 = n & ~7u;
    int32_t s = n8 ? dot8n_q8_xt(w, x, n8) : 0;
    for (uint32_t i = n8; i < n; i++) s += (int32_t)w[i] * x[i];
    return s;
}
#define FLM_DOT_Q8 dot_q8_xt

/* A code byte at offset o (its activations at byte offsets xo and xo + 2): both nibbles unsigned,
 * times their activations, into ACC. */
#define XT_U4(o, xo)                                                                                      \
    "l8ui %[a], %[w], " #o "\n\tl16si %[b], %[x], " #xo "\n\textui %[c], %[a], 0, 4\n\tmula.aa.ll %[c], %[b]\n\t" \
    "l16si %[b], %[x], " #xo "+2\n\textui %[c], %[a], 4, 4\n\tmula.aa.ll %[c], %[b]\n\t"

/* One LOOP of n_turns turns over the code bytes at wp and their activations at xp, each turn 4 code
 * bytes (XT_TURN4: 8 codes) or 8 (XT_TURN8: 16 codes) by STEP (XT_U4 or XT_S4), the sum from ACC into
 * sum (its parameters named apart from the operands, which a macro would rename too). */
#define XT_TURN4(STEP) STEP(0, 0) STEP(1, 4) STEP(2, 8) STEP(3, 12) "addi %[w], %[w], 4\n\taddi %[x], %[x], 16\n"
#define XT_TURN8(STEP)                                                                                     \
    STEP(0, 0) STEP(1, 4) STEP(2, 8) STEP(3, 12) STEP(4, 16) STEP(5, 20) STEP(6, 24) STEP(7, 28)              \
    "addi %[w], %[w], 8\n\taddi %[x], %[x], 32\n"
#define XT_NIBBLE_LOOP(sum, wp, xp, n_turns, TURN)                                                    \
    do {                                                                                                  \
        int32_t a_, b_, c_;                                                                               \
        __asm volatile("movi %[a], 0\n\twsr %[a], acclo\n\twsr %[a], acchi\n\tloop %[t], 1f\n\t" TURN     \
                       "1:\n\trsr %[s], acclo"                                                             \
                       : [s] "=r"(sum), [a] "=&r"(a_), [b] "=&r"(b_), [c] "=&r"(c_), [w] "+r"(wp), [x] "+r"(xp), \
                         [t] "+r"(n_turns)                                                                \
                       :                                                                                  \
                       : "memory");                                                                       \
    } while (0)

/* sum u x over n codes (nibbles unsigned, low first), n a nonzero multiple of 8: the row-scaled dot
 * less its -8 sum x, which the rows fold in per group. 16 codes a LOOP turn when n allows, else 8. */
static inline __attribute__((always_inline)) int32_t dot_u4_xt(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s;
    uint32_t turns = n & 15u ? n / 8u : n / 16u;
    if (n & 15u) XT_NIBBLE_LOOP(s, w, x, turns, XT_TURN4(XT_U4));
    else XT_NIBBLE_LOOP(s, w, x, turns, XT_TURN8(XT_U4));
    return s;
}

/* A code byte at offset o of two's-complement nibbles (q4 with group scales; its activations at byte
 * offsets xo and xo + 2): each nibble shifted to the top and arithmetically back (SEXT takes bit 7 at
 * the lowest), times its activation, into ACC. */
#define XT_S4(o, xo)                                                                                      \
    "l8ui %[a], %[w], " #o "\n\tl16si %[b], %[x], " #xo "\n\tslli %[c], %[a], 28\n\tsrai %[c], %[c], 28\n\t"  \
    "mula.aa.ll %[c], %[b]\n\tl16si %[b], %[x], " #xo "+2\n\tslli %[c], %[a], 24\n\tsrai %[c], %[c], 28\n\t"  \
    "mula.aa.ll %[c], %[b]\n\t"

/* dot_q4_scalar's value (q4 with group scales, two's-complement codes): 16 codes a LOOP turn when n
 * allows (72 instructions, 222 bytes: inside LOOP's 256-byte reach now that an activation is one
 * L16SI), else 8, then one code at a time. 4.5 instructions a weight and 2 a turn: no sum of x to
 * fold, which a group-scaled row would redo per row. */
static inline __attribute__((always_inline)) int32_t dot_q4_xt(const uint8_t *restrict w, const flm_act *restrict x,
                                                               uint32_t n) {
    const uint32_t n8 = n & ~7u;
    int32_t s = 0;
    uint32_t turns = n8 & 15u ? n8 / 8u : n8 / 16u;
    const uint8_t *wp = w;
    const flm_act *xp = x;
    if (n8 & 15u) XT_NIBBLE_LOOP(s, wp, xp, turns, XT_TURN4(XT_S4));
    else if (n8) XT_NIBBLE_LOOP(s, wp, xp, turns, XT_TURN8(XT_S4));
    for (uint32_t i = n8; i < n; i++) s += ((int32_t)(((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) ^ 8u) - 8) * x[i];
    return s;
}
#define FLM_DOT_Q4 dot_q4_xt

/* One element (at byte offset 2o) of the k12 attention's two dots: both K rows' codes and the query's
 * code (int16: L16SI), row a's product into ACC (MULA.AA.LL), row b's by MUL16S added into s1; each
 * load an instruction away from its use (the LX7 stalls a cycle otherwise). */
#define XT_Q12(o)                                                                                         \
    "l16si %[va], %[a], 2*" #o "\n\tl16si %[vx], %[x], 2*" #o "\n\tl16si %[vb], %[b], 2*" #o "\n\t"             \
    "mula.aa.ll %[va], %[vx]\n\tmul16s %[vb], %[vb], %[vx]\n\tadd %[s1], %[s1], %[vb]\n\t"

/* dot2_q12_scalar's values (k12 K rows a and b against the query's codes x, |c| <= 2047, n <= 512:
 * int32 sums, ACC's low word holds row a's): 8 elements a LOOP turn (3 instructions a product, 3
 * pointer steps a turn; clang's loop of the reference takes 8 a product), then one element at a time. Not
 * inlined: inlined into the boot self-check's large frame, clang-22 fails to find a register to
 * spill through. */
static __attribute__((noinline)) void dot2_q12_xt(const int16_t *a, const int16_t *b, const flm_act *x,
                                                              uint32_t n, int32_t out[2]) {
    const uint32_t n8 = n & ~7u;
    const int16_t *pa = a, *pb = b;
    const flm_act *px = x;
    uint32_t turns = n8 / 8u;
    int32_t s0 = 0, s1 = 0, va, vb, vx;
    if (n8) {
        __asm volatile("movi %[va], 0\n\twsr %[va], acclo\n\twsr %[va], acchi\n\tloop %[t], 1f\n\t"
                       XT_Q12(0) XT_Q12(1) XT_Q12(2) XT_Q12(3) XT_Q12(4) XT_Q12(5) XT_Q12(6) XT_Q12(7)
                       "addi %[a], %[a], 16\n\taddi %[b], %[b], 16\n\taddi %[x], %[x], 16\n"
                       "1:\n\trsr %[s0], acclo"
                       : [s0] "=r"(s0), [s1] "+r"(s1), [a] "+r"(pa), [b] "+r"(pb), [x] "+r"(px), [t] "+r"(turns),
                         [va] "=&r"(va), [vb] "=&r"(vb), [vx] "=&r"(vx)
                       :
                       : "memory");
    }
    dot2_q12_scalar(a + n8, b + n8, x + n8, n - n8, out);   /* the tail */
    out[0] += s0;
    out[1] += s1;
}
#define FLM_DOT2_Q12 dot2_q12_xt

#define FLM_SCALAR_ROWS 1

/* The bits of a nonzero x up to its highest set bit (NSAU counts the zeros above it). */
static inline uint32_t bit_length_xt(uint32_t x) { return 32u - (uint32_t)__builtin_clz(x); }

/* f * (s * x): the FPU's two products, as the reference rounds them. */
static inline float scale_row_xt(float f, float s, float x) { return f * (s * x); }

#define RS_DOT_Q8 dot8n_q8_xt
#define RS_DOT_U4 dot_u4_xt
#define RS_BIT_LENGTH bit_length_xt
#define RS_SCALE scale_row_xt
#include "kernels_rs_scalar.h"
#endif
