#include "kernels.h"
#include <string.h>

/* A block's little-endian f32 scale, assembled from bytes (no memcpy call on cores without
 * unaligned loads, e.g. the Cortex-M0+). */
static float rdf(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static int32_t nib(uint32_t v) { return (int32_t)(v & 15u) - (int32_t)((v & 8u) << 1); }

/* An fp16 scale, widened exactly (every binary16 value is a binary32 value). */
static float rdh(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0u) {                     /* zero or subnormal: m * 2^-24, exact in binary32 */
        float f = (float)m * 0x1p-24f;
        return (h & 0x8000u) ? -f : f;
    }
    uint32_t u = (h & 0x8000u) << 16 | (e == 31u ? 255u : e + 112u) << 23 | m << 13;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Walks one row's groups (docs/formats.md section 1): f32 scales sit in front of each group's
 * codes; fp16 scales sit together at the row's start (padded to 4), then the groups' codes. Codes
 * of every group start 4-byte aligned either way. */
typedef struct { const uint8_t *codes, *scale; uint32_t scale16; } row_reader;

static row_reader row_at(const flm_tensor *w, uint32_t r) {
    const uint8_t *p = w->data + (size_t)r * w->stride;
    uint32_t ng = (w->cols + w->group - 1u) / w->group;
    row_reader rr = {p, p, w->scale16};
    if (w->scale16) rr.codes = p + ((2u * ng + 3u) & ~3u);
    return rr;
}

/* The next group's scale; afterwards rr->codes points at that group's codes. */
static float next_scale(row_reader *rr) {
    float s;
    if (rr->scale16) { s = rdh(rr->scale); rr->scale += 2; }
    else { s = rdf(rr->codes); rr->codes += 4; }
    return s;
}

void flm_quantize_act(const float *x, uint32_t n, uint32_t g, int8_t *xq, float *xs) {
    for (uint32_t s = 0, gi = 0; s < n; s += g, gi++) {
        uint32_t len = n - s < g ? n - s : g;
        float amax = 0.0f;
        for (uint32_t i = 0; i < len; i++) {
            float a = x[s + i] < 0.0f ? -x[s + i] : x[s + i];
            if (a > amax) amax = a;
        }
        if (amax == 0.0f) {
            xs[gi] = 0.0f;
            memset(xq + s, 0, len);
            continue;
        }
        xs[gi] = amax / 127.0f;
        float inv = 127.0f / amax;
        for (uint32_t i = 0; i < len; i++) {
            float v = x[s + i] * inv;
            /* clamp before rounding (same codes for every finite v); NaN/inf from a broken
             * model become 0 / +-127 instead of an undefined float-to-int conversion */
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f;
            int32_t q = (int32_t)(v + (v >= 0.0f ? 0.5f : -0.5f));
            xq[s + i] = (int8_t)q;
        }
    }
}

static int32_t dot_q8(const int8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4)   /* unrolled: integer sums are exact in any order */
        s += (int32_t)w[i] * x[i] + (int32_t)w[i + 1] * x[i + 1] + (int32_t)w[i + 2] * x[i + 2] +
             (int32_t)w[i + 3] * x[i + 3];
    for (; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

static int32_t dot_q4(const uint8_t *w, const int8_t *x, uint32_t n) {
    int32_t s = 0;
    uint32_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint32_t b = w[i >> 1];
        s += nib(b) * (int32_t)x[i] + nib(b >> 4) * (int32_t)x[i + 1];
    }
    if (i < n) s += nib(w[i >> 1]) * (int32_t)x[i];
    return s;
}

void flm_matvec(const flm_tensor *w, const int8_t *xq, const float *xs, float *out) {
    for (uint32_t r = 0; r < w->rows; r++) out[r] = flm_matvec_row(w, r, xq, xs);
}

float flm_matvec_row(const flm_tensor *w, uint32_t r, const int8_t *xq, const float *xs) {
    const uint32_t g = w->group, cols = w->cols;
    row_reader rr = row_at(w, r);
    float acc = 0.0f;
    for (uint32_t s = 0, gi = 0; s < cols; s += g, gi++) {
        uint32_t len = cols - s < g ? cols - s : g;
        uint32_t nbytes = w->fmt == FLM_Q8 ? len : (len + 1u) / 2u;
        float sc = next_scale(&rr);
        const uint8_t *p = rr.codes;
        int32_t isum = w->fmt == FLM_Q8 ? dot_q8((const int8_t *)p, xq + s, len) : dot_q4(p, xq + s, len);
        float term = (float)isum * (sc * xs[gi]);
        acc = gi == 0 ? term : acc + term;
        rr.codes += (nbytes + 3u) & ~3u;
    }
    return acc;
}

void flm_dequant_row(const flm_tensor *w, uint32_t r, float *out) {
    row_reader rr = row_at(w, r);
    for (uint32_t s = 0; s < w->cols; s += w->group) {
        uint32_t len = w->cols - s < w->group ? w->cols - s : w->group;
        uint32_t nbytes = w->fmt == FLM_Q8 ? len : (len + 1u) / 2u;
        float sc = next_scale(&rr);
        const uint8_t *p = rr.codes;
        if (w->fmt == FLM_Q8) {
            for (uint32_t i = 0; i < len; i++) out[s + i] = (float)((const int8_t *)p)[i] * sc;
        } else {   /* each code byte read once: two elements */
            uint32_t i = 0;
            for (; i + 1 < len; i += 2) {
                uint32_t b = p[i >> 1];
                out[s + i] = (float)nib(b) * sc;
                out[s + i + 1] = (float)nib(b >> 4) * sc;
            }
            if (i < len) out[s + i] = (float)nib(p[i >> 1]) * sc;
        }
        rr.codes += (nbytes + 3u) & ~3u;
    }
}
