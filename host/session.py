"""One host-side conversation with a board: open the port, handshake, check the model, generate.

Everything that can go wrong on the board side is a ``BoardError`` with a one-line message;
``DeviceError`` (the device answered ERROR), ``LinkTimeout`` (the device went silent),
``LinkLost`` (the port went away), ``BoardReset`` (the board restarted mid-generation) and
``ModelMismatch`` are subclasses that also carry the partial ``RunResult`` gathered before the
failure (``.partial``; None where nothing was generated yet).

Step numbers count forward passes of one generation from 0 (step == pos for a fresh
generation).  A TOKEN whose ``step`` skips ahead marks the skipped steps missing; a DONE whose
``steps`` is beyond the last step seen marks the tail missing.  A device that answers RESEND
(docs/formats.md section 2.1) is asked for every missing step and for a DONE that does not come;
``Session.generate_with_recovery`` also reconnects, re-handshakes and regenerates what could not
be re-sent.  Frame seq gaps and bad frames counted by the decoder are reported next to them.
"""
from __future__ import annotations

import os
import stat
import time
from typing import Callable

from . import protocol as P
from .collect import Collector, _Run
from .recovery import Recovery, _resume_point  # noqa: F401  (_resume_point: tests)
from .run_result import RunResult, clock_name, prompt_of, stats_dict  # noqa: F401
from .session_errors import (BoardError, BoardReset, DeviceError, Diverged, LinkLost, LinkTimeout,  # noqa: F401
                             ModelMismatch, _error_text)

__all__ = ["BoardError", "BoardReset", "DeviceError", "Diverged", "LinkLost", "LinkTimeout", "ModelMismatch",
           "RunResult", "Session", "open_port", "stats_dict"]


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



def _as_hash(h) -> bytes:
    if isinstance(h, str):
        try:
            return bytes.fromhex(h)
        except ValueError:
            raise BoardError(f"model hash {h!r} is not hex") from None
    return bytes(h)


class Session(Collector, Recovery):
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
            raise LinkLost(f"lost the connection to {self.name}: {_io_reason(e)}") from None

    def _send(self, msg) -> None:
        try:
            self.link.send(msg)
        except OSError as e:
            raise LinkLost(f"cannot write to {self.name}: {_io_reason(e)}") from None

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
        if hello.proto_version != P.PROTO_VERSION:
            fix = ("rebuild and flash its firmware with this flashlm (flashlm build / flashlm flash)"
                   if hello.proto_version < P.PROTO_VERSION else "update flashlm on this host")
            raise BoardError(f"{hello.board or self.name} speaks protocol version {hello.proto_version}, "
                             f"this host speaks version {P.PROTO_VERSION}: {fix}")
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

    # -- layout and golden check: a request the board answers with HELLO -------------------
    def set_layout(self, layout_id: int, state_tiers: int, tiers: bytes, timeout: float | None = None):
        """Switch the board's placement (LAYOUT); returns the HELLO it answers with. ERROR raises
        DeviceError, silence LinkTimeout. Tensors are re-staged, the KV cache starts empty, the
        golden check runs again (the KV format is part of the placement)."""
        # a HELLO with another layout_id answered an earlier PING: the LAYOUT's own follows
        return self._request_hello(P.Layout(int(layout_id), int(state_tiers), bytes(tiers)), "the layout",
                                   timeout, lambda h, logs: h.layout_id == layout_id)

    def selftest(self, timeout: float | None = None):
        """SELFTEST: the board runs every step of its image's golden check (docs/formats.md 1.3) and
        answers a LOG, then HELLO with the result; returns that Hello."""
        # the check's own LOG comes first: a HELLO before it answered an earlier PING
        return self._request_hello(P.SelfTest(), "SELFTEST", timeout,
                                   lambda h, logs: any("golden" in t for t in logs))

    def _request_hello(self, msg, what: str, timeout: float | None, answers: Callable) -> P.Hello:
        """Send msg; return the first HELLO that ``answers(hello, logs)`` accepts (logs: the LOG texts
        since msg). ERROR raises DeviceError, silence LinkTimeout."""
        timeout = self.frame_timeout if timeout is None else timeout
        self._send(msg)
        deadline, logs = time.monotonic() + timeout, []
        while (left := deadline - time.monotonic()) > 0:
            fr = self._recv(left)
            if fr is None:
                break
            m = fr.msg
            if isinstance(m, P.Hello) and answers(m, logs):
                self.hello = m
                return m
            if isinstance(m, P.Error):
                raise DeviceError(f"{self.hello.board if self.hello else self.name} refused {what}: "
                                  f"{_error_text(m)}", m)
            if isinstance(m, P.Log):
                self.logs.append(m.text)
                logs.append(m.text)
        raise LinkTimeout(f"{self.name} did not answer {what} within {timeout:g} s")

    # -- generation ------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 0.0,
                 seed: int = 0, on_token: Callable | None = None, send_logits: bool = False,
                 frame_timeout: float | None = None, resend: bool = True, slide: bool = False,
                 all_logits: bool = False, batch: int = 0, speculate: str = "none", draft_k: int = 0) -> RunResult:
        """Send GENERATE (GENERATE_TEXT when ``prompt_ids`` is a str: the device encodes it, and the
        ids it used come back in the TOKEN frames), collect TOKEN frames until DONE. ``send_logits``,
        ``slide`` and ``all_logits`` are the GENERATE flags, ``batch`` the tokens per prefill pass
        (0: the device's), ``speculate`` and ``draft_k`` the drafts to verify (docs/formats.md
        section 2, 2.4).

        With a device that answers RESEND (HELLO flag bit1; docs/formats.md section 2.1) every lost
        TOKEN, and a lost DONE, is asked for again while the device still keeps it; what cannot be
        recovered is listed in ``missing_steps``. ERROR raises DeviceError, silence LinkTimeout, a
        vanished port LinkLost, a board that restarted BoardReset (all carry ``.partial``).
        Ctrl-C sends STOP and returns what arrived."""
        run = self._start(prompt_ids, max_new_tokens, temperature, top_p, seed, on_token, send_logits,
                          frame_timeout, resend, slide, all_logits, batch, speculate, draft_k)
        self._collect(run)
        return run.finish()

    def _start(self, prompt_ids, max_new_tokens, temperature, top_p, seed, on_token, send_logits,
               frame_timeout, resend, slide=False, all_logits=False, batch=0, speculate="none", draft_k=0) -> "_Run":
        text = prompt_ids if isinstance(prompt_ids, str) else None
        prompt_ids = [] if text is not None else [int(i) for i in prompt_ids]
        res = RunResult(hello=self.hello, prompt_ids=prompt_ids, max_new_tokens=int(max_new_tokens),
                        temperature=float(temperature), top_p=float(top_p), seed=int(seed),
                        slide=bool(slide), all_logits=bool(all_logits or send_logits), board_name=self.name,
                        prompt_text=text, batch=int(batch), speculate=speculate, draft_k=int(draft_k))
        params = dict(max_new_tokens=int(max_new_tokens), temperature=float(temperature), top_p=float(top_p),
                      seed=int(seed), send_logits=bool(send_logits), slide=bool(slide), all_logits=bool(all_logits),
                      batch=int(batch), speculate=speculate, draft_k=int(draft_k))
        msg = P.GenerateText(text, **params) if text is not None else P.Generate(prompt_ids=prompt_ids, **params)
        run = _Run(self, res, msg, self.frame_timeout if frame_timeout is None else frame_timeout, on_token)
        if resend and self.hello is not None and self.hello.can_resend:
            run.generation = self._next_generation(res)
        self._send(msg)
        run.gen_sends = 1
        run.last_rx = run.last_probe = time.monotonic()
        return run


def _io_reason(e: OSError) -> str:
    text = e.strerror or str(e) or type(e).__name__
    return text.splitlines()[0]
