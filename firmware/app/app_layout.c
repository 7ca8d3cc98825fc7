/* Placement: stage tensors out of flash into PSRAM/SRAM, carve the state regions (at boot and on
 * LAYOUT; docs/formats.md section 1). */
#include "app_layout.h"
#include "app_frames.h"
#include "app_golden.h"
#include "app_speculate.h"
#include "app_text.h"
#include "crc32.h"
#include "hal.h"
#include <string.h>

/* A board without staging space need not define hal_tier_arena. */
#if defined(__GNUC__)
__attribute__((weak)) uint8_t *hal_tier_arena(uint32_t tier, size_t *cap) {
    (void)tier;
    *cap = 0;
    return 0;
}
#endif

static const char *const TIER_NAME[FLM_N_TIERS] = {"flash", "PSRAM", "SRAM"};

static size_t up64(size_t n) { return (n + 63u) & ~(size_t)63u; }

static uint8_t *take(flm_pool *p, size_t n, size_t align) {
    size_t off = (p->used + align - 1u) & ~(align - 1u);
    uint8_t *r = p->base + off;
    p->used = off + n;
    return r;
}

/* Where a tensor staged in tier t goes: the HAL's space for t, else main()'s arena when that is
 * in t. The state regions of tier t: main()'s arena when it is in t, else the HAL's space. */
static uint32_t tensor_pool(uint32_t t) { return flm_dev.pool[t].cap || t != flm_dev.arena_tier ? t : 0u; }
static uint32_t state_pool(uint32_t t) { return t == flm_dev.arena_tier ? 0u : t; }

static uint32_t region_tier(uint32_t state_tiers, int r) {
    uint32_t t = (state_tiers >> (4u * (uint32_t)r)) & 15u;
    return t ? t : flm_dev.arena_tier;
}

/* The layout id: crc32 of one tier byte per table entry, then u32 state_tiers when non-zero. */
static uint32_t layout_crc(const flm_model *m, const uint8_t *tiers, uint32_t state_tiers) {
    uint32_t crc = flm_crc32_update(0, tiers, m->n_entries);
    if (state_tiers) {
        uint8_t le[4] = {(uint8_t)state_tiers, (uint8_t)(state_tiers >> 8), (uint8_t)(state_tiers >> 16),
                         (uint8_t)(state_tiers >> 24)};
        crc = flm_crc32_update(crc, le, 4);
    }
    return crc;
}

/* Apply a placement: every tensor at tiers[i] (one per table entry; NULL: the table's own), the
 * state regions at state_tiers. Returns 0, or -1 with the reason in err when it does not fit (the
 * model is then left half-placed: the caller places a layout that fits). */
int app_place(const uint8_t *tiers, uint32_t state_tiers, char *err, size_t en) {
    flm_model *m = &flm_dev.model;
    flm_tensor *x;
    flm_blob_retier(m, tiers);
    m->kv_fmt = (state_tiers >> FLM_KV_SHIFT) & 15u;   /* before the region sizes: they depend on both */
    const char *kv_why = flm_kv_refusal(m, m->kv_fmt);
    if (kv_why) {
        size_t i = 0;
        app_put_str(err, &i, en, kv_why);
        err[i] = 0;
        return -1;
    }
    m->batch = flm_batch_of(state_tiers);
    m->ple_table.tier = FLM_TIER_FLASH;   /* a gather of one row per token: read in place, never staged */
    /* bytes per pool: tensors 64-aligned (cache lines), then the regions (multiples of 8), then the
     * prompt buffer last, so an arena of exactly state + prompt holds the default placement */
    size_t need[FLM_N_TIERS] = {0, 0, 0};
    for (uint32_t i = 0; (x = flm_tensor_at(m, i)) != 0; i++)
        if (x->tier != FLM_TIER_FLASH) need[tensor_pool(x->tier)] += up64(x->length);
    for (int r = 0; r < FLM_N_REGIONS; r++) need[state_pool(region_tier(state_tiers, r))] += flm_state_region_bytes(m, r);
    need[state_pool(region_tier(state_tiers, FLM_REG_SCRATCH))] += (size_t)m->seq_len * 4u;
    for (uint32_t p = 0; p < FLM_N_TIERS; p++) {
        if (need[p] <= flm_dev.pool[p].cap) continue;
        size_t i = 0;
        app_put_str(err, &i, en, "layout needs ");
        app_put_dec(err, &i, en, (uint32_t)need[p]);
        app_put_str(err, &i, en, " bytes of ");
        app_put_str(err, &i, en, TIER_NAME[p ? p : flm_dev.arena_tier]);
        if (flm_dev.pool[p].cap) {
            app_put_str(err, &i, en, p ? "; this build has " : " in the engine's arena; this build has ");
            app_put_dec(err, &i, en, (uint32_t)flm_dev.pool[p].cap);
        } else {
            app_put_str(err, &i, en, "; this board has no staging space there");
        }
        err[i] = 0;
        return -1;
    }
    for (uint32_t t = 0; t < FLM_N_TIERS; t++) { flm_dev.pool[t].used = 0; flm_dev.staged[t] = 0; }
    for (uint32_t i = 0; (x = flm_tensor_at(m, i)) != 0; i++) {
        if (x->tier == FLM_TIER_FLASH) continue;
        uint8_t *dst = take(&flm_dev.pool[tensor_pool(x->tier)], x->length, 64u);
        memcpy(dst, x->data, x->length);
        x->data = dst;
        flm_dev.staged[x->tier] += x->length;
    }
    flm_blob_tie_head(m);
    uint8_t *base[FLM_N_REGIONS];
    for (int r = 0; r < FLM_N_REGIONS; r++)
        base[r] = take(&flm_dev.pool[state_pool(region_tier(state_tiers, r))], flm_state_region_bytes(m, r), 8u);
    const uint32_t scratch = region_tier(state_tiers, FLM_REG_SCRATCH);
    flm_dev.prompt = (uint32_t *)(void *)take(&flm_dev.pool[state_pool(scratch)], (size_t)m->seq_len * 4u, 8u);
    app_draft_place(&flm_dev.pool[state_pool(scratch)], scratch);   /* last: what is left, if it fits */
    flm_state_init_regions(&flm_dev.state, m, base, region_tier(state_tiers, FLM_REG_KV));
    for (uint32_t i = 0; i < m->n_entries && i < FLM_MAX_ENTRIES; i++)
        flm_dev.tiers[i] = tiers ? tiers[i] : (uint8_t)flm_rd32(m->blob + m->table + i * 64u + 48u);
    uint32_t crc = layout_crc(m, flm_dev.tiers, state_tiers);
    m->layout_id = crc;
    flm_dev.state_tiers = state_tiers;
    return 0;
}

void app_log_layout(const char *what) {
    char t[120];
    size_t i = 0;
    app_put_str(t, &i, sizeof t, what);
    app_put_str(t, &i, sizeof t, " layout ");
    app_put_dec(t, &i, sizeof t, flm_dev.model.layout_id);
    app_put_str(t, &i, sizeof t, ": staged ");
    app_put_dec(t, &i, sizeof t, flm_dev.staged[FLM_TIER_PSRAM]);
    app_put_str(t, &i, sizeof t, " bytes in PSRAM, ");
    app_put_dec(t, &i, sizeof t, flm_dev.staged[FLM_TIER_SRAM]);
    app_put_str(t, &i, sizeof t, " in SRAM; KV cache ");
    app_put_str(t, &i, sizeof t, flm_kv_name(flm_dev.model.kv_fmt));
    app_put_str(t, &i, sizeof t, " in ");
    app_put_str(t, &i, sizeof t, TIER_NAME[flm_dev.state.kv_tier]);
    app_send_log(t);
}

/* LAYOUT payload: u32 layout_id, u32 state_tiers, u32 n, u8 tier[n] (docs/formats.md). */
void app_set_layout(const uint8_t *p, size_t len) {
    char err[120];
    const flm_model *m = &flm_dev.model;
    if (!flm_dev.image_ok) { app_send_error(app_no_model_code(), flm_dev.image_err); return; }
    if (len < 12u || len != 12u + (size_t)flm_get_u32(p + 8)) {
        app_send_error(FLM_E_BAD_MESSAGE, "LAYOUT payload has the wrong length");
        return;
    }
    uint32_t want_id = flm_get_u32(p), st = flm_get_u32(p + 4), n = flm_get_u32(p + 8);
    const uint8_t *tiers = p + 12;
    if (n != m->n_entries || n > FLM_MAX_ENTRIES) {
        app_fmt2(err, sizeof err, "LAYOUT gives ", n, " tiers; the image has ", m->n_entries, " table entries");
        app_send_error(FLM_E_BAD_LAYOUT, err);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (tiers[i] >= FLM_N_TIERS) {
            app_fmt2(err, sizeof err, "LAYOUT: entry ", i, " has tier ", tiers[i], ", expected 0 (flash), 1 (psram) or 2 (sram)");
            app_send_error(FLM_E_BAD_LAYOUT, err);
            return;
        }
        if (tiers[i] != FLM_TIER_FLASH && memcmp(m->blob + m->table + i * 64u, "ple.table", 10) == 0) {
            app_fmt2(err, sizeof err, "LAYOUT: entry ", i, " (ple.table) has tier ", tiers[i],
                 "; the PLE table is read from flash only, one row per token (tier 0)");
            app_send_error(FLM_E_BAD_LAYOUT, err);
            return;
        }
        if (tiers[i] != FLM_TIER_FLASH && memcmp(m->blob + m->table + i * 64u, "draft", 6) == 0) {
            app_fmt2(err, sizeof err, "LAYOUT: entry ", i, " (draft) has tier ", tiers[i],
                 "; the draft model is read from flash in place (tier 0)");
            app_send_error(FLM_E_BAD_LAYOUT, err);
            return;
        }
    }
    if (!flm_state_tiers_ok(st)) {
        app_send_error(FLM_E_BAD_LAYOUT, "LAYOUT: bad state_tiers (each region: 0 default, 1 psram, 2 sram; "
                                     "bits 12-15 KV format: 0 f32, 1 int8)");
        return;
    }
    if (layout_crc(m, tiers, st) != want_id) {
        app_fmt2(err, sizeof err, "LAYOUT: layout_id ", want_id, " does not match its tiers (device computes ",
             layout_crc(m, tiers, st), ")");
        app_send_error(FLM_E_BAD_LAYOUT, err);
        return;
    }
    uint8_t prev[FLM_MAX_ENTRIES];
    memcpy(prev, flm_dev.tiers, n);
    uint32_t prev_state = flm_dev.state_tiers;
    if (app_place(tiers, st, err, sizeof err) != 0) {
        char ignored[8];
        app_place(prev, prev_state, ignored, sizeof ignored);   /* fitted before, fits again */
        app_send_error(FLM_E_BAD_LAYOUT, err);
        return;
    }
    app_log_layout("switched to");
    app_golden_check(0);   /* the new placement's numerics (its KV format) */
    app_send_hello();
}
