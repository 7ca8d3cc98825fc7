/* The ESP32-C3's instruction set (rv32imc, no FPU) on QEMU's generic RISC-V machine, and the
 * ESP32-P4's without its SIMD (rv32imafc, the F extension's hardware floats): a bare-metal HAL for
 * qemu-system-riscv32 -M virt -bios none -icount shift=0. Not an ESP32-C3 or -P4: no peripheral,
 * cache, flash or memory timing of theirs is modelled; what carries over is the instruction set,
 * the compiler's code for it and its floats (on the C3 the soft-float, softfloat.c through
 * softfloat_libgcc.c's --wrap names, as the real C3's project links them; on the P4 the F
 * instructions, which start_qemu_rv32.S enables).
 *
 * Serial: the machine's NS16550A UART at 0x10000000 (QEMU's serial0; the launcher bridges it to a
 * pty). Idle: wfi until the UART's receive interrupt is pending at the PLIC (never taken: mstatus.MIE
 * stays 0, so no handler is needed). The blob: read in place at the linker script's
 * __flm_blob_start, where QEMU's generic loader put it (standing for the flash partition).
 *
 * Clock: minstret, the instructions the hart retired. Under -icount shift=0 QEMU derives it from its
 * instruction counter (one instruction, one nanosecond of virtual time), so the difference of two
 * readings with no wait between them is the exact count of instructions run in between; across a
 * wfi it also holds the virtual time the hart waited. HELLO's clock kind 3: emulated instructions,
 * not microseconds of any chip.
 *
 * Addresses (QEMU's virt machine memory map): UART0 0x10000000 (IRQ 10), PLIC 0x0c000000 (context 0
 * = hart 0 machine mode), sifive_test 0x00100000 (a write ends QEMU: 0x5555 pass, code << 16 |
 * 0x3333 fail with exit status code). Register layouts: the NS16550A's (byte registers: RBR/THR 0,
 * IER 1, FCR 2, LCR 3, MCR 4, LSR 5) and the RISC-V PLIC specification's. */
#include "hal.h"

#define REG8(a) (*(volatile uint8_t *)(uintptr_t)(a))
#define REG32(a) (*(volatile uint32_t *)(uintptr_t)(a))

#define UART 0x10000000u
#define UART_RBR (UART + 0u)
#define UART_THR (UART + 0u)
#define UART_IER (UART + 1u)
#define UART_FCR (UART + 2u)
#define UART_LCR (UART + 3u)
#define UART_LSR (UART + 5u)
#define LSR_DR 0x01u     /* receive data ready */
#define LSR_THRE 0x20u   /* transmit holding register empty */
#define UART_IRQ 10u

#define PLIC 0x0c000000u
#define PLIC_PRIORITY(irq) (PLIC + 4u * (irq))
#define PLIC_ENABLE0 (PLIC + 0x2000u)           /* context 0: irqs 0-31 */
#define PLIC_THRESHOLD0 (PLIC + 0x200000u)
#define PLIC_CLAIM0 (PLIC + 0x200004u)
#define MIE_MEIE (1u << 11)

#define TEST_DEV 0x00100000u


extern const uint8_t __flm_blob_start[], __flm_blob_end[];

static void uart_put(uint8_t c) {
    while (!(REG8(UART_LSR) & LSR_THRE)) {}
    REG8(UART_THR) = c;
}

/* End QEMU with exit status code (0: success). */
void flm_rv32_exit(uint32_t code) __attribute__((noreturn));
void flm_rv32_exit(uint32_t code) {
    REG32(TEST_DEV) = code ? (code << 16) | 0x3333u : 0x5555u;
    for (;;) {}
}

static void put_hex(uint32_t v) {
    for (int k = 28; k >= 0; k -= 4) uart_put((uint8_t)"0123456789abcdef"[(v >> k) & 15u]);
}

/* A trap (start_qemu_rv32.S): a line on the serial link for whoever reads it, then QEMU ends with
 * exit status 100 + mcause, which the launcher names (host/boards/qemu.py). */
void flm_rv32_trap(uint32_t mcause, uint32_t mepc, uint32_t mtval) __attribute__((noreturn));
void flm_rv32_trap(uint32_t mcause, uint32_t mepc, uint32_t mtval) {
    const char *s = "\r\nflashlm rv32: trap mcause 0x";
    while (*s) uart_put((uint8_t)*s++);
    put_hex(mcause);
    s = " mepc 0x";
    while (*s) uart_put((uint8_t)*s++);
    put_hex(mepc);
    s = " mtval 0x";
    while (*s) uart_put((uint8_t)*s++);
    put_hex(mtval);
    uart_put('\r');
    uart_put('\n');
    flm_rv32_exit(100u + (mcause & 31u));
}

int hal_init(int argc, char **argv) {
    (void)argc;
    (void)argv;
    REG8(UART_LCR) = 0x03u;     /* 8N1 (QEMU ignores the divisor: bytes pass at once) */
    REG8(UART_FCR) = 0x07u;     /* FIFOs on and cleared */
    REG8(UART_IER) = 0x01u;     /* receive-data interrupt: only ever wakes hal_idle's wfi */
    REG32(PLIC_PRIORITY(UART_IRQ)) = 1u;
    REG32(PLIC_ENABLE0) = 1u << UART_IRQ;
    REG32(PLIC_THRESHOLD0) = 0u;
    __asm volatile("csrs mie, %0" ::"r"(MIE_MEIE));
    return 0;
}

const uint8_t *hal_blob(size_t *len) {
    *len = flm_blob_span(__flm_blob_start, (size_t)(__flm_blob_end - __flm_blob_start));
    return __flm_blob_start;
}

size_t hal_serial_read(uint8_t *buf, size_t max) {
    size_t n = 0;
    while (n < max && (REG8(UART_LSR) & LSR_DR)) buf[n++] = REG8(UART_RBR);
    return n;
}

void hal_serial_write(const uint8_t *buf, size_t len) {
    for (size_t i = 0; i < len; i++) uart_put(buf[i]);
}

void hal_idle(void) {
    if (!(REG8(UART_LSR) & LSR_DR)) __asm volatile("wfi");
    /* claim and complete whatever woke the hart, so the next wfi waits again */
    const uint32_t irq = REG32(PLIC_CLAIM0);
    if (irq) REG32(PLIC_CLAIM0) = irq;
}

uint64_t hal_time_us(void) {   /* emulated instructions (minstret), not µs: see above */
    uint32_t hi, lo, hi2;
    do {
        __asm volatile("csrr %0, minstreth" : "=r"(hi));
        __asm volatile("csrr %0, minstret" : "=r"(lo));
        __asm volatile("csrr %0, minstreth" : "=r"(hi2));
    } while (hi != hi2);
    return (uint64_t)hi << 32 | lo;
}

uint8_t hal_clock_kind(void) { return FLM_CLOCK_INSTRUCTIONS; }

const char *hal_board_name(void) { return FLM_BOARD_NAME; }   /* the profile's name (flm_config.h) */
