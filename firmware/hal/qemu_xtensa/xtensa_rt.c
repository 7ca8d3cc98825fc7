/* The compiler run-time helpers LLVM's Xtensa code calls and nothing here supplies (no libgcc or
 * compiler-rt for the windowed ABI on this machine), for the bare-metal Xtensa build:
 *
 * - __divsf3: LLVM divides floats with a call (the S3's FPU has no one-instruction divide; ESP-IDF's
 *   libgcc does it with the FPU's divide-step instructions, correctly rounded). Here it is flashlm's
 *   own IEEE soft-float (softfloat.c, integer-only: round to nearest even, subnormals kept), the
 *   same arithmetic the C3 and the RP2040 run. Under the Xtensa ABI a float argument or result
 *   travels in an address register, so the bit patterns as uint32_t are the float's ABI exactly.
 * - __muldi3: 64-bit products (de233_fpu lacks MUL32HIGH, which the S3 has: on the chip LLVM would
 *   use MULUH/MULSH instead of this call), from 16-bit halves and MULL.
 * - __udivdi3, __umoddi3, __divdi3, __moddi3: 64-bit division, shift and subtract.
 *
 * Compiled with -fno-builtin; integer operations only, and no 64-bit multiply or divide in C (they
 * would call these very functions). bench/esp_probe.c checks them against the host. */
#include <stdint.h>

uint32_t flm_sf_div(uint32_t a, uint32_t b);

uint32_t __divsf3(uint32_t a, uint32_t b);
uint64_t __muldi3(uint64_t a, uint64_t b);
uint64_t __udivdi3(uint64_t n, uint64_t d);
uint64_t __umoddi3(uint64_t n, uint64_t d);
int64_t __divdi3(int64_t n, int64_t d);
int64_t __moddi3(int64_t n, int64_t d);

uint32_t __divsf3(uint32_t a, uint32_t b) { return flm_sf_div(a, b); }

/* a * b mod 2^64: al * bl in full from 16-bit halves, then the cross terms' low words */
uint64_t __muldi3(uint64_t a, uint64_t b) {
    const uint32_t al = (uint32_t)a, ah = (uint32_t)(a >> 32), bl = (uint32_t)b, bh = (uint32_t)(b >> 32);
    const uint32_t a0 = al & 0xffffu, a1 = al >> 16, b0 = bl & 0xffffu, b1 = bl >> 16;
    const uint32_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const uint32_t mid = (p00 >> 16) + (p01 & 0xffffu) + (p10 & 0xffffu);
    const uint32_t lo = (p00 & 0xffffu) | (mid << 16);
    const uint32_t hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16) + al * bh + ah * bl;
    return (uint64_t)hi << 32 | lo;
}

/* quotient and remainder of n / d, d != 0 (d == 0: all ones and n, where C leaves it undefined) */
static uint64_t divmod(uint64_t n, uint64_t d, uint64_t *rem) {
    uint64_t q = 0, r = 0;
    if (d == 0u) {
        *rem = n;
        return ~(uint64_t)0;
    }
    for (int i = 63; i >= 0; i--) {
        r = r << 1 | (n >> i & 1u);
        if (r >= d) {
            r -= d;
            q |= (uint64_t)1 << i;
        }
    }
    *rem = r;
    return q;
}

uint64_t __udivdi3(uint64_t n, uint64_t d) {
    uint64_t r;
    return divmod(n, d, &r);
}

uint64_t __umoddi3(uint64_t n, uint64_t d) {
    uint64_t r;
    divmod(n, d, &r);
    return r;
}

/* C's signed division truncates toward zero; the remainder takes the dividend's sign */
int64_t __divdi3(int64_t n, int64_t d) {
    uint64_t r;
    const uint64_t q = divmod(n < 0 ? 0u - (uint64_t)n : (uint64_t)n, d < 0 ? 0u - (uint64_t)d : (uint64_t)d, &r);
    return (n < 0) != (d < 0) ? (int64_t)(0u - q) : (int64_t)q;
}

int64_t __moddi3(int64_t n, int64_t d) {
    uint64_t r;
    divmod(n < 0 ? 0u - (uint64_t)n : (uint64_t)n, d < 0 ? 0u - (uint64_t)d : (uint64_t)d, &r);
    return n < 0 ? (int64_t)(0u - r) : (int64_t)r;
}
