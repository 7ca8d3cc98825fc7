/* Probe firmware for the emulated RP2040 (bench/kernels.py builds it in place of the app's
 * main.c, with the same engine, HAL, soft-float and flags as the real firmware). It answers
 * binary commands on UART0 (little-endian; one command byte, then its arguments):
 *
 *   'F' op mode start count   u32: sum over i of result(i) * (2i + 1), mod 2^32 (generated operands)
 *   'R' op mode start count   count u32 results (generated operands)
 *   'X' op count + count (a, b) u32 pairs   count u32 results (given operands)
 *   'T' op count              u32 SysTick cycles of count calls of op on typical operands
 *   'M' kind fmt group cols rows scales   u32 SysTick cycles (kind 0: flm_matvec, 1: the group
 *                             dots alone, 2: flm_quantize_act of the input, rows times; scales 0: f32
 *                             per group, 1: fp16 per group, 2: row-scaled)
 *   'C'                       u32 flm_kernels_self_check()
 *
 * Operand generation (op_pair) is mirrored in bench/kernels.py, which computes the expected
 * results with NumPy. NaN results are sent as 0x7fc00000: which NaN comes out is not specified. */
#include <stdint.h>
#include <string.h>

#include "hal.h"
#include "kernels.h"

enum { FADD, FSUB, FMUL, FDIV, FCMPEQ, FCMPLT, FCMPLE, FCMPGT, FCMPGE, I2F, UI2F, F2IZ, GTERM, RSCALE, QCODE, NOP };

#ifdef FLM_SOFTFLOAT_M0_H   /* softfloat_m0.s's (through hal_rp2040.h) */
float flm_group_term(int32_t isum, float sc, float xs);
#else                   /* built on libgcc's soft-float (bench/kernels.py build_probe): the plain expressions */
static float flm_group_term(int32_t isum, float sc, float xs) { return (float)isum * (sc * xs); }
static float flm_rs_scale(int32_t acc, float s, float x) { return (float)acc * (s * x); }
static void flm_quant_codes_m0(const float *x, uint32_t n, float inv, int8_t *q) {
    for (uint32_t i = 0; i < n; i++) {
        const float v = x[i] * inv;
        q[i] = (int8_t)(v != v ? 0 : v > 127.0f ? 127 : v < -127.0f ? -127 : (int32_t)(v + (v < 0.0f ? -0.5f : 0.5f)));
    }
}
#endif

#define SYST_CSR (*(volatile uint32_t *)0xe000e010u)
#define SYST_RVR (*(volatile uint32_t *)0xe000e014u)
#define SYST_CVR (*(volatile uint32_t *)0xe000e018u)

static void get(void *dst, size_t n) {
    uint8_t *p = dst;
    while (n) {
        size_t k = hal_serial_read(p, n);
        if (!k) hal_idle();
        p += k;
        n -= k;
    }
}
static uint32_t get32(void) { uint8_t b[4]; get(b, 4); return b[0] | b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24; }
static void put32(uint32_t v) { uint8_t b[4] = {v, v >> 8, v >> 16, v >> 24}; hal_serial_write(b, 4); }

static uint32_t fmix(uint32_t h) {
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    return h;
}

/* The i-th operand pair of a mode: 0 any bit patterns, 1 exponents within 7 of each other
 * (cancellation, alignment), 2 tiny and subnormal, 3 products or quotients near overflow or
 * underflow, 4 as 1 with 5-bit significands (exact sums and products, ties). */
static void op_pair(uint32_t mode, uint32_t i, uint32_t *a, uint32_t *b) {
    uint32_t x = fmix(2u * i), y = fmix(2u * i + 1u);
    if (mode == 1u || mode == 4u) y = (y & 0x83ffffffu) | (x & 0x7c000000u);
    if (mode == 2u) { x &= 0x81ffffffu; y &= 0x81ffffffu; }
    if (mode == 3u) {
        int32_t e = (int32_t)((i & 1u) ? 381u : 127u) - (int32_t)((x >> 23) & 255u) + (int32_t)((y >> 24) & 15u) - 8;
        e = e < 1 ? 1 : e > 254 ? 254 : e;
        y = (y & 0x807fffffu) | (uint32_t)e << 23;
    }
    if (mode == 4u) { x &= 0xfffc0000u; y &= 0xfffc0000u; }
    *a = x;
    *b = y;
}

static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t u_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* NOP's stand-in call costs what any call costs: 'T' subtracts it. */
__attribute__((noinline)) static uint32_t nop(uint32_t a, uint32_t b) { __asm volatile("" ::: "memory"); return a ^ b; }

__attribute__((noinline)) static uint32_t run_op(uint32_t op, uint32_t a, uint32_t b) {
    float x = f_of(a), y = f_of(b);
    uint32_t r;
    switch (op) {
    case FADD: r = u_of(x + y); break;
    case FSUB: r = u_of(x - y); break;
    case FMUL: r = u_of(x * y); break;
    case FDIV: r = u_of(x / y); break;
    case FCMPEQ: return x == y;
    case FCMPLT: return x < y;
    case FCMPLE: return x <= y;
    case FCMPGT: return x > y;
    case FCMPGE: return x >= y;
    case I2F: r = u_of((float)((int32_t)a >> (b & 31u))); break;
    case UI2F: r = u_of((float)(a >> (b & 31u))); break;
    case F2IZ: return (uint32_t)(int32_t)x;
    case GTERM: r = u_of(flm_group_term((int32_t)(a ^ b) >> ((b >> 3) & 7u), x, y)); break;
    case RSCALE:   /* the row scale a power of two (a's sign and exponent) when b is odd, else any */
        r = u_of(flm_rs_scale((int32_t)(a ^ b) >> ((b >> 3) & 7u), f_of(b & 1u ? a & 0xff800000u : a), y));
        break;
    case QCODE: {   /* an activation code: x = a, inv = b */
        int8_t q;
        flm_quant_codes_m0(&x, 1u, y, &q);
        return (uint32_t)(int32_t)q;
    }
    default: return nop(a, b);
    }
    return (r << 1) > 0xff000000u ? 0x7fc00000u : r;
}

/* 'T': operands like the engine's (normal values of moderate size; ints of a group dot's size) */
#define T_MAX 256
static uint32_t ta[T_MAX], tb[T_MAX];

static uint32_t time_op(uint32_t op, uint32_t count) {
    for (uint32_t i = 0; i < T_MAX; i++) {
        uint32_t x = fmix(2u * i), y = fmix(2u * i + 1u);
        if (op == I2F || op == UI2F) { ta[i] = x & 0x8001ffffu; tb[i] = 0; }
        else { ta[i] = (x & 0x87ffffffu) | 0x3c000000u; tb[i] = (y & 0x87ffffffu) | 0x3c000000u; }
        if (op == F2IZ) ta[i] = (x & 0x83ffffffu) | 0x40000000u;   /* |a| in [2, 32) */
        if (op == UI2F) ta[i] &= 0x7fffffffu;
    }
    volatile uint32_t sink = 0;
    SYST_RVR = 0xffffffu;
    SYST_CVR = 0;
    SYST_CSR = 5u;   /* enabled, processor clock */
    uint32_t t0 = SYST_CVR;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t k = i & (T_MAX - 1u);
        switch (op) {   /* one call each, as the engine's code makes it */
        case FADD: sink = u_of(f_of(ta[k]) + f_of(tb[k])); break;
        case FSUB: sink = u_of(f_of(ta[k]) - f_of(tb[k])); break;
        case FMUL: sink = u_of(f_of(ta[k]) * f_of(tb[k])); break;
        case FDIV: sink = u_of(f_of(ta[k]) / f_of(tb[k])); break;
        case FCMPEQ: sink = f_of(ta[k]) == f_of(tb[k]); break;
        case FCMPLE: sink = f_of(ta[k]) <= f_of(tb[k]); break;
        case FCMPLT: sink = f_of(ta[k]) < f_of(tb[k]); break;
        case FCMPGT: sink = f_of(ta[k]) > f_of(tb[k]); break;
        case FCMPGE: sink = f_of(ta[k]) >= f_of(tb[k]); break;
        case I2F: sink = u_of((float)(int32_t)ta[k]); break;
        case UI2F: sink = u_of((float)ta[k]); break;
        case F2IZ: sink = (uint32_t)(int32_t)f_of(ta[k]); break;
        case GTERM: sink = u_of(flm_group_term((int32_t)(ta[k] << 12) >> 12, f_of(ta[k]), f_of(tb[k]))); break;
        case RSCALE: sink = u_of(flm_rs_scale((int32_t)(ta[k] << 8) >> 8, f_of(ta[k] & 0xff800000u), f_of(tb[k]))); break;
        case QCODE: {   /* inv > 0, as flm_quantize_act passes it */
            int8_t q;
            flm_quant_codes_m0((const float *)&ta[k], 1u, f_of(tb[k] & 0x7fffffffu), &q);
            sink = (uint32_t)q;
            break;
        }
        default: sink = nop(ta[k], tb[k]); break;
        }
    }
    uint32_t t1 = SYST_CVR;
    (void)sink;
    return (t0 - t1) & 0xffffffu;
}

/* 'M': a random tensor in SRAM in the blob's row layout (docs/formats.md section 1) */
static uint8_t wbuf[40 * 1024] __attribute__((aligned(8)));
static flm_act xq[4096] __attribute__((aligned(8)));
static float xs[4096 / 16], xf[4096], out[512];

static uint32_t time_matvec(uint32_t kind, uint32_t fmt, uint32_t g, uint32_t cols, uint32_t rows, uint32_t scales) {
    const uint32_t s16 = scales == 1u, rs = scales == 2u;
    uint32_t ng = (cols + g - 1u) / g, code = fmt == FLM_Q8 ? g : (g + 1u) / 2u;
    uint32_t head = rs ? 4u + ((ng + 3u) & ~3u) : s16 ? (2u * ng + 3u) & ~3u : 0u;   /* before the codes */
    uint32_t stride = head + ng * ((code + 3u) & ~3u) + (s16 || rs ? 0u : 4u * ng);
    if (cols % g || cols > sizeof xq / sizeof xq[0] || rows > 512u || (size_t)stride * rows > sizeof wbuf) return 0xffffffffu;
    for (uint32_t i = 0; i < stride * rows; i += 4) {
        uint32_t v = fmix(i);
        memcpy(wbuf + i, &v, 4);
    }
    for (uint32_t r = 0; r < rows; r++) {      /* scales: normal values near 2^-7 (a row's: 2^-15) */
        uint8_t *p = wbuf + r * stride;
        if (rs) { const uint32_t v = 0x38000000u; memcpy(p, &v, 4); }
        for (uint32_t k = 0; k < ng; k++) {
            uint32_t v = fmix(r * ng + k);
            if (rs) p[4u + k] = (uint8_t)(v | 1u);
            else if (s16) { p[2u * k] = (uint8_t)v; p[2u * k + 1u] = 0x20u | ((v >> 8) & 3u); }
            else { v = (v & 0x007fffffu) | 0x3c000000u; memcpy(p + k * (4u + ((code + 3u) & ~3u)), &v, 4); }
        }
    }
    for (uint32_t i = 0; i < cols; i++) xf[i] = f_of((fmix(~i) & 0x80ffffffu) | 0x3e000000u);
    flm_tensor w = {wbuf, fmt, rows, cols, g, stride, FLM_TIER_SRAM, stride * rows, (uint8_t)s16, (uint8_t)rs};
    flm_quantize_act(xf, cols, flm_act_group(&w), flm_act_qmax(&w), xq, xs);
    volatile int32_t sink = 0;
    SYST_RVR = 0xffffffu;
    SYST_CVR = 0;
    SYST_CSR = 5u;
    uint32_t t0 = SYST_CVR;
    if (kind == 0u) {
        flm_matvec(&w, xq, xs, out);
    } else if (kind == 1u) {   /* the same code bytes, dots only */
        uint32_t cstride = (code + 3u) & ~3u, skip = s16 || rs ? 0u : 4u;
        for (uint32_t r = 0; r < rows; r++) {
            const uint8_t *p = wbuf + r * stride + head;
            int32_t s = 0;
            for (uint32_t k = 0; k < ng; k++, p += skip + cstride)
                s += fmt == FLM_Q8 ? flm_dot_q8((const int8_t *)(p + skip), xq + k * g, g)
                                   : flm_dot_q4(p + skip, xq + k * g, g);
            sink = s;
        }
    } else {
        for (uint32_t r = 0; r < rows; r++) flm_quantize_act(xf, cols, flm_act_group(&w), flm_act_qmax(&w), xq, xs);
    }
    uint32_t t1 = SYST_CVR;
    (void)sink;
    return (t0 - t1) & 0xffffffu;
}

int main(void) {
    if (hal_init(0, 0)) return 1;
    for (;;) {
        uint8_t c;
        get(&c, 1);
        if (c == 'F' || c == 'R') {
            uint32_t op = get32(), mode = get32(), start = get32(), count = get32(), h = 0;
            for (uint32_t i = 0; i < count; i++) {
                uint32_t a, b;
                op_pair(mode, start + i, &a, &b);
                uint32_t r = run_op(op, a, b);
                if (c == 'R') put32(r);
                h += r * (2u * i + 1u);
            }
            if (c == 'F') put32(h);
        } else if (c == 'X') {
            uint32_t op = get32(), count = get32();
            for (uint32_t i = 0; i < count; i++) {
                uint32_t a = get32(), b = get32();
                put32(run_op(op, a, b));
            }
        } else if (c == 'T') {
            uint32_t op = get32(), count = get32();
            put32(time_op(op, count));
        } else if (c == 'M') {
            uint32_t kind = get32(), fmt = get32(), g = get32(), cols = get32(), rows = get32(), sc = get32();
            put32(time_matvec(kind, fmt, g, cols, rows, sc));
        } else if (c == 'C') {
            put32((uint32_t)flm_kernels_self_check());
        }
    }
}
