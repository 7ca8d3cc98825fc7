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
from dataclasses import dataclass, field
from typing import Callable

from . import protocol as P
from .virtual import BoardError

__all__ = ["BoardError", "BoardReset", "DeviceError", "Diverged", "LinkLost", "LinkTimeout", "ModelMismatch",
           "RunResult", "Session", "open_port", "stats_dict"]


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


class LinkLost(BoardError):
    """The port went away (unplugged, the virtual board's process died)."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class BoardReset(BoardError):
    """The board restarted during a generation (its frame numbering began again at 0)."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class ModelMismatch(BoardError):
    """The board holds a different model than the one the host was asked to use."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class Diverged(BoardError):
    """A step generated again came out differently from the first time."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


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
    prompt_ids: list[int]                                # a text prompt's: from the TOKEN frames
    max_new_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    slide: bool = False                                  # GENERATE flag SLIDE: a full context slid its window
    all_logits: bool = False                             # GENERATE flag ALL_LOGITS (or LOGITS): every step's whole head
    tokens: list = field(default_factory=list)          # protocol Token, in step order
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
    harness: list = field(default_factory=list)          # emulator's per-step read counts (rp2040-emu)
    generation: int | None = None                        # the device's number for it (RESEND)
    resent_steps: list[int] = field(default_factory=list)   # lost, then recovered by RESEND
    resend_requests: int = 0
    conflicts: list[int] = field(default_factory=list)   # a second copy of a step differed (never expected)
    device_errors: list[str] = field(default_factory=list)  # ERRORs that did not end the run (bad_frame)
    notes: list[str] = field(default_factory=list)
    recoveries: list[dict] = field(default_factory=list)   # reconnects / regenerations (generate_with_recovery)
    done_from_host: bool = False                         # DONE totals summed by the host over merged runs
    prompt_text: str | None = None                       # the prompt, when the device encoded it (GENERATE_TEXT)

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

    # -- layout ----------------------------------------------------------------------------
    def set_layout(self, layout_id: int, state_tiers: int, tiers: bytes, timeout: float | None = None):
        """Switch the board's placement (LAYOUT); returns the HELLO it answers with. ERROR raises
        DeviceError, silence LinkTimeout. Tensors are re-staged, the KV cache starts empty."""
        timeout = self.frame_timeout if timeout is None else timeout
        self._send(P.Layout(int(layout_id), int(state_tiers), bytes(tiers)))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            fr = self._recv(left)
            if fr is None:
                break
            m = fr.msg
            if isinstance(m, P.Hello):
                if m.layout_id != layout_id:
                    continue      # a late answer to an earlier PING: the LAYOUT's own HELLO follows
                self.hello = m
                return m
            if isinstance(m, P.Error):
                raise DeviceError(f"{self.hello.board if self.hello else self.name} refused the layout: "
                                  f"{_error_text(m)}", m)
            if isinstance(m, P.Log):
                self.logs.append(m.text)
        raise LinkTimeout(f"{self.name} did not answer LAYOUT within {timeout:g} s")

    # -- generation ------------------------------------------------------------------------
    resend_timeout = 0.5   # s, at most, to wait for an answer to RESEND before asking for a step again
    _rtt = 0.0             # the last status query's round trip (s)
    resend_tries = 4       # times one step is asked for before it is reported missing
    probe_interval = 0.5   # s of silence mid-generation before the host asks the device where it is

    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, top_p: float = 0.0,
                 seed: int = 0, on_token: Callable | None = None, send_logits: bool = False,
                 frame_timeout: float | None = None, resend: bool = True, slide: bool = False,
                 all_logits: bool = False) -> RunResult:
        """Send GENERATE (GENERATE_TEXT when ``prompt_ids`` is a str: the device encodes it, and the
        ids it used come back in the TOKEN frames), collect TOKEN frames until DONE. ``send_logits``,
        ``slide`` and ``all_logits`` are the GENERATE flags (docs/formats.md section 2).

        With a device that answers RESEND (HELLO flag bit1; docs/formats.md section 2.1) every lost
        TOKEN, and a lost DONE, is asked for again while the device still keeps it; what cannot be
        recovered is listed in ``missing_steps``. ERROR raises DeviceError, silence LinkTimeout, a
        vanished port LinkLost, a board that restarted BoardReset (all carry ``.partial``).
        Ctrl-C sends STOP and returns what arrived."""
        run = self._start(prompt_ids, max_new_tokens, temperature, top_p, seed, on_token, send_logits,
                          frame_timeout, resend, slide, all_logits)
        self._collect(run)
        return run.finish()

    def _start(self, prompt_ids, max_new_tokens, temperature, top_p, seed, on_token, send_logits,
               frame_timeout, resend, slide=False, all_logits=False) -> "_Run":
        text = prompt_ids if isinstance(prompt_ids, str) else None
        prompt_ids = [] if text is not None else [int(i) for i in prompt_ids]
        res = RunResult(hello=self.hello, prompt_ids=prompt_ids, max_new_tokens=int(max_new_tokens),
                        temperature=float(temperature), top_p=float(top_p), seed=int(seed),
                        slide=bool(slide), all_logits=bool(all_logits or send_logits), board_name=self.name,
                        prompt_text=text)
        params = dict(max_new_tokens=int(max_new_tokens), temperature=float(temperature), top_p=float(top_p),
                      seed=int(seed), send_logits=bool(send_logits), slide=bool(slide), all_logits=bool(all_logits))
        msg = P.GenerateText(text, **params) if text is not None else P.Generate(prompt_ids=prompt_ids, **params)
        run = _Run(self, res, msg, self.frame_timeout if frame_timeout is None else frame_timeout, on_token)
        if resend and self.hello is not None and self.hello.can_resend:
            run.generation = self._next_generation(res)
        self._send(msg)
        run.gen_sends = 1
        run.last_rx = run.last_probe = time.monotonic()
        return run

    def _status(self, tries: int = 6):
        """The device's RESENT to a status query, or None. The query names one impossible step, a
        tag the device lists back as unavailable, so a late answer to an earlier RESEND is not
        taken for it. Retried with a doubling wait (from ~10 round trips up to resend_timeout)."""
        wait = min(self.resend_timeout, max(0.05, 10 * self._rtt)) if self._rtt else self.resend_timeout
        for _ in range(tries):
            self._status_n = (getattr(self, "_status_n", 0) + 1) & 0xFFFF
            tag = STATUS_TAG + self._status_n
            t0 = time.monotonic()
            self._send(P.Resend(0, (tag,)))
            end = t0 + wait
            wait = min(self.resend_timeout, 2 * wait)
            while (left := end - time.monotonic()) > 0:
                fr = self._recv(left)
                if fr is None:
                    break
                if isinstance(fr.msg, P.Resent) and tag in fr.msg.unavailable:
                    self._rtt = time.monotonic() - t0
                    return fr.msg
                if isinstance(fr.msg, P.Log):
                    self.logs.append(fr.msg.text)
        return None

    def _next_generation(self, res: "RunResult") -> int | None:
        """The number the device will give the next GENERATE (a generation still running from an
        earlier host is stopped first); None when it does not answer: then nothing is re-sent."""
        for _ in range(3):
            st = self._status()
            if st is None:
                res.notes.append("no answer to the RESEND status query: lost steps are reported, not re-requested")
                return None
            if st.state != "generating":
                return st.generation + 1
            self._send(P.Stop())
            end = time.monotonic() + self.stop_timeout
            while (left := end - time.monotonic()) > 0:
                fr = self._recv(left)
                if fr is None or isinstance(fr.msg, P.Done):
                    break
        raise BoardError(f"{self.name} is still generating after STOP; cannot start a new generation")

    def _collect(self, run: "_Run") -> None:
        res = run.res
        while True:
            try:
                now = time.monotonic()
                if run.generation is not None:
                    self._ask(run, now)
                if res.done is not None and (run.generation is None or not (run.missing - run.gone)):
                    break
                if res.done is None:
                    silent = now - run.last_rx
                    if silent >= run.timeout:
                        if run.stop_sent:
                            break       # stopped and the device did not confirm: keep what arrived
                        last = f"after step {max(run.seen)}" if run.seen else "before the first token"
                        n = len(res.tokens)
                        raise LinkTimeout(f"{self.name} went silent: no frame for {run.timeout:g} s {last} "
                                          f"({n} token frame{'s' * (n != 1)} received)", run.finish())
                    wait = run.timeout - silent
                    if run.generation is not None:       # wake up to probe or ask again
                        wait = min(wait, self._resend_wait(run))
                else:
                    wait = self._resend_wait(run)
                fr = self._recv(max(wait, 0.001))
                if fr is None:
                    continue
                if self._on_frame(run, fr):
                    run.last_rx = time.monotonic()   # only this generation's frames count as life
            except LinkLost as e:
                raise LinkLost(str(e), run.finish()) from None
            except KeyboardInterrupt:
                res.interrupted = True
                if run.stop_sent:
                    break            # second Ctrl-C: stop waiting for the device
                run.stop_sent = True
                run.tries = min(run.tries, 1)
                try:
                    self._send(P.Stop())
                except (OSError, BoardError):
                    break
                run.timeout = min(run.timeout, self.stop_timeout)

    def _ask(self, run: "_Run", now: float) -> None:
        """RESEND the missing steps that are due (each at most ``run.tries`` times), and probe a
        link that has been silent for ``probe_interval`` with the DONE step."""
        due = []
        patience = self._resend_wait(run)
        for s in sorted(run.missing - run.gone):
            times, last = run.asked.get(s, (0, float("-inf")))
            if now - last < patience:
                continue
            if times >= run.tries:
                run.gone.add(s)         # asked often enough: it stays missing
                continue
            due.append(s)
        res = run.res
        since = now - run.last_probe       # a quick probe when silent, then one per probe_interval
        probe = (res.done is None and now - run.last_rx >= patience
                 and (since >= self.probe_interval or (not run.probe_pending and since >= patience)))
        if probe:
            run.last_probe = now
            run.probe_pending = True
        while due or probe:
            room = P.RESEND_MAX - (1 if probe else 0)
            chunk, due = due[:room], due[room:]
            self._send(P.Resend(run.generation, tuple(chunk) + ((P.RESEND_DONE,) if probe else ())))
            res.resend_requests += 1
            for s in chunk:
                run.asked[s] = (run.asked.get(s, (0, 0.0))[0] + 1, now)
            probe = False

    def _resend_wait(self, run: "_Run") -> float:
        """How long an answer to RESEND may take: a few round trips plus a few steps' worth of
        wall time (the device answers between steps), at most ``resend_timeout``. Also how long
        the link may be silent mid-generation before the host asks the device where it is."""
        return min(self.resend_timeout, max(0.05, 3 * self._rtt + 3 * run.step_wall))

    def _on_frame(self, run: "_Run", fr) -> bool:
        """Handle one frame; True when it is news of this generation (resets the silence timer)."""
        res = run.res
        stats = self.link.stats
        new_gaps = stats.gaps[run.gaps_checked:]
        run.gaps_checked = len(stats.gaps)
        if stats.resets > run.resets_seen or any(got == 0 for _, got in new_gaps):
            run.resets_seen = stats.resets     # frame numbering began again: the board rebooted
            last = f"after step {max(run.seen)}" if run.seen else "before the first token"
            raise BoardReset(f"{self.name} restarted during the generation {last} (its frame numbers "
                             f"began again at 0)", run.finish())
        m = fr.msg
        if isinstance(m, P.Hello):
            return False            # a late answer to a repeated PING
        if isinstance(m, P.Resent):
            return self._on_resent(run, m)
        if isinstance(m, P.Token):
            self._on_token(run, m)
        elif isinstance(m, P.Done):
            if res.done is None:
                res.done = m
                run.lost_until(int(m.steps))
        elif isinstance(m, P.Error):
            if m.code == 1:      # bad_frame: one of our frames was damaged on the way; asked again later
                res.device_errors.append(_error_text(m))
                if not run.seen and res.done is None:
                    run.last_probe = float("-inf")   # it may have been the GENERATE: probe when quiet
            elif m.code == 6 and run.gen_sends > 1:
                res.device_errors.append(_error_text(m))   # a repeated GENERATE met the running one
            else:
                raise DeviceError(f"{self.hello.board if self.hello else self.name} refused the "
                                  f"generation: {_error_text(m)}", m, run.finish())
        elif isinstance(m, P.Logits):
            res.logits[int(m.step)] = list(m.values)
        elif isinstance(m, P.Log):
            res.logs.append(m.text)
            self.logs.append(m.text)
        return True

    def _on_token(self, run: "_Run", m) -> None:
        res = run.res
        s = int(m.step)
        if s in run.seen:
            (res.conflicts if m != run.seen[s] else res.duplicate_steps).append(s)
            return
        if s >= run.max_steps:
            res.device_errors.append(f"TOKEN step {s} is beyond the {run.max_steps} steps this generation can have")
            return
        run.lost_until(s)
        run.expected = max(run.expected, s + 1)
        if s in run.missing:
            run.missing.discard(s)
            run.gone.discard(s)
            if s in run.asked:
                res.resent_steps.append(s)
        if s == run.expected - 1:          # a fresh step in order: how fast the device computes
            now = time.monotonic()
            if run.last_token_t is not None:
                run.step_wall = max(run.step_wall, min(now - run.last_token_t, self.resend_timeout))
            run.last_token_t = now
        run.seen[s] = m
        res.tokens.append(m)
        if run.on_token is not None:
            run.on_token(m)

    def _on_resent(self, run: "_Run", m) -> bool:
        res = run.res
        run.probe_pending = False
        if run.generation is None:
            return False
        if m.generation != run.generation:
            before = m.generation == run.generation - 1
            if (before and m.state != "generating" and not run.seen and res.done is None
                    and P.RESEND_DONE in m.unavailable):
                # The answer to a probe sent after GENERATE, from a device that has not accepted
                # it (the device works in order): the GENERATE was lost on the way.
                if run.gen_sends >= 3:
                    raise LinkTimeout(f"{self.name} did not receive GENERATE (sent {run.gen_sends} times)",
                                      run.finish())
                res.notes.append("GENERATE was lost on the way; sent again")
                self._send(run.gen_msg)
                run.gen_sends += 1
                return True
            if before and not run.seen:
                return False        # a late answer to an earlier request
            last = f"after step {max(run.seen)}" if run.seen else "before the first token"
            raise BoardReset(f"{self.name} no longer knows this generation {last} (it is at generation "
                             f"{m.generation}, this was {run.generation}): it restarted", run.finish())
        run.lost_until(int(m.steps))
        for s in m.unavailable:
            if s != P.RESEND_DONE and s < m.first_kept and s in run.missing:
                run.gone.add(s)       # no longer kept on the device
        return True

    # -- surviving a lost link or a board reset ----------------------------------------------
    def generate_with_recovery(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0,
                               top_p: float = 0.0, seed: int = 0, on_token: Callable | None = None,
                               send_logits: bool = False, frame_timeout: float | None = None,
                               reconnect: Callable | None = None, max_recoveries: int = 3,
                               handshake_timeout: float = 5.0, slide: bool = False,
                               all_logits: bool = False, after_handshake: Callable | None = None) -> RunResult:
        """``generate`` that survives a vanished port (LinkLost), a board that restarted
        (BoardReset) or went silent (LinkTimeout), and steps that could not be re-sent.

        ``reconnect()`` returns a new ``Link`` (reopen the port, restart a virtual board); without
        it the same link is used again (a board that reset behind the same port). After a
        reconnect the host handshakes again and refuses to go on (ModelMismatch) if the board's
        model hash is not the one of the first handshake. If the device still keeps this
        generation it continues there (RESEND); otherwise the missing steps are generated again:
        greedy runs resume from the prompt plus the tokens known so far, sampled and sliding runs
        replay from the prompt with the same seed (the device's sampler is deterministic; a slid
        window is not the computation of a longer prompt). Every step both runs computed must agree
        (input id, logits CRC, output id), or BoardError. ``after_handshake(hello)`` runs after every
        re-handshake (e.g. to send again a LAYOUT a restarted board forgot). At most
        ``max_recoveries`` recoveries; each is described in ``result.recoveries``. A text prompt
        (a str) is encoded by the device; once its TOKEN frames have shown the ids, a recovery goes on
        from the ids, else it sends the text again."""
        if self.hello is None:
            raise BoardError("generate_with_recovery needs a handshake first (it checks the model hash)")
        want = bytes(self.hello.model_hash)
        text = prompt_ids if isinstance(prompt_ids, str) else None
        prompt_ids = [] if text is not None else [int(i) for i in prompt_ids]
        shown: set[int] = set()

        def show(t):
            if t.step not in shown:
                shown.add(t.step)
                if on_token is not None:
                    on_token(t)

        total: RunResult | None = None
        events: list[dict] = []
        prompt, max_new, run = text if text is not None else prompt_ids, int(max_new_tokens), None
        try:
            while True:
                try:
                    if run is None:
                        run = self._start(prompt, max_new, temperature, top_p, seed, show, send_logits,
                                          frame_timeout, True, slide, all_logits)
                    self._collect(run)
                    part, err = run.finish(), None
                except (LinkLost, BoardReset, LinkTimeout) as e:
                    if e.partial is None:
                        raise
                    part, err = e.partial, e
                total = _merge(total, part, self.name)
                if total.interrupted or (err is None and total.complete):
                    break
                if len(events) >= max_recoveries:
                    if err is not None:
                        raise type(err)(f"{err} (gave up after {len(events)} recoveries)", total)
                    break
                seen = [t.step for t in total.tokens]
                ev = {"after": type(err).__name__ if err else "missing_steps",
                      "reason": str(err) if err else f"{len(total.missing_steps)} step(s) lost on the link",
                      "last_step": max(seen) if seen else None}
                if err is not None:
                    self._relink(reconnect, err, total, handshake_timeout, want)
                    if after_handshake is not None:
                        after_handshake(self.hello)
                    ev["board"] = self.hello.board
                    if (not isinstance(err, BoardReset) and run is not None and run.generation is not None
                            and self.hello.can_resend):
                        st = self._status()
                        if st is not None and st.generation == run.generation:
                            run.rebase(self.link)
                            run.lost_until(int(st.steps))
                            run.last_rx = run.last_probe = time.monotonic()
                            run.tries = self.resend_tries
                            ev["action"] = "continued the same generation (lost steps re-sent from the device)"
                            events.append(ev)
                            continue
                if text is not None and (prompt_ids := prompt_of(total.tokens)):
                    text = None                 # the device's ids for the text are known now
                run = None
                if text is not None:
                    ev["action"] = "generated again from the text prompt"
                    events.append(ev)
                    continue
                prompt, max_new = _resume_point(total, prompt_ids, int(max_new_tokens), float(temperature), slide)
                ev["action"] = (f"generated again (prompt + {len(prompt) - len(prompt_ids)} known tokens), "
                                f"steps {len(prompt) - 1}..{len(prompt) + max_new - 2}")
                events.append(ev)
        except KeyboardInterrupt:
            if total is None:
                raise
            total.interrupted = True
        total.recoveries = events
        if total.prompt_text is not None and not total.prompt_ids:
            total.prompt_ids = prompt_of(total.tokens)
        return total

    def _relink(self, reconnect, err, total, timeout: float, want: bytes) -> None:
        if reconnect is None and isinstance(err, LinkLost):
            raise LinkLost(f"{err} (no way to reconnect)", total)
        try:
            if reconnect is not None:
                self.link = reconnect()
            self.hello = None
            hello = self.handshake(timeout=timeout)
        except LinkTimeout as e:
            raise LinkTimeout(f"after '{err}': {e}", total) from None
        except DeviceError as e:
            raise DeviceError(f"after '{err}': {e}", e.error, total) from None
        except BoardError as e:
            raise LinkLost(f"after '{err}': {e}", total) from None
        have = bytes(hello.model_hash)
        if have != want:
            raise ModelMismatch(f"{hello.board or self.name} came back after '{err}' holding model "
                                f"{have.hex()[:16]}, but the generation began with model {want.hex()[:16]}: "
                                f"refusing to continue", total)


STATUS_TAG = 0xFFFE0000   # status queries name a step STATUS_TAG + k: no real step, echoed as unavailable


class _Run:
    """The state of one generation being collected."""

    def __init__(self, session: Session, res: RunResult, gen_msg, timeout: float, on_token):
        self.res = res
        self.gen_msg = gen_msg
        self.timeout = timeout
        self.on_token = on_token
        # a text prompt's length is the device's to find: up to the context (or on, sliding)
        limit = len(gen_msg.prompt_ids) - 1 + int(gen_msg.max_new_tokens) if isinstance(gen_msg, P.Generate) else 1 << 20
        if session.hello is not None and session.hello.max_seq_len and not gen_msg.slide:
            limit = min(limit, int(session.hello.max_seq_len))
        self.max_steps = max(1, min(limit, 1 << 20))
        self.generation: int | None = None
        self.seen: dict[int, P.Token] = {}
        self.expected = 0
        self.missing: set[int] = set()
        self.gone: set[int] = set()
        self.asked: dict[int, tuple[int, float]] = {}
        self.gen_sends = 0
        self.stop_sent = False
        self.probe_pending = False
        self.step_wall = 0.0               # the longest wall time seen between two new TOKENs
        self.last_token_t: float | None = None
        self.tries = session.resend_tries
        self.t0 = self.last_rx = self.last_probe = time.monotonic()
        self._acc = {k: 0 for k in stats_dict(P.DecoderStats())}
        self._acc_gaps: list = []
        self.rebase(session.link)

    def rebase(self, link) -> None:
        """Collect on ``link`` from now on; the old link's counters are kept."""
        old = getattr(self, "link", None)
        if old is not None:
            self._acc = {k: v + d for (k, v), d in zip(self._acc.items(), self._delta().values())}
            self._acc_gaps += old.stats.gaps[self.gaps_before:]
        self.link = link
        self.before = stats_dict(link.stats)
        self.gaps_before = self.gaps_checked = len(link.stats.gaps)
        self.resets_seen = link.stats.resets

    def _delta(self) -> dict:
        return _delta(stats_dict(self.link.stats), self.before)

    def lost_until(self, n: int) -> None:
        """Every step below n not seen yet is lost (frames arrive in order)."""
        n = min(n, self.max_steps)
        if n > self.expected:
            self.missing.update(range(self.expected, n))
            self.expected = n

    def finish(self) -> RunResult:
        res = self.res
        stats = self.link.stats
        res.wall_s = time.monotonic() - self.t0
        res.stats = stats_dict(stats)
        res.run_stats = {k: self._acc[k] + v for k, v in self._delta().items()}
        res.gap_pairs = self._acc_gaps + stats.gaps[self.gaps_before:]
        res.tokens.sort(key=lambda t: t.step)
        if res.prompt_text is not None and not res.prompt_ids:
            res.prompt_ids = prompt_of(res.tokens)
        res.missing_steps = sorted(self.missing)
        res.generation = self.generation
        return res


def prompt_of(tokens) -> list[int]:
    """The prompt ids a generation's TOKEN frames show (step s reads prompt id s, up to the first
    step that produces a token), or [] while one of those steps is missing."""
    ids = []
    for i, t in enumerate(sorted(tokens, key=lambda t: t.step)):
        if t.step != i:
            return []
        ids.append(t.in_id)
        if t.out_id is not None:
            return ids
    return []


REFILL_WINDOW = 32   # the device's ring (FLM_TOKEN_RING): a refill that ends within it can be patched by RESEND


def _resume_point(total: RunResult, prompt_ids: list[int], max_new: int, temperature: float,
                  slide: bool = False):
    """(prompt, max_new_tokens) of the generation that recomputes what ``total`` lacks.

    Greedy runs resume from the prompt plus the generated tokens known before the first gap;
    sampled and sliding runs replay from the prompt (the seed restarts the sampler). Without the DONE the
    run goes to the end (the device's DONE is needed); with it, only as far as the last missing
    step within REFILL_WINDOW steps of the first, so every step the refill computes is still
    kept on the device when it ends, and a loss in the refill itself can be re-sent."""
    n = len(prompt_ids)
    prompt = list(prompt_ids)
    if temperature <= 0 and not slide:
        by = {t.step: t for t in total.tokens}
        known, s = [], n - 1
        while s in by and by[s].out_id is not None:
            known.append(by[s].out_id)
            s += 1
        k = max(len(known) - 1, 0)    # recompute the last known token too: a cross-check
        prompt += known[:k]
    if total.done is None or not total.missing_steps:
        return prompt, max_new - (len(prompt) - n)
    first = total.missing_steps[0]
    end = max(m for m in total.missing_steps if m < first + REFILL_WINDOW)
    return prompt, max(end + 1 - (len(prompt) - 1), 1)


def _merge(total: RunResult | None, part: RunResult, name: str) -> RunResult:
    """``part`` (a later generation covering the same steps) merged into ``total``."""
    if total is None or total is part:
        return part
    by = {t.step: t for t in total.tokens}
    for t in part.tokens:
        o = by.get(t.step)
        if o is None:
            by[t.step] = t
            continue
        if (o.in_id != t.in_id or o.logits_crc != t.logits_crc
                or (o.out_id is not None and t.out_id is not None and o.out_id != t.out_id)):
            raise Diverged(f"{name}: step {t.step} came out differently when generated again (input "
                           f"{o.in_id}/{t.in_id}, logits crc {o.logits_crc:08x}/{t.logits_crc:08x}, "
                           f"output {o.out_id}/{t.out_id}): refusing to merge the runs", total)
    toks = sorted(by.values(), key=lambda t: t.step)
    total.tokens = toks
    if part.done is not None and total.done is None:   # (a refill that stopped early has its own DONE)
        d = part.done
        total.done = P.Done(d.steps, sum(t.out_id is not None for t in toks), d.reason,
                            sum(sum(t.us) for t in toks),
                            tuple(sum(t.us[i] for t in toks) for i in range(len(P.PHASES))))
        total.done_from_host = True
    have = set(by)
    if total.done is not None:
        total.missing_steps = [s for s in range(int(total.done.steps)) if s not in have]
    else:
        total.missing_steps = sorted((set(total.missing_steps) | set(part.missing_steps)) - have)
    total.run_stats = {k: total.run_stats.get(k, 0) + v for k, v in part.run_stats.items()}
    total.stats = part.stats
    total.gap_pairs = list(total.gap_pairs) + list(part.gap_pairs)
    for k, v in part.logits.items():
        total.logits.setdefault(k, v)
    total.logs += part.logs
    total.duplicate_steps += part.duplicate_steps
    total.resent_steps += part.resent_steps
    total.conflicts += part.conflicts
    total.device_errors += part.device_errors
    total.notes += part.notes
    total.resend_requests += part.resend_requests
    total.wall_s += part.wall_s
    total.interrupted = total.interrupted or part.interrupted
    total.harness = list(total.harness) + list(part.harness)
    total.hello = part.hello or total.hello
    return total


def _error_text(err: P.Error) -> str:
    return f"{err.text} ({err.name})" if err.text else err.name


def _io_reason(e: OSError) -> str:
    text = e.strerror or str(e) or type(e).__name__
    return text.splitlines()[0]
