/* Probe firmware for the QEMU boards of the ESP32 family's instruction sets (bench/esp_qemu.py builds
 * it in place of the app's main.c, with the same engine, HAL, soft-float, Makefile and flags as the
 * board's firmware). The clock is the HAL's: emulated instructions. It answers binary commands on the
 * serial link (little-endian; one command byte, then u32 arguments), one u32 answer each:
 *
 *   'M' kind fmt group cols rows scales   instructions of flm_matvec over a pseudo-random tensor in
 *                              SRAM (kind 0), of its integer group dots alone (kind 1: one
 *                              flm_dot_q8 / flm_dot_q4 call per group), of flm_quantize_act of the
 *                              input, rows times (kind 2); scales 0: f32 per group, 2: row-scaled
 *   'L' n                      instructions of a loop of n turns of two instructions (ISA assembly):
 *                              the clock is exact when L(n) - L(0) = 2n for every n
 *   'T' op count               instructions of count float operations op (0 add, 1 mul, 2 div,
 *                              3 int-to-float, 4 float-to-int, 5 compare, 6 flm_expf, 7 flm_silu,
 *                              8 flm_sqrtf, 9 the same loop with an integer xor in place of the
 *                              operation: the baseline)
 *   'H' op a_lo a_hi b_lo b_hi the run-time helpers' results for operands a, b (u64 answer as two
 *                              u32): 0 a*b, 1 a/b, 2 a%b unsigned, 3 a/b, 4 a%b signed, 5 a/b as floats
 *   'K' rows cols              the floor kernels below (not the engine's): instructions of int8 group
 *                              dots over rows x cols codes, and whether each equals flm_dot_q8's (two u32)
 *   'C'                        flm_kernels_self_check() */
#include <stdint.h>
#include <string.h>

#include "flm_math.h"
#include "hal.h"
#include "kernels.h"

static void get(void *dst, size_t n) {
    uint8_t *p = dst;
    while (n) {
        size_t k = hal_serial_read(p, n);
        if (!k) hal_idle();
        p += k;
        n -= k;
    }
}
static uint32_t get32(void) {
    uint8_t b[4];
    get(b, 4);
    return b[0] | b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static void put32(uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    hal_serial_write(b, 4);
}

static uint32_t fmix(uint32_t h) {
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    return h;
}
static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t u_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* 'L': n turns of "add -1, branch if not zero" */
__attribute__((noinline)) static uint32_t time_loop(uint32_t n) {
    uint64_t t0 = hal_time_us();
    if (n) {
#if defined(__riscv)
        __asm volatile("1: addi %0, %0, -1\n\tbnez %0, 1b" : "+r"(n));
#elif defined(__XTENSA__)
        __asm volatile("1: addi %0, %0, -1\n\tbnez %0, 1b" : "+r"(n));
#else
#error "no loop for this ISA"
#endif
    }
    return (uint32_t)(hal_time_us() - t0);
}

/* 'T': operands like the engine's (normal values of moderate size) */
#define T_MAX 256u
static uint32_t ta[T_MAX], tb[T_MAX];
static uint32_t time_op(uint32_t op, uint32_t count) {
    for (uint32_t i = 0; i < T_MAX; i++) {
        ta[i] = (fmix(2u * i) & 0x87ffffffu) | 0x3c000000u;
        tb[i] = (fmix(2u * i + 1u) & 0x87ffffffu) | 0x3c000000u;
        if (op == 3u) ta[i] &= 0x8001ffffu;
    }
    volatile uint32_t sink = 0;
    uint64_t t0 = hal_time_us();
    for (uint32_t i = 0; i < count; i++) {
        const uint32_t k = i & (T_MAX - 1u);
        switch (op) {
        case 0: sink = u_of(f_of(ta[k]) + f_of(tb[k])); break;
        case 1: sink = u_of(f_of(ta[k]) * f_of(tb[k])); break;
        case 2: sink = u_of(f_of(ta[k]) / f_of(tb[k])); break;
        case 3: sink = u_of((float)(int32_t)ta[k]); break;
        case 4: sink = (uint32_t)(int32_t)f_of(ta[k] & 0x83ffffffu); break;
        case 5: sink = f_of(ta[k]) < f_of(tb[k]); break;
        case 6: sink = u_of(flm_expf(f_of((ta[k] & 0x80ffffffu) | 0x3f000000u))); break;   /* |x| in [0.5, 4) */
        case 7: sink = u_of(flm_silu(f_of((ta[k] & 0x80ffffffu) | 0x3f000000u))); break;
        case 8: sink = u_of(flm_sqrtf(f_of(ta[k] & 0x7fffffffu))); break;
        default: sink = ta[k] ^ tb[k]; break;
        }
    }
    (void)sink;
    return (uint32_t)(hal_time_us() - t0);
}

/* 'H': the compiler's 64-bit helpers (on Xtensa xtensa_rt.c's, on rv32 libgcc's) and float division */
static uint64_t helper(uint32_t op, uint64_t a, uint64_t b) {
    volatile uint64_t va = a, vb = b;   /* no constant folding */
    switch (op) {
    case 0: return va * vb;
    case 1: return va / vb;
    case 2: return va % vb;
    case 3: return (uint64_t)((int64_t)va / (int64_t)vb);
    case 4: return (uint64_t)((int64_t)va % (int64_t)vb);
    default: {
        volatile float x = f_of((uint32_t)va), y = f_of((uint32_t)vb);
        return u_of(x / y);
    }
    }
}

/* 'M': a pseudo-random tensor in SRAM in the blob's row layout (docs/formats.md section 1) */
static uint8_t wbuf[64 * 1024] __attribute__((aligned(8)));
static flm_act xq[4096] __attribute__((aligned(8)));
static float xs[4096 / 16], xf[4096], out[512];

static uint32_t time_matvec(uint32_t kind, uint32_t fmt, uint32_t g, uint32_t cols, uint32_t rows, uint32_t scales) {
    const uint32_t rs = scales == 2u;
    const uint32_t ng = (cols + g - 1u) / g, code = fmt == FLM_Q8 ? g : (g + 1u) / 2u;
    const uint32_t head = rs ? 4u + ((ng + 3u) & ~3u) : 0u;   /* before the codes */
    const uint32_t stride = head + ng * ((code + 3u) & ~3u) + (rs ? 0u : 4u * ng);
    if (scales == 1u || cols % g || cols > sizeof xq / sizeof xq[0] || rows > 512u || (size_t)stride * rows > sizeof wbuf)
        return 0xffffffffu;
    for (uint32_t i = 0; i < stride * rows; i += 4) {
        const uint32_t v = fmix(i);
        memcpy(wbuf + i, &v, 4);
    }
    for (uint32_t r = 0; r < rows; r++) {      /* scales: normal values near 2^-7 (a row's: 2^-15) */
        uint8_t *p = wbuf + r * stride;
        if (rs) { const uint32_t v = 0x38000000u; memcpy(p, &v, 4); }
        for (uint32_t k = 0; k < ng; k++) {
            uint32_t v = fmix(r * ng + k);
            if (rs) p[4u + k] = (uint8_t)(v | 1u);
            else { v = (v & 0x007fffffu) | 0x3c000000u; memcpy(p + k * (4u + ((code + 3u) & ~3u)), &v, 4); }
        }
    }
    for (uint32_t i = 0; i < cols; i++) xf[i] = f_of((fmix(~i) & 0x80ffffffu) | 0x3e000000u);
    flm_tensor w = {wbuf, fmt, rows, cols, g, stride, FLM_TIER_SRAM, stride * rows, 0, (uint8_t)rs};
    flm_quantize_act(xf, cols, flm_act_group(&w), flm_act_qmax(&w), xq, xs);
    volatile int32_t sink = 0;
    const uint64_t t0 = hal_time_us();
    if (kind == 0u) {
        flm_matvec(&w, xq, xs, out);
    } else if (kind == 1u) {   /* the same code bytes, dots only */
        const uint32_t cstride = (code + 3u) & ~3u, skip = rs ? 0u : 4u;
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
    const uint64_t t1 = hal_time_us();
    (void)sink;
    return (uint32_t)(t1 - t0);
}

/* ---- floor kernels: how few instructions an int8 dot with int16 activation codes (flm_act) can take
 * on this ISA (NOT the engine's code: docs/kernels.md derives the floor per ISA, these measure it
 * beside the engine's kernels) ---- */
#if defined(__riscv)
/* rv32imc: LB and LH sign-extend as they load, MUL, ADD: four instructions a weight, the pointer
 * steps and the branch shared by 8 weights. n a multiple of 8. */
static int32_t dot_q8_floor(const int8_t *w, const int16_t *x, uint32_t n) {
    int32_t s = 0;
    for (const int8_t *end = w + n; w != end; w += 8, x += 8)
        s += w[0] * x[0] + w[1] * x[1] + w[2] * x[2] + w[3] * x[3] + w[4] * x[4] + w[5] * x[5] + w[6] * x[6]
             + w[7] * x[7];
    return s;
}
#elif defined(__XTENSA__)
/* Xtensa LX7 without PIE: no sign-extending byte load, so L8UI + SEXT for a code, L16SI for an
 * activation, then MAC16's MULA.AA.LL (ACC += the low 16 bits of each, signed: a sign-extended
 * int8 is its own low half): four instructions a weight, in a zero-overhead LOOP of 4 weights whose
 * two pointer steps are the only overhead. n a multiple of 4, |sum| < 2^31 (ACCLO holds it). */
static int32_t dot_q8_floor(const int8_t *w, const int16_t *x, uint32_t n) {
    int32_t s;
    uint32_t a, b, turns = n / 4u;
#define W8(k) "l8ui %[a], %[w], " #k "\n\tl16si %[b], %[x], 2*" #k "\n\tsext %[a], %[a], 7\n\t" \
              "mula.aa.ll %[a], %[b]\n\t"
    __asm volatile("movi %[a], 0\n\twsr %[a], acclo\n\twsr %[a], acchi\n\t"
                   "loop %[t], 1f\n\t" W8(0) W8(1) W8(2) W8(3)
                   "addi %[w], %[w], 4\n\taddi %[x], %[x], 8\n"
                   "1:\n\trsr %[s], acclo"
                   : [s] "=r"(s), [a] "=&r"(a), [b] "=&r"(b), [w] "+r"(w), [x] "+r"(x), [t] "+r"(turns)
                   :
                   : "memory");
#undef W8
    return s;
}
#endif

static uint32_t floor_ok;
static uint32_t time_floor(uint32_t rows, uint32_t cols) {
    const int8_t *codes = (const int8_t *)wbuf;
    for (uint32_t i = 0; i < rows * cols; i += 4) {
        const uint32_t v = fmix(i);
        memcpy(wbuf + i, &v, 4);
    }
    for (uint32_t i = 0; i < cols; i++) xq[i] = (flm_act)((int32_t)(fmix(~i) % 4095u) - 2047);   /* 12-bit, as q8's */
    volatile int32_t sink = 0;
    const uint64_t t0 = hal_time_us();
    for (uint32_t r = 0; r < rows; r++) sink = dot_q8_floor(codes + r * cols, xq, cols);
    const uint64_t t1 = hal_time_us();
    floor_ok = 1;
    for (uint32_t r = 0; r < rows; r++)
        floor_ok &= dot_q8_floor(codes + r * cols, xq, cols) == flm_dot_q8(codes + r * cols, xq, cols);
    (void)sink;
    return (uint32_t)(t1 - t0);
}

int main(void) {
    if (hal_init(0, 0)) return 1;
    for (;;) {
        uint8_t c;
        get(&c, 1);
        if (c == 'M') {
            const uint32_t kind = get32(), fmt = get32(), g = get32(), cols = get32(), rows = get32(), sc = get32();
            put32(time_matvec(kind, fmt, g, cols, rows, sc));
        } else if (c == 'L') {
            put32(time_loop(get32()));
        } else if (c == 'T') {
            const uint32_t op = get32(), count = get32();
            put32(time_op(op, count));
        } else if (c == 'H') {
            const uint32_t op = get32(), al = get32(), ah = get32(), bl = get32(), bh = get32();
            const uint64_t r = helper(op, (uint64_t)ah << 32 | al, (uint64_t)bh << 32 | bl);
            put32((uint32_t)r);
            put32((uint32_t)(r >> 32));
        } else if (c == 'K') {
            const uint32_t rows = get32(), cols = get32();
            const uint32_t n = rows * cols <= sizeof wbuf && cols <= sizeof xq ? time_floor(rows, cols) : 0xffffffffu;
            put32(n);
            put32(floor_ok);
        } else if (c == 'C') {
            put32((uint32_t)flm_kernels_self_check());
        }
    }
}
