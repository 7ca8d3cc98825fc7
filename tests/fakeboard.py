"""A small fake device for host tests: speaks protocol v4 (docs/formats.md section 2) on the
master side of an ``os.openpty()`` pair, from a thread.  The host opens ``board.path`` (the
slave) like any serial port.

Frames are built here straight from the spec (own COBS, struct, zlib.crc32), not with
host/link/, so the host is tested against the document rather than against itself.

The "model": the token after ``x`` at position ``p`` is ``(5 * x + p + 3) % vocab``; piece i is
``PIECES[i]``.  Faults to inject: junk before answering, ignored PINGs, dropped / corrupted
TOKEN frames (by step), going silent after some TOKENs, a bad image, an ERROR for GENERATE, an
old board speaking protocol v1 or v2 (``proto=1``, ``proto=2``: its HELLO only). Every step is a
forward pass of its own (no prefill chunks, no drafts). ``ple=True``: steps spend time in
the PLE phase (a model with Per-Layer Embeddings); ``out_vocab`` rows of the output layer.
"""
from __future__ import annotations

import os
import select
import struct
import threading
import time
import tty
import zlib

NO_TOKEN = 0xFFFFFFFF
REASONS = {"max_tokens": 0, "eos": 1, "context_full": 2, "stopped": 3}


def piece(i: int) -> bytes:
    special = {3: b"\n\t", 5: "é".encode(), 6: b"'q'", 7: b"\xe2\x82"}   # 7: a cut UTF-8 sequence
    return special.get(i, f" w{i}".encode())


def next_token(x: int, pos: int, vocab: int) -> int:
    return (5 * x + pos + 3) % vocab


def step_us(step: int, prompt: bool, ple: bool = False) -> tuple[int, ...]:
    """embed, attention, ffn, ple, output, sampling, draft"""
    return (10 + step, 100 + 3 * step, 200 + step, 30 + step if ple else 0, 50, 0 if prompt else 7, 0)


def step_bytes(pos: int) -> tuple[int, int, int]:
    return (4096, 0, 64 * (pos + 1))


def cobs_encode(data: bytes) -> bytes:
    out, block = bytearray(), bytearray()
    for b in data:
        if b == 0:
            out.append(len(block) + 1)
            out += block
            block.clear()
        else:
            block.append(b)
            if len(block) == 254:
                out.append(255)
                out += block
                block.clear()
    out.append(len(block) + 1)
    out += block
    return bytes(out)


def cobs_decode(data: bytes) -> bytes | None:
    out, i = bytearray(), 0
    while i < len(data):
        code = data[i]
        if code == 0 or i + code > len(data):
            return None
        out += data[i + 1:i + code]
        i += code
        if code != 255 and i < len(data):
            out.append(0)
    return bytes(out)


def frame(msg_type: int, seq: int, payload: bytes) -> bytes:
    body = struct.pack("<BH", msg_type, seq & 0xFFFF) + payload
    body += struct.pack("<I", zlib.crc32(body))
    return cobs_encode(body) + b"\x00"


def expected_run(prompt, max_new, vocab, max_seq_len):
    """The (step, pos, in_id, out_id) records the fake produces for a GENERATE."""
    recs, tok, pos, gen = [], prompt[0], 0, 0
    while pos < max_seq_len and gen < max_new:
        if pos + 1 < len(prompt):
            out, nxt = None, prompt[pos + 1]
        else:
            out = nxt = next_token(tok, pos, vocab)
            gen += 1
        recs.append((pos, pos, tok, out))
        tok, pos = nxt, pos + 1
    return recs


class FakeBoard:
    def __init__(self, *, vocab=40, max_seq_len=24, model_hash=bytes(range(16)), layout_id=7,
                 board="fakeboard", fw="fake-0.1", clock=2, image_ok=True,
                 image_error="tensor table out of bounds", boot_junk=b"", ignore_pings=0,
                 drop_steps=(), corrupt_steps=(), silent_after=None, generate_error=None,
                 step_delay=0.0, proto=5, ple=False, out_vocab=None, golden=(2, 2, 4, 0xFFFF),
                 selftest_golden=None):
        self.vocab, self.max_seq_len = vocab, max_seq_len
        # HELLO's golden check (state, checked, total, first step that differs), and after a SELFTEST
        self.golden, self.selftest_golden = golden, selftest_golden
        self.proto, self.ple = proto, ple
        self.out_vocab = vocab if out_vocab is None else out_vocab
        self.model_hash, self.layout_id = bytes(model_hash), layout_id
        self.board, self.fw, self.clock = board, fw, clock
        self.image_ok, self.image_error = image_ok, image_error
        self.boot_junk, self.ignore_pings = boot_junk, ignore_pings
        self.drop_steps, self.corrupt_steps = set(drop_steps), set(corrupt_steps)
        self.silent_after, self.generate_error = silent_after, generate_error
        self.step_delay = step_delay
        self.received: list[tuple[int, int, bytes]] = []   # (type, seq, payload) from the host
        self.bad_rx = 0
        self.seq = 0
        self.tokens_sent = 0
        self.silent = False
        self._rx = bytearray()
        self._pings = 0
        self._junk_sent = False
        self._stop = threading.Event()
        self._stop_gen = False

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self):
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)            # what firmware does to its pty: no echo, no CR/LF games
        self.path = os.ttyname(self.slave)
        self._send(0x81, self._hello())   # boot HELLO (seq 0); the host's open flushes it
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fakeboard")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        os.close(self.master)
        os.close(self.slave)

    def types_received(self) -> list[int]:
        return [t for t, _, _ in self.received]

    # -- wire --------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.silent:
            return
        view = memoryview(data)
        while view and not self._stop.is_set():
            _, w, _ = select.select([], [self.master], [], 0.1)
            if w:
                n = os.write(self.master, view)
                view = view[n:]

    def _send(self, msg_type: int, payload: bytes, mangle: str | None = None) -> None:
        raw = frame(msg_type, self.seq, payload)
        self.seq = (self.seq + 1) & 0xFFFF
        if mangle == "drop":
            return
        if mangle == "corrupt":
            b = bytearray(raw)
            i = len(b) // 2
            b[i] = b[i] ^ 0x01 or 0x02    # never turn it into a delimiter
            raw = bytes(b)
        self._write(raw)

    def _poll(self, timeout: float) -> list[tuple[int, int, bytes]]:
        r, _, _ = select.select([self.master], [], [], timeout)
        if not r:
            return []
        try:
            data = os.read(self.master, 4096)
        except OSError:
            return []
        out = []
        for b in data:
            if b != 0:
                self._rx.append(b)
                continue
            body = cobs_decode(bytes(self._rx))
            self._rx.clear()
            if body is None or len(body) < 7 or zlib.crc32(body[:-4]) != struct.unpack("<I", body[-4:])[0]:
                self.bad_rx += 1
                continue
            t, seq = struct.unpack_from("<BH", body)
            out.append((t, seq, body[3:-4]))
        self.received.extend(out)
        return out

    # -- messages ----------------------------------------------------------------------------
    def _hello(self) -> bytes:
        fw, board = self.fw.encode(), self.board.encode()
        sizes = (struct.pack("<IIIB", self.layout_id, self.vocab, self.max_seq_len, self.clock) if self.proto == 1
                 else struct.pack("<IIIIB", self.layout_id, self.vocab, self.out_vocab, self.max_seq_len, self.clock))
        golden = struct.pack("<BHHH", *self.golden) if self.proto >= 3 else b""
        return (struct.pack("<HH", self.proto, 1 if self.image_ok else 0) + self.model_hash + sizes
                + bytes([len(fw)]) + fw + bytes([len(board)]) + board + (b"\x01" + golden if self.proto >= 3 else b""))

    def _error(self, code: int, text: str) -> None:
        raw = text.encode()
        self._send(0x84, struct.pack("<HH", code, len(raw)) + raw)

    def _serve(self) -> None:
        while not self._stop.is_set():
            for t, _, payload in self._poll(0.05):
                if t == 0x01:
                    self._on_ping()
                elif t == 0x02:
                    self._on_generate(payload)
                elif t == 0x07:
                    self._on_selftest()

    def _on_ping(self) -> None:
        self._pings += 1
        if self.boot_junk and not self._junk_sent:
            self._junk_sent = True
            self._write(self.boot_junk)          # no delimiter: it glues onto whatever comes next
        if self._pings <= self.ignore_pings:
            return
        if not self.image_ok:
            self._error(3, self.image_error)
        self._send(0x81, self._hello())

    def _on_selftest(self) -> None:
        if self.selftest_golden is not None:
            self.golden = self.selftest_golden
        text = b"golden check, KV cache f32: as the test set it"
        self._send(0x86, struct.pack("<H", len(text)) + text)
        self._send(0x81, self._hello())

    def _on_generate(self, p: bytes) -> None:
        max_new, temp, top_p, seed, flags, batch, spec, draft_k, _, n = struct.unpack_from("<IffQIBBBBI", p)
        prompt = list(struct.unpack_from(f"<{n}I", p, 32))
        if not self.image_ok:
            return self._error(7, "no model image")
        if self.generate_error:
            return self._error(*self.generate_error)
        if not prompt or n > self.max_seq_len:
            return self._error(4, f"prompt of {n} tokens exceeds the context of {self.max_seq_len}")
        self._log(f"generate {n} prompt tokens, max {max_new}")
        totals, nbytes, steps, gen, reason = [0] * 7, [0] * 3, 0, 0, "max_tokens"
        for step, pos, in_id, out_id in expected_run(prompt, max_new, self.vocab, self.max_seq_len):
            if self._stop.is_set():
                return
            for t, _, _ in self._poll(0):
                if t == 0x04:
                    self._stop_gen = True
            if self._stop_gen:
                reason = "stopped"
                break
            if self.step_delay:
                time.sleep(self.step_delay)
            us = step_us(step, out_id is None, self.ple)
            pc = piece(out_id) if out_id is not None else b""
            payload = (struct.pack("<4I", step, pos, in_id, NO_TOKEN if out_id is None else out_id)
                       + struct.pack("<7I", *us) + struct.pack("<3I", *step_bytes(pos))
                       + struct.pack("<IIBBBBB", self.out_vocab, 0x1234 + step, 0, 1, 1, 0, len(pc)) + pc
                       + bytes(3))      # protocol 4: no experts (a dense model)
            mangle = "drop" if step in self.drop_steps else "corrupt" if step in self.corrupt_steps else None
            self._send(0x82, payload, mangle)
            self.tokens_sent += 1
            if self.silent_after is not None and self.tokens_sent >= self.silent_after:
                self.silent = True
            totals = [a + b for a, b in zip(totals, us)]
            nbytes = [a + b for a, b in zip(nbytes, step_bytes(pos))]
            steps += 1
            gen += out_id is not None
        else:
            if gen < max_new:
                reason = "context_full"
        self._stop_gen = False
        self._send(0x83, struct.pack("<IIBQ", steps, gen, REASONS[reason], sum(totals))
                   + struct.pack("<7Q", *totals) + struct.pack("<4I", steps, 0, 0, 0) + struct.pack("<3Q", *nbytes)
                   + struct.pack("<3Q", 0, 0, 0) + struct.pack("<2I", 0, 0))   # its stack: not measured

    def _log(self, text: str) -> None:
        raw = text.encode()
        self._send(0x86, struct.pack("<H", len(raw)) + raw)
