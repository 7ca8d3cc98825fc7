/* Reads a blob file, prints the engine's RAM regions for it: "kv logits scratch" bytes
 * (flm_state_region_bytes), or the refusal reason. converter/footprint.py must say the same. */
#include <stdio.h>
#include <stdlib.h>
#include "engine.h"

uint64_t hal_time_us(void) { return 0; }   /* the engine's clock; unused here */

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
        puts(err);
        return 1;
    }
    printf("%zu %zu %zu\n", flm_state_region_bytes(&m, FLM_REG_KV), flm_state_region_bytes(&m, FLM_REG_LOGITS),
           flm_state_region_bytes(&m, FLM_REG_SCRATCH));
    free(buf);
    return 0;
}
