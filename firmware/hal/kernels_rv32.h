/* The RV32 kernels (the ESP32-C3's rv32imc, the ESP32-P4's rv32imafc without its SIMD): this ISA's
 * kernel_hooks.h hooks, copied into a project as its src/hal/kernels_arch.h for the boards whose
 * profile says kernels = "rv32" (the real C3 and P4 and their instruction sets in QEMU).
 *
 * The floor of an int8 group dot on rv32imc (docs/kernels.md): LB sign-extends as it loads, so a
 * weight costs two loads, a MUL and an ADD, four instructions; the pointers' steps and the loop's
 * branch are shared by a whole unrolled group. An int4 code byte (two weights, row-scaled: nibbles
 * offset by 8) is LBU, ANDI, SRLI, two LB, two MUL and two ADD: 4.5 a weight when the -8 of each
 * code is folded out of the dot (sum (u - 8) x = sum u x - 8 sum x, sum x once per activation group
 * for all rows). The dots below are that code, in inline assembly: GCC keeps a plain C loop rolled
 * (seven instructions a weight), and an unrolled one it schedules all loads of a turn first.
 *
 * The rows take one group at a time (FLM_SCALAR_ROWS): a group's bookkeeping is a few instructions
 * against its dot's 128. The row-scaled rows (the default format) keep each row's fixed cost small:
 * the multiplier-weighted sum in int32 where it cannot overflow, float(acc) built on the bits (one
 * bit-length search, no shift loop, no int-to-float call), then the reference's two products. */
#ifndef FLM_KERNELS_ARCH_H
#define FLM_KERNELS_ARCH_H

/* The loops below read activation codes with LB: they are int8 under the numerics contract these
 * kernels were written against (an int16 contract needs LH and a step of 2 a code). */
typedef char flm_rv_act_is_int8[sizeof(flm_act) == 1u ? 1 : -1];

/* Two weights at byte offset o: both loads of each, their products, added into s (the operand
 * registers a, b, c, d given by the caller). In assembly, so that the compiler cannot hoist a whole
 * turn's loads ahead of the products (it does, needing 16 registers and spilling the rows' state). */
#define RV_Q8_PAIR(o)                                                                                     \
    "lb %[a], " #o "(%[w])\n\tlb %[b], " #o "(%[x])\n\tlb %[c], " #o "+1(%[w])\n\tlb %[d], " #o "+1(%[x])\n\t"     \
    "mul %[a], %[a], %[b]\n\tmul %[c], %[c], %[d]\n\tadd %[s], %[s], %[a]\n\tadd %[s], %[s], %[c]\n\t"

/* dot_q8_rv for n a nonzero multiple of 8: 16 weights a turn when n allows (4 instructions a
 * weight and 3 a turn), else 8. */
static inline __attribute__((always_inline)) int32_t dot8n_q8_rv(const int8_t *w, const flm_act *x, uint32_t n) {
    int32_t s = 0, a, b, c, d;
    const int8_t *end = w + n;
    if (!(n & 15u)) {
        __asm volatile("1:\n\t" RV_Q8_PAIR(0) RV_Q8_PAIR(2) RV_Q8_PAIR(4) RV_Q8_PAIR(6) RV_Q8_PAIR(8) RV_Q8_PAIR(10)
                       RV_Q8_PAIR(12) RV_Q8_PAIR(14) "addi %[w], %[w], 16\n\taddi %[x], %[x], 16\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(w), [x] "+r"(x), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    } else {
        __asm volatile("1:\n\t" RV_Q8_PAIR(0) RV_Q8_PAIR(2) RV_Q8_PAIR(4) RV_Q8_PAIR(6)
                       "addi %[w], %[w], 8\n\taddi %[x], %[x], 8\n\tbne %[w], %[e], 1b"
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
    "lbu %[a], " #o "(%[w])\n\tlb %[b], 2*" #o "(%[x])\n\tlb %[d], 2*" #o "+1(%[x])\n\tandi %[c], %[a], 15\n\t"       \
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
                       RV_U4_BYTE(6) RV_U4_BYTE(7) "addi %[w], %[w], 8\n\taddi %[x], %[x], 16\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(w), [x] "+r"(x), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    } else {
        __asm volatile("1:\n\t" RV_U4_BYTE(0) RV_U4_BYTE(1) RV_U4_BYTE(2) RV_U4_BYTE(3)
                       "addi %[w], %[w], 4\n\taddi %[x], %[x], 8\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(w), [x] "+r"(x), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    }
    return s;
}

/* dot_q4o_scalar's value (row-scaled q4, codes offset by 8): the unsigned dot where n allows, -8 sum x. */
static inline __attribute__((always_inline)) int32_t dot_q4o_rv(const uint8_t *restrict w, const flm_act *restrict x,
                                                                uint32_t n) {
    const uint32_t n8 = n & ~7u;
    int32_t s = dot_u4_rv(w, x, n8), sx = 0;
    for (uint32_t i = 0; i < n8; i++) sx += x[i];
    s -= 8 * sx;
    for (uint32_t i = n8; i < n; i++) s += ((int32_t)((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) - 8) * x[i];
    return s;
}
#define FLM_DOT_Q4O dot_q4o_rv

/* A code byte at offset o of two's-complement nibbles (q4 with group scales): LB sign-extends the
 * byte, so its high nibble is one SRAI; the low one is shifted to the top and back. 5 instructions a
 * weight, no sum of x to fold. */
#define RV_S4_BYTE(o)                                                                                     \
    "lb %[a], " #o "(%[w])\n\tlb %[b], 2*" #o "(%[x])\n\tlb %[d], 2*" #o "+1(%[x])\n\tslli %[c], %[a], 28\n\t"        \
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
                       RV_S4_BYTE(6) RV_S4_BYTE(7) "addi %[w], %[w], 8\n\taddi %[x], %[x], 16\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(wp), [x] "+r"(xp), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    } else if (n8) {
        __asm volatile("1:\n\t" RV_S4_BYTE(0) RV_S4_BYTE(1) RV_S4_BYTE(2) RV_S4_BYTE(3)
                       "addi %[w], %[w], 4\n\taddi %[x], %[x], 8\n\tbne %[w], %[e], 1b"
                       : [s] "+r"(s), [w] "+r"(wp), [x] "+r"(xp), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d)
                       : [e] "r"(end)
                       : "memory");
    }
    for (uint32_t i = n8; i < n; i++) s += ((int32_t)(((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) ^ 8u) - 8) * x[i];
    return s;
}
#define FLM_DOT_Q4 dot_q4_rv
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

/* kernels_ref.h i64_to_f32's value (|v| < 2^40, rounded once to nearest even) made on the bits: the
 * exponent from the bit length, the 24 bits below the top bit and their rounding, no float call. */
static inline float i64_to_f32_rv(int64_t v) {
    const uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    const uint32_t hi = (uint32_t)(m >> 32), lo = (uint32_t)m;
    if (!m) return 0.0f;
    const uint32_t n = hi ? 32u + bit_length_rv(hi) : bit_length_rv(lo);   /* 1 .. 41 */
    uint32_t q, e = n - 1u;
    if (n <= 24u) {
        q = lo << (24u - n);                                                /* exact */
    } else {
        const uint32_t sh = n - 24u;                                        /* 1 .. 17 */
        q = (uint32_t)(m >> sh);
        const uint64_t rest = m & (((uint64_t)1 << sh) - 1u), half = (uint64_t)1 << (sh - 1u);
        if (rest > half || (rest == half && (q & 1u))) q++;
        if (q >> 24) { q >>= 1; e++; }                                      /* rounded up to 2^24 */
    }
    return flm_f32_from_bits((v < 0 ? 0x80000000u : 0u) | (127u + e) << 23 | (q & 0x7fffffu));
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

/* Rows [r0, r1) of a row-scaled w of ng whole groups of g codes (q8, or q4 offset by 8): each row's
 * multiplier-weighted sum of its group dots, sum k[gi] * isum_gi, in int32 where it cannot overflow
 * (|isum| <= 127 * 127 a code, a multiplier <= 255: up to RV_I32_COLS columns) else int64, then
 * row_rs's scaling. q4: the unsigned dots less 8 times the activation groups' sums sx. One function
 * per format and width, so each loop keeps its values in registers and saves them once a call. */
#define RV_I32_COLS 523u
#define RV_RS_ROWS(name, T, isum)                                                                             \
    static __attribute__((noinline)) void name(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, \
                                               float xscale, float *out, const int32_t *sx) {                    \
        const uint32_t g = w->group, ng = w->cols / g, head = 4u + ((ng + 3u) & ~3u);                           \
        (void)sx;                                                                                              \
        for (uint32_t r = r0; r < r1; r++) {                                                                   \
            const uint8_t *p = w->data + (size_t)r * w->stride, *k = p + 4, *c = p + head;                   \
            const flm_act *x = xq;                                                                             \
            T acc = 0;                                                                                         \
            for (uint32_t gi = 0; gi < ng; gi++, x += g) acc += (int32_t)k[gi] * (isum);                       \
            *out++ = scale_row_rv(i64_to_f32_rv(acc), rdf(p), xscale);                                        \
        }                                                                                                      \
    }
RV_RS_ROWS(rs_rows32_q8_rv, int32_t, (c += g, dot8n_q8_rv((const int8_t *)c - g, x, g)))
RV_RS_ROWS(rs_rows64_q8_rv, int64_t, (c += g, dot8n_q8_rv((const int8_t *)c - g, x, g)))
RV_RS_ROWS(rs_rows32_q4_rv, int32_t, (c += g / 2u, dot_u4_rv(c - g / 2u, x, g) - 8 * sx[gi]))
RV_RS_ROWS(rs_rows64_q4_rv, int64_t, (c += g / 2u, dot_u4_rv(c - g / 2u, x, g) - 8 * sx[gi]))

/* Rows [r0, r1) of a row-scaled w of whole groups of a multiple of 8 codes (q8 or q4): each row_rs's
 * value, the q4 rows' activation sums made once for all of them (at most RV_SX_GROUPS groups); other
 * shapes return 0 (row_rs per row). */
#define RV_SX_GROUPS 128u
static inline __attribute__((always_inline)) int rs_rows_rv(const flm_tensor *w, uint32_t r0, uint32_t r1,
                                                            const flm_act *xq, const float *xs, float *out) {
    const uint32_t g = w->group, ng = w->cols / g, wide = w->cols > RV_I32_COLS;
    if (w->cols % g || g % 8u || ng > RV_SX_GROUPS) return 0;
    if (w->fmt == FLM_Q8) {
        (wide ? rs_rows64_q8_rv : rs_rows32_q8_rv)(w, r0, r1, xq, xs[0], out, 0);
        return 1;
    }
    int32_t sx[RV_SX_GROUPS];
    for (uint32_t gi = 0; gi < ng; gi++) {
        int32_t s = 0;
        for (uint32_t i = 0; i < g; i++) s += xq[gi * g + i];
        sx[gi] = s;
    }
    (wide ? rs_rows64_q4_rv : rs_rows32_q4_rv)(w, r0, r1, xq, xs[0], out, sx);
    return 1;
}
#define FLM_RS_ROWS rs_rows_rv
#endif
