/* The row-scaled rows of the cores without SIMD whose kernels take one group at a time
 * (kernels_rv32.h, kernels_xtensa.h): copied into a project beside its kernels_arch.h, which
 * defines before including it
 *   RS_DOT_Q8(w, x, n) -> int32_t  the int8 dot of n codes, n a nonzero multiple of 8
 *   RS_DOT_U4(w, x, n) -> int32_t  sum u x of n codes, nibbles unsigned, low first, n as above
 *   RS_BIT_LENGTH(x) -> uint32_t   the bits of a nonzero x up to its highest set bit
 *   RS_SCALE(f, s, x) -> float     f * (s * x) as the reference rounds it
 * and gets FLM_DOT_Q4O and FLM_RS_ROWS. A row keeps its fixed cost small: the multiplier-weighted
 * sum of its group dots in int32 where it cannot overflow, float(acc) built on the bits (no
 * int-to-float call, no shift loop), then the reference's scaling. */
#ifndef FLM_KERNELS_RS_SCALAR_H
#define FLM_KERNELS_RS_SCALAR_H

/* dot_q4o_scalar's value (row-scaled q4, codes offset by 8): the unsigned dot where n allows,
 * less 8 sum x (sum (u - 8) x = sum u x - 8 sum x), then one code at a time. */
static inline __attribute__((always_inline)) int32_t dot_q4o_rs(const uint8_t *restrict w, const flm_act *restrict x,
                                                                uint32_t n) {
    const uint32_t n8 = n & ~7u;
    int32_t s = n8 ? RS_DOT_U4(w, x, n8) : 0, sx = 0;
    for (uint32_t i = 0; i < n8; i++) sx += x[i];
    s -= 8 * sx;
    for (uint32_t i = n8; i < n; i++) s += ((int32_t)((uint32_t)w[i >> 1] >> (4u * (i & 1u)) & 15u) - 8) * x[i];
    return s;
}
#define FLM_DOT_Q4O dot_q4o_rs

/* kernels_ref.h i64_to_f32's value (v rounded once to nearest even) made on the bits: the exponent
 * from the bit length, the 24 bits below the top bit and their rounding. Exact for any |v| < 2^63 (a
 * row's |acc| <= 127 * 2047 * 255 * cols < 2^26 * cols). Below 2^32 in magnitude (most rows) in
 * 32-bit operations only: a 64-bit shift or compare is several instructions on these cores. */
static inline __attribute__((always_inline)) float i64_to_f32_rs(int64_t v) {
    const uint64_t m = v < 0 ? 0u - (uint64_t)v : (uint64_t)v;
    const uint32_t hi = (uint32_t)(m >> 32), lo = (uint32_t)m;
    uint32_t q, e;
    if (!hi) {
        if (!lo) return 0.0f;
        const uint32_t n = RS_BIT_LENGTH(lo);                               /* 1 .. 32 */
        e = n - 1u;
        if (n <= 24u) {
            q = lo << (24u - n);                                            /* exact */
        } else {
            const uint32_t sh = n - 24u, rest = lo & ((1u << sh) - 1u), half = 1u << (sh - 1u);   /* sh 1 .. 8 */
            q = lo >> sh;
            q += rest > half || (rest == half && (q & 1u));
        }
    } else {
        const uint32_t n = 32u + RS_BIT_LENGTH(hi), sh = n - 24u;          /* n 33 .. 63, sh 9 .. 39 */
        const uint64_t rest = m & (((uint64_t)1 << sh) - 1u), half = (uint64_t)1 << (sh - 1u);
        e = n - 1u;
        q = (uint32_t)(m >> sh);
        q += rest > half || (rest == half && (q & 1u));
    }
    if (q >> 24) { q >>= 1; e++; }                                          /* rounded up to 2^24 */
    return flm_f32_from_bits((v < 0 ? 0x80000000u : 0u) | (127u + e) << 23 | (q & 0x7fffffu));
}

/* Rows [r0, r1) of a row-scaled w of ng whole groups of g codes (q8, or q4 offset by 8): each row's
 * multiplier-weighted sum of its group dots, sum k[gi] * isum_gi, then row_rs's scaling. The sum is
 * exact in int32 where it cannot overflow: a column's |code * activation| times a multiplier's 255,
 * q8 127 * 2047 (12-bit activations) up to RS_I32_COLS_Q8 columns, q4 8 * 127 (codes -8..7, 8-bit
 * activations) up to RS_I32_COLS_Q4. Wider rows (wide = 1) split each isum into its low 16 bits
 * and the rest, isum = hi * 2^16 + lo: sum k * lo in uint32 (below 128 groups * 255 * 65535 < 2^31,
 * rs_rows takes at most RS_SX_GROUPS = 128 groups) and sum k * hi in int32 (|hi| <= 2^15 for any
 * int32 isum), then acc = sum_hi * 2^16 + sum_lo in int64 once a row: the same integer as an int64 sum
 * of int64 products, without a 64-bit multiply per group (the S3's build has none: __muldi3).
 * q4: the unsigned dots less 8 times the activation groups' sums sx. One function per format and
 * width, so each loop keeps its values in registers and saves them once a call. */
#define RS_I32_COLS_Q8 32u     /* 127 * 2047 * 255 * 32 < 2^31 - 1 < the same * 33 */
#define RS_I32_COLS_Q4 8288u   /* 8 * 127 * 255 * 8288 < 2^31 - 1 < the same * 8289 */
#define RS_ROWS(name, wide, isum)                                                                             \
    static __attribute__((noinline)) void name(const flm_tensor *w, uint32_t r0, uint32_t r1, const flm_act *xq, \
                                               float xscale, float *out, const int32_t *sx) {                    \
        const uint32_t g = w->group, ng = w->cols / g, head = 4u + ((ng + 3u) & ~3u);                           \
        (void)sx;                                                                                              \
        for (uint32_t r = r0; r < r1; r++) {                                                                   \
            const uint8_t *p = w->data + (size_t)r * w->stride, *k = p + 4, *c = p + head;                   \
            const flm_act *x = xq;                                                                             \
            int32_t acc = 0;                                                                                   \
            uint32_t lo = 0;                                                                                   \
            for (uint32_t gi = 0; gi < ng; gi++, x += g) {                                                     \
                const int32_t s = (isum);                                                                      \
                if (wide) {                                                                                    \
                    lo += (uint32_t)k[gi] * ((uint32_t)s & 0xffffu);                                           \
                    acc += (int32_t)k[gi] * (s >> 16);                                                         \
                } else {                                                                                       \
                    acc += (int32_t)k[gi] * s;                                                                 \
                }                                                                                              \
            }                                                                                                  \
            const int64_t v = wide ? (int64_t)acc * 65536 + (int64_t)lo : (int64_t)acc;                       \
            *out++ = RS_SCALE(i64_to_f32_rs(v), rdf(p), xscale);                                              \
        }                                                                                                      \
    }
RS_ROWS(rs_rows32_q8, 0, (c += g, RS_DOT_Q8((const int8_t *)c - g, x, g)))
RS_ROWS(rs_rows64_q8, 1, (c += g, RS_DOT_Q8((const int8_t *)c - g, x, g)))
RS_ROWS(rs_rows32_q4, 0, (c += g / 2u, RS_DOT_U4(c - g / 2u, x, g) - 8 * sx[gi]))
RS_ROWS(rs_rows64_q4, 1, (c += g / 2u, RS_DOT_U4(c - g / 2u, x, g) - 8 * sx[gi]))

/* Rows [r0, r1) of a row-scaled w of whole groups of a multiple of 8 codes (q8 or q4): each row_rs's
 * value, the q4 rows' activation sums made once for all of them (at most RS_SX_GROUPS groups); other
 * shapes return 0 (row_rs per row). */
#define RS_SX_GROUPS 128u
static inline __attribute__((always_inline)) int rs_rows(const flm_tensor *w, uint32_t r0, uint32_t r1,
                                                         const flm_act *xq, const float *xs, float *out) {
    const uint32_t g = w->group, ng = w->cols / g;
    if (w->cols % g || g % 8u || ng > RS_SX_GROUPS) return 0;
    if (w->fmt == FLM_Q8) {
        (w->cols > RS_I32_COLS_Q8 ? rs_rows64_q8 : rs_rows32_q8)(w, r0, r1, xq, xs[0], out, 0);
        return 1;
    }
    int32_t sx[RS_SX_GROUPS];
    for (uint32_t gi = 0; gi < ng; gi++) {
        int32_t s = 0;
        for (uint32_t i = 0; i < g; i++) s += xq[gi * g + i];
        sx[gi] = s;
    }
    (w->cols > RS_I32_COLS_Q4 ? rs_rows64_q4 : rs_rows32_q4)(w, r0, r1, xq, xs[0], out, sx);
    return 1;
}
#define FLM_RS_ROWS rs_rows
#endif
