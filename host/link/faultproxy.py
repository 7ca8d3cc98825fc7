"""A serial fault injector: a pty that sits between the host and a board and damages the bytes.

    board tty (upstream) <──> FaultProxy <──> proxy.port (a pty the host opens like any serial port)

Per direction (``to_host``: board → host, ``to_device``: host → board) and per byte, with
seeded, reproducible randomness:

* ``drop``   — the byte is lost;
* ``dup``    — the byte is delivered twice;
* ``flip``   — one random bit of the byte is inverted (it may become or stop being a 0x00
               frame delimiter);
* ``insert`` — a random byte is inserted before it;
* ``noise``  — a burst of boot-log text (as an ESP32 prints after a reset) is inserted before it.

Line events: ``boot_noise`` is written to the host once it first talks (and again whenever the
upstream is swapped, as after a board reset); ``close_after`` closes the host side of the line
after that many bytes have gone to the host (the host's reads fail, as when a USB cable is
pulled) and ``reopen_after`` seconds later a new pty appears at ``proxy.port``;
``close_line()``/``reopen()`` do the same on demand. ``swap_upstream(path)`` moves the board side
to another tty (a restarted native board) while the host keeps its port, as a USB-UART bridge does
when the chip behind it resets. ``baud`` paces the board → host direction at baud/10 bytes per
second, reading the board no faster than that, so a board blocks on a slow link as on a real UART.

Every fault is counted in ``proxy.stats`` (per direction and kind). Usable from tests
(``with FaultProxy(board.port, to_host=Faults(drop=1e-3)) as fp: ... fp.port``) and from the
command line (``flashlm faultproxy``, host/cli/faultproxy.py).
"""
from __future__ import annotations

import errno
import os
import random
import select
import termios
import threading
import time
import tty
from dataclasses import dataclass, fields

BOOT_LOG = (b"ESP-ROM:esp32s3-20210327\r\nBuild:Mar 27 2021\r\n"
            b"rst:0x1 (POWERON),boot:0x8 (SPI_FAST_FLASH_BOOT)\r\nSPIWP:0xee\r\n"
            b"mode:DIO, clock div:1\r\nload:0x3fce3818,len:0x508\r\nentry 0x403c9880\r\n"
            b"I (24) boot: ESP-IDF v5.1 2nd stage bootloader\r\nI (31) boot: chip revision: v0.1\r\n")

KINDS = ("drop", "dup", "flip", "insert", "noise")


@dataclass
class Faults:
    """Per-byte probabilities of each fault in one direction (0 = never)."""
    drop: float = 0.0
    dup: float = 0.0
    flip: float = 0.0
    insert: float = 0.0
    noise: float = 0.0

    def __post_init__(self):
        for f in fields(self):
            v = float(getattr(self, f.name))
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"fault rate {f.name}={v} is not in [0, 1]")
            setattr(self, f.name, v)
        if sum(getattr(self, k) for k in KINDS) > 1.0:
            raise ValueError("fault rates add up to more than 1")

    @property
    def any(self) -> bool:
        return any(getattr(self, k) for k in KINDS)

    @classmethod
    def parse(cls, spec: str) -> "Faults":
        """``"drop=0.001,flip=1e-4"`` -> Faults; ``""`` -> no faults."""
        kw = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            k, sep, v = item.partition("=")
            if not sep or k not in KINDS:
                raise ValueError(f"bad fault item {item!r}: expected KIND=RATE, KIND one of {', '.join(KINDS)}")
            kw[k] = float(v)
        return cls(**kw)


class _Damage:
    """Applies one direction's faults to a byte stream, counting them."""

    def __init__(self, faults: Faults, rng: random.Random, stats: dict):
        self.f = faults
        self.rng = rng
        self.stats = stats
        f = faults
        # cumulative thresholds, one uniform draw per byte
        self.cuts = []
        acc = 0.0
        for k in KINDS:
            acc += getattr(f, k)
            self.cuts.append((acc, k))
        self.total = acc

    def noise(self) -> bytes:
        r = self.rng
        start = r.randrange(len(BOOT_LOG))
        n = r.randint(8, 120)
        return (BOOT_LOG * 2)[start:start + n]

    def apply(self, data: bytes) -> bytes:
        st = self.stats
        st["bytes"] += len(data)
        if not self.total:
            return data
        out = bytearray()
        rnd = self.rng.random
        for b in data:
            u = rnd()
            if u >= self.total:
                out.append(b)
                continue
            kind = next(k for c, k in self.cuts if u < c)
            st[kind] += 1
            if kind == "drop":
                continue
            if kind == "dup":
                out += bytes((b, b))
            elif kind == "flip":
                out.append(b ^ (1 << self.rng.randrange(8)))
            elif kind == "insert":
                out.append(self.rng.randrange(256))
                out.append(b)
            else:  # noise
                burst = self.noise()
                st["noise_bytes"] += len(burst)
                out += burst
                out.append(b)
        return bytes(out)


def _new_stats() -> dict:
    return {"bytes": 0, **{k: 0 for k in KINDS}, "noise_bytes": 0}


def _open_raw(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        tty.setraw(fd, termios.TCSANOW)   # not TCSAFLUSH: what the board already sent is kept
    except OSError:
        pass          # not a tty (a FIFO in a test): fine
    return fd


class FaultProxy:
    """The proxy; a context manager that runs its pump thread while open."""

    def __init__(self, upstream: str, to_host: Faults | None = None, to_device: Faults | None = None, *,
                 seed: int = 0, boot_noise: bytes | bool = False, close_after: int | None = None,
                 reopen_after: float | None = None, baud: int | None = None):
        self.upstream = str(upstream)
        self.to_host = to_host or Faults()
        self.to_device = to_device or Faults()
        self.seed = seed
        self.boot_noise = BOOT_LOG if boot_noise is True else (boot_noise or b"")
        self.close_after = close_after
        self.reopen_after = reopen_after
        self.baud = baud
        self.stats = {"to_host": _new_stats(), "to_device": _new_stats(),
                      "boot_noise": 0, "boot_noise_bytes": 0, "closes": 0, "reopens": 0, "swaps": 0,
                      "lost_while_down": 0, "upstream_errors": 0}
        self._dmg_host = _Damage(self.to_host, random.Random(seed * 2 + 1), self.stats["to_host"])
        self._dmg_dev = _Damage(self.to_device, random.Random(seed * 2 + 2), self.stats["to_device"])
        self._lock = threading.RLock()
        self._up: int | None = None
        self._master: int | None = None
        self._slave: int | None = None
        self.port: str | None = None
        self.line_up = threading.Event()
        self._q_host = bytearray()       # damaged, waiting to be written to the host
        self._q_dev = bytearray()
        self._host_spoke = False
        self._noise_due = bool(self.boot_noise)
        self._sent_to_host = 0
        self._reopen_at: float | None = None
        self._credit = 0.0
        self._credit_t = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "FaultProxy":
        self._up = _open_raw(self.upstream)
        self._open_line()
        self._thread = threading.Thread(target=self._pump, daemon=True, name="faultproxy")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            self._close_line_fds()
            if self._up is not None:
                os.close(self._up)
                self._up = None
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- line control (thread-safe) ---------------------------------------------------------
    def close_line(self, reopen_after: float | None = None) -> None:
        """Close the host's side of the line now; a new pty appears after ``reopen_after`` s."""
        with self._lock:
            if self._master is None:
                return
            self._close_line_fds()
            self.stats["closes"] += 1
            self._reopen_at = None if reopen_after is None else time.monotonic() + reopen_after
        self._wake()

    def reopen(self) -> str:
        """Open a new host-side pty (if the line is down); returns its path."""
        with self._lock:
            if self._master is None:
                self._open_line()
                self.stats["reopens"] += 1
            self._reopen_at = None
            return self.port

    def swap_upstream(self, path: str, noise: bool = True) -> None:
        """Talk to another board tty from now on (the host keeps its port)."""
        fd = _open_raw(path)
        with self._lock:
            if self._up is not None:
                os.close(self._up)
            self._up = fd
            self.upstream = str(path)
            self.stats["swaps"] += 1
            if noise and self.boot_noise:
                self._q_host += self.boot_noise
                self.stats["boot_noise"] += 1
                self.stats["boot_noise_bytes"] += len(self.boot_noise)
        self._wake()

    def faults_injected(self) -> dict:
        """{kind: count} over both directions, plus line events."""
        out = {k: self.stats["to_host"][k] + self.stats["to_device"][k] for k in KINDS}
        out["boot_noise"] = self.stats["boot_noise"]
        out["closes"] = self.stats["closes"]
        out["swaps"] = self.stats["swaps"]
        return out

    # -- internals ------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _open_line(self) -> None:
        master, slave = os.openpty()
        tty.setraw(slave, termios.TCSANOW)   # binary frames: no echo, no newline translation
        os.set_blocking(master, False)
        self._master, self._slave = master, slave   # we hold the slave: no hang-up between opens
        self.port = os.ttyname(slave)
        self._q_host.clear()
        self._host_spoke = False
        self._noise_due = bool(self.boot_noise)
        self.line_up.set()

    def _close_line_fds(self) -> None:
        self.line_up.clear()          # first: a host that sees the line fail must not find it "up"
        for fd in (self._master, self._slave):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._master = self._slave = None
        self._q_host.clear()

    def _read_budget(self) -> int:
        if not self.baud:
            return 4096
        now = time.monotonic()
        self._credit = min(self._credit + (now - self._credit_t) * self.baud / 10.0, 256.0)
        self._credit_t = now
        return int(self._credit)

    def _pump(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._reopen_at is not None and time.monotonic() >= self._reopen_at:
                    self.reopen()
                up, master = self._up, self._master
                budget = self._read_budget()
                rl = [self._wake_r]
                if up is not None and budget > 0:
                    rl.append(up)
                if master is not None:
                    rl.append(master)
                wl = []
                if master is not None and self._q_host:
                    wl.append(master)
                if up is not None and self._q_dev:
                    wl.append(up)
            timeout = 0.005 if (self.baud and budget <= 0) or self._reopen_at is not None else 0.1
            try:
                r, w, _ = select.select(rl, wl, [], timeout)
            except (OSError, ValueError):
                continue          # an fd closed under us by close_line/swap: go round again
            with self._lock:
                if self._wake_r in r:
                    try:
                        os.read(self._wake_r, 512)
                    except OSError:
                        pass
                if up is not None and up == self._up and up in r:
                    self._from_board(up, budget)
                if master is not None and master == self._master and master in r:
                    self._from_host(master)
                if self._master is not None and self._master in w:
                    self._flush_host()
                if self._up is not None and self._up in w:
                    self._flush_dev()

    def _from_board(self, up: int, budget: int) -> None:
        try:
            data = os.read(up, max(1, min(budget, 4096)))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:              # the board's tty is gone (process killed): wait for a swap
            self.stats["upstream_errors"] += 1
            os.close(up)
            self._up = None
            return
        if self.baud:
            self._credit -= len(data)
        if self._master is None:
            self.stats["lost_while_down"] += len(data)
            return
        if self._noise_due and self._host_spoke:
            self._noise_due = False
            self._q_host += self.boot_noise
            self.stats["boot_noise"] += 1
            self.stats["boot_noise_bytes"] += len(self.boot_noise)
        self._q_host += self._dmg_host.apply(data)

    def _from_host(self, master: int) -> None:
        try:
            data = os.read(master, 4096)
        except BlockingIOError:
            return
        except OSError:
            return                # no host has the pty open: nothing to read
        if not data:
            return
        self._host_spoke = True
        if self._up is None:
            return                # board side down: the bytes go nowhere, as on a dead UART
        self._q_dev += self._dmg_dev.apply(data)

    def _flush_host(self) -> None:
        data = bytes(self._q_host)
        if self.close_after is not None:
            room = self.close_after - self._sent_to_host
            if room <= 0:
                self.close_after = None
                self.close_line(self.reopen_after)
                return
            data = data[:room]
        try:
            n = os.write(self._master, data)
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno in (errno.EIO, errno.EAGAIN):
                return
            raise
        del self._q_host[:n]
        self._sent_to_host += n
        if self.close_after is not None and self._sent_to_host >= self.close_after:
            self.close_after = None
            self.close_line(self.reopen_after)

    def _flush_dev(self) -> None:
        try:
            n = os.write(self._up, bytes(self._q_dev))
        except BlockingIOError:
            return
        except OSError:
            self._q_dev.clear()
            return
        del self._q_dev[:n]
