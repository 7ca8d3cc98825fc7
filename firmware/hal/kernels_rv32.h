/* The RV32 kernels (the ESP32-C3's rv32imc, the ESP32-P4's rv32imafc without its SIMD): this ISA's
 * kernel_hooks.h hooks, copied into a project as its src/hal/kernels_arch.h for the boards whose
 * profile says kernels = "rv32" (the real C3 and P4 and their instruction sets in QEMU).
 *
 * The floor of an int8 group dot on rv32imc (docs/kernels.md): LB sign-extends a code as it loads,
 * LH an activation code (int16, flm_act), so a weight costs two loads, a MUL and an ADD, four
 * instructions; the pointers' steps and the loop's branch are shared by a whole unrolled group. An
 * int4 code byte (two weights, row-scaled: nibbles offset by 8) is LBU, ANDI, SRLI, two LH, two MUL
 * and two ADD: 4.5 a weight when the -8 of each
 * code is folded out of the dot (sum (u - 8) x = sum u x - 8 sum x, sum x once per activation group
 * for all rows). The dots below are that code, in inline assembly: GCC keeps a plain C loop rolled
 * (seven instructions a weight), and an unrolled one it schedules all loads of a turn first.
 *
 * The rows take one group at a time (FLM_SCALAR_ROWS): a group's bookkeeping is a few instructions
 * against its dot's 128. The row-scaled rows (the default format) are kernels_rs_scalar.h's over
 * these dots, with a bit-length search for float(acc) and, on the soft-float C3, one product a row. */
#ifndef FLM_KERNELS_ARCH_H
#define FLM_KERNELS_ARCH_H

/* The loops below read activation codes with LH, two bytes a code: flm_act is int16 (kernels.h). A
 * product of an int8 code and a 12-bit activation and a group's sum of them fit in 32 bits
 * (|isum| <= 127 * 2047 * 512 < 2^28), so MUL and ADD keep the exact integer. */
typedef char flm_rv_act_is_int16[sizeof(flm_act) == 2u ? 1 : -1];

/* Two weights at byte offset o: both loads of each, their products, added into s (the operand
 * registers a, b, c, d given by the caller). In assembly, so that the compiler cannot hoist a whole
 * turn's loads ahead of the products (it does, needing 16 registers and spilling the rows' state). */
#define RV_Q8_PAIR(o)                                                                                     \
    "lb %[a], " #o "(%[w])\n\tlh %[b], 2*" #o "(%[x])\n\tlb %[c], " #o "+1(%[w])\n\tlh %[d], 2*" #o "+2(%[x])\n\t" \
    "mul %[a], %[a], %[b]\n\tmul %[c], %[c], %[d]\n\tadd %[s], %[s], %[a]\n\tadd %[s], %[s], %[c]\n\t"

/* dot_q8_rv for n a nonzero multiple of 8: 16 weights a turn when n allows (4 instructions a
 * weight and 3 a turn), else 8. */
static inline __attribute__((always_inline)) int32_t dot8n_q8_rv(const int8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0, a, b, c, d;
    const int8_t *end = w + n;
    if (!(n & 15u)) {
        __asm volatile("1:\n\t" RV_Q8_PAIR(0) RV_Q8_PAIR(2) RV_Q8_PAIR(4) RV_Q8_PAIR(6) RV_Q8_PAIR(8) RV_Q8_PAIR(10)
                       RV_Q8_PAIR(12) RV_Q8_PAIR(14) "addi %[w], %[w], 16\n\taddi %[x], %[x], 32\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(w), [x] "+r"(x), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    } else {
        __asm volatile("1:\n\t" RV_Q8_PAIR(0) RV_Q8_PAIR(2) RV_Q8_PAIR(4) RV_Q8_PAIR(6)
                       "addi %[w], %[w], 8\n\taddi %[x], %[x], 16\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(w), [x] "+r"(x), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    }
    return s;
}

/* dot_q8_scalar's value, any n: the multiple of 8 above, then one weight at a time. */
static inline __attribute__((always_inline)) int32_t dot_q8_rv(const int8_t *w, const flm_act *x, uint32_t n) {
    const uint32_t n8 = n & ~7u;
    int32_t s = n8 ? dot8n_q8_rv(w, x, n8) : 0;
    for (uint32_t i = n8; i < n; i++) s += (int32_t)w[i] * x[i];
    return s;
}
#define FLM_DOT_Q8 dot_q8_rv

/* A code byte at offset o: its two nibbles unsigned, times their activations, added into s. */
#define RV_U4_BYTE(o)                                                                                     \
    "lbu %[a], " #o "(%[w])\n\tlh %[b], 4*" #o "(%[x])\n\tlh %[d], 4*" #o "+2(%[x])\n\tandi %[c], %[a], 15\n\t"       \
    "srli %[a], %[a], 4\n\tmul %[c], %[c], %[b]\n\tmul %[a], %[a], %[d]\n\tadd %[s], %[s], %[c]\n\tadd %[s], %[s], %[a]\n\t"

/* sum u x over n codes (nibbles unsigned, low first), n a multiple of 8: the row-scaled dot less
 * its -8 sum x, which the rows fold in per group. 16 codes a turn when n allows (4.5 instructions a
 * weight and 3 a turn), else 8. */
static inline __attribute__((always_inline)) int32_t dot_u4_rv(const uint8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0, a, b, c, d;
    const uint8_t *end = w + n / 2u;
    if (!n) return 0;
    if (!(n & 15u)) {
        __asm volatile("1:\n\t" RV_U4_BYTE(0) RV_U4_BYTE(1) RV_U4_BYTE(2) RV_U4_BYTE(3) RV_U4_BYTE(4) RV_U4_BYTE(5)
                       RV_U4_BYTE(6) RV_U4_BYTE(7) "addi %[w], %[w], 8\n\taddi %[x], %[x], 32\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(w), [x] "+r"(x), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    } else {
        __asm volatile("1:\n\t" RV_U4_BYTE(0) RV_U4_BYTE(1) RV_U4_BYTE(2) RV_U4_BYTE(3)
                       "addi %[w], %[w], 4\n\taddi %[x], %[x], 16\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(w), [x] "+r"(x), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    }
    return s;
}

/* A code byte at offset o of two's-complement nibbles (q4 with group scales): LB sign-extends the
 * byte, so its high nibble is one SRAI; the low one is shifted to the top and back. 5 instructions a
 * weight, no sum of x to fold. */
#define RV_S4_BYTE(o)                                                                                     \
    "lb %[a], " #o "(%[w])\n\tlh %[b], 4*" #o "(%[x])\n\tlh %[d], 4*" #o "+2(%[x])\n\tslli %[c], %[a], 28\n\t"        \
    "srai %[a], %[a], 4\n\tsrai %[c], %[c], 28\n\tmul %[c], %[c], %[b]\n\tmul %[a], %[a], %[d]\n\t"                  \
    "add %[s], %[s], %[c]\n\tadd %[s], %[s], %[a]\n\t"

/* dot_q4_scalar's value (q4 with group scales): 16 codes a turn where n allows, else 8, then one
 * code at a time. */
static inline __attribute__((always_inline)) int32_t dot_q4_rv(const uint8_t *restrict w, const flm_act *restrict x,
                                                               uint32_t n) {
    const uint32_t n8 = n & ~7u;
    const uint8_t *wp = w, *end = w + n8 / 2u;
    const flm_act *xp = x;
    int32_t s = 0, a, b, c, d;
    if (n8 && !(n8 & 15u)) {
        __asm volatile("1:\n\t" RV_S4_BYTE(0) RV_S4_BYTE(1) RV_S4_BYTE(2) RV_S4_BYTE(3) RV_S4_BYTE(4) RV_S4_BYTE(5)
                       RV_S4_BYTE(6) RV_S4_BYTE(7) "addi %[w], %[w], 8\n\taddi %[x], %[x], 32\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(wp), [x] "+r"(xp), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    } else if (n8) {
        __asm volatile("1:\n\t" RV_S4_BYTE(0) RV_S4_BYTE(1) RV_S4_BYTE(2) RV_S4_BYTE(3)
                       "addi %[w], %[w], 4\n\taddi %[x], %[x], 16\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(wp), [x] "+r"(xp), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    }
    for (uint32_t i = n8; i < n; i++) s += ((int32_t)(((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) ^ 8u) - 8) * x[i];
    return s;
}
#define FLM_DOT_Q4 dot_q4_rv

/* Two elements (at byte offset 2o) of the k12 attention's two dots: their query codes and both K
 * rows' codes (int16: LH), four products, added into s0 (row a) and s1 (row b); the second
 * element's loads placed between the first's products, so that no loaded value is used by the
 * next instruction. */
#define RV_Q12_PAIR(o)                                                                                    \
    "lh %[x0], 2*" #o "(%[x])\n\tlh %[a0], 2*" #o "(%[a])\n\tlh %[b0], 2*" #o "(%[b])\n\t"                      \
    "lh %[x1], 2*" #o "+2(%[x])\n\tmul %[a0], %[a0], %[x0]\n\tmul %[b0], %[b0], %[x0]\n\t"                      \
    "lh %[a1], 2*" #o "+2(%[a])\n\tlh %[b1], 2*" #o "+2(%[b])\n\tadd %[s0], %[s0], %[a0]\n\t"                   \
    "add %[s1], %[s1], %[b0]\n\tmul %[a1], %[a1], %[x1]\n\tmul %[b1], %[b1], %[x1]\n\t"                         \
    "add %[s0], %[s0], %[a1]\n\tadd %[s1], %[s1], %[b1]\n\t"

/* dot2_q12_scalar's values (k12 K rows a and b against the query's codes x, |c| <= 2047, n <= 512:
 * int32 sums): 8 elements a turn (3.5 instructions a product and 4 a turn; GCC's loop of the
 * reference takes 7 a product), then one element at a time. */
static inline __attribute__((always_inline)) void dot2_q12_rv(const int16_t *a, const int16_t *b, const flm_act *x,
                                                              uint32_t n, int32_t out[2]) {
    const uint32_t n8 = n & ~7u;
    const int16_t *pa = a, *pb = b, *end = a + n8;
    const flm_act *px = x;
    int32_t s0 = 0, s1 = 0, a0, b0, x0, a1, b1, x1;
    if (n8) {
        __asm volatile("1:\n\t" RV_Q12_PAIR(0) RV_Q12_PAIR(2) RV_Q12_PAIR(4) RV_Q12_PAIR(6)
                       "addi %[a], %[a], 16\n\taddi %[b], %[b], 16\n\taddi %[x], %[x], 16\n\tbne %[a], %[e], 1b"
                       : [s0] "+r"(s0), [s1] "+r"(s1), [a] "+r"(pa), [b] "+r"(pb), [x] "+r"(px), [a0] "=&r"(a0),
                         [b0] "=&r"(b0), [x0] "=&r"(x0), [a1] "=&r"(a1), [b1] "=&r"(b1), [x1] "=&r"(x1)
                       : [e] "r"(end)
                       : "memory");
    }
    dot2_q12_scalar(a + n8, b + n8, x + n8, n - n8, out);   /* the tail */
    out[0] += s0;
    out[1] += s1;
}
#define FLM_DOT2_Q12 dot2_q12_rv
#define FLM_SCALAR_ROWS 1

/* The bits of a nonzero x's highest set bit, plus one (rv32imc has no count-leading-zeros). */
static inline uint32_t bit_length_rv(uint32_t x) {
    uint32_t n = 1;
    if (x >> 16) { n += 16; x >>= 16; }
    if (x >> 8) { n += 8; x >>= 8; }
    if (x >> 4) { n += 4; x >>= 4; }
    if (x >> 2) { n += 2; x >>= 2; }
    return n + (x >> 1);
}

/* f * (s * x) as the reference rounds it. Without an FPU each product is a soft-float call: when s
 * is a normal power of two (the quantizer's row scales are) and s * x and f * x are normal with a
 * binade to spare, f * (s * x) = f * x with s's exponent added, one product instead of two (a power
 * of two times a normal number is exact, and rounding to nearest commutes with it away from the
 * subnormals and the overflow); any other operands take the two products. */
static inline float scale_row_rv(float f, float s, float x) {
#ifndef __riscv_flen
    const uint32_t sb = flm_f32_bits(s), es = sb >> 23 & 255u, ex = flm_f32_bits(x) >> 23 & 255u;
    const int32_t k = (int32_t)es - 127;
    if (!(sb & 0x7fffffu) && es - 1u < 254u && ex - 1u < 254u && (uint32_t)((int32_t)ex + k - 1) < 254u) {
        const uint32_t y = flm_f32_bits(f * x), ey = y >> 23 & 255u;
        if (ey - 1u < 254u && (uint32_t)((int32_t)ey + k - 2) < 252u)
            return flm_f32_from_bits((y + ((uint32_t)k << 23)) ^ (sb & 0x80000000u));
    }
#endif
    return f * (s * x);
}

#define RS_DOT_Q8 dot8n_q8_rv
#define RS_DOT_U4 dot_u4_rv
#define RS_BIT_LENGTH bit_length_rv
#define RS_SCALE scale_row_rv
#include "kernels_rs_scalar.h"
#endif
