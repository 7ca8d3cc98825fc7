/* Native (host) board: the blob file is mmapped as the flash tier, the serial link is a pty
 * whose slave path is printed as "pty /dev/pts/N", time is the host's monotonic clock.
 * "PSRAM" is a static buffer (FLM_PSRAM_ARENA_BYTES from flm_config.h) standing in for the tier;
 * "SRAM" is the arena main() passes to the app. */
#define _GNU_SOURCE
#include "hal.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static const uint8_t *blob;
static size_t blob_len;
static int master = -1;

int hal_init(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s BLOB\n", argv[0]);
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM);   /* a virtual board dies with the host that started it */
    int fd = open(argv[1], O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "native board: cannot open blob %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    blob_len = (size_t)sb.st_size;
    if (blob_len) {
        void *p = mmap(0, blob_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr, "native board: cannot map %s: %s\n", argv[1], strerror(errno));
            return 1;
        }
        blob = p;
    }
    close(fd);
    master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) {
        fprintf(stderr, "native board: cannot create a pty: %s\n", strerror(errno));
        return 1;
    }
    const char *name = ptsname(master);
    /* Hold the slave open in raw mode: no echo or newline translation of binary frames before the
     * host opens it, and no hang-up when the host closes and reopens the port. */
    int slave = open(name, O_RDWR | O_NOCTTY);
    struct termios tio;
    if (slave < 0 || tcgetattr(slave, &tio)) {
        fprintf(stderr, "native board: cannot open %s: %s\n", name, strerror(errno));
        return 1;
    }
    cfmakeraw(&tio);
    tcsetattr(slave, TCSANOW, &tio);
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    printf("pty %s\n", name);
    fflush(stdout);
    return 0;
}

const uint8_t *hal_blob(size_t *len) {
    *len = blob_len;
    return blob;
}

size_t hal_serial_read(uint8_t *buf, size_t max) {
    ssize_t n = read(master, buf, max);
    return n > 0 ? (size_t)n : 0;
}

void hal_serial_write(const uint8_t *buf, size_t len) {
    while (len) {
        ssize_t n = write(master, buf, len);
        if (n > 0) { buf += n; len -= (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        struct pollfd p = {master, POLLOUT, 0};
        if (poll(&p, 1, 2000) <= 0) return;   /* nobody reading for 2 s: drop, as a UART would */
    }
}

void hal_idle(void) {
    struct pollfd p = {master, POLLIN, 0};
    poll(&p, 1, 20);
}

uint64_t hal_time_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint8_t hal_clock_kind(void) { return 0; }

const char *hal_board_name(void) { return FLM_BOARD_NAME; }

#if defined(FLM_PSRAM_ARENA_BYTES) && FLM_PSRAM_ARENA_BYTES > 0
static uint8_t psram_arena[FLM_PSRAM_ARENA_BYTES] __attribute__((aligned(64)));
#endif

uint8_t *hal_tier_arena(uint32_t tier, size_t *cap) {
#if defined(FLM_PSRAM_ARENA_BYTES) && FLM_PSRAM_ARENA_BYTES > 0
    if (tier == 1u) {   /* FLM_TIER_PSRAM */
        *cap = sizeof psram_arena;
        return psram_arena;
    }
#endif
    (void)tier;
    *cap = 0;
    return 0;
}
