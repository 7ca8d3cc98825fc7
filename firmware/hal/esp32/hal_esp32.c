/* ESP32-S3 / ESP32-C3 / ESP32-P4 under ESP-IDF v5. NOT COMPILED HERE: it needs ESP-IDF, which PlatformIO
 * brings on the user's machine ('flashlm flash'); the engine beside it is cross-compiled here.
 *
 * Flash: the blob is the data partition "model" (partitions.csv), memory-mapped with
 * esp_partition_mmap, so the engine reads it through the flash cache like any const array.
 * RAM tiers: PSRAM = heap_caps_malloc(MALLOC_CAP_SPIRAM), SRAM = internal heap. The arena is one
 * block sized by the build for everything the layout puts in its tier; when the internal heap has
 * no block that large it goes to PSRAM instead (hal_board_arena), and the app falls back from there.
 * Serial: the console port, UART0 (through the board's USB-UART bridge) or USB-Serial-JTAG.
 * Time: esp_timer_get_time(), µs since boot from the chip's system timer.
 * Matmul: on a dual-core chip (ESP32-S3, ESP32-P4) hal_matmul hands the second half of the rows to a task
 * on core 1 (the engine runs on core 0); the C3 has one core and uses the engine's own path. */
#include "hal.h"
#include "hal_board.h"
#include "blob.h"
#include "kernels.h"

#include <string.h>

#include "esp_heap_caps.h"
#include "esp_log.h"
#include "esp_partition.h"
#include "esp_timer.h"
#include "freertos/FreeRTOS.h"
#include "freertos/task.h"
#if FLM_CONSOLE_USB_SERIAL_JTAG
#include "driver/usb_serial_jtag.h"
#else
#include "driver/uart.h"
#endif

#define RX_BUFFER 4096
#define SRAM_RESERVE (32u * 1024u)   /* internal heap left to ESP-IDF and its drivers */

static const uint8_t *blob;
static size_t blob_len;

static void map_blob(void) {
    const esp_partition_t *p = esp_partition_find_first(ESP_PARTITION_TYPE_DATA,
                                                        (esp_partition_subtype_t)FLM_BLOB_SUBTYPE,
                                                        FLM_BLOB_PARTITION);
    if (!p) return;
    /* Map only the blob's own bytes (its header's total_size): MMU pages are shared with the app
     * and PSRAM. A partition without a valid header maps one page, for the engine to refuse. */
    size_t n = p->size < 65536u ? p->size : 65536u;
    uint8_t h[12];
    if (esp_partition_read(p, 0, h, sizeof h) == ESP_OK && memcmp(h, "FLMB", 4) == 0) {
        uint32_t total = (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
        n = total > 0 && total <= p->size ? total : p->size;
    }
    const void *ptr = NULL;
    esp_partition_mmap_handle_t handle;
    if (esp_partition_mmap(p, 0, n, ESP_PARTITION_MMAP_DATA, &ptr, &handle) == ESP_OK) {
        blob = ptr;
        blob_len = n;
    }
}

#if portNUM_PROCESSORS > 1
/* The rows are independent: any split is bit for bit the one-core result. */
#define SPLIT_MIN_ROWS 32u   /* fewer rows: handing half over costs more than it saves */

static flm_rows_share job;         /* core 1's share of the product */
static TaskHandle_t caller;        /* the engine's task, notified when the share is done */
static TaskHandle_t worker;

static void matmul_worker(void *arg) {
    (void)arg;
    for (;;) {
        ulTaskNotifyTake(pdTRUE, portMAX_DELAY);
        flm_rows_share_run(&job);
        xTaskNotifyGive(caller);
    }
}

void hal_matmul(const flm_tensor *w, const flm_batch *b, uint8_t *row_buf, size_t row_buf_bytes) {
    if (!worker || w->rows < SPLIT_MIN_ROWS) {
        flm_matmul_rows(w, 0, w->rows, b, row_buf, row_buf_bytes);
        return;
    }
    size_t buf_half;
    const uint32_t half = flm_split_rows(w, b, row_buf, row_buf_bytes, &job, &buf_half);
    caller = xTaskGetCurrentTaskHandle();
    xTaskNotifyGive(worker);                        /* the notification orders the job's writes */
    flm_matmul_rows(w, 0, half, b, row_buf, buf_half);
    ulTaskNotifyTake(pdTRUE, portMAX_DELAY);        /* core 1's rows are done */
}
#endif

int hal_init(int argc, char **argv) {
    (void)argc;
    (void)argv;
#if portNUM_PROCESSORS > 1
    /* same priority as the engine's task; without it (no memory) every matmul stays on core 0 */
    if (xTaskCreatePinnedToCore(matmul_worker, "flm_matmul", 4096, NULL, uxTaskPriorityGet(NULL), &worker, 1) != pdPASS)
        worker = NULL;
#endif
    esp_log_level_set("*", ESP_LOG_NONE);   /* from here on the console port carries frames */
#if FLM_CONSOLE_USB_SERIAL_JTAG
    usb_serial_jtag_driver_config_t cfg = USB_SERIAL_JTAG_DRIVER_CONFIG_DEFAULT();
    cfg.rx_buffer_size = RX_BUFFER;
    cfg.tx_buffer_size = RX_BUFFER;
    if (usb_serial_jtag_driver_install(&cfg) != ESP_OK) return 1;
#else
    uart_config_t uc = {
        .baud_rate = FLM_BAUD,
        .data_bits = UART_DATA_8_BITS,
        .parity = UART_PARITY_DISABLE,
        .stop_bits = UART_STOP_BITS_1,
        .flow_ctrl = UART_HW_FLOWCTRL_DISABLE,
        .source_clk = UART_SCLK_DEFAULT,
    };
    if (uart_driver_install(UART_NUM_0, RX_BUFFER, 0, 0, NULL, 0) != ESP_OK) return 1;
    if (uart_param_config(UART_NUM_0, &uc) != ESP_OK) return 1;
#endif
    map_blob();
    return 0;
}

const uint8_t *hal_blob(size_t *len) {
    *len = blob_len;
    return blob;
}

size_t hal_serial_read(uint8_t *buf, size_t max) {
#if FLM_CONSOLE_USB_SERIAL_JTAG
    int n = usb_serial_jtag_read_bytes(buf, (uint32_t)max, 0);
#else
    int n = uart_read_bytes(UART_NUM_0, buf, (uint32_t)max, 0);
#endif
    return n > 0 ? (size_t)n : 0;
}

void hal_serial_write(const uint8_t *buf, size_t len) {
#if FLM_CONSOLE_USB_SERIAL_JTAG
    while (len) {   /* nobody reading for 2 s: drop the rest, as a UART would */
        int n = usb_serial_jtag_write_bytes(buf, len, pdMS_TO_TICKS(2000));
        if (n <= 0) return;
        buf += n;
        len -= (size_t)n;
    }
#else
    uart_write_bytes(UART_NUM_0, buf, len);   /* no TX ring: returns once the FIFO took it all */
#endif
}

void hal_idle(void) { vTaskDelay(1); }

uint64_t hal_time_us(void) { return (uint64_t)esp_timer_get_time(); }

uint8_t hal_clock_kind(void) { return 1; }

const char *hal_board_name(void) { return FLM_BOARD_NAME; }

static uint32_t caps_of(uint32_t tier) {
    return (tier == FLM_TIER_PSRAM ? MALLOC_CAP_SPIRAM : MALLOC_CAP_INTERNAL) | MALLOC_CAP_8BIT;
}

/* The arena's tier once allocated: FLM_ARENA_TIER, or PSRAM when internal RAM had no block that
 * large (the internal heap is several regions; the build sized the arena for the largest). */
static uint32_t arena_tier = FLM_ARENA_TIER;

uint8_t *hal_board_arena(size_t n, uint32_t *tier) {
    uint8_t *p = heap_caps_aligned_alloc(8, n, caps_of(FLM_ARENA_TIER));
    arena_tier = FLM_ARENA_TIER;
    if (!p && FLM_ARENA_TIER == FLM_TIER_SRAM && FLM_PSRAM_BUDGET >= n) {
        /* the app then stages what the layout puts in SRAM into hal_tier_arena's block, or, when
         * that is too small, runs every tensor from flash and says so in a LOG frame */
        p = heap_caps_aligned_alloc(8, n, caps_of(FLM_TIER_PSRAM));
        if (p) arena_tier = FLM_TIER_PSRAM;
    }
    *tier = arena_tier;
    return p;
}

uint8_t *hal_tier_arena(uint32_t tier, size_t *cap) {
    *cap = 0;
    if (tier != FLM_TIER_PSRAM && tier != FLM_TIER_SRAM) return NULL;
    /* an arena in its planned tier holds everything the layout puts there; a second pool in that
     * tier would take the staged tensors away from it (the app stages into the HAL's pool first) */
    if (tier == arena_tier && arena_tier == FLM_ARENA_TIER) return NULL;
    size_t budget = tier == FLM_TIER_PSRAM ? FLM_PSRAM_BUDGET : FLM_SRAM_BUDGET;
    size_t n = heap_caps_get_largest_free_block(caps_of(tier));   /* 0 without PSRAM */
    size_t reserve = tier == FLM_TIER_SRAM ? SRAM_RESERVE : 0;
    n = n > reserve ? n - reserve : 0;
    if (n > budget) n = budget;
    n &= ~(size_t)7;
    uint8_t *p = n ? heap_caps_aligned_alloc(8, n, caps_of(tier)) : NULL;
    if (p) *cap = n;
    return p;
}
