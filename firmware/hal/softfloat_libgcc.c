/* libgcc's single-precision soft-float helpers (__addsf3, __ltsf2 ...) on flashlm's exact IEEE
 * arithmetic (softfloat.c), for a RISC-V without F such as the ESP32-C3 (rv32imc): GCC compiles
 * every float operation of the engine to a call of these. ESP-IDF binds those names to the chip's
 * ROM by plain linker-script assignments (esp32c3.rom.libgcc.ld), which a definition of our own
 * would not reliably override, so the names here are __wrap___addsf3 ... and the project links
 * with -Wl,--wrap=__addsf3 ... (firmware/exact_float.py): every call of __addsf3 then resolves to
 * __wrap___addsf3. The set is the complete binary32 arithmetic, int32 conversion and comparison
 * family, not only what one compiler emitted for the engine here: which comparison GCC picks for an
 * expression (a < b as __ltsf2, or as __gtsf2 with the operands swapped) may differ in ESP-IDF's
 * GCC. tests/test_exact_float.py checks each against the host's IEEE arithmetic and that the list
 * of wraps is the list of functions defined here.
 *
 * Under the ilp32 ABI (no hardware float) a float travels in an integer register, so a float
 * parameter or result is its bit pattern as a uint32_t. Integer operations only: a float
 * expression here would call the very functions it defines. */
#include <stdint.h>

uint32_t flm_sf_add(uint32_t a, uint32_t b);
uint32_t flm_sf_mul(uint32_t a, uint32_t b);
uint32_t flm_sf_div(uint32_t a, uint32_t b);
int32_t flm_sf_f2iz(uint32_t a);
uint32_t flm_sf_from_int(uint32_t sign, uint32_t m);

uint32_t __wrap___addsf3(uint32_t a, uint32_t b);
uint32_t __wrap___subsf3(uint32_t a, uint32_t b);
uint32_t __wrap___mulsf3(uint32_t a, uint32_t b);
uint32_t __wrap___divsf3(uint32_t a, uint32_t b);
uint32_t __wrap___floatsisf(int32_t i);
uint32_t __wrap___floatunsisf(uint32_t u);
int32_t __wrap___fixsfsi(uint32_t a);
uint32_t __wrap___fixunssfsi(uint32_t a);
int32_t __wrap___eqsf2(uint32_t a, uint32_t b);
int32_t __wrap___nesf2(uint32_t a, uint32_t b);
int32_t __wrap___ltsf2(uint32_t a, uint32_t b);
int32_t __wrap___lesf2(uint32_t a, uint32_t b);
int32_t __wrap___gtsf2(uint32_t a, uint32_t b);
int32_t __wrap___gesf2(uint32_t a, uint32_t b);
int32_t __wrap___unordsf2(uint32_t a, uint32_t b);

uint32_t __wrap___addsf3(uint32_t a, uint32_t b) { return flm_sf_add(a, b); }
/* a - b is a + (-b) exactly in IEEE arithmetic, NaN operands included (their sign is not part of
 * the result's value; flm_sf_add quiets and returns the NaN) */
uint32_t __wrap___subsf3(uint32_t a, uint32_t b) { return flm_sf_add(a, b ^ 0x80000000u); }
uint32_t __wrap___mulsf3(uint32_t a, uint32_t b) { return flm_sf_mul(a, b); }
uint32_t __wrap___divsf3(uint32_t a, uint32_t b) { return flm_sf_div(a, b); }

/* int to float, rounded to nearest, ties to even (0u - u: the magnitude of INT32_MIN too) */
uint32_t __wrap___floatsisf(int32_t i) {
    uint32_t u = (uint32_t)i;
    return i < 0 ? flm_sf_from_int(0x80000000u, 0u - u) : flm_sf_from_int(0u, u);
}
uint32_t __wrap___floatunsisf(uint32_t u) { return flm_sf_from_int(0u, u); }

/* float to int, truncating toward zero. Out of range and NaN are undefined in C; here they saturate
 * (NaN gives 0, a negative value 0 for the unsigned one). */
int32_t __wrap___fixsfsi(uint32_t a) { return flm_sf_f2iz(a); }
uint32_t __wrap___fixunssfsi(uint32_t a) {
    uint32_t e = (a >> 23) & 255u;
    if ((a >> 31) || e < 127u || (e == 255u && (a << 9))) return 0u;    /* negative, |a| < 1, NaN */
    if (e >= 127u + 32u) return 0xffffffffu;
    uint32_t m = ((a & 0x007fffffu) | 0x00800000u) << 8;                /* leading one at bit 31 */
    return m >> (31u - (e - 127u));
}

/* Whether a or b is a NaN. */
static int32_t either_nan(uint32_t a, uint32_t b) { return (a << 1) > 0xff000000u || (b << 1) > 0xff000000u; }

/* -1, 0 or 1 as a is below, equal to or above b; unordered (a NaN operand) gives `unordered`.
 * +0 and -0 are equal. */
static int32_t compare(uint32_t a, uint32_t b, int32_t unordered) {
    if (either_nan(a, b)) return unordered;
    if (((a | b) << 1) == 0u) return 0;
    if (a == b) return 0;
    /* ordered: by sign, then by magnitude (reversed for negatives) */
    if ((a ^ b) >> 31) return (a >> 31) ? -1 : 1;
    int32_t below = (a >> 31) ? a > b : a < b;
    return below ? -1 : 1;
}

/* libgcc's return conventions: each result, tested against 0 with the relation the helper is
 * named for, gives the comparison's truth, false when unordered (so __eqsf2 and __nesf2 are
 * nonzero for a NaN operand, __ltsf2 and __lesf2 positive, __gtsf2 and __gesf2 negative). */
int32_t __wrap___eqsf2(uint32_t a, uint32_t b) { return compare(a, b, 1); }
int32_t __wrap___nesf2(uint32_t a, uint32_t b) { return compare(a, b, 1); }
int32_t __wrap___ltsf2(uint32_t a, uint32_t b) { return compare(a, b, 1); }
int32_t __wrap___lesf2(uint32_t a, uint32_t b) { return compare(a, b, 1); }
int32_t __wrap___gtsf2(uint32_t a, uint32_t b) { return compare(a, b, -1); }
int32_t __wrap___gesf2(uint32_t a, uint32_t b) { return compare(a, b, -1); }
/* nonzero iff a or b is a NaN */
int32_t __wrap___unordsf2(uint32_t a, uint32_t b) { return either_nan(a, b); }
