/* The boot self-check (kernels.h flm_kernels_self_check): this core's kernels (kernels.c through
 * kernel_hooks.h: the vectorised rows, a HAL's assembly) against the reference kernels
 * (kernels_ref.h) on built-in tensors, bit for bit. The app refuses to generate when they disagree.
 *
 * kernels.c includes it last, so it is compiled in the kernels' translation unit: its calls of the
 * reference rows count in the compiler's inlining decisions for the kernels' own rows (a row
 * reader helper inlined or split), and the instruction counts bench measures are this unit's. */
#ifndef FLM_KERNELS_CHECK_H
#define FLM_KERNELS_CHECK_H

/* Built-in tensors of 3 rows and 3 groups of g, as q8 and q4 with f32, fp16 and row scales, each
 * with 3g columns (whole groups) and 3g - 3 (a short last group): g = 24 (the Cortex-M0+ whole-row
 * loops' odd step and a whole turn of two, softfloat_m0.s), 23 (odd groups: q4 halves a byte), 32
 * (the Cortex-M0+ row-scaled kernels: a pair of rows and a single one, q4's lanes), 16 (q4's lanes in
 * sub-blocks of 16), and on cores
 * with SIMD the group sizes of the vectorised rows (64, 128); pseudo-random codes, activations as the
 * engine passes them (q8: 12-bit, -2047 and 2047 among them; q4: 8-bit, -127 and 127 among them),
 * multipliers up to 255. Every row alone (flm_matvec_row) and all three at once (flm_matvec_rows)
 * against the scalar kernels, bit for bit; the row-scaled ones also in a pass of several tokens where
 * the core has rows of its own for that (kernel_hooks.h FLM_PASS_ROWS_AGREE). Then the int8 and k12 attention's loops and the
 * activation codes of a HAL (qmax 127 into int8 and flm_act, qmax 2047). */
#define SC_ROWS 3u
#define SC_NG 3u
#ifdef FLM_VECTOR
static const uint32_t sc_groups[] = {24u, 23u, 32u, 16u, 64u, 128u};
#define SC_GMAX 128u
#else
static const uint32_t sc_groups[] = {24u, 23u, 32u, 16u};
#define SC_GMAX 32u
#endif

static uint32_t sc_mix(uint32_t h) {
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    return h;
}

/* The tensor of group size g, format fmt, scales kind (0 f32, 1 fp16, 2 row) and cols columns, filled
 * into buf: scales 1.5 * 2^-k (f32 or fp16), or a row scale 2^-7 with the first multiplier 255. */
static flm_tensor sc_tensor(uint8_t *buf, uint32_t g, uint32_t fmt, uint32_t kind, uint32_t cols) {
    const uint32_t code = ((fmt == FLM_Q8 ? g : (g + 1u) / 2u) + 3u) & ~3u;   /* a whole group's, padded */
    const uint32_t s16 = kind == 1u, rs = kind == 2u;
    const uint32_t stride = rs ? 8u + SC_NG * code : s16 ? ((2u * SC_NG + 3u) & ~3u) + SC_NG * code : SC_NG * (4u + code);
    for (uint32_t i = 0; i < SC_ROWS * stride; i++) buf[i] = (uint8_t)sc_mix(i + 977u * fmt + 131u * g + cols);
    for (uint32_t r = 0; r < SC_ROWS; r++) {
        uint8_t *p = buf + r * stride;
        if (rs) { p[0] = p[1] = p[2] = 0; p[3] = 0x3cu; p[4] = 255u; continue; }
        for (uint32_t k = 0; k < SC_NG; k++) {
            if (s16) { p[2u * k] = 0; p[2u * k + 1u] = (uint8_t)(0x3eu - 4u * k); }
            else { uint8_t *q = p + k * (4u + code); q[0] = q[1] = 0; q[2] = 0xc0u; q[3] = (uint8_t)(0x3fu - k); }
        }
    }
    flm_tensor w = {buf, fmt, SC_ROWS, cols, g, stride, FLM_TIER_SRAM, SC_ROWS * stride, (uint8_t)s16, (uint8_t)rs};
    return w;
}

static int sc_rows_agree(const flm_tensor *w, const flm_act *xq, const float *xs) {
    float all[SC_ROWS];
    flm_matvec_rows(w, 0, SC_ROWS, xq, xs, all);
    for (uint32_t r = 0; r < SC_ROWS; r++) {
        const float one = flm_matvec_row(w, r, xq, xs);
        const float ref = w->rowscale ? row_rs(w, r, xq, xs, dot_q8_scalar, dot_q4o_scalar)
                                      : row_with(w, r, xq, xs, dot_q8_scalar, dot_q4_scalar, group_term);
        if (memcmp(&one, &ref, 4) != 0 || memcmp(&all[r], &ref, 4) != 0) return 0;
    }
    return 1;
}

/* The int8 attention's loops on rows of codes a and b: 32 codes (the tuned words) and 30 (a tail);
 * x the query's codes (+-127). */
static int sc_attention_agree(const int8_t *a, const int8_t *b, const flm_act *x) {
    for (uint32_t n = 30u; n <= 32u; n += 2u) {
        int32_t fast[2], ref[2], acc[32], acc_ref[32];
        flm_dot2_q8(a, b, x, n, fast);
        dot2_scalar(a, b, x, n, ref);
        for (uint32_t i = 0; i < n; i++) acc[i] = acc_ref[i] = (int32_t)sc_mix(i) >> 8;
        flm_axpy_q8(acc, a, -70001, n);
        axpy_scalar(acc_ref, a, -70001, n);
        if (memcmp(fast, ref, sizeof fast) || memcmp(acc, acc_ref, n * 4u)) return 0;
    }
    return 1;
}

/* The k12 attention's dots (K rows a and b of int16 codes, query x, all within +-2047): 32 codes and
 * 30, as above. */
static int sc_k12_agree(const int16_t *a, const int16_t *b, const flm_act *x) {
    for (uint32_t n = 30u; n <= 32u; n += 2u) {
        int32_t fast[2], ref[2];
        flm_dot2_q12(a, b, x, n, fast);
        dot2_q12_scalar(a, b, x, n, ref);
        if (memcmp(fast, ref, sizeof fast) || flm_dot_q12(a, x, n) != ref[0]) return 0;
    }
    return 1;
}

/* The core's activation codes (kernel_hooks.h FLM_QUANT_CODES, FLM_ACT_CODES_Q) against act_codes and
 * act_codes_q: a group of pseudo-random floats scaled to +-127 (the usual case) and the edges (0, -0,
 * the halves around 0.5, 127 and 2047, 127.5, 2047.5, subnormals, infinities, NaN), with qmax 127
 * and 2047. (On cores with vectors tests/test_kernels.py checks every float too.) */
static int sc_codes_agree(void) {
    static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x3effffffu, 0xbf000000u, 0x3f000001u, 0x42fe0000u,
                                    0xc2fd0000u, 0x42ff0000u, 0x00000001u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                    0x3fc00000u, 0x40200000u, 0x42fcffffu, 0x7f7fffffu, 0x44ffe000u, 0xc4ffd000u,
                                    0x44fff000u, 0x44ffdfffu};
    float x[SC_NG * SC_GMAX];
    int8_t fast[SC_NG * SC_GMAX], ref[SC_NG * SC_GMAX];
    flm_act fq[SC_NG * SC_GMAX], rq[SC_NG * SC_GMAX];
    const uint32_t n = SC_NG * SC_GMAX, ne = sizeof edge / sizeof edge[0];
    static const int32_t qmax[2] = {FLM_QMAX_8, FLM_QMAX_12};
    for (uint32_t i = 0; i < n; i++) x[i] = flm_f32_from_bits((sc_mix(i) & 0x807fffffu) | 0x3c000000u);
    FLM_QUANT_CODES(x, n, 0x1.8p+12f, fast);
    act_codes(x, n, 0x1.8p+12f, ref);
    if (memcmp(fast, ref, n)) return 0;
    for (uint32_t k = 0; k < 2u; k++) {
        const float inv = k ? 0x1.8p+16f : 0x1.8p+12f;
        FLM_ACT_CODES_Q(x, n, inv, qmax[k], fq);
        act_codes_q(x, n, inv, qmax[k], rq);
        if (memcmp(fq, rq, n * sizeof fq[0])) return 0;
    }
    for (uint32_t i = 0; i < ne; i++) x[i] = flm_f32_from_bits(edge[i]);
    FLM_QUANT_CODES(x, ne, 1.0f, fast);
    act_codes(x, ne, 1.0f, ref);
    if (memcmp(fast, ref, ne)) return 0;
    for (uint32_t k = 0; k < 2u; k++) {
        FLM_ACT_CODES_Q(x, ne, 1.0f, qmax[k], fq);
        act_codes_q(x, ne, 1.0f, qmax[k], rq);
        if (memcmp(fq, rq, ne * sizeof fq[0])) return 0;
    }
    return 1;
}

/* A pass's rows (kernel_hooks.h FLM_PASS_ROWS_AGREE) on the row-scaled w: FLM_CHECK_TOKENS tokens
 * whose codes are x's turned by 7 columns a token, each its own X (1 where the core has none). */
static int sc_pass_agree(const flm_tensor *w, const flm_act *x) {
#ifdef FLM_PASS_ROWS_AGREE
    const uint32_t n = SC_NG * SC_GMAX;
    flm_act xt[FLM_CHECK_TOKENS * SC_NG * SC_GMAX] __attribute__((aligned(4)));
    static const float xs[FLM_CHECK_TOKENS] = {0.25f, -0.0078125f, 3.0f, 1.5f, -0.5f};
    for (uint32_t t = 0; t < FLM_CHECK_TOKENS; t++)
        for (uint32_t i = 0; i < n; i++) xt[t * n + i] = x[(i + 7u * t) % n];
    return FLM_PASS_ROWS_AGREE(w, xt, n, xs);
#else
    (void)w, (void)x;
    return 1;
#endif
}

int flm_kernels_self_check(void) {   /* (its buffers on the stack: no SRAM kept for a boot-time check) */
    uint8_t buf[SC_ROWS * SC_NG * (4u + SC_GMAX)] __attribute__((aligned(4)));
    flm_act xq8[SC_NG * SC_GMAX] __attribute__((aligned(4))), xq4[SC_NG * SC_GMAX] __attribute__((aligned(4)));
    static const float xs[SC_NG] = {0.25f, -0.0078125f, 3.0f};
    if (!sc_codes_agree()) return -1;
    for (uint32_t i = 0; i < SC_NG * SC_GMAX; i++) {
        const uint32_t h = sc_mix(i);
        xq8[i] = (flm_act)(i < 4u ? (i & 1u ? 2047 : -2047) : (int32_t)(h % 4095u) - 2047);
        xq4[i] = (flm_act)(i < 4u ? (i & 1u ? 127 : -127) : (int32_t)(h % 255u) - 127);
    }
    for (uint32_t gi = 0; gi < sizeof sc_groups / sizeof sc_groups[0]; gi++) {
        const uint32_t g = sc_groups[gi];
        for (uint32_t cols = SC_NG * g - 3u; cols <= SC_NG * g; cols += 3u) {
            for (uint32_t fmt = FLM_Q8; fmt <= FLM_Q4; fmt++) {
                for (uint32_t kind = 0; kind < 3u; kind++) {
                    const flm_tensor w = sc_tensor(buf, g, fmt, kind, cols);
                    if (!sc_rows_agree(&w, fmt == FLM_Q8 ? xq8 : xq4, xs)) return -1;
                    if (kind == 2u && !sc_pass_agree(&w, fmt == FLM_Q8 ? xq8 : xq4)) return -1;
                }
            }
        }
        if (!sc_attention_agree((const int8_t *)buf, (const int8_t *)buf + 32u, xq4)) return -1;
        if (!sc_k12_agree(xq8 + 64u, xq8 + 32u, xq8)) return -1;
    }
    return 0;
}
#endif
