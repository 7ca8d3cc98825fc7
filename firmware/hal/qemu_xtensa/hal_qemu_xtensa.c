/* The ESP32-S3's instruction set (Xtensa LX7: windowed ABI, single-precision FPU, MUL32, DIV32,
 * MAC16; no PIE SIMD) on QEMU's Xtensa sim machine, core de233_fpu, with -semihosting and
 * -icount shift=5. Not an ESP32-S3: no S3 peripheral, cache, flash, PSRAM or memory timing is
 * modelled, nor the second core; what carries over is the instruction set, the compiler's code for
 * it and its float arithmetic.
 *
 * Serial: the sim machine has no UART. The link is QEMU's semihosting (the simcall instruction,
 * Xtensa ISS convention: a2 = call number, a3..a5 = arguments, result in a2, errno in a3) on file
 * descriptors 0 and 1, which QEMU passes to its own stdin and stdout: the launcher makes both the
 * pty (host/boards/qemu.py). SYS_select_one with a zero timeout tells whether a byte waits,
 * so a read never blocks; hal_idle waits up to 20 ms in it (QEMU blocks the core's thread there:
 * no host CPU is spent while the board waits for the host).
 *
 * Clock: CCOUNT, turned into an exact count of instructions. QEMU computes CCOUNT from its virtual
 * clock, floor((virtual ns - origin) x 40 MHz) (40 MHz: the core's configured clock), and under
 * -icount shift=5 every instruction advances the virtual clock by exactly 32 ns: 1.28 counts per
 * instruction, from a phase that is not known (QEMU's virtual clock does not start on a multiple of
 * 32 ns of the origin). calibrate() finds the phase: 25 readings 3 instructions apart (96 ns each)
 * step by floor((r + 96 i) / 25) for exactly one r in 0..24 (96 is prime to 25, so the pattern of
 * steps tells r); from then on the instructions since the first reading are the one integer m with
 * floor((r + 32 m) / 25) = CCOUNT - first, m = ceil((25 (CCOUNT - first) - r) / 32), exact (1.28 > 1:
 * one m per count). A new calibration is taken before CCOUNT's 32 bits could wrap (carried over
 * exactly: the new first reading is counted on the old scale) and after every wait (the wait may move
 * the virtual clock; the instructions from the last reading before the wait to the new first one are
 * not counted). hal_time_us returns the count: emulated instructions (HELLO clock kind 3), not
 * microseconds of any chip. When no phase fits (a QEMU that computes CCOUNT otherwise), the HAL says
 * so on QEMU's stderr; bench/esp_probe.c checks the count against loops of known length.
 *
 * The blob: read in place at the linker script's __flm_blob_start, where QEMU's generic loader
 * put it (standing for the flash partition). PSRAM: a static arena in the .psram region. */
#include "hal.h"

#define SYS_EXIT 1
#define SYS_READ 3
#define SYS_WRITE 4
#define SYS_SELECT_ONE 29
#define SELECT_READ 1


extern const uint8_t __flm_blob_start[], __flm_blob_end[];

static int32_t simcall(int32_t nr, int32_t a, int32_t b, int32_t c) {
    register int32_t a2 __asm__("a2") = nr, a3 __asm__("a3") = a, a4 __asm__("a4") = b, a5 __asm__("a5") = c;
    __asm volatile(".byte 0x00, 0x51, 0x00"      /* simcall (LLVM 22's assembler has no mnemonic for it) */
                   : "+r"(a2), "+r"(a3)
                   : "r"(a4), "r"(a5)
                   : "memory");
    return a2;
}

void flm_xt_exit(int32_t code) __attribute__((noreturn));
void flm_xt_exit(int32_t code) {
    for (;;) simcall(SYS_EXIT, code, 0, 0);
}

static void put_text(const char *s) {
    int32_t n = 0;
    while (s[n]) n++;
    simcall(SYS_WRITE, 2, (int32_t)(uintptr_t)s, n);   /* QEMU's stderr: the launcher's log */
}

static void put_hex(uint32_t v) {
    char b[9];
    for (int k = 0; k < 8; k++) b[k] = "0123456789abcdef"[(v >> (28 - 4 * k)) & 15u];
    b[8] = 0;
    put_text(b);
}

/* An exception (start_qemu_xtensa.S flm_xt_fault): a line on QEMU's stderr, then exit status
 * 100 + EXCCAUSE, which the launcher names. */
void flm_xt_fault_report(uint32_t cause, uint32_t pc, uint32_t vaddr) __attribute__((noreturn));
void flm_xt_fault_report(uint32_t cause, uint32_t pc, uint32_t vaddr) {
    put_text("flashlm xtensa: exception cause 0x");
    put_hex(cause);
    put_text(" pc 0x");
    put_hex(pc);
    put_text(" vaddr 0x");
    put_hex(vaddr);
    put_text("\n");
    flm_xt_exit(100 + (int32_t)(cause & 63u));
}

/* ---- clock ------------------------------------------------------------------------------- */

#define CAL_READS 25u
#define CAL_STEP 96u        /* ns between two readings: 3 instructions of 32 ns */

static uint64_t counted;    /* instructions from hal_init to the calibration's first reading */
static uint32_t first, phase;

static uint32_t ccount(void) {
    uint32_t v;
    __asm volatile("rsr %0, ccount" : "=r"(v));
    return v;
}

/* Instructions from the calibration's first reading to a reading c. */
static uint64_t since_first(uint32_t c) { return ((uint64_t)(c - first) * 25u + 31u - phase) / 32u; }

/* Take CAL_READS readings 3 instructions apart; returns the phase r they fit, or -1. */
static int32_t read_phase(uint32_t c[CAL_READS]) {
    uint32_t *p = c, t;
    __asm volatile(".rept 25\n\trsr %1, ccount\n\ts32i %1, %0, 0\n\taddi %0, %0, 4\n\t.endr"
                   : "+r"(p), "=&r"(t)
                   :
                   : "memory");
    for (uint32_t r = 0; r < 25u; r++) {
        uint32_t i = 1;
        while (i < CAL_READS && c[i] - c[0] == (r + CAL_STEP * i) / 25u) i++;
        if (i == CAL_READS) return (int32_t)r;
    }
    return -1;
}

/* A new calibration; continuous: whether the instructions up to it are counted (no wait since the
 * last reading) or not. */
static void calibrate(int continuous) {
    uint32_t c[CAL_READS];
    const int32_t r = read_phase(c);
    if (r < 0) {
        static int told;
        if (!told) put_text("flashlm xtensa: CCOUNT does not step 1.28 per instruction (-icount shift=5?): "
                            "the emulated instruction counts are not exact\n");
        told = 1;
    }
    if (continuous) counted += since_first(c[0]);
    first = c[0];
    phase = r < 0 ? 0u : (uint32_t)r;
}

uint64_t hal_time_us(void) {   /* emulated instructions, not µs: see above */
    const uint32_t c = ccount();
    if (c - first >= 0x40000000u) {   /* ~0.8 G instructions: well before the 32 bits wrap */
        calibrate(1);
        return counted;
    }
    return counted + since_first(c);
}

uint8_t hal_clock_kind(void) { return FLM_CLOCK_INSTRUCTIONS; }

/* ---- board -------------------------------------------------------------------------------- */

int hal_init(int argc, char **argv) {
    (void)argc;
    (void)argv;
    calibrate(0);
    return 0;
}

const uint8_t *hal_blob(size_t *len) {
    *len = flm_blob_span(__flm_blob_start, (size_t)(__flm_blob_end - __flm_blob_start));
    return __flm_blob_start;
}

static int input_waiting(int32_t usec) {
    int32_t tv[2] = {0, usec};
    return simcall(SYS_SELECT_ONE, 0, SELECT_READ, (int32_t)(uintptr_t)tv) > 0;
}

size_t hal_serial_read(uint8_t *buf, size_t max) {
    if (!max || !input_waiting(0)) return 0;
    const int32_t n = simcall(SYS_READ, 0, (int32_t)(uintptr_t)buf, (int32_t)max);
    return n > 0 ? (size_t)n : 0;
}

void hal_serial_write(const uint8_t *buf, size_t len) {
    while (len) {
        const int32_t n = simcall(SYS_WRITE, 1, (int32_t)(uintptr_t)buf, (int32_t)len);
        if (n <= 0) return;    /* the link is gone: drop, as a UART would */
        buf += n;
        len -= (size_t)n;
    }
}

void hal_idle(void) {
    counted += since_first(ccount());
    input_waiting(20000);
    calibrate(0);              /* the wait may have moved QEMU's virtual clock */
}

const char *hal_board_name(void) { return FLM_BOARD_NAME; }   /* the profile's name (flm_config.h) */

#if defined(FLM_PSRAM_ARENA_BYTES) && FLM_PSRAM_ARENA_BYTES > 0
static uint8_t psram_arena[FLM_PSRAM_ARENA_BYTES] __attribute__((aligned(64), section(".psram")));
#endif

uint8_t *hal_tier_arena(uint32_t tier, size_t *cap) {
#if defined(FLM_PSRAM_ARENA_BYTES) && FLM_PSRAM_ARENA_BYTES > 0
    if (tier == FLM_TIER_PSRAM) {
        *cap = sizeof psram_arena;
        return psram_arena;
    }
#endif
    (void)tier;
    *cap = 0;
    return 0;
}
