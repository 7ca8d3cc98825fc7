// The RP2040's SSI in direct mode, for host/emu/harness.mjs: the firmware takes the SSI out of
// XIP mode and runs its own read, whose words the DMA carries from DR0 into SRAM. rp2040js's SSI
// keeps the registers and answers nothing (a stub for boot2); this adds the read itself, on the
// same QSPI bus xip.mjs's cache misses use.
//
// Sources:
//   [SSI]  RP2040 Datasheet §4.10 SSI (DW_apb_ssi): CTRLR0.TMOD = 3 (EEPROM read: the data frames
//          follow what the TX FIFO holds, no data is sent), CTRLR0.DFS_32 + 1 bits a frame,
//          CTRLR0.SPI_FRF the data lines; CTRLR1.NDF + 1 frames a read; SPI_CTRLR0 INST_L (0: no
//          instruction, the continuous-read case), ADDR_L, WAIT_CYCLES, TRANS_TYPE; the read
//          starts once the instruction (if INST_L) and the address are in the TX FIFO written
//          through DR0; 16-entry RX FIFO; DMACR.RDMAE with DMARDLR: the RX request is raised
//          while the RX FIFO holds more than DMARDLR words; SSIENR = 0 clears the FIFOs and ends a
//          read; SR.RFNE / TFE / BUSY, RXFLR, TXFLR. Offsets: the SDK's hardware/regs/ssi.h.
//   [DS]   §2.6.3 "Flash": the SSI sits behind the XIP block, one QSPI bus for the cache's line
//          fills and the firmware's direct reads; §2.5.3.1 the DMA's DREQ 39 = XIP_SSIRX.
//   [BOOT2] boot2_w25q080.S: in continuous-read mode the address word is (address << 8) | mode
//          bits (ADDR_L 8 = 32 bits: 24 address + 8 mode), INST_L 0.
//
// Timing, clk_sys cycles, from the registers at the start (xip.mjs's lineTransfer's terms):
//   header = ceil(inst_bits / w_inst) + ceil(addr_bits / w_addr) + wait_cycles   (SCK clocks)
//   word i arrives at start + (header + (i + 1) * frame_bits / w_data) * SCKDV + RX_SAMPLE_DLY + BUS_CYCLES
// start is when the bus is free (after a line fill under way). The Pico's boot2 setting at
// SCKDV 2: 1 KB (256 words) arrives (12 + 256 * 8) * 2 + 1 + 2 = 4,123 cycles after the address
// (31 MB/s at 125 MHz). Every word counts as a flash read (onWord), the cache is not used; a line
// fill asked for while the read holds the bus is a firmware error (the SSI is not in XIP mode):
// the cache reports it through its onBadTransfer. Assumed where the sources are silent: a word
// arriving at a full RX FIFO is lost (an overrun, counted; a DMA paced by the RX request never
// lets it happen at these rates); a read of DR0 with the FIFO empty returns 0 (an underrun, counted).
import { BUS_CYCLES } from './xip.mjs';

export const DREQ_XIP_SSIRX = 39;
export const RX_FIFO_WORDS = 16;
const DR0 = 0x60, SR = 0x28, TXFLR = 0x20, RXFLR = 0x24, SSIENR = 0x08, DMACR = 0x4c, DMARDLR = 0x54;
const SR_BUSY = 1, SR_TFNF = 2, SR_TFE = 4, SR_RFNE = 8;

/** The header (SCK clocks), the data lines and the frame size a direct read would use at these
 *  register values; why names what the model does not run (a read is then refused). */
export function directShape({ crtlr0, spictlr0 }) {
  const frf = (crtlr0 >>> 21) & 3;
  const tmod = (crtlr0 >>> 8) & 3;
  const frameBits = ((crtlr0 >>> 16) & 0x1f) + 1;
  if (tmod !== 3) return { why: `CTRLR0.TMOD ${tmod} (only the EEPROM read, 3, is modelled)` };
  if (frf === 0 || frf === 3) return { why: `CTRLR0.SPI_FRF ${frf} (only dual and quad reads are modelled)` };
  if (frameBits !== 32) return { why: `CTRLR0.DFS_32 gives ${frameBits}-bit frames (only 32 are modelled)` };
  const w = [1, 2, 4][frf];
  const trans = spictlr0 & 3;
  const instBits = [0, 4, 8, 16][(spictlr0 >>> 8) & 3];
  const addrBits = ((spictlr0 >>> 2) & 0xf) * 4;
  const wait = (spictlr0 >>> 11) & 0x1f;
  const header = Math.ceil(instBits / (trans === 2 ? w : 1)) + Math.ceil(addrBits / (trans === 0 ? 1 : w)) + wait;
  return { why: null, header, frameSck: frameBits / w, instWords: instBits ? 1 : 0, addrBits };
}

/** Direct-mode reads on rp2040js's SSI (ssi): takes over DR0, SR, TXFLR, RXFLR, SSIENR, DMACR
 *  and DMARDLR, leaves the rest to it. now() is the cycle of an access; readFlash(offset) a word
 *  of the flash image; the cache (xip.mjs) is the bus the read shares. */
export class SsiDirect {
  constructor(ssi, cache, now, readFlash, warn) {
    this.ssi = ssi;
    this.cache = cache;
    this.now = now;
    this.readFlash = readFlash;
    this.warn = warn;
    this.tx = [];                 // words written to DR0 that no read has taken yet
    this.rx = [];                 // words arrived, not yet read from DR0
    this.read = null;             // the read under way: {start, offset, frames, next, first, per}
    this.dmacr = 0;
    this.dmardlr = 0;
    this.words = 0;               // words moved from the flash
    this.cycles = 0;              // bus cycles the reads held
    this.overruns = 0;
    this.underruns = 0;
    this.onWord = () => {};       // hears each word's flash offset as it arrives (the byte counts)
    this.dreq = () => {};         // the RX request to the DMA (connectDma)
    const read = ssi.readUint32.bind(ssi);
    const write = ssi.writeUint32.bind(ssi);
    ssi.readUint32 = (offset) => this.readReg(offset, read);
    ssi.writeUint32 = (offset, value) => this.writeReg(offset, value >>> 0, write);
  }

  /** A read under way or words waiting in the RX FIFO. */
  get busy() {
    return this.read !== null || this.rx.length > 0;
  }

  /** The clock reached cycle now: the words arrived by then go into the RX FIFO. */
  poll(now) {
    const r = this.read;
    if (r) {
      while (r.next < r.frames && r.first + r.next * r.per <= now) {
        const off = (r.offset + 4 * r.next) & 0xffffff;
        if (this.rx.length < RX_FIFO_WORDS) this.rx.push(this.readFlash(off));
        else if (!this.overruns++) this.warn('SSI RX FIFO overrun: a direct read\'s word was lost');
        this.onWord(off);
        this.words++;
        r.next++;
      }
      if (r.next === r.frames) this.read = null;
    }
    this.request();
  }

  request() {
    this.dreq((this.dmacr & 1) === 1 && this.rx.length > this.dmardlr);
  }

  readReg(offset, read) {
    switch (offset) {
      case DR0: {
        this.poll(this.now());
        if (!this.rx.length) { this.underruns++; return 0; }
        const v = this.rx.shift();
        this.request();
        return v;
      }
      case SR:
        this.poll(this.now());
        return SR_TFNF | (this.tx.length ? 0 : SR_TFE) | (this.rx.length ? SR_RFNE : 0) | (this.read ? SR_BUSY : 0);
      case TXFLR: return this.tx.length;
      case RXFLR: this.poll(this.now()); return this.rx.length;
      case DMACR: return this.dmacr;
      case DMARDLR: return this.dmardlr;
      default: return read(offset);
    }
  }

  writeReg(offset, value, write) {
    switch (offset) {
      case DR0:
        this.tx.push(value);
        this.begin();
        return;
      case DMACR: this.dmacr = value & 3; this.request(); return;
      case DMARDLR: this.dmardlr = value & 0xff; this.request(); return;
      case SSIENR:
        write(offset, value);
        if (!(value & 1)) {           // disabling ends the read and clears both FIFOs
          this.read = null;
          this.tx = [];
          this.rx = [];
          this.request();
        }
        return;
      default: write(offset, value);
    }
  }

  /** Starts a read once the TX FIFO holds its instruction and address. */
  begin() {
    const ssi = this.ssi;
    const shape = directShape(ssi);
    if (!(ssi.ssienr & 1)) { this.tx = []; this.warn('SSI DR0 written while SSIENR = 0: ignored'); return; }
    if (shape.why) { this.tx = []; this.warn(`SSI direct read refused: ${shape.why}`); return; }
    if (this.tx.length < shape.instWords + 1 || this.read) return;
    const addr = this.tx[shape.instWords] >>> 0;
    this.tx = [];
    const sckdv = ssi.baudr & 0xffff;
    if (!sckdv) { this.warn('SSI direct read refused: BAUDR.SCKDV = 0'); return; }
    const frames = (ssi.crtlr1 & 0xffff) + 1;
    const now = this.now();
    const c = this.cache;
    const start = Math.max(now, c.busFree);
    const per = shape.frameSck * sckdv;
    const total = (shape.header + frames * shape.frameSck) * sckdv + (ssi.rxsampldly & 0xff) + BUS_CYCLES;
    c.busFree = start + total;        // line fills wait, and one asked for meanwhile is a fault
    c.directUntil = start + total;
    this.cycles += total;
    this.read = { offset: shape.addrBits > 24 ? addr >>> (shape.addrBits - 24) : addr & 0xffffff, frames,
                  next: 0, per, first: start + shape.header * sckdv + per + (ssi.rxsampldly & 0xff) + BUS_CYCLES };
  }

  counters() {
    return { ssi_words: this.words, ssi_cycles: this.cycles, ssi_overruns: this.overruns, ssi_underruns: this.underruns };
  }
}

/** The RX request to rp2040js's DMA (DREQ_XIP_SSIRX): a channel paced by it moves a word while
 *  the RX FIFO holds more than DMARDLR; rp2040js runs the transfer on the clock's next tick. */
export function connectDma(direct, dma) {
  direct.dreq = (on) => (on ? dma.setDREQ(DREQ_XIP_SSIRX) : dma.clearDREQ(DREQ_XIP_SSIRX));
}
