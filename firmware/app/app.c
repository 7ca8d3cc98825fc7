/* The device app: boot (check the image and the kernels, place the model, the golden check), then
 * serve the host's commands forever. The commands' handlers live in app_*.c (app_state.h lists
 * the files, bottom up; this one is the top). */
#include "app.h"
#include "app_console.h"
#include "app_frames.h"
#include "app_golden.h"
#include "app_layout.h"
#include "app_receive.h"
#include "app_request.h"
#include "app_speculate.h"
#include "app_text.h"
#include "hal.h"
#include "kernels.h"
#include <string.h>

flm_app flm_dev;
uint8_t flm_rxbuf[FLM_RXBUF_BYTES];

void flm_app_boot(uint8_t *arena, size_t cap, uint32_t arena_tier) {
    size_t len = 0;
    flm_tx_init(&flm_dev.tx, hal_serial_write);
    flm_rx_init(&flm_dev.rx, flm_rxbuf, sizeof flm_rxbuf);
    flm_dev.bad_seen = 0;   /* the receiver counts bad frames from 0 again */
    const uint8_t *blob = hal_blob(&len);
    app_ring_reset();
    flm_dev.image_ok = 0;
    flm_dev.arena_tier = arena_tier;
    flm_dev.pool[0] = (flm_pool){arena, arena ? cap : 0, 0};
    for (uint32_t t = FLM_TIER_PSRAM; t < FLM_N_TIERS; t++) {
        size_t c = 0;
        uint8_t *b = hal_tier_arena(t, &c);
        flm_dev.pool[t] = (flm_pool){b, b ? c : 0, 0};
    }
    char t[120];
    flm_dev.kernels_ok = flm_kernels_self_check() == 0;
    if (!flm_dev.kernels_ok) {
        app_scopy(flm_dev.image_err, sizeof flm_dev.image_err,
              "kernel self-check failed: the tuned q8/q4 group dots disagree with the scalar ones; not generating");
    } else if (!blob) {
        app_scopy(flm_dev.image_err, sizeof flm_dev.image_err, "no image in flash");
    } else if (flm_blob_open(&flm_dev.model, blob, len, flm_dev.image_err, sizeof flm_dev.image_err) == 0) {
        app_draft_open();
        size_t need = flm_state_bytes(&flm_dev.model) + (size_t)flm_dev.model.seq_len * 4u;
        if (flm_dev.model.n_entries > FLM_MAX_ENTRIES) {
            app_fmt2(flm_dev.image_err, sizeof flm_dev.image_err, "image has ", flm_dev.model.n_entries,
                 " tensor-table entries; this build handles ", FLM_MAX_ENTRIES, "");
        } else if (app_place(0, flm_dev.model.state_tiers, t, sizeof t) == 0) {
            flm_dev.image_ok = 1;
        } else {
            app_send_log(t);   /* the image's own placement does not fit this build: run it from flash */
            static const uint8_t flash_only[FLM_MAX_ENTRIES];
            if (app_place(flash_only, 0, t, sizeof t) == 0) {
                flm_dev.image_ok = 1;
                app_send_log("the image's layout does not fit; every tensor is read from flash instead");
            } else {
                app_fmt2(flm_dev.image_err, sizeof flm_dev.image_err, "model needs ", (uint32_t)need,
                     " bytes of RAM for KV cache and buffers; this build has ", (uint32_t)cap, "");
            }
        }
    }
    if (flm_dev.image_ok) {
        app_fmt2(t, sizeof t, "flashlm " FLM_FW_VERSION ": image ok, ", (uint32_t)len, " bytes; arena ",
             (uint32_t)(flm_state_bytes(&flm_dev.model) + flm_dev.model.seq_len * 4u), " bytes used");
        app_send_log(t);
        app_log_layout("boot");
        if (flm_dev.draft_open) app_send_log(flm_dev.draft_ok ? "draft model ready for speculative decoding" : flm_dev.draft_why);
    } else {
        app_scopy(t, sizeof t, "flashlm " FLM_FW_VERSION ": image refused");
        app_send_log(t);
    }
    app_golden_check(0);
    app_send_hello();
}

void flm_app_serve(void) {
    for (;;) {
        int got = app_receive();
        if (got == APP_RX_NOTHING) {
            app_report_bad_frames();
            hal_idle();
            continue;
        }
        if (got == APP_RX_LINE) { app_console_line(); continue; }
        app_report_console();
        switch (flm_dev.rx.type) {
        case FLM_PING: app_send_hello(); break;
        case FLM_GENERATE: app_generate_ids(flm_dev.rx.payload, flm_dev.rx.len); break;
        case FLM_LAYOUT: app_set_layout(flm_dev.rx.payload, flm_dev.rx.len); break;
        case FLM_STOP: break;   /* nothing running */
        case FLM_RESEND: app_resend(flm_dev.rx.payload, flm_dev.rx.len); break;
        case FLM_GENERATE_TEXT: app_generate_text(flm_dev.rx.payload, flm_dev.rx.len); break;
        case FLM_SELFTEST: app_selftest(flm_dev.rx.payload, flm_dev.rx.len); break;
        default: app_send_error(FLM_E_BAD_MESSAGE, "unknown message type"); break;
        }
    }
}

void flm_app_run(uint8_t *arena, size_t cap, uint32_t arena_tier) {
    flm_app_boot(arena, cap, arena_tier);
    flm_app_serve();
}
