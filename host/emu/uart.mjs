// UART0 of the emulated RP2040 on the harness's stdin/stdout (host/boards/emulated.py passes the
// master side of a raw pty; bench and tests pass pipes).
//
// Output leaves one write at a time: fs.write runs on libuv's thread pool, and two writes to the same
// pipe from two threads may land in either order or interleave past PIPE_BUF (Node's fs.write docs:
// unsafe without waiting for the callback); a loaded host reading slowly made that happen.
import fs from 'node:fs';

const TX_BACKLOG_MAX = 1 << 20;   // bytes the host has not read yet before the "UART" drops

export class UartPort {
  /** uart: rp2040js's RPUART; onInput(): bytes arrived; onEnd(): the host closed its side;
   *  onError(message, exit code): a write (1) or a read (0) failed. */
  constructor(uart, { onInput, onEnd, onError }) {
    this.uart = uart;
    this.tx = [];              // bytes the firmware sent since the last flush
    this.queue = [];           // buffers waiting for their write, in order
    this.writing = false;
    this.backlog = 0;          // bytes handed to a write and not yet written
    this.dropped = 0;
    this.rx = [];              // bytes from the host not yet in the 32-entry RX FIFO
    this.rxHead = 0;
    this.closing = null;       // close(): called once the queue is written
    this.onError = onError;
    uart.onByte = (b) => { this.tx.push(b); };
    const input = fs.createReadStream(null, { fd: 0, highWaterMark: 4096, autoClose: false });
    input.on('data', (chunk) => {
      for (const b of chunk) this.rx.push(b);
      onInput();
    });
    input.on('end', onEnd);
    input.on('error', (e) => (e.code === 'EIO' ? onEnd() : onError(`UART input failed: ${e.code || e.message}`, 0)));
  }

  /** The host's bytes into the RX FIFO as far as it has room. */
  feed() {
    while (this.rxHead < this.rx.length && !this.uart.rxFIFO.full) this.uart.feedByte(this.rx[this.rxHead++]);
    if (this.rxHead === this.rx.length && this.rxHead) { this.rx.length = 0; this.rxHead = 0; }
  }

  /** Bytes from the host the firmware has not taken yet. */
  hasInput() {
    return this.rxHead < this.rx.length;
  }

  /** What the firmware sent, queued for the host. */
  flush() {
    if (!this.tx.length) return;
    const buf = Buffer.from(this.tx);
    this.tx = [];
    if (this.backlog + buf.length > TX_BACKLOG_MAX) {   // nobody reads the port: drop, as a UART would
      if (!this.dropped) process.stderr.write('rp2040-emu: host is not reading; dropping UART output\n');
      this.dropped += buf.length;
      return;
    }
    this.backlog += buf.length;
    this.queue.push(buf);
    if (!this.writing) this.write();
  }

  /** done() once everything sent so far is written (at once when nothing is pending). */
  close(done) {
    this.closing = done;
    if (this.tx.length) { this.queue.push(Buffer.from(this.tx)); this.tx = []; }
    if (!this.writing) this.write();
  }

  write() {
    const buf = this.queue[0];
    if (!buf) {
      this.writing = false;
      if (this.closing) this.closing();
      return;
    }
    this.writing = true;
    fs.write(1, buf, 0, buf.length, null, (err, n) => {
      if (err) { this.onError(`UART output failed: ${err.code || err.message}`, 1); return; }
      this.backlog -= n;
      if (n < buf.length) this.queue[0] = buf.subarray(n);   // a partial write: the rest goes next
      else this.queue.shift();
      this.write();
    });
  }
}
