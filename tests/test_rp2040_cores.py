"""The emulated RP2040's second core (host/emu/cores.mjs, interleaved by host/emu/harness.mjs) on
hand-checked programs: the boot ROM's launch handshake, FIFO ping-pong and the FIFO status flags,
spinlock contention, each core's CPUID and divider, both cores missing the XIP cache at once (the
QSPI bus serves one line at a time); and the engine with its matrix rows split over both cores, bit
for bit the reference's and the one-core build's."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from converter.boards import load_board
from converter.quantize import quantize
from emuboard import BOARD, emu_link, require_emulator
from modelzoo import random_model
from nativeboard import assert_matches_reference, run

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "host" / "emu" / "harness.mjs"
LINE_CYCLES = load_board(BOARD)["tiers"]["flash"]["line_cycles"]
BLOB_OFFSET = 0x10000
LINES = 256                      # flash lines each core reads in the cache experiment

LINK = """
SECTIONS {
  .boot2 0x10000000 : { BYTE(0); . = 256; }
  .vectors 0x10000100 : { KEEP(*(.vectors)) }
  .text : { *(.text .text.*) *(.rodata .rodata.*) }
  /DISCARD/ : { *(.ARM.*) *(.comment) *(.data .data.* .bss .bss.*) }
}
"""

# Core 0 launches core 1 as the boot ROM expects, then runs the experiments and prints one
# "name value" line each over UART0. Shared words live at fixed SRAM addresses (no .data/.bss).
PROGRAM = r"""
#include <stdint.h>
#define REG(a) (*(volatile uint32_t *)(a))
#define CPUID 0xd0000000u
#define FIFO_ST 0xd0000050u
#define FIFO_WR 0xd0000054u
#define FIFO_RD 0xd0000058u
#define DIV_UDIVIDEND 0xd0000060u
#define DIV_UDIVISOR 0xd0000064u
#define DIV_QUOTIENT 0xd0000070u
#define SPINLOCK(n) (0xd0000100u + 4u * (n))
#define SPINLOCK_ST 0xd000005cu
#define UART_DR 0x40034000u
#define WD_SCRATCH(n) (0x4005800cu + 4u * (n))
#define SHARED ((volatile uint32_t *)0x20001000u)
#define FLASH ((const volatile uint32_t *)(0x10000000u + %(blob)du))
#define ROUNDS 1000u
#define LINES %(lines)du

static void push(uint32_t v) { while (!(REG(FIFO_ST) & 2u)) {} REG(FIFO_WR) = v; __asm volatile("sev"); }
static uint32_t pop(void) { while (!(REG(FIFO_ST) & 1u)) __asm volatile("wfe"); return REG(FIFO_RD); }
static void put(const char *s) { while (*s) REG(UART_DR) = (uint8_t)*s++; }
static void say(const char *name, uint32_t v) {
    char b[12]; int i = 11; b[i] = 0;
    do { b[--i] = (char)('0' + v %% 10u); v /= 10u; } while (v);
    put(name); put(" "); put(b + i); put("\n");
}
static void mark(uint32_t step, uint32_t what) { REG(WD_SCRATCH(2)) = step; REG(WD_SCRATCH(3)) = what; }
static uint32_t read_lines(const volatile uint32_t *p) {
    uint32_t s = 0;
    for (uint32_t i = 0; i < LINES; i++) s += p[2u * i];   /* one word of each 8-byte line */
    return s;
}

static void core1(void) {
    SHARED[0] = REG(CPUID);
    REG(DIV_UDIVIDEND) = 1000u; REG(DIV_UDIVISOR) = 7u;    /* its own divider */
    __asm volatile("nop; nop; nop; nop; nop; nop; nop; nop");
    SHARED[1] = REG(DIV_QUOTIENT);
    for (uint32_t i = 0; i < 10u; i++) push(pop() + 1u);   /* ping-pong */
    (void)pop();                                            /* contention: both at once */
    for (uint32_t i = 0; i < ROUNDS; i++) {
        while (!REG(SPINLOCK(5))) SHARED[3]++;              /* spins while core 0 holds it */
        SHARED[2] = SHARED[2] + 1u;
        REG(SPINLOCK(5)) = 0u;
    }
    for (uint32_t i = 0; i < ROUNDS; i++) SHARED[4] = SHARED[4] + 1u;   /* no lock: updates get lost */
    push(1u);
    (void)pop();                                            /* both cores read flash at once */
    SHARED[6] = read_lines(FLASH + 2u * LINES);
    push(1u);
    for (;;) __asm volatile("wfe");                         /* never reads its FIFO again */
}

static void main0(void) __attribute__((noreturn));
static void main0(void) {
    say("cpuid0", REG(CPUID));
    say("st_before", REG(FIFO_ST));
    const uint32_t seq[6] = {0u, 0u, 1u, 0x10000100u, 0x20041000u, (uint32_t)(uintptr_t)core1};
    uint32_t tries = 0;
    for (uint32_t i = 0; i < 6u; tries++) {
        if (!seq[i]) { while (REG(FIFO_ST) & 1u) (void)REG(FIFO_RD); __asm volatile("sev"); }
        push(seq[i]);
        i = pop() == seq[i] ? i + 1u : 0u;
    }
    say("tries", tries);
    REG(DIV_UDIVIDEND) = 100u; REG(DIV_UDIVISOR) = 3u;
    __asm volatile("nop; nop; nop; nop; nop; nop; nop; nop");
    uint32_t sum = 0;
    for (uint32_t i = 0; i < 10u; i++) { push(i * 3u); sum = sum * 7u + pop(); }
    say("pingpong", sum);
    say("cpuid1", SHARED[0]);
    say("div1", SHARED[1]);
    say("div0", REG(DIV_QUOTIENT));

    push(0u);
    for (uint32_t i = 0; i < ROUNDS; i++) {
        while (!REG(SPINLOCK(5))) SHARED[5]++;
        SHARED[2] = SHARED[2] + 1u;
        REG(SPINLOCK(5)) = 0u;
    }
    for (uint32_t i = 0; i < ROUNDS; i++) SHARED[4] = SHARED[4] + 1u;
    (void)pop();
    say("locked", SHARED[2]);
    say("unlocked", SHARED[4]);
    say("spins1", SHARED[3]);
    say("spins0", SHARED[5]);
    say("lock_st", REG(SPINLOCK_ST));

    mark(0u, 0xF1A5B001u);                                  /* alone */
    uint32_t a = read_lines(FLASH);
    mark(0u, 0xF1A5E0D0u);
    mark(1u, 0xF1A5B001u);                                  /* with core 1 at once */
    push(1u);
    uint32_t b = read_lines(FLASH + 4u * LINES);
    (void)pop();
    mark(1u, 0xF1A5E0D0u);
    say("sums", a + b + SHARED[6]);

    for (uint32_t i = 0; i < 9u; i++) REG(FIFO_WR) = 100u + i;   /* 8 fit, the 9th overflows */
    say("st_full", REG(FIFO_ST));
    (void)REG(FIFO_RD); (void)REG(FIFO_RD);                 /* core 1's answer is long read: empty */
    say("st_sticky", REG(FIFO_ST));
    REG(FIFO_ST) = 0xffu;
    say("st_cleared", REG(FIFO_ST));
    put("end\n");
    for (;;) __asm volatile("wfi");
}

void reset(void) __attribute__((noreturn));
void reset(void) { main0(); }
__attribute__((section(".vectors"), used)) void (*const vectors[2])(void) = {(void (*)(void))0x20042000u, reset};
"""


def build(tmp: Path) -> Path:
    """PROGRAM as a flash image from 0x10000000 (the harness starts it from the vector table)."""
    (tmp / "prog.c").write_text(PROGRAM % dict(blob=BLOB_OFFSET, lines=LINES))
    (tmp / "link.ld").write_text(LINK)
    elf, image = tmp / "prog.elf", tmp / "prog.bin"
    subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m0plus", "-mthumb", "-O1", "-nostdlib", "-ffreestanding",
                    "-Wall", "-Werror", "-T", str(tmp / "link.ld"), str(tmp / "prog.c"), "-lgcc", "-o", str(elf)],
                   check=True, capture_output=True, text=True)
    subprocess.run(["arm-none-eabi-objcopy", "-O", "binary", str(elf), str(image)], check=True)
    return image


@pytest.fixture(scope="module")
def two_cores(tmp_path_factory):
    """PROGRAM run in the harness: its UART lines as {name: value}, and the harness's step counts."""
    require_emulator()
    tmp = tmp_path_factory.mktemp("cores")
    image = build(tmp)
    blob = tmp / "blob.bin"
    blob.write_bytes(bytes((i * 37 + (i >> 8)) & 0xff for i in range(8 * LINES * 8)))
    counts = tmp / "counts.jsonl"
    p = subprocess.Popen(["node", str(HARNESS), "--firmware", str(image), "--blob", str(blob),
                          "--blob-offset", str(BLOB_OFFSET), "--counts", str(counts)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    try:
        while not out.endswith(b"end\n"):
            b = p.stdout.read1(4096)
            if not b:
                break
            out += b
    finally:
        p.terminate()
        err = p.communicate(timeout=10)[1].decode()
    assert out.endswith(b"end\n"), (out, err)
    vals = {k.decode(): int(v) for k, v in re.findall(rb"(\w+) (\d+)\n", out)}
    words = [int.from_bytes(blob.read_bytes()[o:o + 4], "little") for o in range(0, 8 * LINES * 8, 8)]
    return vals, [json.loads(ln) for ln in counts.read_text().splitlines()], words


@pytest.mark.cross
@pytest.mark.emulated
def test_launch_cpuid_divider_and_fifo_ping_pong(two_cores):
    v, _, _ = two_cores
    assert v["cpuid0"] == 0 and v["cpuid1"] == 1
    assert v["st_before"] == 2                      # nothing to read, room to write
    assert v["tries"] == 6                          # the handshake's six words, each echoed at once
    assert v["div0"] == 100 // 3 and v["div1"] == 1000 // 7   # each core its own divider
    want = 0
    for i in range(10):                             # core 1 answers each word plus one
        want = (want * 7 + i * 3 + 1) & 0xffffffff
    assert v["pingpong"] == want


@pytest.mark.cross
@pytest.mark.emulated
def test_fifo_full_and_empty_flags(two_cores):
    v, _, _ = two_cores
    # 8 words fit in core 1's FIFO (it reads no more), the 9th is dropped: RDY clear, WOF set;
    # reading the empty FIFO from core 1 sets ROE; writing FIFO_ST clears both
    assert v["st_full"] == 0b0100
    assert v["st_sticky"] == 0b1100
    assert v["st_cleared"] == 0


@pytest.mark.cross
@pytest.mark.emulated
def test_spinlock_contention(two_cores):
    """Both cores take spinlock 5 a thousand times at once: every locked increment lands, both
    cores waited for the lock, and it is free at the end; then a thousand increments each without
    the lock lose updates (the cores really run interleaved)."""
    v, _, _ = two_cores
    assert v["locked"] == 2000
    assert v["unlocked"] < 2000
    assert v["spins0"] > 0 and v["spins1"] > 0
    assert v["lock_st"] == 0


@pytest.mark.cross
@pytest.mark.emulated
def test_both_cores_missing_the_cache_queue_on_one_qspi_bus(two_cores):
    """Core 0 reads LINES flash lines alone (step 0), then both cores read LINES other lines each at
    once (step 1): one line moves at a time, so step 1 lasts at least 2 x LINES transfers, and at
    most that plus core 0's own loop; both cores' reads are in the step's bytes and misses."""
    v, counts, words = two_cores
    assert v["sums"] == sum(words[:3 * LINES]) & 0xffffffff
    alone, both = ({c["step"]: c for c in counts}[s] for s in (0, 1))
    data = lambda c: c["xip"]["misses"] - c["xip"]["fetch_misses"]
    # the blob's lines, and the code's few literal-pool lines
    assert LINES <= data(alone) <= LINES + 4 and 2 * LINES <= data(both) <= 2 * LINES + 8
    assert alone["bytes"][0] == 4 * LINES and both["bytes"][0] == 8 * LINES
    loop = alone["cycles"] - alone["xip"]["misses"] * LINE_CYCLES
    assert 0 < loop < 12 * LINES                    # core 0's own instructions while alone
    assert 2 * LINES * LINE_CYCLES <= both["cycles"] <= 2 * LINES * LINE_CYCLES + loop + 40 * LINE_CYCLES


# ---------------------------------------------------------------------------------------------
# the engine on both cores

@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    require_emulator()
    return tmp_path_factory.mktemp("cores-builds")


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_engine_bit_exact_on_one_core_and_two(fmt, tmp_path, build_root):
    """The same generation on the default build (rows split over both cores) and on a one-core
    build: both the reference's logits bit for bit, the same bytes read each step (core 1's reads
    counted with core 0's), and fewer cycles a step with core 1 at work."""
    from converter.reference import FLAG_LOGITS, generate
    _, ir = random_model(seed=9)
    qm = quantize(ir, fmt, 32)
    ref = generate(qm, [1, 7, 3], 6, flags=FLAG_LOGITS)
    counts = {}
    for cores in (2, 1):
        with emu_link(qm, tmp_path, build_root, cores=cores) as (link, _, board):
            board.read_counts()
            toks, logits, _ = run(link, [1, 7, 3], 6)
            assert_matches_reference(toks, logits, ref)
            counts[cores] = board.read_counts()
    two, one = counts[2], counts[1]
    assert [c["bytes"] for c in two] == [c["bytes"] for c in one]
    assert all(t["cycles"] < o["cycles"] for t, o in zip(two, one))


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_two_cores_with_the_xip_model_off(tmp_path, build_root):
    """`--xip-model off` (flash reads cost what SRAM reads cost) with both cores: the reference's
    logits bit for bit, no XIP counters."""
    from converter.reference import FLAG_LOGITS, generate
    _, ir = random_model(seed=5)
    qm = quantize(ir, "q4", 32)
    ref = generate(qm, [1, 7, 3], 6, flags=FLAG_LOGITS)
    with emu_link(qm, tmp_path, build_root, xip_model=False) as (link, _, board):
        board.read_counts()
        toks, logits, _ = run(link, [1, 7, 3], 6)
        assert_matches_reference(toks, logits, ref)
        counts = board.read_counts()
    assert counts and all("xip" not in c and c["cycles"] > 0 for c in counts)
