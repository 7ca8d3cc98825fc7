/* The string functions of string.h for the bare-metal Xtensa build. Compiled with -fno-builtin
 * (xtensa.py), so that the compiler does not turn these loops back into calls of themselves.
 * memcpy and memset move words when both ends are word-aligned (the engine's row copies and
 * clears are), bytes otherwise. */
#include <stdint.h>
#include <string.h>

void *memcpy(void *restrict dst, const void *restrict src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (!(((uintptr_t)d | (uintptr_t)s) & 3u)) {
        for (; n >= 4; n -= 4, d += 4, s += 4) *(uint32_t *)(void *)d = *(const uint32_t *)(const void *)s;
    }
    while (n--) *d++ = *s++;
    return dst;
}

void *memmove(void *dst, const void *src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (d <= s || d >= s + n) return memcpy(dst, src, n);   /* no overlap a forward copy breaks */
    while (n--) d[n] = s[n];
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    uint8_t *d = dst;
    const uint8_t b = (uint8_t)c;
    if (!((uintptr_t)d & 3u)) {
        const uint32_t w = b * 0x01010101u;
        for (; n >= 4; n -= 4, d += 4) *(uint32_t *)(void *)d = w;
    }
    while (n--) *d++ = b;
    return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
    const uint8_t *p = a, *q = b;
    for (; n; n--, p++, q++)
        if (*p != *q) return *p < *q ? -1 : 1;
    return 0;
}

size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

int strcmp(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return (unsigned char)*a - (unsigned char)*b;
}

int strncmp(const char *a, const char *b, size_t n) {
    for (; n; n--, a++, b++) {
        if (*a != *b) return (unsigned char)*a - (unsigned char)*b;
        if (!*a) return 0;
    }
    return 0;
}

char *strchr(const char *s, int c) {
    for (;; s++) {
        if (*s == (char)c) return (char *)s;
        if (!*s) return 0;
    }
}
