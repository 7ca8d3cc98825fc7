/* Message text for ERROR, LOG and the console without a C library's printf (small boards). */
#ifndef FLM_APP_TEXT_H
#define FLM_APP_TEXT_H
#include <stddef.h>
#include <stdint.h>

size_t app_slen(const char *s);
void app_scopy(char *dst, size_t cap, const char *src);
void app_put_dec(char *buf, size_t *i, size_t cap, uint32_t v);   /* buf[*i..] += decimal(v) */
void app_put_str(char *buf, size_t *i, size_t cap, const char *s);
size_t app_fmt2(char *buf, size_t cap, const char *a, uint32_t x, const char *b, uint32_t y, const char *c);
/* buf[*i..] += an elapsed count n of the board's clock (hal_time_us) in its unit: "N ms" (ms) or
 * "N us" of a time, "N instructions" of the instruction counter (FLM_CLOCK_INSTRUCTIONS). */
void app_put_elapsed(char *buf, size_t *i, size_t cap, uint64_t n, int ms);
#endif
