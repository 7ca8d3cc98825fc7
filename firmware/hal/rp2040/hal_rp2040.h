/* RP2040 bare-metal HAL: what the rest of the firmware sees besides hal.h.
 *
 * Force-included (-include) into every translation unit of an RP2040 build, so app_generate.c's optional
 * step hooks report each forward step to whoever watches the chip: on the emulated board the
 * harness (host/emu/harness.mjs) attributes the core's memory reads to steps with them; on a real
 * chip they are a few writes to the watchdog's scratch registers, which nothing else uses. */
#ifndef FLM_HAL_RP2040_H
#define FLM_HAL_RP2040_H
#include <stdint.h>

/* Watchdog scratch registers 0..3 (4..7 belong to the boot ROM) carry the marks. */
#define FLM_MARK_BEGIN 0xF1A5B001u     /* SCRATCH2 = step: a forward step starts */
#define FLM_MARK_END 0xF1A5E0D0u       /* the step's forward pass is over */
#define FLM_MARK_REGION 0xF1A5AE60u    /* SCRATCH0..1 = [lo, hi), SCRATCH2 = tier: reads there count */
#define FLM_MARK_FAULT 0xF1A5DEADu     /* SCRATCH2 = exception number, SCRATCH1 = stacked PC */

/* Code linked to run from SRAM (rp2040.ld: copied there with .data at boot), where no XIP cache
 * miss can stall it. Assembly puts such code in a section named .ramtext or .ramtext.NAME. */
#define FLM_RAMFUNC __attribute__((section(".ramtext"), noinline))

/* state is the engine's flm_state (void * so this header needs no engine header). */
void hal_rp2040_step_begin(uint32_t step, const void *state);
void hal_rp2040_step_end(uint32_t step);
/* Before a step_begin: another state whose KV cache the step reads (the draft model's). */
void hal_rp2040_mark_state(const void *state);

#define FLM_STEP_BEGIN(step, state) hal_rp2040_step_begin((step), (state))
#define FLM_STEP_END(step) hal_rp2040_step_end(step)
#define FLM_STEP_STATE(state) hal_rp2040_mark_state(state)

/* Launches core 1 (cores_rp2040.c), which from then on computes half the rows of every hal_matmul. */
void hal_rp2040_cores_launch(void);

/* the soft-float's assembly entry points (kernels_arch.h maps the kernels' hooks to them) */
#include "softfloat_m0.h"
#endif
