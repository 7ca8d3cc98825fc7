/* Reads a blob file, runs the firmware's validator on it, prints "ok KV LOGITS SCRATCH" (the bytes
 * of the engine's three RAM regions for the model, flm_state_region_bytes) or the refusal reason.
 *
 * With a second argument "head": runs the engine's output layer on activations instead. stdin:
 * u32 n, then n vectors of dim f32 (the residual stream after the last layer); stdout, for each:
 * u32 pruned token, u32 head_rows (flm_head_argmax), u32 the full scan's first maximum (flm_head
 * and the sampler's greedy argmax), then the n_out logits of the full scan.
 *
 * With "chunks T": the multi-token pass. stdin: u32 n, then n token ids; they run at positions 0..n-1
 * in passes of up to T tokens (the state sized for a batch of T), each pass computing every token's
 * whole head (flm_head_all); stdout: the n x n_out logits, then u32 bytes read per tier over all
 * passes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "sampler.h"

uint64_t hal_time_us(void) { return 0; }   /* the engine's clock; nothing runs here */

static int heads(const flm_model *m) {
    size_t need = flm_state_bytes(m);
    uint8_t *arena = malloc(need);
    float *x = malloc(m->dim * 4u);
    flm_state s;
    uint32_t count;
    if (!arena || !x || flm_state_init(&s, m, arena, need, FLM_TIER_SRAM) != 0 || fread(&count, 4, 1, stdin) != 1)
        return 2;
    for (uint32_t k = 0; k < count; k++) {
        if (fread(x, 4, m->dim, stdin) != m->dim) return 2;
        flm_step_stats st;
        uint32_t out[3];
        memset(&st, 0, sizeof st);
        memcpy(s.x, x, m->dim * 4u);
        out[0] = flm_head_argmax(&s, &st);
        out[1] = st.head_rows;
        memcpy(s.x, x, m->dim * 4u);
        const float *logits = flm_head(&s, &st);
        out[2] = flm_sample(logits, m->n_out, 0.0f, 0.0f, 0, s.probs, s.idx);
        fwrite(out, 4, 3, stdout);
        fwrite(logits, 4, m->n_out, stdout);
    }
    free(x);
    free(arena);
    return 0;
}

static int chunks(flm_model *m, uint32_t batch) {
    uint32_t n;
    if (batch < 1u || batch > 255u || fread(&n, 4, 1, stdin) != 1 || n > m->seq_len) return 2;
    uint32_t *ids = malloc((n ? n : 1u) * 4u);
    if (!ids || fread(ids, 4, n, stdin) != n) return 2;
    m->batch = batch;
    size_t need = flm_state_bytes(m);
    uint8_t *arena = malloc(need);
    flm_state s;
    if (!arena || flm_state_init(&s, m, arena, need, FLM_TIER_SRAM) != 0) return 2;
    flm_step_stats st;
    memset(&st, 0, sizeof st);
    for (uint32_t pos = 0; pos < n; pos += batch) {
        uint32_t len = n - pos < batch ? n - pos : batch;
        for (uint32_t i = 0; i < len; i++) if (ids[pos + i] >= m->vocab) return 2;
        flm_body_many(&s, ids + pos, len, pos, &st);
        fwrite(flm_head_all(&s, &st), 4, (size_t)len * m->n_out, stdout);
    }
    fwrite(st.bytes, 4, FLM_N_TIERS, stdout);
    free(arena);
    free(ids);
    return 0;
}

int main(int argc, char **argv) {
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : 0;
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) return 2;
    fclose(f);
    static flm_model m;
    char err[120];
    int rc = 0;
    if (flm_blob_open(&m, buf, (size_t)n, err, sizeof err) != 0) {
        puts(err);
    } else if (argc > 2 && !strcmp(argv[2], "head")) {
        rc = heads(&m);
    } else if (argc > 3 && !strcmp(argv[2], "chunks")) {
        rc = chunks(&m, (uint32_t)atoi(argv[3]));
    } else {
        uint32_t len;
        for (uint32_t i = 0; i < m.vocab; i++) (void)flm_piece(&m, i, &len);
        printf("ok %zu %zu %zu\n", flm_state_region_bytes(&m, FLM_REG_KV), flm_state_region_bytes(&m, FLM_REG_LOGITS),
               flm_state_region_bytes(&m, FLM_REG_SCRATCH));
    }
    free(buf);
    return rc;
}
