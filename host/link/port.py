"""The serial link to a board: ``open_port`` opens a serial port with pyserial, ``Link`` sends and
receives frames over it (a ``FrameDecoder`` plus a transmit seq)."""
from __future__ import annotations

import os
import stat
import time
from collections import deque
from typing import Any

import serial

from ..errors import BoardError
from .codec import encode_frame
from .frames import DecoderStats, FrameDecoder
from .messages import Frame, Message


def open_port(path, baud: int = 115200, timeout: float = 0.05):
    """Open a serial port with pyserial; a missing or non-tty path is a one-line BoardError."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BoardError(f"serial port {path} does not exist") from None
    except OSError as e:
        raise BoardError(f"serial port {path}: {e.strerror or e}") from None
    if not stat.S_ISCHR(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a character device"
        raise BoardError(f"serial port {path} is {kind}, not a serial port")
    try:
        return serial.Serial(path, baudrate=baud, timeout=timeout, write_timeout=5, exclusive=True)
    except (serial.SerialException, OSError, ValueError) as e:
        reason = str(e)
        low = reason.lower()
        if "termios" in low or "inappropriate ioctl" in low or "errno 25" in low:
            reason = "not a tty"
        elif "permission" in low:
            reason = "permission denied (are you in the dialout group?)"
        elif "lock" in low or "busy" in low or "resource temporarily" in low:
            reason = "in use by another program"
        raise BoardError(f"cannot open serial port {path}: {reason}") from None


_POLL_S = 0.1


class Link:
    """Frames over a byte port with ``read(n)``, ``write(b)`` and a pyserial-style ``timeout``
    attribute (``read`` returns what arrived, possibly ``b""``, after at most ``timeout`` s).

    ``send`` numbers host frames from 0; ``recv`` returns the next received frame or None, never
    waiting longer than its timeout in total (given a port that honours ``timeout``)."""

    def __init__(self, port: Any, decoder: FrameDecoder | None = None):
        self.port = port
        self.decoder = decoder if decoder is not None else FrameDecoder()
        self.tx_seq = 0
        self._pending: deque[Frame] = deque()

    @property
    def stats(self) -> DecoderStats:
        return self.decoder.stats

    def send(self, msg: Message) -> int:
        """Writes ``msg`` as one frame; returns the seq it was sent with."""
        seq = self.tx_seq
        self.port.write(encode_frame(msg, seq))
        self.tx_seq = (seq + 1) & 0xFFFF
        return seq

    def recv(self, timeout: float) -> Frame | None:
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            waiting = getattr(self.port, "in_waiting", 0) or 0
            if not waiting:
                current = getattr(self.port, "timeout", None)
                if current is None or current <= 0 or current > remaining:
                    # Short polls keep pyserial from reconfiguring the port on every read.
                    self.port.timeout = min(remaining, _POLL_S)
            data = self.port.read(max(1, waiting))
            if data:
                self._pending.extend(self.decoder.feed(data))
        return self._pending.popleft()
