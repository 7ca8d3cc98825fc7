/* RP2040 start-up: the vector table at the start of the image (flash 0x10000100, after the
 * 256-byte boot2 slot), the reset handler (.data copy, .bss clear, stack paint, VTOR, main), a fault
 * handler that reports the exception over the watchdog scratch registers (hal_rp2040.h), and
 * hal_stack_peak, which reads the paint back.
 *
 * On the emulated board the harness does what the boot ROM and boot2 do on a chip: it sets VTOR
 * to the table and loads SP and PC from its first two words. */
#include <stdint.h>
#include "hal_rp2040.h"

extern uint32_t __data_lma[], __data_start[], __data_end[], __bss_start[], __bss_end[], __stack_top[];
extern const uint32_t __vectors_start[];
int main(void);
void flm_uart0_irq(void);
void flm_dma0_irq(void);   /* stream_rp2040.c (a fault in a build without streaming) */

#define REG(addr) (*(volatile uint32_t *)(addr))
#define PPB_VTOR 0xe000ed08u

/* The main stack is the RAM between .bss's end and the top (rp2040.ld; the link guarantees 8 KB of it).
 * Reset fills what the reset handler's own frame does not use with this word; the deepest the stack
 * ever went is where the first word that differs from it sits, reading up from .bss's end. */
#define STACK_PAINT 0x5354434bu   /* "KCTS" */
#define PAINT_MARGIN 64u          /* bytes kept clear below the reset handler's stack pointer */

typedef void (*vector)(void);
#define N_VECTORS (16 + 26)   /* 16 system exceptions, then the RP2040's 26 interrupt lines */

/* The table the core uses once running: a copy in SRAM (at its start, rp2040.ld: VTOR wants 256-byte
 * alignment), so that an interrupt taken while a streamed product has the SSI out of XIP mode
 * (stream_rp2040.c's DMA interrupt) fetches its vector without an XIP cache miss. */
static vector ram_vectors[N_VECTORS] __attribute__((section(".ram_vectors"), used));

void flm_reset(void) __attribute__((noreturn));
void flm_reset(void) {
    uint32_t *src = __data_lma, *dst = __data_start;
    while (dst < __data_end) *dst++ = *src++;
    for (dst = __bss_start; dst < __bss_end; dst++) *dst = 0;
    uint8_t *sp;
    __asm volatile("mov %0, sp" : "=r"(sp));
    for (dst = __bss_end; (uint8_t *)dst < sp - PAINT_MARGIN; dst++) *dst = STACK_PAINT;
    for (uint32_t i = 0; i < N_VECTORS; i++) ram_vectors[i] = ((const vector *)(const void *)__vectors_start)[i];
    REG(PPB_VTOR) = (uint32_t)(uintptr_t)ram_vectors;
    main();
    for (;;) __asm volatile("wfi");
}

uint32_t hal_stack_peak(uint32_t *size) {
    const uint32_t *p = __bss_end;
    while (p < __stack_top && *p == STACK_PAINT) p++;
    *size = (uint32_t)((uintptr_t)__stack_top - (uintptr_t)__bss_end);
    return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)p);
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

void flm_dma0_irq(void) __attribute__((weak, alias("flm_fault")));

/* The boot table: 16 system exceptions, then the RP2040's 26 interrupt lines (DMA_IRQ_0 is line 11,
 * UART0 line 20). */
__attribute__((section(".vectors"), used)) const vector flm_vectors[N_VECTORS] = {
    [0] = (vector)(uintptr_t)__stack_top,
    [1] = flm_reset,
    [2] = flm_fault,    /* NMI */
    [3] = flm_fault,    /* HardFault */
    [11] = flm_fault,   /* SVCall */
    [14] = flm_fault,   /* PendSV */
    [15] = flm_fault,   /* SysTick */
    [16] = flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault,
    flm_fault, flm_fault, flm_fault,
    [16 + 11] = flm_dma0_irq,
    [16 + 12] = flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault, flm_fault,
    [16 + 20] = flm_uart0_irq,
    [16 + 21] = flm_fault, flm_fault, flm_fault, flm_fault, flm_fault,
};
