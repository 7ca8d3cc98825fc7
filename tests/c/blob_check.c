/* Reads a blob file, runs the firmware's validator on it, prints "ok KV LOGITS SCRATCH" (the bytes
 * of the engine's three RAM regions for the model, flm_state_region_bytes) or the refusal reason.
 *
 * With a second argument "head": runs the engine's output layer on activations instead. stdin:
 * u32 n, then n vectors of dim f32 (the residual stream after the last layer); stdout, for each:
 * u32 pruned token, u32 head_rows (flm_head_argmax), u32 the full scan's first maximum (flm_head
 * and the sampler's greedy argmax), then the n_out logits of the full scan. */
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
    } else {
        uint32_t len;
        for (uint32_t i = 0; i < m.vocab; i++) (void)flm_piece(&m, i, &len);
        printf("ok %zu %zu %zu\n", flm_state_region_bytes(&m, FLM_REG_KV), flm_state_region_bytes(&m, FLM_REG_LOGITS),
               flm_state_region_bytes(&m, FLM_REG_SCRATCH));
    }
    free(buf);
    return rc;
}
