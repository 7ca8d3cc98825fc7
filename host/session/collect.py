"""Collecting one generation's frames (``Collector``, a part of ``Session``): TOKEN frames in step
order, a DONE, and RESEND for every lost step while the device keeps it (docs/formats.md section
2.1). A TOKEN whose ``step`` skips ahead marks the skipped steps missing; a DONE whose ``steps`` is
beyond the last step seen marks the tail missing."""
from __future__ import annotations

import time

from ..errors import BoardError
from ..link import messages as P
from ..link.frames import DecoderStats
from .errors import BoardReset, DeviceError, LinkLost, LinkTimeout, error_text
from .result import RunResult, _delta, prompt_of, stats_dict


class Collector:
    """The collecting half of ``Session`` (which provides ``link``, ``name``, ``hello``, ``_send``,
    ``_recv``)."""

    resend_timeout = 0.5   # s, at most, to wait for an answer to RESEND before asking for a step again
    _rtt = 0.0             # the last status query's round trip (s)
    resend_tries = 6       # times one step is asked for before it is reported missing (a TOKEN of about 60 bytes
                           # crosses a link losing 0.6 % of bytes whole 70 % of the time: 6 asks leave 1 in 1,000)
    probe_interval = 0.5   # s of silence mid-generation before the host asks the device where it is

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
                res.device_errors.append(error_text(m))
                if not run.seen and res.done is None:
                    run.last_probe = float("-inf")   # it may have been the GENERATE: probe when quiet
            elif m.code == 6 and run.gen_sends > 1:
                res.device_errors.append(error_text(m))   # a repeated GENERATE met the running one
            else:
                raise DeviceError(f"{self.hello.board if self.hello else self.name} refused the "
                                  f"generation: {error_text(m)}", m, run.finish())
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


STATUS_TAG = 0xFFFE0000   # status queries name a step STATUS_TAG + k: no real step, echoed as unavailable


class _Run:
    """The state of one generation being collected."""

    def __init__(self, session, res: RunResult, gen_msg, timeout: float, on_token):   # session: a Session
        self.res = res
        self.gen_msg = gen_msg
        self.timeout = timeout
        self.on_token = on_token
        # a text prompt's length is the device's to find: up to the context (or on, sliding)
        limit = 1 << 20 if gen_msg.is_text else len(gen_msg.prompt) - 1 + int(gen_msg.max_new_tokens)
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
        self._acc = {k: 0 for k in stats_dict(DecoderStats())}
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

