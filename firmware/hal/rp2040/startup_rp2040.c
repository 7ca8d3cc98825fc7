/* RP2040 start-up: the vector table at the start of the image (flash 0x10000100, after the
 * 256-byte boot2 slot), the reset handler (.data copy, .bss clear, VTOR, main) and a fault
 * handler that reports the exception over the watchdog scratch registers (hal_rp2040.h).
 *
 * On the emulated board the harness does what the boot ROM and boot2 do on a chip: it sets VTOR
 * to the table and loads SP and PC from its first two words. */
#include <stdint.h>
#include "hal_rp2040.h"

extern uint32_t __data_lma[], __data_start[], __data_end[], __bss_start[], __bss_end[], __stack_top[];
extern const uint32_t __vectors_start[];
int main(void);
void flm_uart0_irq(void);

#define REG(addr) (*(volatile uint32_t *)(addr))
#define PPB_VTOR 0xe000ed08u

void flm_reset(void) __attribute__((noreturn));
void flm_reset(void) {
    uint32_t *src = __data_lma, *dst = __data_start;
    while (dst < __data_end) *dst++ = *src++;
    for (dst = __bss_start; dst < __bss_end; dst++) *dst = 0;
    REG(PPB_VTOR) = (uint32_t)(uintptr_t)__vectors_start;
    main();
    for (;;) __asm volatile("wfi");
}

/* frame: the registers the core stacked on exception entry (r0-r3, r12, lr, pc, xpsr) */
void flm_fault_report(const uint32_t *frame, uint32_t ipsr) __attribute__((noreturn, used));
void flm_fault_report(const uint32_t *frame, uint32_t ipsr) {
    REG(0x40058010u) = frame[6];       /* watchdog SCRATCH1: stacked PC */
    REG(0x40058014u) = ipsr & 0x3fu;   /* SCRATCH2: exception number */
    REG(0x40058018u) = FLM_MARK_FAULT; /* SCRATCH3 */
    for (;;) __asm volatile("wfi");
}

__attribute__((naked)) static void flm_fault(void) {
    __asm volatile(
        "mrs r0, msp\n"
        "mrs r1, ipsr\n"
        "ldr r2, =flm_fault_report\n"
        "bx r2\n");
}

typedef void (*vector)(void);

/* 16 system exceptions, then the RP2040's 26 interrupt lines (UART0 is line 20). */
__attribute__((section(".vectors"), used)) const vector flm_vectors[16 + 26] = {
    [0] = (vector)(uintptr_t)__stack_top,
    [1] = flm_reset,
    [2] = flm_fault,    /* NMI */
    [3] = flm_fault,    /* HardFault */
    [11] = flm_fault,   /* SVCall */
    [14] = flm_fault,   /* PendSV */
    [15] = flm_fault,   /* SysTick */
    [16] = flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault,
    flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault,
    flm_fault, flm_fault, flm_fault, flm_fault,
    [16 + 20] = flm_uart0_irq,
    [16 + 21] = flm_fault, flm_fault, flm_fault, flm_fault, flm_fault,
};
