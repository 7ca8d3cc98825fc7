/* RP2040 bare-metal HAL (no SDK): the QSPI flash's XIP read mode and clock, clocks from the
 * 12 MHz crystal through PLL_SYS to 125 MHz, UART0 (PL011) on GPIO0/1 at FLM_UART_BAUD 8N1, the
 * 1 MHz TIMER for hal_time_us, the weights blob read in place from the XIP flash window at the
 * linker script's __flm_blob_start, and core 1 launched to share the matrix products (cores_rp2040.c).
 *
 * Register addresses and bit positions are from the RP2040 datasheet (sections 2.6.3 XIP,
 * 2.14 subsystem resets, 2.15 clocks, 2.16 XOSC, 2.18 PLL, 4.2 UART, 4.6 timer, 4.7 watchdog,
 * 4.10 SSI); the Cortex-M0+ ones (VTOR, NVIC) from the ARMv6-M architecture reference. */
#include "hal.h"
#include "hal_rp2040.h"
#include "engine.h"

#ifndef FLM_UART_BAUD
#define FLM_UART_BAUD 115200u
#endif
#define XOSC_HZ 12000000u
#define CLK_SYS_HZ 125000000u   /* 12 MHz * 125 = 1500 MHz VCO, / 6 / 2 */

#define REG(addr) (*(volatile uint32_t *)(addr))
#define ALIAS_SET 0x2000u       /* atomic set / clear aliases of every APB register */
#define ALIAS_CLR 0x3000u

#define RESETS_BASE 0x4000c000u
#define RESETS_RESET (RESETS_BASE + 0x0u)
#define RESETS_DONE (RESETS_BASE + 0x8u)
#define RST_DMA (1u << 2)
#define RST_IO_BANK0 (1u << 5)
#define RST_PADS_BANK0 (1u << 8)
#define RST_PLL_SYS (1u << 12)
#define RST_TIMER (1u << 21)
#define RST_UART0 (1u << 22)

#define CLOCKS_BASE 0x40008000u
#define CLK_REF_CTRL (CLOCKS_BASE + 0x30u)
#define CLK_REF_SELECTED (CLOCKS_BASE + 0x38u)
#define CLK_SYS_CTRL (CLOCKS_BASE + 0x3cu)
#define CLK_SYS_DIV (CLOCKS_BASE + 0x40u)
#define CLK_SYS_SELECTED (CLOCKS_BASE + 0x44u)
#define CLK_PERI_CTRL (CLOCKS_BASE + 0x48u)

#define XOSC_BASE 0x40024000u
#define XOSC_CTRL (XOSC_BASE + 0x0u)
#define XOSC_STATUS (XOSC_BASE + 0x4u)
#define XOSC_STARTUP (XOSC_BASE + 0xcu)

#define PLL_SYS_BASE 0x40028000u
#define PLL_CS (PLL_SYS_BASE + 0x0u)
#define PLL_PWR (PLL_SYS_BASE + 0x4u)
#define PLL_FBDIV (PLL_SYS_BASE + 0x8u)
#define PLL_PRIM (PLL_SYS_BASE + 0xcu)

#define IO_BANK0_BASE 0x40014000u
#define GPIO_CTRL(n) (IO_BANK0_BASE + 0x04u + 8u * (n))
#define FUNC_UART 2u

#define UART0_BASE 0x40034000u
#define UART_DR (UART0_BASE + 0x00u)
#define UART_FR (UART0_BASE + 0x18u)
#define UART_IBRD (UART0_BASE + 0x24u)
#define UART_FBRD (UART0_BASE + 0x28u)
#define UART_LCR_H (UART0_BASE + 0x2cu)
#define UART_CR (UART0_BASE + 0x30u)
#define UART_IMSC (UART0_BASE + 0x38u)
#define FR_TXFF (1u << 5)
#define FR_RXFE (1u << 4)
#define IM_RX ((1u << 4) | (1u << 6))   /* RXIM: FIFO level, RTIM: receive timeout */
#define UART0_IRQ 20u

#define TIMER_BASE 0x40054000u
#define TIMER_RAWH (TIMER_BASE + 0x24u)
#define TIMER_RAWL (TIMER_BASE + 0x28u)

#define WATCHDOG_BASE 0x40058000u
#define WD_SCRATCH(n) (WATCHDOG_BASE + 0x0cu + 4u * (n))
#define WD_TICK (WATCHDOG_BASE + 0x2cu)

#define SSI_BASE 0x18000000u
#define SSI_CTRLR0 (SSI_BASE + 0x00u)
#define SSI_CTRLR1 (SSI_BASE + 0x04u)
#define SSI_SSIENR (SSI_BASE + 0x08u)
#define SSI_BAUDR (SSI_BASE + 0x14u)
#define SSI_RX_SAMPLE_DLY (SSI_BASE + 0xf0u)
#define SSI_SPI_CTRLR0 (SSI_BASE + 0xf4u)
#ifndef FLM_RP2040_CORES
#define FLM_RP2040_CORES 2   /* 1: core 1 stays in the boot ROM and core 0 computes every row */
#endif
#ifndef FLM_XIP_SCKDV
#define FLM_XIP_SCKDV 2u   /* the board profile's [flash].spi_clkdiv: SCK = clk_sys / 2 */
#endif

#define NVIC_ISER 0xe000e100u
#define NVIC_ICPR 0xe000e280u

extern const uint8_t __flm_blob_start[], __flm_blob_end[];

/* The flash read path every XIP cache miss takes (datasheet 4.10 SSI, 2.6.3 XIP), as a Pico's
 * boot2 leaves it for a W25Q-series flash in continuous-read mode: quad I/O, no instruction (the
 * flash already holds EBh), 24 address bits then the mode bits 0xA0 that keep it in that mode,
 * 4 dummy clocks, 32-bit frames; SCK = clk_sys / FLM_XIP_SCKDV, RX sampled one clk_sys late.
 * Written again here because this firmware, not a boot2, decides the divider (the emulator
 * harness derives the cost of a miss from these registers, host/emu/xip.mjs). The SSI must be
 * disabled while it is reconfigured, and no XIP fetch can happen meanwhile: this runs from SRAM. */
FLM_RAMFUNC static void xip_setup(void) {
    REG(SSI_SSIENR) = 0u;
    REG(SSI_BAUDR) = FLM_XIP_SCKDV;
    REG(SSI_RX_SAMPLE_DLY) = 1u;
    REG(SSI_CTRLR0) = (2u << 21) | (31u << 16) | (3u << 8);   /* SPI_FRF quad, DFS_32 32 bits, TMOD EEPROM read */
    REG(SSI_CTRLR1) = 0u;                                      /* NDF: one frame per request */
    REG(SSI_SPI_CTRLR0) = (0xa0u << 24) | (4u << 11) | (0u << 8) | (8u << 2) | 2u;
                          /* XIP_CMD = mode bits, WAIT_CYCLES 4, INST_L none, ADDR_L 8 x 4 bits, 2C2A */
    REG(SSI_SSIENR) = 1u;
}

static void unreset(uint32_t bits) {
    REG(RESETS_RESET + ALIAS_CLR) = bits;
    while ((REG(RESETS_DONE) & bits) != bits) {}
}

static void clocks_init(void) {
    /* clk_sys back onto clk_ref while the PLL is (re)started */
    REG(CLK_SYS_CTRL + ALIAS_CLR) = 1u;
    while (!(REG(CLK_SYS_SELECTED) & 1u)) {}
    REG(XOSC_CTRL) = 0xaa0u;                                /* FREQ_RANGE 1..15 MHz */
    REG(XOSC_STARTUP) = (XOSC_HZ / 1000u + 128u) / 256u;    /* ~1 ms in units of 256 cycles */
    REG(XOSC_CTRL + ALIAS_SET) = 0xfabu << 12;              /* ENABLE */
    while (!(REG(XOSC_STATUS) & (1u << 31))) {}             /* STABLE */
    REG(CLK_REF_CTRL) = 2u;                                 /* clk_ref = XOSC */
    while (!(REG(CLK_REF_SELECTED) & (1u << 2))) {}

    REG(RESETS_RESET + ALIAS_SET) = RST_PLL_SYS;
    unreset(RST_PLL_SYS);
    REG(PLL_CS) = 1u;                                       /* REFDIV 1 */
    REG(PLL_FBDIV) = 125u;                                  /* VCO 12 MHz * 125 = 1500 MHz */
    REG(PLL_PWR + ALIAS_CLR) = (1u << 0) | (1u << 5);       /* PD, VCOPD off */
    while (!(REG(PLL_CS) & (1u << 31))) {}                  /* LOCK */
    REG(PLL_PRIM) = (6u << 16) | (2u << 12);                /* POSTDIV1 6, POSTDIV2 2 */
    REG(PLL_PWR + ALIAS_CLR) = 1u << 3;                     /* POSTDIVPD off */

    REG(CLK_SYS_DIV) = 1u << 8;
    REG(CLK_SYS_CTRL) = 0u << 5;                            /* AUXSRC pll_sys, SRC still clk_ref */
    REG(CLK_SYS_CTRL + ALIAS_SET) = 1u;                     /* SRC = aux */
    while (!(REG(CLK_SYS_SELECTED) & 2u)) {}
    REG(CLK_PERI_CTRL) = (1u << 11) | (0u << 5);            /* ENABLE, AUXSRC clk_sys */
    REG(WD_TICK) = (1u << 9) | (XOSC_HZ / 1000000u);        /* 1 µs TIMER tick from clk_ref */
}

static void uart_init(void) {
    unreset(RST_IO_BANK0 | RST_PADS_BANK0 | RST_UART0 | RST_TIMER);
    /* baud divisor = clk_peri / (16 * baud) as 16.6 fixed point, rounded */
    const uint32_t div = 8u * CLK_SYS_HZ / FLM_UART_BAUD;
    REG(UART_IBRD) = div >> 7;
    REG(UART_FBRD) = ((div & 0x7fu) + 1u) / 2u;
    REG(UART_LCR_H) = (3u << 5) | (1u << 4);                /* 8 bits, FIFOs on; latches the divisor */
    REG(UART_CR) = (1u << 0) | (1u << 8) | (1u << 9);       /* UARTEN, TXE, RXE */
    REG(GPIO_CTRL(0)) = FUNC_UART;                          /* GPIO0 = UART0 TX */
    REG(GPIO_CTRL(1)) = FUNC_UART;                          /* GPIO1 = UART0 RX */
    REG(NVIC_ISER) = 1u << UART0_IRQ;                       /* only ever wakes hal_idle's WFI */
}

int hal_init(int argc, char **argv) {
    (void)argc;
    (void)argv;
    xip_setup();
    clocks_init();
    uart_init();
    unreset(RST_DMA);                                       /* stream_rp2040.c's channel 0 */
    REG(NVIC_ISER) = 1u << 11u;   /* DMA_IRQ_0: that channel's reads ending (enabled at the DMA during a streamed product only) */
#if FLM_RP2040_CORES > 1
    hal_rp2040_cores_launch();
#endif
    return 0;
}

const uint8_t *hal_blob(size_t *len) {
    *len = flm_blob_span(__flm_blob_start, (size_t)(__flm_blob_end - __flm_blob_start));
    return __flm_blob_start;
}

size_t hal_serial_read(uint8_t *buf, size_t max) {
    size_t n = 0;
    while (n < max && !(REG(UART_FR) & FR_RXFE)) buf[n++] = (uint8_t)REG(UART_DR);
    return n;
}

void hal_serial_write(const uint8_t *buf, size_t len) {
    for (size_t i = 0; i < len; i++) {
        while (REG(UART_FR) & FR_TXFF) {}
        REG(UART_DR) = buf[i];
    }
}

/* The UART0 interrupt only wakes the core: mask it again and return. */
void flm_uart0_irq(void) { REG(UART_IMSC) = 0u; }

void hal_idle(void) {
    REG(NVIC_ICPR) = 1u << UART0_IRQ;
    REG(UART_IMSC) = IM_RX;
    if (REG(UART_FR) & FR_RXFE) __asm volatile("wfi");
    REG(UART_IMSC) = 0u;
}

uint64_t hal_time_us(void) {
    uint32_t hi = REG(TIMER_RAWH), lo, hi2;
    for (;;) {
        lo = REG(TIMER_RAWL);
        hi2 = REG(TIMER_RAWH);
        if (hi2 == hi) break;
        hi = hi2;
    }
    return ((uint64_t)hi << 32) | lo;
}

#ifndef FLM_CLOCK_KIND
#define FLM_CLOCK_KIND 2   /* 2: emulated timer (rp2040js); a real chip's build passes 1 */
#endif
uint8_t hal_clock_kind(void) { return FLM_CLOCK_KIND; }

const char *hal_board_name(void) { return FLM_BOARD_NAME; }

/* ---- step marks for the emulator harness (see hal_rp2040.h) --------------------------- */

static void mark_region(const void *lo, const void *hi, uint32_t tier) {
    REG(WD_SCRATCH(0)) = (uint32_t)(uintptr_t)lo;
    REG(WD_SCRATCH(1)) = (uint32_t)(uintptr_t)hi;
    REG(WD_SCRATCH(2)) = tier;
    REG(WD_SCRATCH(3)) = FLM_MARK_REGION;
}

static void mark_tensor(const flm_tensor *t) {
    /* tensors staged into RAM (tier psram/sram) are read there; flash ones in the blob window */
    if ((uintptr_t)t->data >= 0x20000000u && (uintptr_t)t->data < 0x20042000u)
        mark_region(t->data, t->data + t->length, t->tier);
}

void hal_rp2040_mark_state(const void *state) {
    const flm_state *s = (const flm_state *)state;
    mark_region(s->kc, s->kc + s->kv_bytes, s->kv_tier);   /* kc and vc are adjacent in the arena */
}

void hal_rp2040_step_begin(uint32_t step, const void *state) {
    const flm_state *s = (const flm_state *)state;
    const flm_model *m = s->m;
    const flm_tensor *t;
    hal_rp2040_mark_state(s);
    for (uint32_t i = 0; (t = flm_tensor_at(m, i)) != 0; i++) mark_tensor(t);
    REG(WD_SCRATCH(2)) = step;
    REG(WD_SCRATCH(3)) = FLM_MARK_BEGIN;
}

void hal_rp2040_step_end(uint32_t step) {
    REG(WD_SCRATCH(2)) = step;
    REG(WD_SCRATCH(3)) = FLM_MARK_END;
}
