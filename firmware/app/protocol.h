/* Framed serial protocol (docs/formats.md section 2): COBS frames with seq and CRC-32.
 * Transmit streams: a frame of any length is sent without buffering it whole. */
#ifndef FLM_PROTOCOL_H
#define FLM_PROTOCOL_H
#include <stddef.h>
#include <stdint.h>

#define FLM_PROTO_VERSION 5u

enum flm_msg {
    FLM_PING = 0x01, FLM_GENERATE = 0x02, FLM_LAYOUT = 0x03, FLM_STOP = 0x04, FLM_RESEND = 0x05,
    FLM_GENERATE_TEXT = 0x06, FLM_SELFTEST = 0x07,
    FLM_HELLO = 0x81, FLM_TOKEN = 0x82, FLM_DONE = 0x83, FLM_ERROR = 0x84,
    FLM_LOGITS = 0x85, FLM_LOG = 0x86, FLM_RESENT = 0x87
};

enum flm_err {
    FLM_E_BAD_FRAME = 1, FLM_E_BAD_MESSAGE = 2, FLM_E_BAD_IMAGE = 3, FLM_E_PROMPT_TOO_LONG = 4,
    FLM_E_BAD_TOKEN = 5, FLM_E_BUSY = 6, FLM_E_NO_MODEL = 7, FLM_E_BAD_LAYOUT = 8, FLM_E_CANNOT_ENCODE = 9,
    FLM_E_SELF_CHECK = 10
};

typedef void (*flm_write_fn)(const uint8_t *buf, size_t len);

/* Transmitter: begin, any number of put calls, end. COBS and CRC are computed on the fly. */
typedef struct {
    flm_write_fn write;
    uint16_t seq;          /* seq of the next frame */
    uint32_t crc;
    uint8_t block[255];    /* block[0] is the COBS code byte being built */
    uint8_t n;             /* bytes in block, including the code byte */
} flm_tx;

void flm_tx_init(flm_tx *t, flm_write_fn write);
void flm_tx_begin(flm_tx *t, uint8_t type);
void flm_tx_put(flm_tx *t, const void *data, size_t len);
void flm_tx_u8(flm_tx *t, uint8_t v);
void flm_tx_u16(flm_tx *t, uint16_t v);
void flm_tx_u32(flm_tx *t, uint32_t v);
void flm_tx_u64(flm_tx *t, uint64_t v);
void flm_tx_f32(flm_tx *t, float v);
void flm_tx_s8(flm_tx *t, const char *s, size_t len);   /* cut at 255 bytes */
void flm_tx_s16(flm_tx *t, const char *s, size_t len);
void flm_tx_end(flm_tx *t);

/* Receiver: feed bytes one at a time; returns 1 when a valid frame is ready in type/seq/payload.
 * Bytes are collected until a 0x00 delimiter; oversize, COBS-invalid or CRC-failing frames are
 * counted in bad_frames and dropped. The caller owns buf (the raw frame bytes, pre-COBS-decode).
 * Decoding is in place: payload points into buf and is valid until the next flm_rx_feed call.
 * Empty frames (repeated delimiters) are ignored and not counted. cap bounds the COBS-encoded
 * frame: a frame of L bytes needs cap >= L + L/254 + 1. */
typedef struct {
    uint8_t *buf;
    size_t cap;
    size_t n;
    int overflow;
    uint8_t type;
    uint16_t seq;
    const uint8_t *payload;
    size_t len;
    uint32_t bad_frames;
    uint32_t good_frames;
} flm_rx;

void flm_rx_init(flm_rx *r, uint8_t *buf, size_t cap);
int flm_rx_feed(flm_rx *r, uint8_t byte);

/* Little-endian field readers for payload parsing; bounds are the caller's job. */
uint16_t flm_get_u16(const uint8_t *p);
uint32_t flm_get_u32(const uint8_t *p);
uint64_t flm_get_u64(const uint8_t *p);
float flm_get_f32(const uint8_t *p);

#endif
