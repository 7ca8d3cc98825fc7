/* flm_quantize_act's codes against the reference's rounding, (int32_t)(v +- 0.5f) in binary32, for
 * every float v in [-127, 127] (tests/test_kernels.py): each group holds 127 (so 127/amax = 1 and
 * v = x exactly) and 63 of the floats; flm_quantize_i8's codes and scales must be the same. Prints
 * the number of wrong codes and the first few. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "kernels.h"

#define G 64u
#define N (G * 4096u)

int main(void) {
    static float x[N], xs[N / G], xs8[N / G];
    static flm_act q[N];
    static int8_t q8[N];
    const uint64_t end = 2u * (0x42fe0000ull + 1u);   /* each magnitude up to 127.0f, and its negation */
    uint64_t bad = 0, k = 0;
    while (k < end) {
        for (uint32_t i = 0; i < N; i++) {
            uint32_t u = 0;                             /* +0 pads the last group */
            if (i % G == 0u) u = 0x42fe0000u;
            else if (k < end) { u = (uint32_t)(k >> 1) | (uint32_t)(k & 1u) << 31; k++; }
            memcpy(&x[i], &u, 4);
        }
        flm_quantize_act(x, N, G, 127, q, xs);
        flm_quantize_i8(x, N, G, q8, xs8);
        for (uint32_t i = 0; i < N; i++) {
            int32_t want = (int32_t)(x[i] + (x[i] < 0.0f ? -0.5f : 0.5f));
            if ((q[i] != want || q8[i] != want) && bad++ < 5)
                printf("x=%a code %d (int8 %d), want %d\n", (double)x[i], q[i], q8[i], want);
        }
        if (memcmp(xs, xs8, sizeof xs) != 0 && bad++ < 5) printf("flm_quantize_i8's scales differ\n");
    }
    printf("%llu\n", (unsigned long long)bad);
    return 0;
}
