// flashlm's emulated RP2040: runs a firmware image in rp2040js with UART0 on stdin/stdout.
//
//   node harness.mjs --firmware firmware.bin --blob model.flmb --blob-offset 0x10000
//                    [--flash-size 2097152] [--counts FILE] [--xip-model on|off]
//                    [--profile NAME=ADDR[,NAME=ADDR...]] [--watch LO-HI[,LO-HI...]]
//
// stdin/stdout are the UART0 byte stream (host/boards/emulated.py passes the master side of a raw pty);
// everything else (warnings, faults) goes to stderr. The firmware image is loaded at the start
// of the XIP flash window (0x10000000) and the weights blob at --blob-offset in it; the core
// then starts as the boot ROM would after the Pico's boot2: VTOR = 0x10000100, SP and PC from
// that table, the SSI in quad continuous-read mode at SCKDV 2 (xip.mjs picoBoot2).
//
// Two cores (cores.mjs): core 1 waits in the "boot ROM" until core 0 launches it with the FIFO
// handshake; then the harness runs whichever core is behind in cycles, one instruction at a time,
// so the two stay within an instruction of each other, and a core asleep in WFE is skipped until
// the other's SEV wakes it. Both cores' reads go through the one XIP cache and QSPI bus (their
// misses queue) and are counted in the step's bytes; the call profile follows core 0 only.
//
// Time: every instruction advances the emulated clock by its rp2040js cycle count at the
// current clk_sys (with two cores running, the clock follows the one ahead), so the TIMER the
// firmware reads is cycle-based. With --xip-model on (the
// default) every core read of the XIP window, instruction fetches included, goes through a model
// of the XIP cache (xip.mjs: 16 KB, 2-way, 8-byte lines, the four address aliases, XIP_CTRL's
// enable, flush and counters); a miss stalls the core for the QSPI transfer of one line at the SSI
// settings the firmware wrote, and those stall cycles advance the clock and the cycle count like
// any other. With --xip-model off a flash read costs what an SRAM read costs (rp2040js as is).
// The SSI's direct-mode reads (ssidirect.mjs: the firmware's own quad read, its words carried by
// the DMA on DREQ_XIP_SSIRX) run with the model on or off at the rate the SSI's registers give;
// they hold the QSPI bus (a line fill asked for meanwhile is a fault) and their words count as
// flash bytes read.
//
// Read attribution: the firmware marks each forward step through the watchdog scratch registers
// (firmware/hal/rp2040/hal_rp2040.h). Between BEGIN and END the harness counts the bytes of
// every core read (loads, LDM/POP words) by region: the blob's part of the XIP window is tier 0
// (flash), the regions the firmware names (the KV cache, tensors staged into RAM) their tier.
// One JSON line per step goes to --counts:
//   {"gen": g, "step": s, "bytes": [flash, psram, sram], "cycles": c, "us": emulated µs,
//    "wall_ms": host ms, "xip": {"hits", "misses", "fetch_misses", "stall_cycles", "bus_wait_cycles",
//    "miss_cycles"}}
// With a streamed product in the step (ssidirect.mjs) the line also holds "ssi": {"words", "cycles",
// "overruns", "underruns"}: the words direct reads moved (4 flash bytes each, in bytes[0]), the bus
// cycles those reads held, and the RX FIFO's lost words and empty reads (0 in a correct firmware).
// ("xip" only with the model on: the step's cache hits, line transfers, those of them that were
// instruction fetches, the cycles the transfers took (each stalls the core that asked), the cycles
// a core waited for the QSPI bus while it moved the other core's line, and the cycles one transfer
// costs). "cycles" are core 0's, which waits for core 1 at the end of each shared product.
// With --watch (flash offsets [LO, HI) of some of the blob's tensors: a mixture of experts' FFN) the
// line also holds "watched": the bytes of those flash reads that fell in the ranges (part of bytes[0]).
//
// Call profile: with --profile (function names and entry addresses, from the ELF's symbols, in flash or in SRAM) each
// step's line also holds "calls": {NAME: [cycles, calls]}: the emulated cycles spent inside the
// step's calls of each function, everything they ran included (callees, interrupts, flash
// stalls). A call starts when the PC reaches the entry and ends when it reaches the return address
// the LR held there with the SP back where it was; a function already running is not entered again
// (recursion, a loop back to its first instruction). The cycles are the same with or without it.
import fs from 'node:fs';
import { performance } from 'node:perf_hooks';
import { RP2040 } from 'rp2040js';
import { DualCore } from './cores.mjs';
import { XIP_CTRL_BASE, XipCache, XipCtrl, describe, followSsi, picoBoot2 } from './xip.mjs';
import { SsiDirect, connectDma } from './ssidirect.mjs';
import { UartPort } from './uart.mjs';

console.log = console.error;   // stdout is the UART: nothing else may ever write there

const MARK_BEGIN = 0xf1a5b001;
const MARK_END = 0xf1a5e0d0;
const MARK_REGION = 0xf1a5ae60;
const MARK_FAULT = 0xf1a5dead;
const WD_SCRATCH3 = 0x18;
const FLASH_BASE = 0x10000000;
const SRAM_BASE = 0x20000000, SRAM_BYTES = 264 * 1024;
const VECTORS = FLASH_BASE + 0x100;

function parseArgs(argv) {
  const a = { flashSize: 2 * 1024 * 1024, counts: null, xipModel: true, profile: new Map(), watch: [] };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const v = argv[i + 1];
    if (k === '--firmware') a.firmware = v;
    else if (k === '--blob') a.blob = v;
    else if (k === '--blob-offset') a.blobOffset = Number(v);
    else if (k === '--flash-size') a.flashSize = Number(v);
    else if (k === '--counts') a.counts = v;
    else if (k === '--xip-model') {
      if (v !== 'on' && v !== 'off') die(`--xip-model takes on or off, not ${v}`, 2);
      a.xipModel = v === 'on';
    } else if (k === '--profile') {
      for (const item of (v || '').split(',')) {
        const m = /^([A-Za-z_][\w.]*)=(0x[0-9a-fA-F]+|\d+)$/.exec(item);
        if (!m) die(`--profile takes NAME=ADDR[,NAME=ADDR...], not ${item}`, 2);
        a.profile.set(Number(m[2]) & ~1, m[1]);   // a Thumb function's address has bit 0 set
      }
    } else if (k === '--watch') {
      for (const item of (v || '').split(',')) {
        const m = /^(0x[0-9a-fA-F]+|\d+)-(0x[0-9a-fA-F]+|\d+)$/.exec(item);
        if (!m || Number(m[1]) >= Number(m[2])) die(`--watch takes LO-HI[,LO-HI...] (flash offsets), not ${item}`, 2);
        a.watch.push([Number(m[1]), Number(m[2])]);
      }
    } else die(`unknown argument ${k}`, 2);
    i++;
  }
  if (!a.firmware || !a.blob || !Number.isInteger(a.blobOffset)) {
    die('usage: harness.mjs --firmware BIN --blob BLOB --blob-offset N [--flash-size N] [--counts FILE] '
        + '[--xip-model on|off] [--profile NAME=ADDR,...] [--watch LO-HI,...]', 2);
  }
  return a;
}

function die(msg, code = 1) {
  process.stderr.write(`rp2040-emu: ${msg}\n`);
  process.exit(code);
}

const args = parseArgs(process.argv.slice(2));
let firmware, blob;
try {
  firmware = fs.readFileSync(args.firmware);
  blob = fs.readFileSync(args.blob);
} catch (e) {
  die(`cannot read ${e.path}: ${e.code || e.message}`);
}
if (firmware.length > args.blobOffset) {
  die(`firmware image is ${firmware.length} bytes, more than the blob offset ${args.blobOffset}`);
}
if (args.blobOffset + blob.length > args.flashSize) {
  die(`model image of ${blob.length} bytes does not fit the ${args.flashSize}-byte flash at offset ${args.blobOffset}`);
}

const mcu = new RP2040();
let dual = null;
mcu.logger = {
  debug() {},
  info(component, msg) { if (msg === 'SEV') dual.sev(); },   // rp2040js's SEV only logs (cores.mjs)
  warn(component, msg) { process.stderr.write(`rp2040js ${component}: ${msg}\n`); },
  error(component, msg) { process.stderr.write(`rp2040js ${component} error: ${msg}\n`); },
};
mcu.flash.set(firmware, 0);
mcu.flash.set(blob, args.blobOffset);
dual = new DualCore(mcu);
const core = mcu.core;
const core1 = dual.cores[1];
const clock = mcu.clock;
core.VTOR = VECTORS;
core.SP = mcu.readUint32(VECTORS);
core.PC = mcu.readUint32(VECTORS + 4) & ~1;

// ---- the XIP path (xip.mjs) --------------------------------------------------------------
const cache = new XipCache();
const ssi = mcu.peripherals[0x18000];
mcu.peripherals[XIP_CTRL_BASE >>> 14 << 2] = new XipCtrl(cache, (msg) => process.stderr.write(`rp2040-emu: ${msg}\n`));
picoBoot2(ssi);
// The SSI's direct-mode reads (ssidirect.mjs), with or without the XIP model: a DR0 write is at the
// writing core's cycle, the DMA's DR0 reads at the clock's (they run in clock.tick).
let ticking = false;
const direct = new SsiDirect(ssi, cache,
  () => (ticking ? now : dual.current === 0 ? core.cycles + stall : core1.cycles + stall1),
  (off) => (off + 3 < mcu.flash.length ? mcu.flashView.getUint32(off, true) : 0xffffffff),
  (msg) => process.stderr.write(`rp2040-emu: ${msg}\n`));
connectDma(direct, mcu.dma);
direct.onWord = (off) => { if (step) countFlash(off, 4); };
const xipSetting = followSsi(ssi, cache, (s) => {   // the firmware changed what a miss costs
  if (args.xipModel) process.stderr.write(`rp2040-emu: XIP line transfer now ${describe(s)}\n`);
});
let stall = 0;        // cycles core 0's current instruction waits for the flash
let stall1 = 0;       // and core 1's
let fault = null;
cache.onBadTransfer = (addr, directRead) => {
  const pc = dual.cores[dual.current].PC;
  fault = fault || `XIP read of 0x${(addr >>> 0).toString(16)} at pc 0x${pc.toString(16)} on core ${dual.current} `
    + `while ${directRead ? 'the SSI runs a direct read (not in XIP mode)' : xipSetting().why}`;
};

// ---- UART0 <-> stdin/stdout -------------------------------------------------------------
const port = new UartPort(mcu.uart[0], {
  onInput: () => { if (idle) schedule(); },
  onEnd: () => shutdown(null, 0),
  onError: (msg, code) => shutdown(msg, code),
});

// ---- step marks and read counting ---------------------------------------------------------
const countsFd = args.counts ? fs.openSync(args.counts, 'a') : null;
const blobLo = args.blobOffset;
const blobHi = args.blobOffset + blob.length;
let pendingRegions = [];
let regions = [];
const bytes = [0, 0, 0];
const watch = args.watch;
let watched = 0;
let gen = -1;
let step = null;

// A flash read of size bytes at offset off: the blob's count tier 0 (a direct read's words too).
function countFlash(off, size) {
  if (off >= blobLo && off < blobHi) {
    bytes[0] += size;
    for (let i = 0; i < watch.length; i++) if (off >= watch[i][0] && off < watch[i][1]) { watched += size; break; }
  }
}

function countRead(addr, size) {
  if (addr >= FLASH_BASE && addr < 0x14000000) {   // the XIP window and its aliases
    countFlash(addr & 0xffffff, size);
    return;
  }
  for (let i = 0; i < regions.length; i++) {
    const r = regions[i];
    if (addr >= r.lo && addr < r.hi) { bytes[r.tier] += size; return; }
  }
}

// Swapped in and out by assignment (never `delete`: that would turn a core into a slow
// dictionary-mode object for the rest of the run). With the XIP model, a read of the XIP window
// (addr >>> 26 === 4: 0x10000000-0x13ffffff, the four aliases) goes through the cache first, at the
// reading core's cycle count (its instruction's start plus the stalls so far); rp2040js fetches each
// 16-bit opcode with readUint16 at the PC (and PC + 2 for a 32-bit one) before it moves the PC on:
// those are the instruction fetches.
const xipRead16 = (a) => {
  const d = a - core.registers[15];
  stall += cache.read(a, 2, d === 0 || d === 2, core.cycles + stall, 0);
};
const xipRead16c1 = (a) => {
  const d = a - core1.registers[15];
  stall1 += cache.read(a, 2, d === 0 || d === 2, core1.cycles + stall1, 1);
};
const plain = args.xipModel ? {
  readUint32: (a) => { if ((a >>> 26) === 4) stall += cache.read(a, 4, false, core.cycles + stall, 0); return mcu.readUint32(a); },
  readUint16: (a) => { if ((a >>> 26) === 4) xipRead16(a); return mcu.readUint16(a); },
  readUint8: (a) => { if ((a >>> 26) === 4) stall += cache.read(a, 1, false, core.cycles + stall, 0); return mcu.readUint8(a); },
} : {
  readUint32: (a) => mcu.readUint32(a),
  readUint16: (a) => mcu.readUint16(a),
  readUint8: (a) => mcu.readUint8(a),
};
const counting = args.xipModel ? {
  readUint32: (a) => { countRead(a >>> 0, 4); if ((a >>> 26) === 4) stall += cache.read(a, 4, false, core.cycles + stall, 0); return mcu.readUint32(a); },
  readUint16: (a) => { countRead(a >>> 0, 2); if ((a >>> 26) === 4) xipRead16(a); return mcu.readUint16(a); },
  readUint8: (a) => { countRead(a >>> 0, 1); if ((a >>> 26) === 4) stall += cache.read(a, 1, false, core.cycles + stall, 0); return mcu.readUint8(a); },
} : {
  readUint32: (a) => { countRead(a >>> 0, 4); return mcu.readUint32(a); },
  readUint16: (a) => { countRead(a >>> 0, 2); return mcu.readUint16(a); },
  readUint8: (a) => { countRead(a >>> 0, 1); return mcu.readUint8(a); },
};
const plain1 = args.xipModel ? {
  readUint32: (a) => { if ((a >>> 26) === 4) stall1 += cache.read(a, 4, false, core1.cycles + stall1, 1); return mcu.readUint32(a); },
  readUint16: (a) => { if ((a >>> 26) === 4) xipRead16c1(a); return mcu.readUint16(a); },
  readUint8: (a) => { if ((a >>> 26) === 4) stall1 += cache.read(a, 1, false, core1.cycles + stall1, 1); return mcu.readUint8(a); },
} : plain;
const counting1 = args.xipModel ? {
  readUint32: (a) => { countRead(a >>> 0, 4); if ((a >>> 26) === 4) stall1 += cache.read(a, 4, false, core1.cycles + stall1, 1); return mcu.readUint32(a); },
  readUint16: (a) => { countRead(a >>> 0, 2); if ((a >>> 26) === 4) xipRead16c1(a); return mcu.readUint16(a); },
  readUint8: (a) => { countRead(a >>> 0, 1); if ((a >>> 26) === 4) stall1 += cache.read(a, 1, false, core1.cycles + stall1, 1); return mcu.readUint8(a); },
} : counting;
function use(fns, fns1) {
  core.readUint32 = fns.readUint32;
  core.readUint16 = fns.readUint16;
  core.readUint8 = fns.readUint8;
  core1.readUint32 = fns1.readUint32;
  core1.readUint16 = fns1.readUint16;
  core1.readUint8 = fns1.readUint8;
}
use(plain, plain1);

const watchdog = mcu.peripherals[0x40058];
const wdWrite = watchdog.writeUint32.bind(watchdog);
watchdog.writeUint32 = (offset, value) => {
  wdWrite(offset, value);
  if (offset !== WD_SCRATCH3) return;
  const s = watchdog.scratchData;
  value >>>= 0;
  if (value === MARK_REGION) {
    pendingRegions.push({ lo: s[0] >>> 0, hi: s[1] >>> 0, tier: Math.min(s[2], 2) });
  } else if (value === MARK_BEGIN) {
    regions = pendingRegions;
    pendingRegions = [];
    if (s[2] === 0) gen++;
    // the marking instruction's own flash wait (``stall``, added to the cycles after it) is counted
    // in the XIP counters already: it belongs before the step, the END's to the step
    step = { gen, step: s[2] >>> 0, cycles: core.cycles + stall, nanos: clock.nanos, wall: performance.now(),
             xip: cache.counters(), ssi: direct.counters(), calls: profileSnapshot() };
    bytes[0] = bytes[1] = bytes[2] = 0;
    watched = 0;
    use(counting, counting1);
  } else if (value === MARK_END) {
    use(plain, plain1);
    if (step && countsFd !== null) {
      const rec = { gen: step.gen, step: step.step, bytes: bytes.slice(),
                    cycles: core.cycles + stall - step.cycles, us: (clock.nanos - step.nanos) / 1000,
                    wall_ms: performance.now() - step.wall };
      if (watch.length) rec.watched = watched;
      const ssiNow = direct.counters();
      if (ssiNow.ssi_words !== step.ssi.ssi_words) {
        rec.ssi = {};
        for (const k in ssiNow) rec.ssi[k.slice(4)] = ssiNow[k] - step.ssi[k];
      }
      if (args.xipModel) {
        const now = cache.counters();
        rec.xip = {};
        for (const k in now) rec.xip[k] = now[k] - step.xip[k];
        rec.xip.miss_cycles = cache.missCycles;
      }
      if (args.profile.size) {
        rec.calls = {};
        for (const [name, [c, n]] of Object.entries(profileSnapshot())) {
          rec.calls[name] = [c - step.calls[name][0], n - step.calls[name][1]];
        }
      }
      fs.writeSync(countsFd, JSON.stringify(rec) + '\n');
    }
    step = null;
  } else if (value === MARK_FAULT) {
    fault = `exception ${s[2]} at pc 0x${(s[1] >>> 0).toString(16)}`;
  }
};

// ---- the call profile (--profile) ----------------------------------------------------------
// The check runs before every instruction, so its common case (neither an entry nor the innermost
// call's return) is two comparisons: an entry table over the image's halfwords and that return.
const profNames = [...args.profile.values()];
const profTotals = profNames.map(() => [0, 0]);          // per function: cycles of finished calls, calls
const profRunning = new Uint8Array(profNames.length);
const profEntry = new Uint8Array((firmware.length >>> 1) + 1);   // (pc - FLASH_BASE) / 2 -> 1 + function
const profRam = new Map();      // entries of functions that run from SRAM (FLM_RAMFUNC): pc -> 1 + function
for (const [addr, name] of args.profile) {
  const i = (addr - FLASH_BASE) / 2;
  if (addr >= SRAM_BASE && addr < SRAM_BASE + SRAM_BYTES) profRam.set(addr, profNames.indexOf(name) + 1);
  else if (!(i >= 0 && i < profEntry.length)) die(`--profile: ${name} at 0x${addr.toString(16)} is not in the firmware image`, 2);
  else profEntry[i] = profNames.indexOf(name) + 1;
}
const profFrames = [];          // the calls under way, innermost last: {fn, ret, sp, start}
let profRet = -1;               // the innermost call's return address

// Before each instruction: end the calls that returned to where they were called from, start the
// one whose entry this is.
function profileAt() {
  const pc = core.PC;
  if (pc === profRet) {
    while (profFrames.length) {
      const f = profFrames[profFrames.length - 1];
      if (pc !== f.ret || core.SP !== f.sp) break;
      profFrames.pop();
      profRunning[f.fn] = 0;
      profTotals[f.fn][0] += core.cycles - f.start;
      profTotals[f.fn][1]++;
    }
    profRet = profFrames.length ? profFrames[profFrames.length - 1].ret : -1;
  }
  const e = pc >= SRAM_BASE ? profRam.get(pc) : profEntry[(pc - FLASH_BASE) >>> 1];   // undefined outside the image and the ROM
  if (e && !profRunning[e - 1]) {
    profFrames.push({ fn: e - 1, ret: core.LR & ~1, sp: core.SP, start: core.cycles });
    profRunning[e - 1] = 1;
    profRet = core.LR & ~1;
  }
}

// Every function's cycles so far (name -> [cycles, calls]), the calls under way up to now included.
function profileSnapshot() {
  const out = {};
  profNames.forEach((name, i) => { out[name] = [profTotals[i][0], profTotals[i][1]]; });
  for (const f of profFrames) out[profNames[f.fn]][0] += core.cycles + stall - f.start;
  return out;
}

// ---- the run loop ------------------------------------------------------------------------
let idle = false;
let scheduled = false;
const parentPid = process.ppid;

function schedule() {
  idle = false;
  if (!scheduled) { scheduled = true; setImmediate(run); }
}

// One instruction of core k; returns its cycles, its flash wait included.
function stepCore(k) {
  dual.current = k;
  if (k === 0) {
    let c = core.executeInstruction();
    if (stall) {          // the instruction waited for the flash: the core's cycles and the clock
      c += stall;
      core.cycles += stall;
      stall = 0;
    }
    return c;
  }
  let c = core1.executeInstruction();
  if (stall1) {
    c += stall1;
    core1.cycles += stall1;
    stall1 = 0;
  }
  return c;
}

let now = 0;   // the cycle the clock stands at: the cycle count of the core ahead

function run() {
  scheduled = false;
  if (exiting) return;
  const sliceEnd = performance.now() + 25;
  for (;;) {
    port.feed();
    if (core.waiting && (core1.waiting || !dual.launched)) {   // WFI / WFE with nothing pending
      if (port.hasInput()) continue;
      idle = true;
      break;
    }
    const ns = 1e9 / mcu.clkSys;
    let i = 0;
    const profiling = args.profile.size > 0;
    for (; i < 20000; i++) {
      // the core behind runs (core 0 on a tie); a core asleep waits for an event or an interrupt
      const k = core1.waiting || (!core.waiting && core.cycles <= core1.cycles) ? 0 : 1;
      if (k === 0 && core.waiting) break;
      if (profiling && k === 0) profileAt();
      stepCore(k);
      const t = k === 0 ? core.cycles : core1.cycles;
      if (t > now) {       // now moves first: the DMA's transfers in this tick happen at t
        const dt = t - now;
        now = t;
        if (direct.busy) direct.poll(now);
        ticking = true;
        clock.tick(dt * ns);
        ticking = false;
      }
    }
    if (fault) break;
    if (performance.now() > sliceEnd) break;
  }
  port.flush();
  if (fault) {
    shutdown(`firmware fault: ${fault}`, 3);
    return;
  }
  if (process.ppid !== parentPid) { shutdown(null, 0); return; }   // the host that started us is gone
  if (!idle) schedule();
}

// The output not yet written goes first, in order; a host that no longer reads gets 2 s.
let exiting = false;
function shutdown(msg, code) {
  if (exiting) return;
  exiting = true;
  if (msg) process.stderr.write(`rp2040-emu: ${msg}\n`);
  port.close(() => process.exit(code));
  setTimeout(() => process.exit(code), 2000);
}

process.stderr.write(`rp2040-emu: ready: firmware ${firmware.length} B, blob ${blob.length} B at flash offset `
                     + `0x${args.blobOffset.toString(16)}; XIP model `
                     + (args.xipModel ? `on: ${describe(xipSetting())}` : 'off: flash reads cost what SRAM reads cost')
                     + '\n');
process.on('SIGTERM', () => shutdown(null, 0));
process.on('SIGINT', () => {});   // Ctrl-C is the host's (it sends STOP); SIGTERM ends us
setInterval(() => { if (process.ppid !== parentPid) shutdown(null, 0); }, 1000).unref();
schedule();
