"""One host-side conversation with a board: open the port, handshake, check the model, generate.

Everything that can go wrong on the board side is a ``BoardError`` with a one-line message;
``DeviceError`` (the device answered ERROR) and ``LinkTimeout`` (the device went silent) are
subclasses that also carry the partial ``RunResult`` gathered before the failure.

Step numbers count forward passes of one generation from 0 (step == pos for a fresh
generation).  A TOKEN whose ``step`` skips ahead marks the skipped steps missing; a DONE whose
``steps`` is beyond the last step seen marks the tail missing.  Frame seq gaps and bad frames
counted by the decoder are reported next to them.
"""
from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from typing import Callable

from . import protocol as P
from .virtual import BoardError

__all__ = ["BoardError", "DeviceError", "LinkTimeout", "ModelMismatch", "RunResult", "Session",
           "open_port", "stats_dict"]


class DeviceError(BoardError):
    """The device answered ERROR."""

    def __init__(self, msg: str, error=None, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.error = error
        self.partial = partial


class LinkTimeout(BoardError):
    """No frame arrived within the bounded wait."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class ModelMismatch(BoardError):
    """The board holds a different model than the one the host was asked to use."""


def open_port(path, baud: int = 115200, timeout: float = 0.05):
    """Open a serial port with pyserial; a missing or non-tty path is a one-line BoardError."""
    import serial

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


def stats_dict(stats: P.DecoderStats) -> dict:
    """The link's decoder counters as a flat dict of numbers (``gaps`` as a count)."""
    return {"frames": stats.frames, "bad_crc": stats.bad_crc, "bad_cobs": stats.bad_cobs,
            "bad_message": stats.bad_message, "junk_bytes": stats.junk_bytes, "gaps": len(stats.gaps),
            "resets": stats.resets, "bad_frames": stats.bad_frames}


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before[k] for k, v in after.items()}


@dataclass
class RunResult:
    """Everything one generation produced, as it arrived."""
    hello: P.Hello | None                                # None if generate ran before a handshake
    prompt_ids: list[int]
    max_new_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    tokens: list = field(default_factory=list)          # protocol Token, in arrival order
    done: P.Done | None = None
    missing_steps: list[int] = field(default_factory=list)
    duplicate_steps: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)            # link stats after the run (cumulative)
    run_stats: dict = field(default_factory=dict)        # link stats during this run only
    gap_pairs: list = field(default_factory=list)        # (expected seq, got seq) during this run
    wall_s: float = 0.0
    interrupted: bool = False
    logits: dict = field(default_factory=dict)           # step -> list of floats
    logs: list[str] = field(default_factory=list)
    board_name: str = ""

    @property
    def frame_gaps(self) -> int:
        return self.run_stats.get("gaps", 0)

    @property
    def bad_frames(self) -> int:
        return self.run_stats.get("bad_frames", 0)

    @property
    def prompt_steps(self) -> list:
        """Steps whose output is unused (the prompt, except its last token)."""
        return [t for t in self.tokens if t.out_id is None]

    @property
    def generated_steps(self) -> list:
        """Steps that produced a token (the last prompt step and every generated one)."""
        return [t for t in self.tokens if t.out_id is not None]

    @property
    def generated_ids(self) -> list[int]:
        return [t.out_id for t in self.generated_steps]

    @property
    def text_bytes(self) -> bytes:
        return b"".join(t.piece for t in self.generated_steps)

    @property
    def board(self) -> str:
        return (self.hello.board if self.hello is not None else "") or self.board_name or "?"

    @property
    def clock(self) -> str:
        return clock_name(self.hello.clock if self.hello is not None else None)

    @property
    def complete(self) -> bool:
        return self.done is not None and not self.missing_steps


def clock_name(clock: int | None) -> str:
    """The HELLO clock source by name; None (no HELLO yet) and unknown codes are shown as is."""
    if clock is not None and 0 <= clock < len(P.CLOCKS):
        return P.CLOCKS[clock]
    return f"clock {clock}"


def _as_hash(h) -> bytes:
    if isinstance(h, str):
        try:
            return bytes.fromhex(h)
        except ValueError:
            raise BoardError(f"model hash {h!r} is not hex") from None
    return bytes(h)


class Session:
    """A conversation with one board over a ``protocol.Link``."""

    def __init__(self, link, name: str | None = None, frame_timeout: float = 10.0,
                 stop_timeout: float = 3.0):
        self.link = link
        self.name = name or link.port.port or "the board"   # link.port is the serial object
        self.frame_timeout = frame_timeout
        self.stop_timeout = stop_timeout
        self.hello = None
        self.logs: list[str] = []

    # -- link I/O: a vanished port is a BoardError, not a pyserial traceback ----------------
    # (pyserial's SerialException and SerialTimeoutException are OSErrors)
    def _recv(self, timeout: float):
        try:
            return self.link.recv(timeout)
        except OSError as e:
            raise BoardError(f"lost the connection to {self.name}: {_io_reason(e)}") from None

    def _send(self, msg) -> None:
        try:
            self.link.send(msg)
        except OSError as e:
            raise BoardError(f"cannot write to {self.name}: {_io_reason(e)}") from None

    # -- handshake -------------------------------------------------------------------------
    def handshake(self, timeout: float = 5.0, interval: float = 0.5):
        """PING until a HELLO arrives (frames and junk before it are skipped); return the Hello."""
        deadline = time.monotonic() + timeout
        pings, errors, frames = 0, [], 0
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            self._send(P.Ping())
            pings += 1
            attempt_end = min(deadline, now + interval)
            while True:
                left = attempt_end - time.monotonic()
                if left <= 0:
                    break
                fr = self._recv(left)
                if fr is None:
                    break
                frames += 1
                m = fr.msg
                if isinstance(m, P.Hello):
                    return self._accept_hello(m, errors)
                if isinstance(m, P.Error):
                    errors.append(m)
                elif isinstance(m, P.Log):
                    self.logs.append(m.text)
        bad = self.link.stats.bad_frames
        msg = (f"no HELLO from {self.name} within {timeout:g} s ({pings} PING{'s' * (pings != 1)} sent, "
               f"{frames} frame{'s' * (frames != 1)} and {bad} bad frame{'s' * (bad != 1)} received)")
        if errors:
            msg += f"; last device error: {_error_text(errors[-1])}"
        elif not frames and not bad:
            msg += " — is the firmware running, and is the baud rate right?"
        raise LinkTimeout(msg)

    def _accept_hello(self, hello, errors):
        if not hello.image_ok:
            if not errors:   # the device sends its reason as ERROR; give it a moment to arrive
                end = time.monotonic() + 0.5
                while not errors and (left := end - time.monotonic()) > 0:
                    fr = self._recv(left)
                    if fr is None:
                        break
                    if isinstance(fr.msg, P.Error):
                        errors.append(fr.msg)
            why = _error_text(errors[-1]) if errors else "no reason given"
            raise DeviceError(f"{hello.board or self.name} rejected its model image: {why}",
                              errors[-1] if errors else None)
        if hello.proto_version != 1:
            raise BoardError(f"{hello.board or self.name} speaks protocol version {hello.proto_version}, "
                             f"this host speaks version 1 (update firmware or host)")
        self.hello = hello
        return hello

    # -- model check -----------------------------------------------------------------------
    @staticmethod
    def check_model(hello, expected_hash) -> None:
        """Refuse to go on when the board's model hash is not the expected one."""
        want, have = _as_hash(expected_hash), bytes(hello.model_hash)
        if want != have:
            raise ModelMismatch(f"{hello.board or 'the board'} holds model {have.hex()[:16]}, "
                                f"but the selected model is {want.hex()[:16]}: flash the matching image "
                                f"or pick the matching --model")

    # -- generation ------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 0.0,
                 seed: int = 0, on_token: Callable | None = None, send_logits: bool = False,
                 frame_timeout: float | None = None) -> RunResult:
        """Send GENERATE, collect TOKEN frames until DONE. ERROR raises DeviceError, silence
        LinkTimeout (both carry ``.partial``). Ctrl-C sends STOP and returns what arrived."""
        prompt_ids = [int(i) for i in prompt_ids]
        res = RunResult(hello=self.hello, prompt_ids=prompt_ids, max_new_tokens=int(max_new_tokens),
                        temperature=float(temperature), top_p=float(top_p), seed=int(seed),
                        board_name=self.name)
        timeout = self.frame_timeout if frame_timeout is None else frame_timeout
        stats = self.link.stats
        before = stats_dict(stats)
        gaps_before = len(stats.gaps)
        seen: set[int] = set()
        expected = 0
        stop_sent = False
        t0 = time.monotonic()

        def finish():
            res.wall_s = time.monotonic() - t0
            res.stats = stats_dict(stats)
            res.run_stats = _delta(res.stats, before)
            res.gap_pairs = stats.gaps[gaps_before:]
            res.missing_steps.sort()
            return res

        self._send(P.Generate(prompt_ids=prompt_ids, max_new_tokens=int(max_new_tokens),
                                  temperature=float(temperature), top_p=float(top_p), seed=int(seed),
                                  send_logits=bool(send_logits)))
        while True:
            try:
                fr = self._recv(timeout)
                if fr is None:
                    if stop_sent:
                        break       # stopped and the device did not confirm: keep what arrived
                    last = f"after step {max(seen)}" if seen else "before the first token"
                    raise LinkTimeout(f"{self.name} went silent: no frame for {timeout:g} s {last} "
                                      f"({len(res.tokens)} token frame{'s' * (len(res.tokens) != 1)} received)",
                                      finish())
                m = fr.msg
                if isinstance(m, P.Token):
                    s = int(m.step)
                    if s in seen:
                        res.duplicate_steps.append(s)
                        continue
                    if s > expected:
                        res.missing_steps.extend(range(expected, s))
                    elif s < expected and s in res.missing_steps:
                        res.missing_steps.remove(s)   # late, but here
                    seen.add(s)
                    expected = max(expected, s + 1)
                    res.tokens.append(m)
                    if on_token is not None:
                        on_token(m)
                elif isinstance(m, P.Done):
                    res.done = m
                    if int(m.steps) > expected:
                        res.missing_steps.extend(range(expected, int(m.steps)))
                    break
                elif isinstance(m, P.Error):
                    raise DeviceError(f"{self.hello.board if self.hello else self.name} refused the "
                                      f"generation: {_error_text(m)}", m, finish())
                elif isinstance(m, P.Logits):
                    res.logits[int(m.step)] = list(m.values)
                elif isinstance(m, P.Log):
                    res.logs.append(m.text)
                    self.logs.append(m.text)
                # a late HELLO (answer to a repeated PING) or anything else: ignore
            except KeyboardInterrupt:
                res.interrupted = True
                if stop_sent:
                    break            # second Ctrl-C: stop waiting for the device
                stop_sent = True
                try:
                    self._send(P.Stop())
                except (OSError, BoardError):
                    break
                timeout = min(timeout, self.stop_timeout)
        return finish()


def _error_text(err: P.Error) -> str:
    return f"{err.text} ({err.name})" if err.text else err.name


def _io_reason(e: OSError) -> str:
    text = e.strerror or str(e) or type(e).__name__
    return text.splitlines()[0]
