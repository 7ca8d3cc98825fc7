// The RP2040's second Cortex-M0+ for host/emu/harness.mjs: rp2040js 1.4.1 emulates core 0 only (its
// SIO answers CPUID 0 and has no inter-core FIFOs; SEV only logs). This file holds what makes a second
// core object on the same bus behave as core 1: each core's view of the SIO, the inter-core FIFOs, the
// events SEV sends, and the boot ROM's launch handshake. The harness interleaves the two cores.
//
// Sources:
//   [SIO]  RP2040 Datasheet §2.3.1 "SIO": one SIO, each core sees its own CPUID (0 / 1), its own
//          hardware divider and interpolators; the 32 spinlocks and the GPIO registers are shared.
//          §2.3.1.5 "Inter-processor FIFOs (Mailboxes)": two FIFOs, 32 bits wide and 8 deep, one per
//          direction; FIFO_ST (0x050): VLD (bit 0, this core's RX FIFO holds data), RDY (bit 1, its TX
//          FIFO has room), WOF (bit 2, sticky: a write to a full TX FIFO, which is ignored), ROE (bit
//          3, sticky: a read of an empty RX FIFO); writing FIFO_ST clears the sticky flags; FIFO_WR
//          (0x054) pushes, FIFO_RD (0x058) pops (0 and ROE when empty).
//   [LAUNCH] Datasheet §2.8.2 "Launching code on processor core 1": core 1 waits in the boot ROM
//          and reads the sequence 0, 0, 1, vector table, stack pointer, entry from its FIFO,
//          echoing every word back; a wrong word restarts the sequence; after the entry it sets
//          VTOR, SP and jumps to the entry.
//   [ARMv6-M] Architecture Reference Manual B1.5.18: SEV sets the event register of every core in
//          the system; WFE returns at once (clearing it) when it is set, else sleeps until an event.
//
// Not modelled: the FIFOs' interrupts (SIO_IRQ_PROC0/1), core 1's own NVIC and SysTick (the PPB the
// harness shows core 1 is core 0's), and the boot ROM's own run time (it answers within the push).

const FIFO_DEPTH = 8;
const CPUID = 0x000;
const FIFO_ST = 0x050;
const FIFO_WR = 0x054;
const FIFO_RD = 0x058;
const SIO_PER_CORE = (o) => (o >= 0x060 && o < 0x080) || (o >= 0x080 && o < 0x100);   // divider, interpolators
const LAUNCH = [0, 0, 1];       // then vector table, stack pointer, entry

/** Two cores on one bus: cores[0] is rp2040js's own, cores[1] a second CortexM0Core of the same mcu.
 *  `current` names the core whose instruction runs (the harness sets it); the SIO serves that core. */
export class DualCore {
  constructor(mcu) {
    this.mcu = mcu;
    const core1 = new mcu.core.constructor(mcu);
    this.cores = [mcu.core, core1];
    this.current = 0;
    this.launched = false;          // core 1 left the boot ROM
    this.rx = [[], []];             // rx[k]: the FIFO core k reads (the other core writes it)
    this.sticky = [0, 0];           // WOF / ROE per core
    this.launchWords = [];          // the handshake's words so far
    // core 1's divider and interpolators: another RPSIO whose core is core 1 (the divider charges
    // its 8 cycles to the core that asked); core 0 keeps rp2040js's own
    const view1 = Object.create(mcu, { core: { value: core1 } });
    this.sio = [mcu.sio, new mcu.sio.constructor(view1)];
    const shared = mcu.sio;
    const read = shared.readUint32.bind(shared);
    const write = shared.writeUint32.bind(shared);
    const sio = this.sio;
    // rp2040js sends every SIO access to mcu.sio: route it by the core that makes it
    shared.readUint32 = (offset) => {
      const k = this.current;
      if (offset === CPUID) return k;
      if (offset === FIFO_ST) return this.status(k);
      if (offset === FIFO_RD) return this.pop(k);
      if (k === 1 && SIO_PER_CORE(offset)) return sio[1].readUint32(offset);
      return read(offset);
    };
    shared.writeUint32 = (offset, value) => {
      const k = this.current;
      if (offset === FIFO_ST) { this.sticky[k] &= ~value; return; }
      if (offset === FIFO_WR) { this.push(k, value >>> 0); return; }
      if (k === 1 && SIO_PER_CORE(offset)) { sio[1].writeUint32(offset, value); return; }
      write(offset, value);
    };
    core1.waiting = true;           // in the boot ROM until launched
  }

  status(k) {
    return (this.rx[k].length ? 1 : 0) | (this.rx[k ^ 1].length < FIFO_DEPTH ? 2 : 0) | this.sticky[k];
  }

  pop(k) {
    const q = this.rx[k];
    if (!q.length) { this.sticky[k] |= 8; return 0; }
    return q.shift();
  }

  push(k, value) {
    const q = this.rx[k ^ 1];
    if (q.length >= FIFO_DEPTH) { this.sticky[k] |= 4; return; }
    q.push(value);
    if (k === 0 && !this.launched) this.bootRom();
  }

  /** Core 1 in the boot ROM reads each word core 0 pushed, echoes it, and launches after the
   *  sequence [LAUNCH]. */
  bootRom() {
    const q = this.rx[1];
    while (q.length && !this.launched) {
      const w = q.shift();
      const i = this.launchWords.length;
      if (i < LAUNCH.length && w !== LAUNCH[i]) this.launchWords = w === 0 ? [0] : [];
      else this.launchWords.push(w);
      if (this.rx[0].length < FIFO_DEPTH) this.rx[0].push(w);
      if (this.launchWords.length === LAUNCH.length + 3) this.launch();
    }
  }

  launch() {
    const [, , , vtor, sp, entry] = this.launchWords;
    const c = this.cores[1];
    c.VTOR = vtor;
    c.SP = sp;
    c.PC = entry & ~1;
    c.cycles = this.cores[0].cycles;
    c.waiting = false;
    this.launched = true;
  }

  /** SEV by the current core [ARMv6-M]: its own next WFE returns at once, and so does the other
   *  core's, or that core, asleep in WFE, wakes (at the sender's time). A core asleep in WFI may wake too (a spurious wake-up is allowed). */
  sev() {
    const k = this.current;
    this.cores[k].eventRegistered = true;
    if (k === 0 && !this.launched) return;   // the boot ROM's WFE: bootRom answers on the push
    const o = this.cores[k ^ 1];
    if (o.waiting) {
      o.waiting = false;
      if (o.cycles < this.cores[k].cycles) o.cycles = this.cores[k].cycles;
    } else {
      o.eventRegistered = true;
    }
  }
}
