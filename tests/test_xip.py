"""The emulated RP2040's XIP model (host/emu/xip.mjs, driven by host/emu/harness.mjs): the cache on
hand-checked access patterns and against a plain reference model on random streams, XIP_CTRL, the
cost of a line transfer from the SSI registers; and on the emulated board: the firmware's own
clock includes exactly the stall cycles, the logits stay bit-exact, and `compare --run` ranks the
head in flash against the head in SRAM as the planner does."""
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from converter.boards import load_board
from converter.timing import lines_per_row, tier_models
from converter.quantize import quantize
from emuboard import BOARD, emu_link, image_for, require_emulator
from host.link.messages import PHASES
from modelzoo import random_model
from nativeboard import assert_matches_reference, run

ROOT = Path(__file__).resolve().parent.parent
XIP = ROOT / "host" / "emu" / "xip.mjs"
A = 0x10000000          # a line in set 0; + 0x2000 and + 0x4000 are other lines of set 0
LINE_CYCLES = load_board(BOARD)["tiers"]["flash"]["line_cycles"]

DRIVER = """
import fs from 'node:fs';
import { XipCache, XipCtrl, lineTransfer, picoBoot2 } from '%s';
const cache = new XipCache();
const ctrl = new XipCtrl(cache, () => {});
const out = [];
cache.onBadTransfer = (addr) => out.push(`no transfer at ${addr.toString(16)}`);
for (const [op, a, b, c, now, k] of JSON.parse(fs.readFileSync(0, 'utf8'))) {
  if (op === 'miss') cache.missCycles = a;
  else if (op === 'read') out.push(now === undefined ? cache.read(a, b, c) : cache.read(a, b, c, now, k));
  else if (op === 'wr') ctrl.writeUint32Atomic(a, b, c || 0);
  else if (op === 'rd') out.push(ctrl.readUint32(a));
  else if (op === 'ssi') out.push(lineTransfer(a));
  else if (op === 'boot2') { const ssi = {}; picoBoot2(ssi); out.push(lineTransfer(ssi)); }
}
console.log(JSON.stringify({ out, counters: cache.counters() }));
"""


def xip(ops: list) -> tuple[list, dict]:
    """Run ops through a fresh XipCache in node: ["miss", cycles] sets the line transfer,
    ["read", addr, size, fetch] gives its stall cycles (["read", addr, size, fetch, now, core]: core's
    read at cycle now, which may wait for the bus), ["wr", offset, value] / ["rd", offset]
    reach XIP_CTRL, ["ssi", registers] / ["boot2"] give lineTransfer's answer."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed (make emu-deps)")
    r = subprocess.run(["node", "--input-type=module", "-e", DRIVER % XIP.as_uri()], input=json.dumps(ops),
                       capture_output=True, text=True, check=True)
    d = json.loads(r.stdout)
    return d["out"], d["counters"]


def reads(*addrs, size=4, fetch=False) -> list:
    return [["read", a, size, fetch] for a in addrs]


# ---------------------------------------------------------------------------------------------
# the cache model

@pytest.mark.emulated
def test_two_way_set_hits_misses_and_lru_evictions():
    B, C = A + 0x2000, A + 0x4000           # same set as A, other tags
    out, n = xip([["miss", 10]] + reads(A, A + 4, A + 8, B, A, C, A, B, C, A))
    # A fills way 0 | same line | next line, set 1 | B fills way 1 | A hit: B is LRU | C evicts B
    # | A hit: C is LRU | B evicts C | C evicts A (LRU) | A evicts B
    assert out == [10, 0, 10, 10, 0, 10, 0, 10, 10, 10]
    assert n == dict(hits=3, misses=7, fetch_misses=0, stall_cycles=70, bus_wait_cycles=0)


@pytest.mark.emulated
def test_a_read_crossing_a_line_looks_up_both_lines():
    out, n = xip([["miss", 10]] + reads(A + 6) + reads(A + 4, A + 12) + reads(A + 7, size=2)
                 + reads(A + 0x17, size=2) + [["read", A + 0x15, 1, False]])
    # A+6..A+9: lines A and A+8 both miss | both cached | A+7..A+8 crosses, both hit
    # | A+0x17..A+0x18: line A+0x10 misses, A+0x18 misses | a byte of A+0x10: hit
    assert out == [20, 0, 0, 0, 20, 0]
    assert n["misses"] == 4 and n["hits"] == 5


@pytest.mark.emulated
def test_the_four_aliases():
    X, Y, Z = A + 0x100, A + 0x200, A + 0x300
    out, _ = xip([["miss", 10]]
                 + reads(X + 0x03000000, X + 0x03000000, X, X)          # 0x13: no check, no fill
                 + reads(Y + 0x02000000, Y, Y + 0x02000000)              # 0x12: no check, fills
                 + reads(Z + 0x01000000, Z + 0x01000000, Z, Z + 0x01000000))   # 0x11: checks, no fill
    assert out == [10, 10, 10, 0,
                   10, 0, 10,
                   10, 10, 10, 0]


@pytest.mark.emulated
def test_instruction_fetches_are_counted_apart_and_share_the_cache():
    out, n = xip([["miss", 10]] + reads(A, A + 2, A + 4, A + 6, A + 8, size=2, fetch=True)
                 + reads(A + 4) + reads(A + 0x2000, A + 0x4000) + reads(A, size=2, fetch=True))
    # four halfwords of line A: one miss | next line | a literal load in the fetched line: hit
    # | two data lines of set 0 evict A | fetching A again misses
    assert out == [10, 0, 0, 0, 10, 0, 10, 10, 10]
    assert n == dict(hits=4, misses=5, fetch_misses=3, stall_cycles=50, bus_wait_cycles=0)


@pytest.mark.emulated
def test_two_cores_misses_queue_on_the_one_qspi_bus():
    """Core 0 misses at cycle 100 (bus busy to 110); core 1 misses at 103: it waits 7 for the bus,
    then 10 for its line; core 0 hits at 105 while core 1's transfer holds the bus (to 120): waits
    15; at 130 the bus is free: a hit costs nothing, a miss its transfer. Each core keeps its own
    last-fetched line, both in the one cache."""
    B = A + 0x100
    out, n = xip([["miss", 10], ["read", A, 4, True, 100, 0], ["read", B, 4, True, 103, 1],
                  ["read", A + 2, 2, True, 105, 0], ["read", B + 2, 2, True, 130, 1],
                  ["read", A + 0x2000, 4, False, 130, 0], ["read", B, 4, False, 141, 1]])
    assert out == [10, 17, 15, 0, 10, 0]
    assert n == dict(hits=3, misses=3, fetch_misses=2, stall_cycles=30, bus_wait_cycles=7 + 15)


@pytest.mark.emulated
def test_xip_ctrl_enable_flush_and_counters():
    out, n = xip([["miss", 10]] + reads(A, A)
                 + [["rd", 0x0c], ["rd", 0x10], ["wr", 0x00, 0x2]]       # CTR_HIT, CTR_ACC; EN off
                 + reads(A, A) + [["rd", 0x00], ["wr", 0x00, 0x1, 2]]    # straight to flash; EN on (SET alias)
                 + reads(A) + [["wr", 0x04, 1]] + reads(A, A)            # tags kept; FLUSH clears them
                 + [["wr", 0x0c, 0], ["rd", 0x0c], ["rd", 0x10], ["wr", 0x00, 0x9], ["rd", 0x00]]
                 + reads(A))                                              # POWER_DOWN forces EN off
    assert out == [10, 0, 1, 2,
                   10, 10, 0x2,
                   0, 10, 0,
                   0, 7, 0x8,
                   10]
    assert n["hits"] == 3 and n["misses"] == 5


@pytest.mark.emulated
def test_line_transfer_from_the_ssi_registers():
    (boot2,), _ = xip([["boot2"]])
    # quad continuous read: 8 address+mode + 4 dummy + 16 data clocks, x SCKDV 2, + 1 RX delay + 2 bus
    assert boot2 == dict(cycles=59, sck=28, sckdv=2, why=None) == dict(boot2, cycles=LINE_CYCLES)
    quad = dict(ssienr=1, baudr=4, rxsampldly=1, crtlr0=(2 << 21) | (31 << 16) | (3 << 8),
                spictlr0=(0xa0 << 24) | (4 << 11) | (8 << 2) | 2)
    dual = dict(quad, baudr=2, rxsampldly=0, crtlr0=1 << 21, spictlr0=(2 << 8) | (8 << 2) | 1)   # BBh-style
    serial = dict(quad, baudr=6, crtlr0=0)                                                       # 03h reads
    out, _ = xip([["ssi", quad], ["ssi", dual], ["ssi", serial], ["ssi", dict(quad, ssienr=0)],
                  ["ssi", dict(quad, baudr=0)]])
    assert [o["cycles"] for o in out[:3]] == [28 * 4 + 3, (8 + 16 + 32) * 2 + 2, (8 + 24 + 64) * 6 + 3]
    assert "disabled" in out[3]["why"] and "SCKDV = 0" in out[4]["why"] and out[3]["cycles"] == 0


@pytest.mark.emulated
def test_a_miss_the_ssi_cannot_serve_is_reported():
    """While the SSI is off (the HAL reconfiguring it) a miss is a fault the harness stops on;
    a hit is still served."""
    out, _ = xip([["miss", 10]] + reads(A) + [["miss", 0]] + reads(A, A + 8))
    assert out == [10, 0, "no transfer at 10000008", 0]


class RefCache:
    """The XIP cache as the datasheet describes it, written plainly: per set the tags, most
    recently used first."""

    def __init__(self, miss: int):
        self.sets, self.enabled, self.miss = {}, True, miss
        self.n = dict(hits=0, misses=0, fetch_misses=0, stall_cycles=0, bus_wait_cycles=0)

    def access(self, addr: int, fetch: bool) -> int:
        line, seg = (addr & 0xffffff) >> 3, (addr >> 24) & 3
        ways, tag = self.sets.setdefault(line % 1024, []), line >> 10
        if self.enabled:
            if seg < 2 and tag in ways:
                ways.remove(tag)
                ways.insert(0, tag)
                self.n["hits"] += 1
                return 0
            if seg in (0, 2):
                if tag in ways:
                    ways.remove(tag)
                elif len(ways) == 2:
                    ways.pop()
                ways.insert(0, tag)
        self.n["misses"] += 1
        self.n["fetch_misses"] += fetch
        self.n["stall_cycles"] += self.miss
        return self.miss

    def read(self, addr: int, size: int, fetch: bool) -> int:
        s = self.access(addr, fetch)
        return s + self.access(addr + size - 1, fetch) if (addr & 7) + size > 8 else s


@pytest.mark.emulated
@pytest.mark.parametrize("seed", range(3))
def test_random_streams_match_a_plain_reference_model(seed):
    """Code fetched in runs, data read at random over a few sets (so that ways evict each other),
    every alias, reads crossing lines, the cache switched off and on and flushed: the same stall
    on every read as the reference (the harness's shortcut for repeated fetch lines included)."""
    rng = random.Random(seed)
    lines = [A + 0x2000 * k + 8 * s for k in range(5) for s in range(3)]
    ops, ref, want = [["miss", 7]], RefCache(7), []
    pc = lines[0]
    for _ in range(4000):
        r = rng.random()
        if r < 0.45:                                   # a fetch run continues, or jumps
            pc = pc + 2 if rng.random() < 0.85 else rng.choice(lines) + 2 * rng.randrange(4)
            op = ["read", pc, 2, True]
        elif r < 0.97:
            size = rng.choice([1, 2, 4])
            op = ["read", rng.choice(lines) + (rng.choice([0, 0x01000000, 0x02000000, 0x03000000])
                                               if rng.random() < 0.2 else 0) + rng.randrange(8), size, False]
        elif r < 0.985:
            on = rng.random() < 0.6
            ops.append(["wr", 0x00, 0x3 if on else 0x2])
            ref.enabled = on
            continue
        else:
            ops.append(["wr", 0x04, 1])
            ref.sets.clear()
            continue
        ops.append(op)
        want.append(ref.read(op[1], op[2], op[3]))
    out, n = xip(ops)
    assert out == want and n == ref.n


def test_planner_gathers_pay_the_lines_a_row_touches():
    fl = tier_models(load_board(BOARD))["flash"]
    assert fl.seq_read_MBps == pytest.approx(8 * 125 / LINE_CYCLES) and fl.line_us == LINE_CYCLES / 125
    assert lines_per_row(72, 8) == 9 and lines_per_row(68, 8) == 9 and lines_per_row(4, 8) == 1
    assert lines_per_row(12, 8) == 2                   # rows at offsets 0 and 4: 2 lines each
    assert fl.us(72 * 10, rows=10, stride=72) == pytest.approx(90 * fl.line_us)
    assert fl.us(12 * 10, rows=10, stride=12) == pytest.approx(20 * fl.line_us)


# ---------------------------------------------------------------------------------------------
# on the emulated board

@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    require_emulator()
    return tmp_path_factory.mktemp("xip-builds")


@pytest.mark.emulated
@pytest.mark.slow
def test_firmware_clock_counts_the_stalls_and_logits_stay_exact(tmp_path, build_root):
    """On core 0 alone (the one-core build: with two, core 1's stalls overlap core 0's work), the
    same generation with the XIP model on and off: bit for bit the reference's logits both
    times; on every step the harness's cycles differ by exactly the stall cycles, and the
    firmware's own per-phase µs (its TIMER) by those cycles at 125 MHz (within a µs a phase, less
    the stalls outside the timed phases)."""
    from converter.reference import FLAG_LOGITS, generate
    _, ir = random_model(seed=5)
    qm = quantize(ir, "q8", 32)
    ref = generate(qm, [1, 7, 3], 6, flags=FLAG_LOGITS)
    got = {}
    for on in (True, False):
        with emu_link(qm, tmp_path, build_root, xip_model=on, cores=1) as (link, _, board):
            board.read_counts()
            toks, logits, _ = run(link, [1, 7, 3], 6)
            assert_matches_reference(toks, logits, ref)
            got[on] = toks, {c["step"]: c for c in board.read_counts()}
    (ton, con), (toff, coff) = got[True], got[False]
    mhz = load_board(BOARD)["clock_mhz"]
    for a, b in zip(ton, toff):
        x, off = con[a.step], coff[b.step]
        assert "xip" not in off and x["bytes"] == off["bytes"]
        s = x["xip"]
        assert s["miss_cycles"] == LINE_CYCLES and s["stall_cycles"] == s["misses"] * LINE_CYCLES
        # the products' rows came by direct reads (stream_rp2040.c), all but a few hundred bytes of
        # the step's flash reads (the embedding's row, the head's tile records) through the cache
        ssi = x["ssi"]
        assert ssi["overruns"] == 0 and ssi["underruns"] == 0 and 4 * ssi["words"] >= 0.9 * x["bytes"][0]
        assert s["fetch_misses"] > 0 and s["misses"] > s["fetch_misses"]
        assert x["cycles"] - off["cycles"] == s["stall_cycles"]
        # the phases' µs (each within a µs) cover all of a step but the few instructions around its
        # first and last timer reads, whose fetch misses are a larger share of the stalls now that
        # the products' rows stream without any (stream_rp2040.c): measured 8 % of them. Sampling
        # is timed after the step's end mark (app_generate.c): its stalls are not the step's.
        timed = [i for i, p in enumerate(PHASES) if p != "sampling"]
        stall_us, more_us = s["stall_cycles"] / mhz, sum(a.us[i] - b.us[i] for i in timed)
        assert 0.85 * stall_us - len(timed) <= more_us <= stall_us + len(timed)


@pytest.mark.native
@pytest.mark.emulated
@pytest.mark.slow
def test_a_miss_costs_what_the_firmwares_ssi_setting_makes_it(tmp_path, build_root):
    """The firmware built to clock the flash at clk_sys / 4 instead of the profile's / 2: the HAL
    writes that divider and the harness charges 28 x 4 + 3 = 115 cycles a miss from then on."""
    import serial

    from converter.blob import write_blob
    from host.link.messages import Hello, Ping
    from host.link.port import Link
    from host.boards.emulated import start_emulated_board
    from nativeboard import recv_until
    blob = tmp_path / "m.flmb"
    write_blob(quantize(random_model(seed=5)[1], "q8", 32), blob)
    proj = Path(shutil.copytree(image_for(blob, build_root).parent, tmp_path / "sckdv4"))
    (proj / "Makefile").write_text((proj / "Makefile").read_text().replace("-DFLM_XIP_SCKDV=2u", "-DFLM_XIP_SCKDV=4u"))
    (proj / "firmware.elf").unlink()
    subprocess.run(["make", "-s", "-C", str(proj)], check=True, capture_output=True)
    with start_emulated_board(proj / "firmware.bin", blob) as b:
        port = serial.Serial(b.port, 115200, timeout=0.05)
        try:
            link = Link(port)
            link.send(Ping())
            recv_until(link, lambda m: isinstance(m, Hello))
            b.read_counts()
            run(link, [1, 2], 2, logits=False)
            counts = b.read_counts()
        finally:
            port.close()
        log = b.stderr_tail(10)
    assert any("XIP line transfer now 115 cycles a line (28 SCK clocks at SCKDV 4)" in ln for ln in log), log
    assert counts and all(c["xip"]["miss_cycles"] == 115 and c["xip"]["stall_cycles"] == 115 * c["xip"]["misses"]
                          for c in counts)


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_compare_run_head_in_flash_vs_sram_goes_the_planners_way(tmp_path, build_root, capsys):
    """`flashlm compare --run --board rp2040-emu`: with the XIP model the output layer read from
    flash takes longer than from SRAM, as the planner predicts (sizes: make bench)."""
    from converter.llama2c import write_llama2c
    from host.cli.main import main
    require_emulator()
    _, ir = random_model(seed=6, vocab_size=96, hidden_dim=96)
    write_llama2c(ir, tmp_path / "model.bin", version=1)
    out = tmp_path / "model"
    assert main(["convert", str(tmp_path / "model.bin"), "-o", str(out), "--no-report"]) == 0
    js = tmp_path / "cmp.json"
    rc = main(["compare", str(out), "--board", BOARD, "--layout", "flash", "--layout", "flash,head=sram", "--run",
               "--prompt-ids", "1,5", "--max-tokens", "4", "--json", str(js), "--png", str(tmp_path / "c.png")])
    assert rc == 0, capsys.readouterr().err
    runs = json.loads(js.read_text())["runs"]
    fl, sr = runs["flash"], runs["flash,head=sram"]
    assert fl["tokens"] == sr["tokens"] and fl["crcs"] == sr["crcs"]
    assert fl["bytes_match"] == fl["steps"] and sr["bytes_match"] == sr["steps"]
    for r in (fl, sr):
        assert sum(r["measured"].values()) > 0
    assert fl["measured"]["output"] > sr["measured"]["output"]
    assert fl["predicted"]["output"] > sr["predicted"]["output"]
