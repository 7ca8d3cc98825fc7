#include "sampler.h"
#include "flm_math.h"

void flm_rng_seed(flm_rng *r, uint64_t seed) {
    r->state = seed ^ 0x9E3779B97F4A7C15ull;
    if (!r->state) r->state = 1;
}

uint32_t flm_rng_u32(flm_rng *r) {
    uint64_t x = r->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->state = x;
    return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 32);
}

static float coin(flm_rng *r) { return (float)(flm_rng_u32(r) >> 8) * 0x1p-24f; }

/* Order for the nucleus: higher probability first, then lower index; a total order, so any
 * correct sort gives the same sequence. */
static int after(const float *p, uint32_t a, uint32_t b) { return p[a] < p[b] || (p[a] == p[b] && a > b); }

static void sift(const float *p, uint32_t *h, uint32_t i, uint32_t n) {
    for (;;) {
        uint32_t c = 2u * i + 1u;
        if (c >= n) return;
        if (c + 1u < n && after(p, h[c + 1u], h[c])) c++;
        if (!after(p, h[c], h[i])) return;
        uint32_t t = h[i]; h[i] = h[c]; h[c] = t;
        i = c;
    }
}

static void heapsort_idx(const float *p, uint32_t *h, uint32_t n) {
    for (uint32_t i = n / 2u; i-- > 0;) sift(p, h, i, n);
    for (uint32_t end = n; end-- > 1u;) {
        uint32_t t = h[0]; h[0] = h[end]; h[end] = t;
        sift(p, h, 0, end);
    }
}

uint32_t flm_sample(const float *logits, uint32_t n, float temperature, float top_p, flm_rng *rng,
                    float *p, uint32_t *idx) {
    if (!(temperature > 0.0f)) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    const float inv_t = 1.0f / temperature;
    float mx = logits[0] * inv_t;
    for (uint32_t i = 0; i < n; i++) {
        p[i] = logits[i] * inv_t;
        if (p[i] > mx) mx = p[i];
    }
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        p[i] = flm_expf(p[i] - mx);
        sum = i == 0 ? p[i] : sum + p[i];
    }
    const float inv = 1.0f / sum;
    for (uint32_t i = 0; i < n; i++) p[i] = p[i] * inv;
    const float r = coin(rng);
    if (!(top_p > 0.0f) || top_p >= 1.0f) {
        float cdf = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            cdf = i == 0 ? p[i] : cdf + p[i];
            if (r < cdf) return i;
        }
        return n - 1u;
    }
    const float cutoff = (1.0f - top_p) / (float)(n - 1u);
    uint32_t m = 0;
    uint32_t best = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (p[i] >= cutoff) idx[m++] = i;
        if (p[i] > p[best]) best = i;
    }
    if (m == 0) return best;     /* a nucleus so small that no token reaches the cutoff */
    heapsort_idx(p, idx, m);
    float cum = 0.0f;
    uint32_t last = m - 1u;
    for (uint32_t j = 0; j < m; j++) {
        cum = j == 0 ? p[idx[j]] : cum + p[idx[j]];
        if (cum > top_p) { last = j; break; }
    }
    const float rr = r * cum;
    float cdf = 0.0f;
    for (uint32_t j = 0; j <= last; j++) {
        cdf = j == 0 ? p[idx[j]] : cdf + p[idx[j]];
        if (rr < cdf) return idx[j];
    }
    return idx[last];
}
