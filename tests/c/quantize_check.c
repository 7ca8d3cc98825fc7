/* flm_quantize_act's codes against the reference's rounding, (int32_t)(v +- 0.5f) in binary32, for
 * every float v in [-qmax, qmax], qmax 127 and 2047 (tests/test_kernels.py): each group holds qmax
 * (so qmax/amax = 1 and v = x exactly) and 63 of the floats; with qmax 127 flm_quantize_i8's codes and
 * scales must be the same. Prints the number of wrong codes and the first few. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "kernels.h"

#define G 64u
#define N (G * 4096u)

static uint64_t check(int32_t qmax, uint32_t qbits) {
    static float x[N], xs[N / G], xs8[N / G];
    static flm_act q[N];
    static int8_t q8[N];
    const uint64_t end = 2u * ((uint64_t)qbits + 1u);   /* each magnitude up to qmax, and its negation */
    uint64_t bad = 0, k = 0;
    while (k < end) {
        for (uint32_t i = 0; i < N; i++) {
            uint32_t u = 0;                             /* +0 pads the last group */
            if (i % G == 0u) u = qbits;
            else if (k < end) { u = (uint32_t)(k >> 1) | (uint32_t)(k & 1u) << 31; k++; }
            memcpy(&x[i], &u, 4);
        }
        flm_quantize_act(x, N, G, qmax, q, xs);
        if (qmax == 127) flm_quantize_i8(x, N, G, q8, xs8);
        for (uint32_t i = 0; i < N; i++) {
            int32_t want = (int32_t)(x[i] + (x[i] < 0.0f ? -0.5f : 0.5f));
            if ((q[i] != want || (qmax == 127 && q8[i] != want)) && bad++ < 5)
                printf("qmax %d: x=%a code %d (int8 %d), want %d\n", (int)qmax, (double)x[i], q[i], q8[i], want);
        }
        if (qmax == 127 && memcmp(xs, xs8, sizeof xs) != 0 && bad++ < 5) printf("flm_quantize_i8's scales differ\n");
    }
    return bad;
}

int main(void) {
    printf("%llu\n", (unsigned long long)(check(127, 0x42fe0000u) + check(2047, 0x44ffe000u)));
    return 0;
}
