/* Reads binary32 values from stdin, writes flm_expf, flm_sqrtf(|x|), flm_silu, flm_gelu of each to stdout. */
#include <stdio.h>
#include "flm_math.h"

int main(void) {
    float x;
    while (fread(&x, 4, 1, stdin) == 1) {
        float ax = x < 0.0f ? -x : x + 0.0f;   /* -0 -> +0, as np.abs */
        float out[4] = {flm_expf(x), flm_sqrtf(ax), flm_silu(x), flm_gelu(x)};
        fwrite(out, 4, 4, stdout);
    }
    return 0;
}
