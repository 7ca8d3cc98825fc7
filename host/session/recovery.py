"""Surviving a lost link or a board reset (``Recovery``, a part of ``Session``): reconnect,
handshake again, continue the generation the device still keeps or generate again what could not
be re-sent, and merge the runs step by step. ``Policy`` says how."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import BoardError
from ..link.messages import Generate, Hello
from .errors import BoardReset, DeviceError, Diverged, LinkLost, LinkTimeout, ModelMismatch
from .result import RunResult, done_from_steps, prompt_of


@dataclass(frozen=True)
class Policy:
    """How a generation survives a vanished port, a board that restarted or went silent, and lost
    steps: at most ``retries`` recoveries; ``reconnect()`` returns a new ``Link`` (reopen the port,
    restart a virtual board; None: the same link again, as for a board that reset behind the same
    port); ``after_handshake(hello)`` runs after every re-handshake (e.g. to send again a LAYOUT a
    restarted board forgot)."""
    retries: int = 3
    frame_timeout: float | None = None      # s of silence mid-generation (None: the session's)
    handshake_timeout: float = 5.0          # s to wait for HELLO after a reconnect
    reconnect: Callable | None = None
    after_handshake: Callable[[Hello], None] | None = None


class Recovery:
    """The recovering half of ``Session``."""

    # -- surviving a lost link or a board reset ----------------------------------------------
    def generate_with_recovery(self, request: Generate, policy: Policy = Policy(),
                               on_token: Callable | None = None) -> RunResult:
        """``generate`` that survives a vanished port (LinkLost), a board that restarted
        (BoardReset) or went silent (LinkTimeout), and steps that could not be re-sent, as
        ``policy`` says.

        After a reconnect the host handshakes again and refuses to go on (ModelMismatch) if the
        board's model hash is not the one of the first handshake. If the device still keeps this
        generation it continues there (RESEND); otherwise the missing steps are generated again:
        greedy runs resume from the prompt plus the tokens known so far, sampled and sliding runs
        replay from the prompt with the same seed (the device's sampler is deterministic; a slid
        window is not the computation of a longer prompt). Every step both runs computed must agree
        (input id, logits CRC, output id), or BoardError. Each recovery is described in
        ``result.recoveries``. A text prompt is encoded by the device; once its TOKEN frames have
        shown the ids, a recovery goes on from the ids, else it sends the text again."""
        if self.hello is None:
            raise BoardError("generate_with_recovery needs a handshake first (it checks the model hash)")
        want = bytes(self.hello.model_hash)
        base = request               # the request, with the prompt as ids once the device showed them
        shown: set[int] = set()

        def show(t):
            if t.step not in shown:
                shown.add(t.step)
                if on_token is not None:
                    on_token(t)

        total: RunResult | None = None
        events: list[dict] = []
        part, run = request, None
        try:
            while True:
                try:
                    if run is None:
                        run = self._start(part, show, policy.frame_timeout, resend=True)
                    self._collect(run)
                    got, err = run.finish(), None
                except (LinkLost, BoardReset, LinkTimeout) as e:
                    if e.partial is None:
                        raise
                    got, err = e.partial, e
                total = _merge(total, got, self.name)
                if total.interrupted or (err is None and total.complete):
                    break
                if len(events) >= policy.retries:
                    if err is not None:
                        raise type(err)(f"{err} (gave up after {len(events)} recoveries)", total)
                    break
                seen = [t.step for t in total.tokens]
                ev = {"after": type(err).__name__ if err else "missing_steps",
                      "reason": str(err) if err else f"{len(total.missing_steps)} step(s) lost on the link",
                      "last_step": max(seen) if seen else None}
                if err is not None:
                    self._relink(policy.reconnect, err, total, policy.handshake_timeout, want)
                    if policy.after_handshake is not None:
                        policy.after_handshake(self.hello)
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
                if base.is_text and (ids := prompt_of(total.tokens)):
                    base = replace(base, prompt=ids)     # the device's ids for the text are known now
                run = None
                if base.is_text:
                    ev["action"] = "generated again from the text prompt"
                    events.append(ev)
                    continue
                part = _resume_point(total, base)
                n = len(part.prompt)
                ev["action"] = (f"generated again (prompt + {n - len(base.prompt)} known tokens), "
                                f"steps {n - 1}..{n + part.max_new_tokens - 2}")
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


REFILL_WINDOW = 32   # the device's ring (FLM_TOKEN_RING): a refill that ends within it can be patched by RESEND


def _resume_point(total: RunResult, request: Generate) -> Generate:
    """The request that recomputes what ``total`` lacks (``request``: the prompt as ids).

    Greedy runs resume from the prompt plus the generated tokens known before the first gap;
    sampled and sliding runs replay from the prompt (the seed restarts the sampler). Without the DONE the
    run goes to the end (the device's DONE is needed); with it, only as far as the last missing
    step within REFILL_WINDOW steps of the first, so every step the refill computes is still
    kept on the device when it ends, and a loss in the refill itself can be re-sent."""
    n = len(request.prompt)
    prompt = list(request.prompt)
    if request.temperature <= 0 and not request.slide:
        by = {t.step: t for t in total.tokens}
        known, s = [], n - 1
        while s in by and by[s].out_id is not None:
            known.append(by[s].out_id)
            s += 1
        k = max(len(known) - 1, 0)    # recompute the last known token too: a cross-check
        prompt += known[:k]
    if total.done is None or not total.missing_steps:
        return replace(request, prompt=prompt, max_new_tokens=request.max_new_tokens - (len(prompt) - n))
    first = total.missing_steps[0]
    end = max(m for m in total.missing_steps if m < first + REFILL_WINDOW)
    return replace(request, prompt=prompt, max_new_tokens=max(end + 1 - (len(prompt) - 1), 1))


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
        if (o.in_id != t.in_id or (o.logits_crc and t.logits_crc and o.logits_crc != t.logits_crc)
                or (o.out_id is not None and t.out_id is not None and o.out_id != t.out_id)):
            raise Diverged(f"{name}: step {t.step} came out differently when generated again (input "
                           f"{o.in_id}/{t.in_id}, logits crc {o.logits_crc:08x}/{t.logits_crc:08x}, "
                           f"output {o.out_id}/{t.out_id}): refusing to merge the runs", total)
    toks = sorted(by.values(), key=lambda t: t.step)
    total.tokens = toks
    if part.done is not None and total.done is None:   # (a refill that stopped early has its own DONE)
        d = part.done
        total.done = done_from_steps(toks, d.steps, d.reason)
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
