"""One host-side conversation with a board: handshake, check the model, switch the layout, generate.

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

import time
from dataclasses import replace
from typing import Callable

from ..errors import BoardError
from ..link import messages as P
from .collect import Collector, _Run
from .errors import DeviceError, LinkLost, LinkTimeout, ModelMismatch, error_text
from .recovery import Recovery
from .result import RunResult


def _as_hash(h) -> bytes:
    if isinstance(h, str):
        try:
            return bytes.fromhex(h)
        except ValueError:
            raise BoardError(f"model hash {h!r} is not hex") from None
    return bytes(h)


class Session(Collector, Recovery):
    """A conversation with one board over a ``Link`` (host/link/port.py)."""

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
            msg += f"; last device error: {error_text(errors[-1])}"
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
            why = error_text(errors[-1]) if errors else "no reason given"
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
                                  f"{error_text(m)}", m)
            if isinstance(m, P.Log):
                self.logs.append(m.text)
                logs.append(m.text)
        raise LinkTimeout(f"{self.name} did not answer {what} within {timeout:g} s")

    # -- generation ------------------------------------------------------------------------
    def generate(self, request: P.Generate, on_token: Callable | None = None,
                 frame_timeout: float | None = None) -> RunResult:
        """Send the request (GENERATE, or GENERATE_TEXT for a text prompt: the device encodes it,
        and the ids it used come back in the TOKEN frames), collect TOKEN frames until DONE.

        With a device that answers RESEND (HELLO flag bit1; docs/formats.md section 2.1) every lost
        TOKEN, and a lost DONE, is asked for again while the device still keeps it; what cannot be
        recovered is listed in ``missing_steps``. ERROR raises DeviceError, silence LinkTimeout, a
        vanished port LinkLost, a board that restarted BoardReset (all carry ``.partial``).
        Ctrl-C sends STOP and returns what arrived."""
        run = self._start(request, on_token, frame_timeout)
        self._collect(run)
        return run.finish()

    def _start(self, request: P.Generate, on_token, frame_timeout, resend: bool = True) -> _Run:
        m = request
        msg = replace(m, prompt=m.prompt if m.is_text else [int(i) for i in m.prompt],
                      max_new_tokens=int(m.max_new_tokens), temperature=float(m.temperature), top_p=float(m.top_p),
                      seed=int(m.seed), send_logits=bool(m.send_logits), slide=bool(m.slide),
                      all_logits=bool(m.all_logits), batch=int(m.batch), draft_k=int(m.draft_k))
        res = RunResult(hello=self.hello, request=msg, prompt_ids=[] if msg.is_text else list(msg.prompt),
                        board_name=self.name)
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
