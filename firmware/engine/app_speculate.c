/* Proposing drafts for speculative decoding (docs/formats.md section 2.4): prompt lookup. The
 * verifying pass (app_generate.c) keeps the tokens greedy decoding gives whatever is proposed; a
 * proposer only decides how many it can skip. converter/reference.py mirrors each one. */
#include "app_state.h"

#define NGRAM_MAX 3u   /* prompt lookup matches the context's last 3, 2, then 1 tokens */

uint32_t app_lookup_drafts(uint32_t *ctx, uint32_t pos, uint32_t k) {
    for (uint32_t n = NGRAM_MAX; n >= 1u; n--) {
        if (pos < n) continue;
        for (uint32_t j = pos; j-- > n - 1u;) {   /* the most recent earlier occurrence first */
            uint32_t i = 0;
            while (i < n && ctx[j - i] == ctx[pos - i]) i++;
            if (i < n) continue;
            /* draft i is the token i places after j; copied forward, so the drafts extend the
             * context they are read from (a repeating stretch shorter than k repeats) */
            for (i = 1; i <= k; i++) ctx[pos + i] = ctx[j + i];
            return k;
        }
    }
    return 0;
}
