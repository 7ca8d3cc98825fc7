/* The C library's string functions the engine calls, for the bare-metal Xtensa build (clang has
 * no C library for Xtensa here; the real ESP32-S3 takes them from ESP-IDF's newlib and its ROM).
 * Defined in flm_libc.c. */
#ifndef FLM_XTENSA_STRING_H
#define FLM_XTENSA_STRING_H
#include <stddef.h>
void *memcpy(void *restrict dst, const void *restrict src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
int strcmp(const char *a, const char *b);
int strncmp(const char *a, const char *b, size_t n);
char *strchr(const char *s, int c);
#endif
