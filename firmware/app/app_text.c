/* Message text for ERROR, LOG and the console without a C library's printf (small boards). */
#include "app_text.h"
#include "hal.h"

size_t app_slen(const char *s) { size_t n = 0; while (s[n]) n++; return n; }

void app_scopy(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    while (src[i] && i + 1 < cap) { dst[i] = src[i]; i++; }
    dst[i] = 0;
}

void app_put_dec(char *buf, size_t *i, size_t cap, uint32_t v) {
    char d[10]; int n = 0;
    do { d[n++] = (char)('0' + v % 10u); v /= 10u; } while (v);
    while (n && *i + 1 < cap) buf[(*i)++] = d[--n];
}

/* buf[*i..] += s (always NUL-terminated) */
void app_put_str(char *buf, size_t *i, size_t cap, const char *s) {
    while (*s && *i + 1 < cap) buf[(*i)++] = *s++;
    buf[*i] = 0;
}

void app_put_elapsed(char *buf, size_t *i, size_t cap, uint64_t n, int ms) {
    if (hal_clock_kind() == FLM_CLOCK_INSTRUCTIONS) {   /* not a time: never called one */
        const int big = n > 0xffffffffu;
        app_put_dec(buf, i, cap, (uint32_t)(big ? n / 1000000u : n));
        app_put_str(buf, i, cap, big ? "M instructions" : " instructions");
        return;
    }
    app_put_dec(buf, i, cap, (uint32_t)(ms ? n / 1000u : n));
    app_put_str(buf, i, cap, ms ? " ms" : " us");
}

/* text = a + decimal(x) + b + decimal(y) + c */
size_t app_fmt2(char *buf, size_t cap, const char *a, uint32_t x, const char *b, uint32_t y, const char *c) {
    size_t i = 0;
    for (const char *s = a; *s && i + 1 < cap; s++) buf[i++] = *s;
    app_put_dec(buf, &i, cap, x);
    for (const char *s = b; *s && i + 1 < cap; s++) buf[i++] = *s;
    app_put_dec(buf, &i, cap, y);
    for (const char *s = c; *s && i + 1 < cap; s++) buf[i++] = *s;
    buf[i] = 0;
    return i;
}
