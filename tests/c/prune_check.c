/* The engine's output layer on given activations: reads a blob file (argv[1]), then from stdin
 * u32 n and n vectors of dim f32 (the residual stream x after the last layer). For each it writes
 * to stdout: u32 pruned token, u32 head_rows (flm_head_argmax), u32 the full scan's first maximum
 * (flm_head + the sampler's greedy argmax), then the n_out logits of the full scan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine.h"
#include "sampler.h"

uint64_t hal_time_us(void) { return 0; }

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
    if (flm_blob_open(&m, buf, (size_t)n, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 3;
    }
    size_t need = flm_state_bytes(&m);
    uint8_t *arena = malloc(need);
    flm_state s;
    if (!arena || flm_state_init(&s, &m, arena, need, FLM_TIER_SRAM) != 0) return 2;
    uint32_t count;
    if (fread(&count, 4, 1, stdin) != 1) return 2;
    for (uint32_t k = 0; k < count; k++) {
        if (fread(s.x, 4, m.dim, stdin) != m.dim) return 2;
        float *x = malloc(m.dim * 4u);
        memcpy(x, s.x, m.dim * 4u);
        flm_step_stats st;
        memset(&st, 0, sizeof st);
        uint32_t out[3];
        out[0] = flm_head_argmax(&s, &st);
        out[1] = st.head_rows;
        memcpy(s.x, x, m.dim * 4u);
        memset(&st, 0, sizeof st);
        const float *logits = flm_head(&s, &st);
        out[2] = flm_sample(logits, m.n_out, 0.0f, 0.0f, 0, s.probs, s.idx);
        fwrite(out, 4, 3, stdout);
        fwrite(logits, 4, m.n_out, stdout);
        free(x);
    }
    free(arena);
    free(buf);
    return 0;
}
