/* The kernels' matvec on tensors from stdin, against converter/numerics.py in tests/test_kernels.py.
 * stdin, repeated until it ends: u32 fmt (1 q8, 2 q4), rows, cols, group, scales (0 f32, 1 fp16, 2 row
 * scale and multipliers), row_stride; the
 * rows' bytes (docs/formats.md section 1); cols i16 activation codes; n_groups f32 activation scales.
 * stdout for each: the rows by flm_matvec_rows (all at once), then by flm_matvec_row (one at a time),
 * f32 each; then i32 flm_kernels_self_check() once at the end. */
#include <stdio.h>
#include <stdlib.h>
#include "kernels.h"

int main(void) {
    uint32_t h[6];
    while (fread(h, 4, 6, stdin) == 6) {
        const uint32_t rows = h[1], cols = h[2], g = h[3], ng = (cols + g - 1u) / g;
        uint8_t *data = malloc((size_t)rows * h[5] + 1u);
        flm_act *xq = malloc(cols * sizeof *xq);
        float *xs = malloc(ng * 4u), *out = malloc(rows * 4u);
        if (!data || !xq || !xs || !out) return 2;
        if (fread(data, 1, (size_t)rows * h[5], stdin) != (size_t)rows * h[5] || fread(xq, 2, cols, stdin) != cols ||
            fread(xs, 4, ng, stdin) != ng)
            return 2;
        const flm_tensor w = {data, h[0], rows, cols, g, h[5], FLM_TIER_SRAM, rows * h[5], h[4] == 1u, h[4] == 2u};
        flm_matvec_rows(&w, 0, rows, xq, xs, out);
        fwrite(out, 4, rows, stdout);
        for (uint32_t r = 0; r < rows; r++) out[r] = flm_matvec_row(&w, r, xq, xs);
        fwrite(out, 4, rows, stdout);
        free(data), free(xq), free(xs), free(out);
    }
    const int32_t ok = flm_kernels_self_check();
    fwrite(&ok, 4, 1, stdout);
    return 0;
}
