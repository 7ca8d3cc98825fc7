// The RP2040's execute-in-place path, for host/emu/harness.mjs: the XIP cache, the XIP_CTRL
// registers, and what a cache miss costs on the QSPI bus at the SSI settings the firmware wrote.
// rp2040js reads the flash array directly, so without this a flash read costs what an SRAM read
// costs; with it every core read of the XIP window (instruction fetches included) is looked up
// here and a miss stalls the core for the transfer.
//
// Sources:
//   [DS]   RP2040 Datasheet §2.6.3 "Flash" / §2.6.3.1 "XIP Cache": 16 kB, two-way set-associative,
//          1-cycle hit; the 24-bit flash address space mirrored at 0x10 (cacheable, allocating),
//          0x11 (cacheable, non-allocating: check for a hit, don't update the cache on a miss),
//          0x12 (non-cacheable, allocating: don't check for a hit, always update the cache),
//          0x13 (non-cacheable, non-allocating); CTRL.EN = 0 sends every access straight to the
//          flash; FLUSH clears the tags; CTR_HIT / CTR_ACC count hits and accesses (noncacheable
//          ones included), a write clears them. Register offsets and bits: the SDK's
//          hardware/regs/xip.h and ssi.h (generated from the datasheet's register lists).
//   [SSI]  Datasheet §4.10 SSI (DW_apb_ssi): SCK = clk_sys / BAUDR.SCKDV; CTRLR0.SPI_FRF the data
//          width (1/2/4 lines); SPI_CTRLR0: INST_L (0/4/8/16 instruction bits), ADDR_L (address +
//          mode bits / 4), WAIT_CYCLES (dummy clocks), TRANS_TYPE (instruction and address on 1
//          line or on SPI_FRF lines); RX_SAMPLE_DLY in clk_sys cycles.
//   [BOOT2] pico-sdk boot2_w25q080.S with boards/pico.h (PICO_FLASH_SPI_CLKDIV 2): quad I/O
//          continuous read (EBh once, then mode bits 0xA0 after each address, no instruction),
//          ADDR_L 8 (24 address + 8 mode bits), 4 dummy clocks, RX_SAMPLE_DLY 1.
//   [LINE] forums.raspberrypi.com (gmx, 2026-01-12): a miss moves one 8-byte (64-bit) line: address,
//          mode and dummy clocks, then 16 quad data clocks, times the clock divider.
//
// Miss cost (clk_sys cycles), from the registers the firmware wrote:
//   sck  = ceil(inst_bits / w_inst) + ceil(addr_bits / w_addr) + wait_cycles + 64 / w_data
//   miss = sck * SCKDV + RX_SAMPLE_DLY + BUS_CYCLES
// w_data = 1, 2 or 4 by SPI_FRF; w_inst, w_addr by TRANS_TYPE (standard SPI frames send an 8-bit
// command and 24 address bits on one line, no dummy clocks). The Pico's boot2 setting gives
// sck = 0 + 8 + 4 + 16 = 28, so 28 * 2 + 1 + 2 = 59 cycles = 472 ns at 125 MHz, 16.9 MB/s when
// every 8 bytes miss. Assumed where the sources are silent: a non-cacheable access moves a whole
// line too; the replacement is LRU within a set; BUS_CYCLES = 2 [EST] is one clk_sys for the bus
// request into the XIP block and one for the data's return. A write to the XIP window (the
// firmware makes none) is not modelled, nor the streaming FIFO or cache-as-SRAM at 0x15000000.
// The SSI's direct-mode reads the DMA carries to SRAM are ssidirect.mjs's: they hold this bus, and
// any read of the window while one runs, hit or miss, is reported (onBadTransfer's second
// argument): the SSI is not in XIP mode, and the firmware's rule is that nothing then runs from
// flash (a hit would be served on a chip; a miss would not).
//
// Two cores (cores.mjs): [DS] §2.6.3 (figure "Flash execute-in-place (XIP) subsystem"): system
// accesses reach the XIP block through its one main AHB-Lite slave, and a miss holds that
// transfer (its wait states) until the SSI returns the line; §2.1 "Bus fabric": the crossbar gives
// a slave to one master at a time. So both cores share this one cache and one QSPI bus: an access,
// hit or miss, that finds the bus holding the other core's line transfer waits for it to end (a
// miss then waits for its own transfer after it); these waits are bus_wait_cycles.
// Each read names the time it is made (the core's cycle count): busFree is when the bus is free.
export const LINE_BYTES = 8;
export const WAYS = 2;
export const SETS = 16384 / (LINE_BYTES * WAYS);   // 1024
export const BUS_CYCLES = 2;
export const XIP_CTRL_BASE = 0x14000000;

// SSI register offsets (rp2040js's RPSSI keeps their values in these fields)
const SSI_FIELDS = { 0x00: 'crtlr0', 0x08: 'ssienr', 0x14: 'baudr', 0xf0: 'rxsampldly', 0xf4: 'spictlr0' };

/** The QSPI transfer of one cache line in clk_sys cycles, from the SSI's register values; an
 *  object {cycles, sck, sckdv, why}: why names what makes the setting unusable (cycles is then 0). */
export function lineTransfer({ baudr, crtlr0, spictlr0, rxsampldly, ssienr }) {
  const sckdv = baudr & 0xffff;
  const frf = (crtlr0 >>> 21) & 3;
  const none = (why) => ({ cycles: 0, sck: 0, sckdv, why });
  if (!(ssienr & 1)) return none('the SSI is disabled (SSIENR = 0)');
  if (sckdv === 0) return none('the SSI clock is stopped (BAUDR.SCKDV = 0)');
  if (frf === 3) return none('CTRLR0.SPI_FRF is the reserved value 3');
  const w = [1, 2, 4][frf];
  let sck;
  if (frf === 0) {
    sck = 8 + 24 + LINE_BYTES * 8;           // 03h-style read: command and address on one line
  } else {
    const trans = spictlr0 & 3;
    const inst = [0, 4, 8, 16][(spictlr0 >>> 8) & 3];
    const addr = ((spictlr0 >>> 2) & 0xf) * 4;
    const wait = (spictlr0 >>> 11) & 0x1f;
    const wInst = trans === 2 ? w : 1;
    const wAddr = trans === 0 ? 1 : w;
    sck = Math.ceil(inst / wInst) + Math.ceil(addr / wAddr) + wait + LINE_BYTES * 8 / w;
  }
  return { cycles: sck * sckdv + (rxsampldly & 0xff) + BUS_CYCLES, sck, sckdv, why: null };
}

/** The XIP cache: 1024 sets of two 8-byte lines, tags over the 24-bit flash address. */
export class XipCache {
  constructor() {
    this.tags = new Int32Array(SETS * WAYS).fill(-1);
    this.victim = new Uint8Array(SETS);      // per set: the way a fill replaces (the LRU one)
    this.enabled = true;                     // XIP_CTRL.EN (setEnabled)
    this.missCycles = 0;                     // the current line transfer (lineTransfer); 0: none possible
    this.hits = 0;                           // CTR_HIT; CTR_ACC (every access) = hits + misses
    this.misses = 0;                         // transfers from the flash
    this.fetchMisses = 0;                    // of them, instruction fetches
    this.stall = 0;                          // clk_sys cycles the transfers took (misses x missCycles)
    this.busWait = 0;                        // cycles a core waited for the other core's transfer
    this.onBadTransfer = () => {};           // a transfer while the SSI cannot make one
    this.directUntil = 0;                    // the cycle a direct read (ssidirect.mjs) frees the bus
    this.busFree = 0;                        // the cycle the QSPI bus ends its last transfer
    // Per core: the line its last instruction fetch hit or filled (addr >>> 3, alias bits
    // included) and its tag slot: straight-line code reads it again and again (read skips the lookup).
    this.fetchKey = new Int32Array([-1, -1]);
    this.fetchSlot = new Int32Array(2);
  }

  flush() {
    this.tags.fill(-1);
    this.fetchKey.fill(-1);
  }

  setEnabled(on) {
    this.enabled = on;
    this.fetchKey.fill(-1);
  }

  /** Core k's read of size bytes at addr (in the XIP window) at cycle now: each 8-byte line it
   *  touches is one access; returns the cycles the core stalls. A read of the line the core's last
   *  instruction fetch found skips the lookup (the common case: straight-line code, literal pools
   *  beside it). Without now (one core) the bus is free whenever the core asks. */
  read(addr, size, fetch, now = this.busFree, k = 0) {
    if (now < this.directUntil) this.onBadTransfer(addr, true);
    if ((addr >>> 3) === this.fetchKey[k] && (addr & 7) + size <= 8) {
      this.hits++;
      this.victim[this.fetchSlot[k] >>> 1] = (this.fetchSlot[k] & 1) ^ 1;
      return this.wait(now);
    }
    const s = this.access(addr, fetch, now, k);
    return (addr & 7) + size > 8 ? s + this.access(addr + size - 1, fetch, now + s, k) : s;
  }

  /** A hit at cycle now: it waits only while the other core's transfer holds the bus. */
  wait(now) {
    if (now >= this.busFree) return 0;
    const s = this.busFree - now;
    this.busWait += s;
    return s;
  }

  /** One access of the line holding addr (an XIP-window address); returns the stall cycles. */
  access(addr, fetch, now, k) {
    const line = (addr & 0xffffff) >>> 3;
    const seg = (addr >>> 24) & 3;           // 0x10.. 0x11.. 0x12.. 0x13..
    if (this.enabled) {
      const set = line & (SETS - 1);
      const tag = line >>> 10;               // log2(SETS)
      const i = set << 1;
      const tags = this.tags;
      if (seg < 2) {                         // cacheable: a hit costs nothing
        let hit = -1;
        if (tags[i] === tag) hit = i;
        else if (tags[i + 1] === tag) hit = i + 1;
        if (hit >= 0) {
          this.victim[set] = (hit & 1) ^ 1;
          this.hits++;
          if (fetch) { this.fetchKey[k] = addr >>> 3; this.fetchSlot[k] = hit; }
          return this.wait(now);
        }
        if (seg === 0) {
          const slot = this.fill(set, tag);
          if (fetch) { this.fetchKey[k] = addr >>> 3; this.fetchSlot[k] = slot; }
        }
      } else if (seg === 2) {                // non-cacheable, allocating: refresh or fill
        if (tags[i] === tag) this.victim[set] = 1;
        else if (tags[i + 1] === tag) this.victim[set] = 0;
        else this.fill(set, tag);
      }
    }
    this.misses++;
    if (fetch) this.fetchMisses++;
    if (this.missCycles <= 0) this.onBadTransfer(addr, false);
    const queued = now < this.busFree ? this.busFree - now : 0;
    this.busWait += queued;
    this.stall += this.missCycles;
    this.busFree = now + queued + this.missCycles;
    return queued + this.missCycles;
  }

  fill(set, tag) {
    const w = this.victim[set];
    const slot = (set << 1) + w;
    this.tags[slot] = tag;
    this.victim[set] = w ^ 1;
    if (slot === this.fetchSlot[0]) this.fetchKey[0] = -1;
    if (slot === this.fetchSlot[1]) this.fetchKey[1] = -1;
    return slot;
  }

  counters() {
    return { hits: this.hits, misses: this.misses, fetch_misses: this.fetchMisses, stall_cycles: this.stall,
             bus_wait_cycles: this.busWait };
  }
}

/** XIP_CTRL at 0x14000000 as an rp2040js peripheral: CTRL, FLUSH, STAT, CTR_HIT, CTR_ACC. */
export class XipCtrl {
  constructor(cache, warn) {
    this.cache = cache;
    this.ctrl = 0x3;                         // EN | ERR_BADWRITE (reset value)
    this.ctrHitBase = 0;                     // the counters read as totals since the last clear
    this.ctrAccBase = 0;
    this.warn = warn;
  }

  readUint32(offset) {
    const c = this.cache;
    switch (offset) {
      case 0x00: return this.ctrl;
      case 0x04: return 0;                   // FLUSH: the flush is immediate here
      case 0x08: return 0x3;                 // STAT: FIFO_EMPTY | FLUSH_READY
      case 0x0c: return Math.min(c.hits - this.ctrHitBase, 0xffffffff) >>> 0;
      case 0x10: return Math.min(c.hits + c.misses - this.ctrAccBase, 0xffffffff) >>> 0;
      default:
        this.warn(`XIP_CTRL read of 0x${offset.toString(16)} (the streaming FIFO is not modelled)`);
        return 0;
    }
  }

  writeUint32Atomic(offset, value, atomicType) {
    const old = offset === 0x00 ? this.ctrl : 0;
    const v = [value, old ^ value, old | value, old & ~value][atomicType] >>> 0;
    const c = this.cache;
    switch (offset) {
      case 0x00:
        this.ctrl = v & 0xb;
        if (this.ctrl & 0x8) this.ctrl &= ~1;        // POWER_DOWN forces EN off
        c.setEnabled((this.ctrl & 1) === 1);
        return;
      case 0x04: if (v & 1) c.flush(); return;
      case 0x0c: this.ctrHitBase = c.hits; return;
      case 0x10: this.ctrAccBase = c.hits + c.misses; return;
      default:
        this.warn(`XIP_CTRL write of 0x${v.toString(16)} to 0x${offset.toString(16)} ignored`);
    }
  }
}

/** Keeps cache.missCycles equal to the line transfer at the SSI's current register values:
 *  wraps the rp2040js SSI's register writes; onChange(setting) hears of each new usable setting.
 *  Returns a function giving the current setting. */
export function followSsi(ssi, cache, onChange) {
  let setting = lineTransfer(ssi);
  let usable = setting;
  cache.missCycles = setting.cycles;
  const write = ssi.writeUint32.bind(ssi);
  ssi.writeUint32 = (offset, value) => {
    write(offset, value);
    if (!(offset in SSI_FIELDS)) return;
    setting = lineTransfer(ssi);
    cache.missCycles = setting.cycles;
    if (!setting.why && (setting.cycles !== usable.cycles || setting.sck !== usable.sck)) {
      usable = setting;
      onChange(setting);
    }
  };
  return () => setting;
}

/** A setting in words, for the harness's log. */
export function describe(s) {
  return s.why || `${s.cycles} cycles a line (${s.sck} SCK clocks at SCKDV ${s.sckdv})`;
}

/** What boot2_w25q080 leaves in the SSI on a Pico [BOOT2]: the state the harness starts the
 *  core in (it stands in for the boot ROM and boot2); the firmware's HAL then writes its own. */
export function picoBoot2(ssi) {
  ssi.baudr = 2;
  ssi.rxsampldly = 1;
  ssi.crtlr0 = (2 << 21) | (31 << 16) | (3 << 8);             // quad, 32-bit frames, EEPROM read
  ssi.spictlr0 = (0xa0 << 24) | (4 << 11) | (0 << 8) | (8 << 2) | 2;   // mode A0, 4 dummy, 2C2A
  ssi.ssienr = 1;
}
