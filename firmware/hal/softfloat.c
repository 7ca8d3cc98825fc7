/* IEEE-754 binary32 arithmetic on the floats' bit patterns, for the boards without an FPU: the
 * Cortex-M0+ (RP2040: the run-time ABI entry points of rp2040/softfloat_aeabi.c and softfloat_m0.s,
 * whose assembly fast paths hand every other case to the complete versions here) and the ESP32-C3's
 * rv32imc (softfloat_libgcc.c: libgcc's soft-fp names, linked in through --wrap). They replace the
 * toolchain's or the boot ROM's float routines: the ROM's are not proved IEEE, and libgcc's were the
 * largest cost of a token on the M0+ (each group of a matvec does an int-to-float, two multiplies
 * and an add). firmware/exact_float.py puts these files into the projects.
 *
 * Exact IEEE semantics, as the NumPy reference computes on the host: round to nearest, ties to
 * even; subnormals kept (no flush to zero); infinities and NaN (a NaN operand comes back quieted,
 * an invalid operation gives the default NaN 0x7fc00000). tests/test_kernels.py checks the M0+
 * build bit for bit against the host's float over random and edge-case operands on the emulator,
 * tests/test_exact_float.py this file with softfloat_libgcc.c compiled for the host. Portable C,
 * integer operations only: a float expression here would call the entry points built on it. */
#include <stdint.h>

#define SIGN 0x80000000u
#define QNAN 0x7fc00000u
#define HID 0x00800000u        /* the hidden bit of a normal significand */
#define MANT 0x007fffffu

uint32_t flm_sf_add(uint32_t a, uint32_t b);
uint32_t flm_sf_mul(uint32_t a, uint32_t b);
uint32_t flm_sf_div(uint32_t a, uint32_t b);
int32_t flm_sf_f2iz(uint32_t a);
uint32_t flm_sf_from_int(uint32_t sign, uint32_t m);

/* The number of left shifts that bring the highest set bit of m (m != 0) to bit 31 (the M0+ has
 * no CLZ instruction; a binary search costs a handful of cycles). */
static uint32_t lead_zeros(uint32_t m) {
    uint32_t n = 0;
    if (m < 0x10000u) { m <<= 16; n += 16; }
    if (m < 0x1000000u) { m <<= 8; n += 8; }
    if (m < 0x10000000u) { m <<= 4; n += 4; }
    if (m < 0x40000000u) { m <<= 2; n += 2; }
    if (m < 0x80000000u) n += 1;
    return n;
}

/* m >> s with every bit shifted out ORed into bit 0 (the sticky bit), for any s. */
static uint32_t shr_sticky(uint32_t m, uint32_t s) {
    if (s == 0u) return m;
    if (s >= 32u) return m != 0u;
    return (m >> s) | ((m << (32u - s)) != 0u);
}

/* Round and pack: the value is m * 2^(e - 127 - 29), m's leading one at bit 29 when e >= 1 is a
 * normal exponent (m < 2^30); the 6 bits below the significand are guard and sticky bits. e <= 0
 * makes the result subnormal (shifted, then rounded once). Adding the exponent field and the
 * significand with its hidden bit lets a rounding carry step into the next binade or to infinity. */
static uint32_t pack(uint32_t sign, int32_t e, uint32_t m) {
    if (e >= 255) return sign | 0x7f800000u;
    if (e <= 0) {
        m = shr_sticky(m, (uint32_t)(1 - e));
        e = 1;
    }
    uint32_t r = sign + ((uint32_t)(e - 1) << 23) + (m >> 6), rest = m & 63u;
    if (rest > 32u || (rest == 32u && (r & 1u))) r++;
    return r;
}

/* FLM_FAULT_FTZ (tests/test_golden.py only): a build that flushes subnormals to zero, as the RP2040
 * boot ROM's float routines may; the golden check must see the difference. The assembly hands every
 * subnormal operand to these functions, so every subnormal operand is flushed, and so are the
 * subnormal results computed here (a few underflowing sums and products the fast paths finish
 * themselves are not: they are flushed when they are next used). */
#ifdef FLM_FAULT_FTZ
#define FTZ(x) ((x) & 0x7f800000u ? (x) : (x) & SIGN)
#else
#define FTZ(x) (x)
#endif

static uint32_t nan_of(uint32_t a, uint32_t b) {
    return ((a << 1) > 0xff000000u ? a : b) | 0x00400000u;
}

uint32_t flm_sf_add(uint32_t a, uint32_t b) {
    a = FTZ(a);
    b = FTZ(b);
    if ((a << 1) < (b << 1)) { uint32_t t = a; a = b; b = t; }   /* |a| >= |b| */
    uint32_t ea = (a >> 23) & 255u, eb = (b >> 23) & 255u;
    if (ea == 255u) {
        if (a << 9) return a | 0x00400000u;                        /* NaN (b may be one too) */
        if (eb == 255u && (a ^ b) >> 31) return QNAN;              /* inf - inf */
        return a;
    }
    if ((b << 1) == 0u) return (a << 1) ? a : a & b;             /* x + 0; -0 + -0 = -0 */
    uint32_t ma = a & MANT, mb = b & MANT;
    if (ea) ma |= HID; else ea = 1u;
    if (eb) mb |= HID; else eb = 1u;
    ma <<= 6;
    mb = shr_sticky(mb << 6, ea - eb);
    uint32_t sign = a & SIGN, m;
    if ((a ^ b) >> 31 == 0u) {
        m = ma + mb;
        if (m >= 0x40000000u) { m = (m >> 1) | (m & 1u); ea++; }
    } else {
        m = ma - mb;
        if (m == 0u) return 0u;                                    /* x - x = +0 */
        uint32_t s = lead_zeros(m) - 2u;                           /* to bring the top bit to 29 */
        if (s >= ea) s = ea - 1u;                                  /* stop at the subnormal range */
        m <<= s;
        ea -= s;
    }
    return FTZ(pack(sign, (int32_t)ea, m));
}

/* A nonzero finite operand's significand with its leading one at bit 23, and its exponent in *e
 * (a subnormal's brought to that leading one, its exponent adjusted). Not named significand: GCC's
 * GNU dialects (the SDKs' gnu17) have a built-in double significand(double) of that name. */
static uint32_t unpack(uint32_t a, int32_t *e) {
    const uint32_t ea = (a >> 23) & 255u, m = a & MANT;
    if (ea) {
        *e = (int32_t)ea;
        return m | HID;
    }
    const uint32_t s = lead_zeros(m) - 8u;
    *e = 1 - (int32_t)s;
    return m << s;
}

uint32_t flm_sf_mul(uint32_t a, uint32_t b) {
    a = FTZ(a);
    b = FTZ(b);
    uint32_t sign = (a ^ b) & SIGN;
    uint32_t ea = (a >> 23) & 255u, eb = (b >> 23) & 255u;
    if (ea == 255u || eb == 255u) {
        if ((a << 1) > 0xff000000u || (b << 1) > 0xff000000u) return nan_of(a, b);
        if ((a << 1) == 0u || (b << 1) == 0u) return QNAN;        /* inf * 0 */
        return sign | 0x7f800000u;
    }
    if ((a << 1) == 0u || (b << 1) == 0u) return sign;
    int32_t xa, xb;
    uint32_t ma = unpack(a, &xa), mb = unpack(b, &xb);
    /* 24 x 24 -> 48-bit product from 12-bit halves (the M0+ multiplies 32 x 32 -> 32 only) */
    uint32_t ah = ma >> 12, al = ma & 0xfffu, bh = mb >> 12, bl = mb & 0xfffu;
    uint32_t mid = ah * bl + al * bh;
    uint32_t lo = al * bl + ((mid & 0xfffu) << 12);
    uint32_t hi = ah * bh + (mid >> 12) + (lo >> 24);             /* product >> 24 */
    lo &= 0xffffffu;
    int32_t e = xa + xb - 127;
    if (hi < HID) {                                                /* product in [1, 2): one more bit */
        hi = (hi << 1) | (lo >> 23);
        lo = (lo << 1) & 0xffffffu;
    } else {
        e++;
    }
    /* hi: 24-bit significand, lo: the 24 bits below it */
    return FTZ(pack(sign, e, (hi << 6) | (lo >> 18) | ((lo & 0x3ffffu) != 0u)));
}

uint32_t flm_sf_div(uint32_t a, uint32_t b) {
    a = FTZ(a);
    b = FTZ(b);
    uint32_t sign = (a ^ b) & SIGN;
    uint32_t ea = (a >> 23) & 255u, eb = (b >> 23) & 255u;
    if (ea == 255u || eb == 255u) {
        if ((a << 1) > 0xff000000u || (b << 1) > 0xff000000u) return nan_of(a, b);
        if (ea == eb) return QNAN;                                 /* inf / inf */
        return ea == 255u ? sign | 0x7f800000u : sign;
    }
    if ((b << 1) == 0u) return (a << 1) ? sign | 0x7f800000u : QNAN;   /* x / 0, 0 / 0 */
    if ((a << 1) == 0u) return sign;
    int32_t xa, xb;
    uint32_t ma = unpack(a, &xa), mb = unpack(b, &xb);
    int32_t e = xa - xb + 127;
    if (ma < mb) { ma <<= 1; e--; }                                /* quotient in [1, 2) */
    /* restoring division, 30 quotient bits (leading one at bit 29), remainder as sticky */
    uint32_t q = 0, r = ma;
    for (int i = 0; i < 30; i++) {
        q <<= 1;
        if (r >= mb) { r -= mb; q |= 1u; }
        r <<= 1;
    }
    return FTZ(pack(sign, e, q | (r != 0u)));
}

/* Truncation toward zero; out of range saturates, NaN gives 0 (the engine converts only values
 * it has clamped). */
int32_t flm_sf_f2iz(uint32_t a) {
    uint32_t e = (a >> 23) & 255u;
    if (e < 127u) return 0;
    if (e >= 127u + 31u) {
        if (e == 255u && (a << 9)) return 0;
        return (a & SIGN) ? INT32_MIN : INT32_MAX;
    }
    uint32_t m = ((a & MANT) | HID) << 8;                          /* leading one at bit 31 */
    uint32_t v = m >> (31u - (e - 127u));
    return (a & SIGN) ? -(int32_t)v : (int32_t)v;
}

/* The float nearest (ties to even) to the integer m with the sign bit sign (SIGN or 0): the
 * int-to-float conversions of softfloat_libgcc.c (the M0+ has its own in assembly). */
uint32_t flm_sf_from_int(uint32_t sign, uint32_t m) {
    if (m == 0u) return sign;
    uint32_t s = lead_zeros(m);
    /* leading one to bit 29 (m >> 2, the two bits shifted out kept sticky), value m * 2^(e-156) */
    return pack(sign, (int32_t)(127u + 31u - s), shr_sticky(m << s, 2u));
}
