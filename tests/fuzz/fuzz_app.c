/* libFuzzer target: the device's frame receiver and command handling, exactly as the boards run
 * them (firmware/app/ + the engine), on a fake HAL whose serial input is the fuzz input. Built by
 * tests/fuzz/run.py with ASan + UBSan.
 *
 * Every input meets the app as it is after boot. Boot reads nothing from the host, so it runs once
 * per process for each image (good and corrupted): its checks (the image's CRC, the kernels'
 * self-check, the golden check) cost many times a command's handling. Before each input the app's
 * state is put back as that boot left it (flm_dev, the memory it placed the model in, the RESEND
 * ring) and what the device sent while booting goes through the oracle again.
 * $FLM_FUZZ_BOOT_EACH=1 boots for every input instead (tests/fuzz/run.py --replay: the committed
 * inputs run exactly as on a board).
 *
 * Input: byte 0 selects the mode, the rest is the host's byte stream.
 *   bit0 = 0: raw mode — the rest is fed to the serial port as it is, in reads of
 *             1 + (byte0 >> 2) bytes (so frames split at every boundary get tried).
 *   bit0 = 1: record mode — the rest is records, each u8 kind, u8 len, len bytes:
 *             kind 0xFF: len raw bytes; kind 0xFE: a LAYOUT whose layout_id the harness computes
 *             from the record (u32 state_tiers, tier bytes); any other kind: one well-formed frame
 *             of that type carrying the len bytes as payload (COBS, seq and CRC by the firmware's
 *             own encoder), so mutations reach the command parsers instead of dying at the CRC.
 *   bit1 = 1: boot with a corrupted image (the refusal paths: ERROR no_model etc.).
 *
 * Oracle, beyond the sanitizers: everything the device sends must decode as good frames with
 * consecutive seq numbers and device message types, or be console text (docs/formats.md 2.3: only
 * bytes >= 0x20 but DEL, tab, CR, LF; each answer ending in CR LF) ahead of a frame; a violation
 * aborts.
 *
 * The model blob comes from $FLM_FUZZ_BLOB (tests/fuzz/make_blob.py writes it). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "app_frames.h"
#include "app_state.h"
#include "blob.h"
#include "crc32.h"
#include "hal.h"
#include "protocol.h"

#define STREAM_CAP (1u << 16)

static uint8_t *good_blob, *bad_blob;
static size_t blob_len;
static int use_bad;

static uint8_t stream[STREAM_CAP];
static size_t stream_len, stream_pos, read_chunk;
static jmp_buf done;
static uint64_t now_us;
static unsigned long idle_calls, empty_reads;

static uint8_t arena[1u << 20] __attribute__((aligned(64)));
static uint8_t psram[1u << 16] __attribute__((aligned(64)));

/* The app after boot, per image: its state, the bytes it used of the arena and of the PSRAM (a copy
 * of each), and what it sent. */
typedef struct {
    flm_app dev;
    uint8_t *mem[2];
    size_t used[2];
    uint8_t *sent;
    size_t sent_len;
} booted;
static booted boots[2];
static int boot_each;
static booted *capturing;   /* while booting: the device's bytes go here, not to the oracle */

/* ---- oracle: the device's output must be well-formed frames, or console text ------------- */
static uint8_t cand[70000], dec_buf[70000];
static size_t cand_n;
static uint32_t out_frames;
static int verbose;    /* $FLM_FUZZ_VERBOSE: print every frame the device sends */

/* c[0..n) (no delimiter) as one frame: checked and counted; 0 when it is not a good frame. */
static int out_frame(const uint8_t *c, size_t n) {
    flm_rx rx;
    flm_rx_init(&rx, dec_buf, sizeof dec_buf);
    for (size_t i = 0; i < n; i++) flm_rx_feed(&rx, c[i]);
    if (!flm_rx_feed(&rx, 0)) return 0;
    if (rx.seq != (uint16_t)out_frames) {
        fprintf(stderr, "oracle: frame seq %u, expected %u\n", rx.seq, (unsigned)(uint16_t)out_frames);
        abort();
    }
    if (rx.type < FLM_HELLO || rx.type > FLM_RESENT) {
        fprintf(stderr, "oracle: the device sent frame type 0x%02x\n", rx.type);
        abort();
    }
    if (rx.type == FLM_TOKEN && rx.len < 61u) {
        fprintf(stderr, "oracle: TOKEN payload of %u bytes\n", (unsigned)rx.len);
        abort();
    }
    if (verbose) {
        fprintf(stderr, "device: seq %u type 0x%02x len %u", rx.seq, rx.type, (unsigned)rx.len);
        if (rx.type == FLM_ERROR || rx.type == FLM_LOG) {
            size_t o = rx.type == FLM_ERROR ? 2u : 0u;
            if (rx.len >= o + 2u)
                fprintf(stderr, " %.*s", (int)(rx.len - o - 2u), (const char *)rx.payload + o + 2u);
        }
        fputc('\n', stderr);
    }
    out_frames++;
    return 1;
}

static int console_byte(uint8_t b) { return (b >= 0x20u && b != 0x7Fu) || b == '\t' || b == '\r' || b == '\n'; }

/* What came before a delimiter: a frame, or console answers (ending in CR LF) and then a frame. */
static void out_candidate(const uint8_t *c, size_t n) {
    if (n == 0 || out_frame(c, n)) return;
    size_t text = 0;
    while (text < n && console_byte(c[text])) text++;
    for (size_t k = text; k >= 2; k--)
        if (c[k - 2] == '\r' && c[k - 1] == '\n' && (k == n || out_frame(c + k, n - k))) {
            if (verbose) fprintf(stderr, "device: %u bytes of console text\n", (unsigned)k);
            return;
        }
    fprintf(stderr, "oracle: the device sent a bad frame\n");
    abort();
}

/* What the device left without a delimiter when the input ran out: console answers only. */
static void out_rest(void) {
    for (size_t i = 0; i < cand_n; i++)
        if (!console_byte(cand[i])) { fprintf(stderr, "oracle: the device left an unfinished frame\n"); abort(); }
    if (cand_n && (cand_n < 2 || cand[cand_n - 2] != '\r' || cand[cand_n - 1] != '\n')) {
        fprintf(stderr, "oracle: console text that does not end its line\n");
        abort();
    }
}

static void out_check(const uint8_t *buf, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (buf[i]) {
            if (cand_n == sizeof cand) { fprintf(stderr, "oracle: a frame longer than any frame\n"); abort(); }
            cand[cand_n++] = buf[i];
            continue;
        }
        out_candidate(cand, cand_n);
        cand_n = 0;
    }
}

/* ---- the fake HAL ---------------------------------------------------------------------- */
int hal_init(int argc, char **argv) { (void)argc; (void)argv; return 0; }

const uint8_t *hal_blob(size_t *len) {
    *len = blob_len;
    return use_bad ? bad_blob : good_blob;
}

size_t hal_serial_read(uint8_t *buf, size_t max) {
    size_t n = stream_len - stream_pos;
    /* the input is used up while the device generates (polled once per step): a generation with
     * the SLIDE flag runs until max_new_tokens, up to 2^32 steps; 512 steps are enough to test */
    if (!n && ++empty_reads > 512u) longjmp(done, 1);
    if (n > max) n = max;
    if (n > read_chunk) n = read_chunk;
    memcpy(buf, stream + stream_pos, n);
    stream_pos += n;
    return n;
}

void hal_serial_write(const uint8_t *buf, size_t len) {
    if (!capturing) {
        out_check(buf, len);
        return;
    }
    capturing->sent = realloc(capturing->sent, capturing->sent_len + len);
    if (!capturing->sent) abort();
    memcpy(capturing->sent + capturing->sent_len, buf, len);
    capturing->sent_len += len;
}

void hal_idle(void) {
    if (stream_pos >= stream_len) longjmp(done, 1);   /* input used up and the device idle */
    if (++idle_calls > 1000000ul) abort();            /* idle with input left: it would hang */
}

uint64_t hal_time_us(void) { return now_us += 7u; }
uint8_t hal_clock_kind(void) { return 0; }
const char *hal_board_name(void) { return "fuzz"; }

uint8_t *hal_tier_arena(uint32_t tier, size_t *cap) {
    if (tier == FLM_TIER_PSRAM) { *cap = sizeof psram; return psram; }
    *cap = 0;
    return 0;
}

/* ---- building the host stream ---------------------------------------------------------- */
static flm_tx host_tx;

static void stream_put(const uint8_t *p, size_t n) {
    if (n > STREAM_CAP - stream_len) n = STREAM_CAP - stream_len;
    memcpy(stream + stream_len, p, n);
    stream_len += n;
}

static void frame(uint8_t type, const uint8_t *p, size_t n) {
    flm_tx_begin(&host_tx, type);
    flm_tx_put(&host_tx, p, n);
    flm_tx_end(&host_tx);
}

static void layout_frame(const uint8_t *p, size_t n) {
    uint8_t payload[12 + 255];
    uint32_t st = 0, crc = 0;
    if (n >= 4) { st = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; p += 4; n -= 4; }
    else n = 0;
    crc = flm_crc32_update(0, p, n);
    if (st) {
        uint8_t le[4] = {(uint8_t)st, (uint8_t)(st >> 8), (uint8_t)(st >> 16), (uint8_t)(st >> 24)};
        crc = flm_crc32_update(crc, le, 4);
    }
    uint32_t v[3] = {crc, st, (uint32_t)n};
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < 4; b++) payload[4 * k + b] = (uint8_t)(v[k] >> (8 * b));
    memcpy(payload + 12, p, n);
    frame(FLM_LAYOUT, payload, 12 + n);
}

static void build_stream(const uint8_t *data, size_t size) {
    stream_len = stream_pos = 0;
    if (!size) return;
    uint8_t mode = data[0];
    data++, size--;
    use_bad = (mode >> 1) & 1;
    if (!(mode & 1)) {
        read_chunk = 1u + (mode >> 2);
        stream_put(data, size);
        return;
    }
    read_chunk = 64;
    flm_tx_init(&host_tx, stream_put);
    size_t i = 0;
    while (i + 2 <= size) {
        uint8_t kind = data[i], len = data[i + 1];
        i += 2;
        size_t n = len <= size - i ? len : size - i;
        if (kind == 0xFF) stream_put(data + i, n);
        else if (kind == 0xFE) layout_frame(data + i, n);
        else frame(kind, data + i, n);
        i += n;
    }
}

/* ---- boot once, then restore ------------------------------------------------------------ */
static uint8_t *const MEM[2] = {arena, psram};   /* flm_dev.pool[0] and pool[FLM_TIER_PSRAM] */

static void boot_once(booted *b) {
    capturing = b;
    flm_app_boot(arena, sizeof arena, FLM_TIER_SRAM);
    capturing = 0;
    b->dev = flm_dev;
    for (int k = 0; k < 2; k++) {
        b->used[k] = flm_dev.pool[k].used;
        b->mem[k] = malloc(b->used[k] + 1u);
        if (!b->mem[k]) abort();
        memcpy(b->mem[k], MEM[k], b->used[k]);
    }
}

static void restore(const booted *b) {
    flm_dev = b->dev;
    for (int k = 0; k < 2; k++) memcpy(MEM[k], b->mem[k], b->used[k]);
    app_ring_reset();                  /* boot's: no generation yet */
    out_check(b->sent, b->sent_len);   /* the oracle sees the boot's frames, seq 0 on */
}

/* ---- libFuzzer entry points ------------------------------------------------------------ */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    verbose = getenv("FLM_FUZZ_VERBOSE") != 0;
    const char *path = getenv("FLM_FUZZ_BLOB");
    FILE *f = path ? fopen(path, "rb") : 0;
    if (!f) {
        fprintf(stderr, "fuzz_app: set FLM_FUZZ_BLOB to a model blob (tests/fuzz/make_blob.py)\n");
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n <= 64) exit(2);
    blob_len = (size_t)n;
    good_blob = malloc(blob_len);
    bad_blob = malloc(blob_len);
    if (!good_blob || !bad_blob || fread(good_blob, 1, blob_len, f) != blob_len) exit(2);
    fclose(f);
    memcpy(bad_blob, good_blob, blob_len);
    bad_blob[blob_len - 3] ^= 0x10;   /* a flipped bit in the last tensor: CRC mismatch at boot */
    boot_each = getenv("FLM_FUZZ_BOOT_EACH") && atoi(getenv("FLM_FUZZ_BOOT_EACH"));
    for (use_bad = 0; use_bad < 2 && !boot_each; use_bad++) boot_once(&boots[use_bad]);
    use_bad = 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    build_stream(data, size);
    cand_n = 0;
    out_frames = 0;
    idle_calls = empty_reads = 0;
    if (!boot_each) restore(&boots[use_bad]);
    if (setjmp(done) == 0) {
        if (boot_each) flm_app_run(arena, sizeof arena, FLM_TIER_SRAM);
        else flm_app_serve();
    }
    out_rest();
    return 0;
}
