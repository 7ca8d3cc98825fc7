/* Token choice on the device: greedy, or seeded temperature / top-p with xorshift64*
 * (mirrored by converter/sampling.py: Rng, sample). */
#ifndef FLM_SAMPLER_H
#define FLM_SAMPLER_H
#include <stdint.h>

typedef struct { uint64_t state; } flm_rng;

void flm_rng_seed(flm_rng *r, uint64_t seed);
uint32_t flm_rng_u32(flm_rng *r);
/* probs and idx: scratch of n entries each. */
uint32_t flm_sample(const float *logits, uint32_t n, float temperature, float top_p, flm_rng *rng,
                    float *probs, uint32_t *idx);
#endif
