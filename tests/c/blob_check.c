/* Reads a blob file, runs the firmware's validator on it, prints "ok KV LOGITS SCRATCH" (the bytes
 * of the engine's three RAM regions for the model, flm_state_region_bytes) or the refusal reason. */
#include <stdio.h>
#include <stdlib.h>
#include "engine.h"

uint64_t hal_time_us(void) { return 0; }   /* the engine's clock; nothing runs here */

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
    if (flm_blob_open(&m, buf, (size_t)n, err, sizeof err) == 0) {
        uint32_t len;
        for (uint32_t i = 0; i < m.vocab; i++) (void)flm_piece(&m, i, &len);
        printf("ok %zu %zu %zu\n", flm_state_region_bytes(&m, FLM_REG_KV), flm_state_region_bytes(&m, FLM_REG_LOGITS),
               flm_state_region_bytes(&m, FLM_REG_SCRATCH));
    } else {
        puts(err);
    }
    free(buf);
    return 0;
}
