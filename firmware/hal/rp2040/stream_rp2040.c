/* hal_matmul on the RP2040: a one-token product on a matrix in flash streams its rows into SRAM
 * while both cores compute, any other runs on both cores as it stands (cores_rp2040.c).
 *
 * Through the XIP cache the two cores wait on flash one 8-byte line at a time (59 cycles a line at
 * SCKDV 2); the SSI in a quad read it was told to run itself moves a 32-bit word every 16 cycles
 * once the address is sent (datasheet 4.10 SSI; host/emu/ssidirect.mjs). So the product takes the
 * SSI out of XIP mode, has DMA channel 0 (datasheet 2.5, paced by DREQ_XIP_SSIRX) carry the rows
 * chunk by chunk into one of two SRAM buffers, and both cores compute chunk i from its buffer,
 * through a view tensor (its data the buffer), while chunk i+1 streams into the other; then the SSI
 * goes back to XIP mode. A chunk is whole rows (a row's scales sit in it), the rows' bytes are the
 * flash's, so the logits are bit for bit those of the XIP path. While the SSI is out of XIP mode
 * nothing may miss in the XIP cache: this file, the row loops, the kernels, the soft-float and core
 * 1's loop run from SRAM (rp2040.ld), the activations and outputs are in SRAM, and no interrupt is
 * enabled during a product (hal_rp2040.c: UART0's only in hal_idle). The SSI's other settings stay
 * what xip_setup wrote (quad, 32-bit frames, EEPROM read, continuous-read mode bits 0xA0, no
 * instruction), so a read is NDF (CTRLR1) and one address word; the flash stays in continuous-read
 * mode, and XIP resumes with NDF 0. FLM_RP2040_STREAM=0 builds without it. */
#include "cores_rp2040.h"
#include "hal_rp2040.h"

#ifndef FLM_RP2040_STREAM
#define FLM_RP2040_STREAM 1
#endif
#define STREAM_CHUNK_BYTES 1024u   /* each of the two buffers: a 1 KB read takes ~4,100 cycles */

#define REG(addr) (*(volatile uint32_t *)(addr))
#define SSI_CTRLR1 0x18000004u
#define SSI_SSIENR 0x18000008u
#define SSI_DMACR 0x1800004cu
#define SSI_DMARDLR 0x18000054u
#define SSI_DR0 0x18000060u
#define DMA_READ 0x50000000u        /* channel 0 */
#define DMA_WRITE 0x50000004u
#define DMA_COUNT 0x50000008u
#define DMA_CTRL_TRIG 0x5000000cu
#define DREQ_XIP_SSIRX 39u
/* EN, DATA_SIZE word, INCR_WRITE, CHAIN_TO itself (none), TREQ_SEL the SSI's RX request */
#define DMA_CTRL (1u | (2u << 2) | (1u << 5) | (0u << 11) | (DREQ_XIP_SSIRX << 15))
#define XIP_BASE 0x10000000u
#define XIP_END 0x11000000u         /* the cached, allocating alias: where the blob is addressed */
#define MODE_BITS 0xa0u             /* continuous read: the flash expects no command next time */

#if FLM_RP2040_STREAM
static uint32_t stream_buf[2][STREAM_CHUNK_BYTES / 4u];

/* rows [r, r + k) of w into buffer i: one read of k rows' words, the DMA carrying them */
FLM_RAMFUNC static void chunk_start(const flm_tensor *w, uint32_t r, uint32_t k, uint32_t i) {
    const uint32_t words = k * w->stride / 4u;
    REG(SSI_SSIENR) = 0u;
    REG(SSI_CTRLR1) = words - 1u;
    REG(SSI_SSIENR) = 1u;
    REG(DMA_READ) = SSI_DR0;
    REG(DMA_WRITE) = (uint32_t)(uintptr_t)stream_buf[i];
    REG(DMA_COUNT) = words;
    REG(DMA_CTRL_TRIG) = DMA_CTRL;
    REG(SSI_DR0) = ((uint32_t)(uintptr_t)(w->data + (size_t)r * w->stride) - XIP_BASE) << 8 | MODE_BITS;
}

FLM_RAMFUNC static void chunk_wait(void) {
    while (REG(DMA_COUNT)) {}
}

FLM_RAMFUNC static void streamed(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
    const uint32_t per = STREAM_CHUNK_BYTES / w->stride;
    flm_tensor v = *w;              /* the chunk's view; copied here, while XIP still runs (memcpy) */
    flm_batch vb = *b;
    REG(SSI_SSIENR) = 0u;
    REG(SSI_DMARDLR) = 0u;          /* a request while the RX FIFO holds a word */
    REG(SSI_DMACR) = 1u;            /* RDMAE */
    chunk_start(w, 0, w->rows < per ? w->rows : per, 0);
    for (uint32_t r = 0, i = 0, k; r < w->rows; r += k, i ^= 1u) {
        k = w->rows - r < per ? w->rows - r : per;
        chunk_wait();
        if (r + k < w->rows) chunk_start(w, r + k, w->rows - r - k < per ? w->rows - r - k : per, i ^ 1u);
        v.data = (const uint8_t *)stream_buf[i];
        v.rows = k;
        v.length = k * w->stride;
        vb.out = b->out + r;
        hal_rp2040_matmul_cores(&v, &vb, row_buf, row_buf_bytes);
    }
    REG(SSI_SSIENR) = 0u;
    REG(SSI_DMACR) = 0u;
    REG(SSI_CTRLR1) = 0u;           /* XIP: one frame a request */
    REG(SSI_SSIENR) = 1u;
}
#endif

void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
#if FLM_RP2040_STREAM
    const uintptr_t a = (uintptr_t)w->data;
    if (b->n == 1u && a >= XIP_BASE && a < XIP_END && !(a & 3u) && !(w->stride & 3u) && w->stride &&
        w->stride <= STREAM_CHUNK_BYTES) {
        streamed(w, b, row_buf, row_buf_bytes);
        return;
    }
#endif
    hal_rp2040_matmul_cores(w, b, row_buf, row_buf_bytes);
}
