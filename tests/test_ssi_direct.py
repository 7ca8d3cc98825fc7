"""The emulated RP2040's SSI in direct mode (host/emu/ssidirect.mjs on rp2040js's SSI registers):
one quad read's cycles and words, the QSPI bus it shares with the XIP cache's line fills, the RX
FIFO, and the DMA paced by its RX request landing the words in SRAM in order — each hand-checked."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMU = ROOT / "host" / "emu"
RP2040JS = EMU / "node_modules" / "rp2040js" / "dist" / "esm" / "index.js"
SSI = 0x18000000
CTRLR1, SSIENR, SR, RXFLR, DMACR, DMARDLR, DR0 = 0x04, 0x08, 0x28, 0x24, 0x4c, 0x54, 0x60
BUSY, TFNF, TFE, RFNE = 1, 2, 4, 8
OFFSET = 0x1000            # the flash offset the reads start at
# The Pico's boot2 setting (quad, continuous read: 24 address + 8 mode bits on 4 lines, 4 dummy
# clocks, SCKDV 2, RX sample delay 1) plus the 2 bus cycles of xip.mjs: the first word arrives
# (8 + 4 + 8) * 2 + 1 + 2 = 43 cycles after the address is written, then one every 8 * 2 = 16
FIRST, PER = 43, 16

DRIVER = """
import fs from 'node:fs';
import { RP2040 } from '%s';
import { XipCache, picoBoot2 } from '%s';
import { SsiDirect, connectDma } from '%s';
const mcu = new RP2040();
const warnings = [];
mcu.logger = { debug() {}, info() {}, warn(c, m) { throw new Error(m); }, error(c, m) { throw new Error(m); } };
const flash = new Uint8Array(256);
for (let i = 0; i < flash.length; i++) flash[i] = (i * 37 + 11) & 0xff;
mcu.flash.set(flash, %d);
const cache = new XipCache();
cache.missCycles = 59;
const bad = [];
cache.onBadTransfer = (addr, direct) => bad.push([addr, direct]);
let now = 0;
const ssi = mcu.peripherals[0x18000];
picoBoot2(ssi);
const direct = new SsiDirect(ssi, cache, () => now, (off) => mcu.flashView.getUint32(off, true), (m) => warnings.push(m));
connectDma(direct, mcu.dma);
const arrived = [];
direct.onWord = (off) => arrived.push([now, off]);
const out = [];
let left = 0;
const moved = [];
for (const [op, a, b, c] of JSON.parse(fs.readFileSync(0, 'utf8'))) {
  if (op === 'at') { now = a; direct.poll(now); }
  else if (op === 'wr') mcu.writeUint32(a, b >>> 0);
  else if (op === 'rd') out.push(mcu.readUint32(a) >>> 0);
  else if (op === 'miss') out.push(cache.read(a, 4, false, now, 0));
  else if (op === 'busfree') out.push(cache.busFree);
  else if (op === 'flash') out.push(mcu.flashView.getUint32(a, true) >>> 0);
  else if (op === 'sram') for (let i = 0; i < b; i++) out.push(mcu.readUint32(a + 4 * i) >>> 0);
  else if (op === 'tick') {           // the harness's clock, one cycle a step at 125 MHz, to cycle a
    left = mcu.readUint32(0x50000008);
    while (now < a) {
      now++;
      if (direct.busy) direct.poll(now);
      mcu.clock.tick(8);
      const n = mcu.readUint32(0x50000008);
      if (n !== left) { moved.push([now, left - n]); left = n; }
    }
  }
}
console.log(JSON.stringify({ out, arrived, moved, bad, warnings, counters: direct.counters() }));
"""


def run(ops: list) -> dict:
    """ops through a fresh rp2040js chip with the SSI's direct mode: ["at", cycle] moves the time
    (the words arrived by then go into the RX FIFO), ["wr", addr, value] / ["rd", addr] are bus
    accesses, ["miss", addr] a core's read through the XIP cache (its stall), ["tick", cycle] runs
    the clock (and the DMA) to cycle, ["flash", offset] / ["sram", addr, n] read memory."""
    if shutil.which("node") is None or not RP2040JS.exists():
        pytest.skip("node and rp2040js are not installed (make emu-deps)")
    src = DRIVER % (RP2040JS.as_uri(), (EMU / "xip.mjs").as_uri(), (EMU / "ssidirect.mjs").as_uri(), OFFSET)
    r = subprocess.run(["node", "--input-type=module", "-e", src], input=json.dumps(ops),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def read(words: int, at: int = 0) -> list:
    """The HAL's start of a direct read of words 32-bit words at OFFSET: NDF, then the address
    word of the continuous read ((address << 8) | mode bits 0xA0)."""
    return [["wr", SSI + SSIENR, 0], ["wr", SSI + CTRLR1, words - 1], ["wr", SSI + SSIENR, 1],
            ["at", at], ["wr", SSI + DR0, (OFFSET << 8) | 0xa0]]


@pytest.mark.emulated
def test_one_quad_read_of_1_kb_takes_4123_cycles_and_holds_the_bus():
    ops = read(256) + [["busfree"], ["at", FIRST - 1], ["rd", SSI + RXFLR], ["rd", SSI + SR]]
    ops += [["at", FIRST], ["rd", SSI + RXFLR], ["rd", SSI + DR0], ["flash", OFFSET]]
    d = run(ops)
    assert d["out"][0] == (12 + 256 * 8) * 2 + 1 + 2 == 4123
    assert d["out"][1:3] == [0, BUSY | TFNF | TFE]
    assert d["out"][3] == 1 and d["out"][4] == d["out"][5]       # one word: the flash's first
    assert d["arrived"] == [[FIRST, OFFSET]]
    d = run(read(256) + [["at", 5000]])
    # every word's arrival, hand-computed: the last at 43 + 255 * 16 = 4123, the read's end
    assert [t for t, _ in d["arrived"]] == [5000] * 256
    assert [o for _, o in d["arrived"]] == [OFFSET + 4 * i for i in range(256)]
    # nobody read DR0: the 16-word RX FIFO overran on the other 240
    assert d["counters"] == dict(ssi_words=256, ssi_cycles=4123, ssi_overruns=240, ssi_underruns=0)
    assert d["warnings"] == ["SSI RX FIFO overrun: a direct read's word was lost"]


@pytest.mark.emulated
def test_the_words_arrive_one_every_16_cycles_and_dr0_gives_them_in_order():
    ops = read(4, at=100)
    for k in range(4):
        ops += [["at", 100 + FIRST + PER * k - 1], ["rd", SSI + RXFLR], ["at", 100 + FIRST + PER * k],
                ["rd", SSI + RXFLR], ["rd", SSI + DR0]]
    ops += [["rd", SSI + SR], ["rd", SSI + DR0]] + [["flash", OFFSET + 4 * i] for i in range(4)]
    d = run(ops)
    out = d["out"]
    for k in range(4):
        assert out[3 * k: 3 * k + 2] == [0, 1]
    assert [out[3 * k + 2] for k in range(4)] == out[14:18]       # the flash's words, in order
    assert out[12] == TFNF | TFE and out[13] == 0                 # done, and a read of an empty FIFO
    assert d["counters"] == dict(ssi_words=4, ssi_cycles=(12 + 4 * 8) * 2 + 3, ssi_overruns=0, ssi_underruns=1)


@pytest.mark.emulated
def test_a_line_fill_during_the_read_is_reported_one_after_it_is_not_and_a_read_waits_for_a_fill():
    # the read of 8 words holds the bus 0..(12 + 8 * 8) * 2 + 3 = 155; the fault's fill queues
    # behind it (155..214); a fill at 250 finds the bus free
    d = run(read(8) + [["at", 50], ["miss", 0x10008000], ["at", 250], ["miss", 0x10008008]])
    assert d["bad"] == [[0x10008000, True]]                      # the SSI is out of XIP mode
    assert d["out"] == [155 - 50 + 59, 59]
    # a fill at 0 holds the bus 0..59: the address written at 10 starts the read at 59
    d = run([["miss", 0x10008000]] + read(1, at=10) + [["at", 59 + FIRST - 1], ["rd", SSI + RXFLR],
                                                      ["at", 59 + FIRST], ["rd", SSI + RXFLR], ["busfree"]])
    assert d["out"] == [59, 0, 1, 59 + (12 + 8) * 2 + 3]
    assert d["bad"] == []


@pytest.mark.emulated
def test_the_dma_paced_by_the_rx_request_lands_each_word_in_sram_as_it_arrives():
    words = 40                     # more than the RX FIFO holds: the DMA keeps it from overrunning
    dma = [["wr", 0x50000000, SSI + DR0], ["wr", 0x50000004, 0x20000000], ["wr", 0x50000008, words],
           # 32-bit, write address incrementing, read address fixed, paced by DREQ_XIP_SSIRX (39)
           ["wr", 0x5000000c, 1 | (2 << 2) | (1 << 5) | (0 << 11) | (39 << 15)],
           ["wr", SSI + DMARDLR, 0], ["wr", SSI + DMACR, 1]]
    ops = dma + read(words) + [["tick", FIRST + PER * words + 50], ["sram", 0x20000000, words + 1]]
    ops += [["flash", OFFSET + 4 * i] for i in range(words)]
    d = run(ops)
    assert d["moved"] == [[FIRST + PER * k, 1] for k in range(words)]
    assert d["out"][:words] == d["out"][words + 1:] and d["out"][words] == 0   # in order, nothing past
    assert d["counters"] == dict(ssi_words=words, ssi_cycles=(12 + words * 8) * 2 + 3, ssi_overruns=0,
                                 ssi_underruns=0)
    assert d["warnings"] == []
