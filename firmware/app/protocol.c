/* Framed serial protocol, docs/formats.md section 2.
 *
 * Wire frame: COBS(type | seq | payload | crc32) followed by 0x00.
 *
 * The transmitter encodes COBS on the fly: block[1..] holds the data bytes of the block being
 * built and block[0] receives its code byte when the block is written out.  A full block (254
 * data bytes) is written when the next byte arrives or at the end of the frame, so a frame whose
 * last run of non-zero bytes fills a block exactly ends with that 0xFF block and no extra 0x01
 * block: the canonical COBS encoding, which host/link/cobs.py produces too (byte-identical). */
#include "protocol.h"

#include <string.h>

#include "crc32.h"

#define FLM_COBS_BLOCK 255u /* code byte + 254 data bytes */

/* ---- transmitter ------------------------------------------------------------------------ */

void flm_tx_init(flm_tx *t, flm_write_fn write) {
    t->write = write;
    t->seq = 0;
    t->crc = 0;
    t->n = 1;
    t->block[0] = 0;
}

/* One byte into the COBS block; the CRC is the caller's business. */
static void tx_cobs_byte(flm_tx *t, uint8_t b) {
    if (t->n == FLM_COBS_BLOCK) { /* full block: no zero follows it */
        t->block[0] = 0xFFu;
        t->write(t->block, FLM_COBS_BLOCK);
        t->n = 1;
    }
    if (b == 0) {
        t->block[0] = t->n;
        t->write(t->block, t->n);
        t->n = 1;
    } else {
        t->block[t->n++] = b;
    }
}

static void tx_bytes(flm_tx *t, const uint8_t *p, size_t len) {
    t->crc = flm_crc32_update(t->crc, p, len);
    while (len--) tx_cobs_byte(t, *p++);
}

void flm_tx_begin(flm_tx *t, uint8_t type) {
    uint8_t head[3];
    head[0] = type;
    head[1] = (uint8_t)(t->seq & 0xFFu);
    head[2] = (uint8_t)(t->seq >> 8);
    t->crc = 0;
    t->n = 1;
    tx_bytes(t, head, sizeof head);
}

void flm_tx_put(flm_tx *t, const void *data, size_t len) {
    if (len) tx_bytes(t, (const uint8_t *)data, len);
}

void flm_tx_u8(flm_tx *t, uint8_t v) { tx_bytes(t, &v, 1); }

void flm_tx_u16(flm_tx *t, uint16_t v) {
    uint8_t b[2];
    b[0] = (uint8_t)(v & 0xFFu);
    b[1] = (uint8_t)(v >> 8);
    tx_bytes(t, b, sizeof b);
}

void flm_tx_u32(flm_tx *t, uint32_t v) {
    uint8_t b[4];
    b[0] = (uint8_t)(v & 0xFFu);
    b[1] = (uint8_t)((v >> 8) & 0xFFu);
    b[2] = (uint8_t)((v >> 16) & 0xFFu);
    b[3] = (uint8_t)(v >> 24);
    tx_bytes(t, b, sizeof b);
}

void flm_tx_u64(flm_tx *t, uint64_t v) {
    flm_tx_u32(t, (uint32_t)(v & 0xFFFFFFFFu));
    flm_tx_u32(t, (uint32_t)(v >> 32));
}

void flm_tx_f32(flm_tx *t, float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u); /* IEEE-754 binary32 bits, sent little-endian */
    flm_tx_u32(t, u);
}

void flm_tx_s8(flm_tx *t, const char *s, size_t len) {
    if (len > 0xFFu) len = 0xFFu;
    flm_tx_u8(t, (uint8_t)len);
    flm_tx_put(t, s, len);
}

void flm_tx_s16(flm_tx *t, const char *s, size_t len) {
    if (len > 0xFFFFu) len = 0xFFFFu;
    flm_tx_u16(t, (uint16_t)len);
    flm_tx_put(t, s, len);
}

void flm_tx_end(flm_tx *t) {
    uint32_t crc = t->crc;
    tx_cobs_byte(t, (uint8_t)(crc & 0xFFu));
    tx_cobs_byte(t, (uint8_t)((crc >> 8) & 0xFFu));
    tx_cobs_byte(t, (uint8_t)((crc >> 16) & 0xFFu));
    tx_cobs_byte(t, (uint8_t)(crc >> 24));
    if (t->n == FLM_COBS_BLOCK) {
        static const uint8_t delim = 0;
        t->block[0] = 0xFFu;
        t->write(t->block, FLM_COBS_BLOCK);
        t->write(&delim, 1);
    } else {
        t->block[0] = t->n;
        t->block[t->n] = 0; /* the delimiter rides along with the last block */
        t->write(t->block, (size_t)t->n + 1u);
    }
    t->n = 1;
    t->seq = (uint16_t)(t->seq + 1u);
}

/* ---- receiver --------------------------------------------------------------------------- */

void flm_rx_init(flm_rx *r, uint8_t *buf, size_t cap) {
    r->buf = buf;
    r->cap = cap;
    r->n = 0;
    r->overflow = 0;
    r->type = 0;
    r->seq = 0;
    r->payload = buf;
    r->len = 0;
    r->bad_frames = 0;
    r->good_frames = 0;
}

/* COBS-decodes b[0..n) in place (the output never overtakes the input).  Returns the decoded
 * length, or 0 when the data is not valid COBS (every valid frame is longer than 0). */
static size_t cobs_decode_inplace(uint8_t *b, size_t n) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t code = b[i];
        size_t k;
        if (code == 0 || code > n - i) return 0; /* zero code, or block runs past the end */
        i++;
        for (k = 1; k < code; k++) b[o++] = b[i++];
        if (code != 0xFFu && i < n) b[o++] = 0;
    }
    return o;
}

int flm_rx_feed(flm_rx *r, uint8_t byte) {
    size_t n;
    uint32_t crc;
    if (byte != 0) {
        if (r->n < r->cap) r->buf[r->n++] = byte;
        else r->overflow = 1;
        return 0;
    }
    /* delimiter */
    n = r->n;
    r->n = 0;
    if (r->overflow) {
        r->overflow = 0;
        r->bad_frames++;
        return 0;
    }
    if (n == 0) return 0; /* empty frame: idle delimiters are allowed */
    n = cobs_decode_inplace(r->buf, n);
    if (n < 7) {
        r->bad_frames++;
        return 0;
    }
    crc = flm_get_u32(r->buf + n - 4);
    if (flm_crc32_update(0, r->buf, n - 4) != crc) {
        r->bad_frames++;
        return 0;
    }
    r->type = r->buf[0];
    r->seq = flm_get_u16(r->buf + 1);
    r->payload = r->buf + 3;
    r->len = n - 7;
    r->good_frames++;
    return 1;
}

/* ---- little-endian readers ------------------------------------------------------------------ */

uint16_t flm_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | ((unsigned)p[1] << 8)); }

uint32_t flm_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t flm_get_u64(const uint8_t *p) {
    return (uint64_t)flm_get_u32(p) | ((uint64_t)flm_get_u32(p + 4) << 32);
}

float flm_get_f32(const uint8_t *p) {
    uint32_t u = flm_get_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
