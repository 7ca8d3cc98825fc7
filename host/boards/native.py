"""The native virtual board: the firmware built for the host, serving the protocol on a pty.

The binary is run as ``BINARY BLOB_PATH``; it prints exactly one line ``pty /dev/pts/N`` on stdout
and then serves the serial protocol on that pty until SIGTERM.  ``start_native_board`` waits for
that line (bounded), and turns every way this can go wrong into a one-line ``BoardError``.

The child runs in its own session, so a Ctrl-C in the terminal reaches only the host (which then
sends STOP over the link) and not the virtual board.
"""
from __future__ import annotations

import collections
import os
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path

from ..errors import BoardError


def drain(stream, sink: collections.deque) -> None:
    """Keep reading a child's pipe so it can never block on a full pipe; keep the last lines."""
    try:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                sink.append(line)
    except (OSError, ValueError):
        pass


class VirtualBoard:
    """A running native firmware process and the pty it serves."""

    def __init__(self, proc: subprocess.Popen, port: str, binary: Path, blob_path: Path,
                 stderr_tail: collections.deque, stdout_tail: collections.deque):
        self.proc = proc
        self.port = port
        self.binary = binary
        self.blob_path = blob_path
        self._stderr = stderr_tail
        self._stdout = stdout_tail
        self._slave: int | None = None     # an emulator's pty: the slave end kept open while it runs
        self.name = "native"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_counts(self) -> list[dict]:
        """The emulator harness's per-step counts since the last call: none on this board (the
        emulated RP2040's harness has them, host/boards/emulated.py)."""
        return []

    def stderr_tail(self, n: int = 3) -> list[str]:
        return list(self._stderr)[-n:]

    def describe_exit(self) -> str | None:
        """One line about why the process is gone, or None while it runs."""
        rc = self.proc.poll()
        if rc is None:
            return None
        return _exit_text(self.binary, rc, self.stderr_tail(1))

    def stop(self, timeout: float = 3.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Idempotent; returns the exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    pass
            except ProcessLookupError:
                pass
        for s in (self.proc.stdout, self.proc.stderr):
            try:
                if s is not None:
                    s.close()
            except OSError:
                pass
        if self._slave is not None:
            try:
                os.close(self._slave)
            except OSError:
                pass
            self._slave = None
        return self.proc.returncode

    def __enter__(self) -> "VirtualBoard":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VirtualBoard(port={self.port!r}, pid={self.proc.pid}, alive={self.alive})"


def exit_how(rc: int) -> str:
    """How a board's process ended, from its exit code."""
    return f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"


def _exit_text(binary: Path, rc: int, tail: list[str]) -> str:
    msg = f"native board {binary.name} {exit_how(rc)}"
    if tail:
        msg += f": {tail[-1]}"
    return msg


def start_native_board(binary, blob_path, timeout: float = 10, wrapper=()) -> VirtualBoard:
    """Start ``BINARY BLOB_PATH`` and wait (at most ``timeout`` s) for its ``pty PATH`` line.
    ``wrapper``: a command line to run it under (bench/callgrind.py: valgrind)."""
    binary, blob_path = Path(binary), Path(blob_path)
    if not binary.exists():
        raise BoardError(f"native board binary {binary} does not exist (run 'flashlm build --board native')")
    if binary.is_dir() or not os.access(binary, os.X_OK):
        raise BoardError(f"native board binary {binary} is not an executable file")
    if not blob_path.is_file():
        raise BoardError(f"model image {blob_path} does not exist")
    try:
        proc = subprocess.Popen([*wrapper, str(binary), str(blob_path)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True)
    except OSError as e:
        raise BoardError(f"cannot start native board {binary}: {e.strerror or e}") from None

    stderr_tail: collections.deque = collections.deque(maxlen=50)
    threading.Thread(target=drain, args=(proc.stderr, stderr_tail), daemon=True,
                     name="native-board-stderr").start()

    def fail(msg: str):
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            pass
        raise BoardError(msg)

    # Read the first stdout line without blocking past the deadline.
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                what = f"printed {buf[:60]!r} but no full line" if buf else "printed nothing"
                fail(f"native board {binary.name} {what} within {timeout:g} s (expected 'pty /dev/pts/N')")
            if not sel.select(min(left, 0.2)):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                try:
                    rc = proc.wait(2)
                except subprocess.TimeoutExpired:
                    fail(f"native board {binary.name} closed its stdout without printing its pty")
                time.sleep(0.05)   # let the stderr reader catch the last line
                fail(_exit_text(binary, rc, list(stderr_tail)[-1:]))
            buf += chunk
    except KeyboardInterrupt:     # no board is left running
        proc.kill()
        proc.wait()
        raise
    finally:
        sel.close()

    line, _, rest = buf.partition(b"\n")
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("pty "):
        fail(f"native board {binary.name} printed {text[:80]!r}, expected 'pty /dev/pts/N'")
    port = text[4:].strip()
    if not port or not os.path.exists(port):
        fail(f"native board {binary.name} announced pty {port!r}, which does not exist")

    stdout_tail: collections.deque = collections.deque(maxlen=50)
    for extra in rest.decode("utf-8", "replace").splitlines():
        if extra.strip():
            stdout_tail.append(extra.strip())
    threading.Thread(target=drain, args=(proc.stdout, stdout_tail), daemon=True,
                     name="native-board-stdout").start()
    return VirtualBoard(proc, port, binary, blob_path, stderr_tail, stdout_tail)
