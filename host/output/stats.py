"""What a run shows and writes: the live per-step table, the end summary, JSON / CSV / PNG.

Every number comes from the device's own per-phase µs (TOKEN frames), never from the host's
wall clock, and is printed together with the board name and the clock source the HELLO named
("host clock", "chip timer", "emulated timer").  Host wall time is reported once, labelled.

Step kinds: a *prefill* step is a prompt step whose output is unused (out_id None: by default
the device skips its output layer); a *decode* step produced a token (the last prompt step and
every later one), so "decode tok/s" is the generated tokens divided by the device time of the
steps that produced them, and "prefill tok/s" the prompt tokens run per second of prefill time.
Each group reports the output-layer rows its steps computed (TOKEN head_rows), as a share of
out_vocab: 0 for a skipped head, below 100 % for a pruned greedy scan.

Forward passes (protocol version 3, docs/formats.md section 2.4): the prompt runs in chunks of up to
the batch and drafted tokens are verified several at a time, so a TOKEN's µs and bytes are those of
the whole pass it came from, repeated in each step the pass produced. Per-step figures here are a
step's share of its pass (the pass's figures divided by its steps: run_result.step_share), so every
sum counts each pass once; ``passes`` summarizes the passes themselves (per chunk µs and bytes,
bytes per prompt token, acceptance of drafts).
"""
from __future__ import annotations

import codecs
import csv
import io
import json
import os
import re
import tempfile
import textwrap
from pathlib import Path

from converter.tokenizer import visible_text

from .protocol import PHASES, TIERS, Hello
from .run_result import step_share
from .session import RunResult, clock_name

PHASE_HEADERS = {"embed": "embed µs", "attention": "attention µs", "ffn": "FFN µs", "ple": "PLE µs",
                 "output": "output µs", "sampling": "sampling µs", "draft": "draft µs"}
PHASE_COLORS = {"embed": "#4c72b0", "attention": "#dd8452", "ffn": "#55a868", "ple": "#937860",
                "output": "#c44e52", "sampling": "#8172b3", "draft": "#8c8c8c"}
PLE_INDEX = PHASES.index("ple")
DRAFT_INDEX = PHASES.index("draft")


def shown_phases(tokens, ple: bool = False, draft: bool = False) -> list[str]:
    """The phases a table shows: all seven, without ``ple`` for a model that has no PLE (the caller
    says so, or every step so far spent 0 µs there), without ``draft`` when nothing was drafted
    (likewise). JSON and CSV always keep all seven."""
    ple = ple or any(t.us[PLE_INDEX] for t in tokens)
    draft = draft or any(t.us[DRAFT_INDEX] for t in tokens)
    return [p for p in PHASES if (p != "ple" or ple) and (p != "draft" or draft)]


# ---------------------------------------------------------------------------------------------
# numbers

def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]; None when empty."""
    v = sorted(float(x) for x in values)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def step_total(tok) -> float:
    """A step's µs: its share of its forward pass's (all of it for a pass of one token)."""
    return sum(step_share(tok)["us"])


def group_stats(tokens, out_vocab: int | None = None) -> dict:
    """p50/p95/mean per phase and of the step total, mean bytes per tier, and the output-layer rows
    computed (mean, and % of out_vocab when known), for some steps (each its share of its pass)."""
    out: dict = {"steps": len(tokens), "phases": {}, "bytes": {}}
    shares = [step_share(t) for t in tokens]
    cols = {p: [sh["us"][i] for sh in shares] for i, p in enumerate(PHASES)}
    cols["total"] = [sum(sh["us"]) for sh in shares]
    for name, vals in cols.items():
        out["phases"][name] = {"p50": percentile(vals, 50), "p95": percentile(vals, 95),
                               "mean": (sum(vals) / len(vals)) if vals else None,
                               "sum": round(sum(vals))}
    for i, tier in enumerate(TIERS):
        vals = [sh["bytes"][i] for sh in shares]
        out["bytes"][tier] = (sum(vals) / len(vals)) if vals else None
    rows = [t.head_rows for t in tokens]
    mean = sum(rows) / len(rows) if rows else None
    out["head_rows"] = {"mean": mean, "p50": percentile(rows, 50), "max": max(rows) if rows else None,
                        "pct_of_out_vocab": 100.0 * mean / out_vocab if mean is not None and out_vocab else None}
    return out


def _rate(n: int, us: int) -> float | None:
    return n / (us / 1e6) if n and us > 0 else None


EMULATED_NOTE = ("the emulated timer advances with rp2040js's instruction cycle counts plus the stalls of "
                 "the harness's XIP model (16 KB 2-way XIP cache, one QSPI line transfer per miss at the "
                 "SSI settings the firmware wrote: host/emu/xip.mjs)")
EMULATED_NOTE_NO_XIP = ("the emulated timer advances with rp2040js's instruction cycle counts; this run had "
                        "the XIP model off (--xip-model off), so a flash read cost what an SRAM read costs and "
                        "flash-read time is a lower bound")
XIP_FIELDS = ("hits", "misses", "fetch_misses", "stall_cycles")


def harness_rows(result: RunResult) -> list[dict]:
    """Per forward pass the emulator harness measured (its marks name the pass's first step, and cover
    proposing its drafts): its counts of the bytes the core read per tier beside the engine's own
    counters from the pass's first TOKEN frame, plus cycles, emulated µs and host ms, the steps the
    pass produced and (XIP model on) the pass's XIP cache hits, misses (line transfers; fetch_misses
    of them instruction fetches), the cycles they stalled the core and the cycles one miss costs."""
    by = {int(r["step"]): r for r in result.harness if "step" in r}
    rows = []
    for t in sorted(result.tokens, key=lambda t: t.step):
        h = by.get(int(t.step))
        if h is None or t.chunk != t.step:
            continue
        hb = [int(b) for b in h.get("bytes", [])]
        eb = [int(b) for b in t.bytes_read]
        rows.append({"step": int(t.step), "kind": "prefill" if t.out_id is None else "decode",
                     "pass": t.kind, "tokens": t.chunk_len, "steps": t.chunk_used,
                     "engine_bytes": dict(zip(TIERS, eb)),
                     "harness_bytes": dict(zip(TIERS, hb)),
                     "agree": hb == eb,
                     "cycles": int(h.get("cycles", 0)), "emulated_us": float(h.get("us", 0.0)),
                     "wall_ms": float(h.get("wall_ms", 0.0)),
                     "xip": {k: int(v) for k, v in h["xip"].items()} if h.get("xip") else None})
    return rows


def harness_summary(result: RunResult) -> dict | None:
    """Agreement of the harness's per-region read counts with the engine's, and per-token cost on
    the emulator (decode passes, per step they produced); None when the run had no harness (not an
    emulated board)."""
    if not result.harness:
        return None
    rows = harness_rows(result)
    gen = [r for r in rows if r["kind"] == "decode"] or rows

    def stats(vals):
        return {"p50": percentile(vals, 50), "mean": (sum(vals) / len(vals)) if vals else None}

    xg = [r for r in gen if r["xip"]]
    xip = None
    if xg:
        xip = {k: stats([r["xip"][k] / r["steps"] for r in xg]) for k in XIP_FIELDS}
        xip["miss_cycles"] = xg[-1]["xip"]["miss_cycles"]
        xip["stall_share"] = sum(r["xip"]["stall_cycles"] for r in xg) / max(1, sum(r["cycles"] for r in xg))
    n = sum(r["steps"] for r in gen)
    return {"steps": len(rows), "agree_steps": sum(r["agree"] for r in rows),
            "mismatch_steps": [r["step"] for r in rows if not r["agree"]],
            "cycles_per_token": stats([r["cycles"] / r["steps"] for r in gen]),
            "emulated_us_per_token": stats([r["emulated_us"] / r["steps"] for r in gen]),
            "wall_ms_per_token": stats([r["wall_ms"] / r["steps"] for r in gen]),
            "harness_bytes_per_token": {tier: (sum(r["harness_bytes"][tier] for r in gen) / n) if n else None
                                        for tier in TIERS},
            "xip_per_token": xip}


def forward_passes(tokens) -> list[dict]:
    """The forward passes of a run, from the TOKEN frames that arrived (a pass's TOKENs share its
    first step and figures): kind, first step, tokens run, steps produced (and how many of those
    arrived), its prompt steps, µs per phase (proposing its drafts: "draft"), bytes per tier."""
    groups: dict = {}
    for t in sorted(tokens, key=lambda t: t.step):
        key = (t.chunk, t.chunk_len, t.chunk_used, t.kind, tuple(t.us), tuple(t.bytes_read))
        groups.setdefault(key, []).append(t)
    out = []
    for (first, n, used, kind, us, nbytes), ts in groups.items():
        out.append({"first": first, "kind": kind, "tokens": n, "steps": used, "steps_seen": len(ts),
                    "prompt_steps": sum(t.out_id is None for t in ts),
                    "us": dict(zip(PHASES, us)), "total_us": sum(us), "bytes": dict(zip(TIERS, nbytes))})
    return out


def pass_summary(result: RunResult) -> dict:
    """Prefill and decoding by forward pass: the prompt's passes (per pass µs and bytes, and per
    prompt token), and the passes after it (acceptance of drafts, tokens per verifying pass, µs and
    bytes per emitted token with drafting included; drafting's own share of the bytes from DONE)."""
    ps = forward_passes(result.tokens)
    pre = [p for p in ps if p["prompt_steps"]]          # passes that ran prompt tokens
    dec = [p for p in ps if not p["prompt_steps"]]      # every step they produced is a generated token
    ver = [p for p in dec if p["kind"] == "verify"]
    n_pre = sum(p["tokens"] for p in pre)
    emitted = sum(p["steps"] for p in dec)

    def per(items, n, key):
        return {tier: (sum(p[key][tier] for p in items) / n if n else None) for tier in TIERS}
    drafted, accepted = sum(p["tokens"] - 1 for p in ver), sum(p["steps"] - 1 for p in ver)
    dec_us = sum(p["total_us"] for p in dec)
    done = result.done
    return {
        "batch": result.batch or (result.hello.batch if result.hello is not None else None),
        "speculate": result.speculate, "draft_k": result.draft_k,
        "prefill": {"passes": len(pre), "tokens": n_pre,
                    "tokens_per_pass": n_pre / len(pre) if pre else None,
                    "us_per_pass": sum(p["total_us"] for p in pre) / len(pre) if pre else None,
                    "us_per_token": sum(p["total_us"] for p in pre) / n_pre if n_pre else None,
                    "bytes_per_pass": per(pre, len(pre), "bytes"),
                    "bytes_per_token": per(pre, n_pre, "bytes"),
                    "chunks": [{"first": p["first"], "tokens": p["tokens"], "us": p["total_us"], "bytes": p["bytes"]}
                               for p in pre]},
        "decode": {"passes": len(dec), "emitted": emitted, "verify_passes": len(ver),
                   "drafted": drafted, "accepted": accepted,
                   "acceptance": accepted / drafted if drafted else None,
                   "tokens_per_verify_pass": sum(p["steps"] for p in ver) / len(ver) if ver else None,
                   "tokens_per_pass": emitted / len(dec) if dec else None,
                   "us_per_token": dec_us / emitted if emitted else None,
                   "tok_per_s": emitted / (dec_us / 1e6) if emitted and dec_us > 0 else None,
                   "draft_us_per_token": sum(p["us"]["draft"] for p in dec) / emitted if emitted else None,
                   "bytes_per_token": per(dec, emitted, "bytes"),
                   "draft_bytes_per_token": ({tier: b / emitted for tier, b in zip(TIERS, done.draft_bytes)}
                                             if done is not None and emitted and not result.done_from_host else None)},
    }


def summarize(result: RunResult) -> dict:
    hello = result.hello
    prompt, gen = result.prompt_steps, result.generated_steps
    out_vocab = hello.out_vocab if hello is not None else None
    ps, gs = group_stats(prompt, out_vocab), group_stats(gen, out_vocab)
    gen_us = gs["phases"]["total"]["sum"]
    prompt_us = ps["phases"]["total"]["sum"]
    done = result.done
    harness = harness_summary(result)
    return {
        "board": result.board,
        "clock": result.clock,
        "fw_version": hello.fw_version if hello is not None else None,
        "model_hash": bytes(hello.model_hash).hex() if hello is not None else None,
        "layout_id": hello.layout_id if hello is not None else None,
        "bit_exact": hello.bit_exact if hello is not None else None,
        "prompt_tokens": len(result.prompt_ids),
        "steps_received": len(result.tokens),
        "generated_tokens": len(gen),
        "reason": done.reason if done is not None else ("interrupted" if result.interrupted else "incomplete"),
        "interrupted": result.interrupted,
        "missing_steps": list(result.missing_steps),
        "duplicate_steps": list(result.duplicate_steps),
        "frame_gaps": result.frame_gaps,
        "bad_frames": result.bad_frames,
        "out_vocab": out_vocab,
        "flags": {"slide": bool(result.slide), "all_logits": bool(result.all_logits)},
        "prefill": ps,
        "decode": gs,
        # device time only: generated tokens over the µs of the steps that produced them (drafting included)
        "tokens_per_s": _rate(len(gen), gen_us),
        "prefill_tok_per_s": _rate(len(prompt), prompt_us),
        "bytes_per_token": gs["bytes"],
        "device_total_us": int(done.total_us) if done is not None else None,
        "device_steps_us": int(sum(step_total(t) for t in result.tokens)),
        "host_wall_s": result.wall_s,
        "passes": pass_summary(result),
        "harness": harness,
        "timing_note": timing_note(result.clock, harness),
    }


def timing_note(clock: str, harness: dict | None) -> str | None:
    """What the emulated timer counts (with or without the XIP model); None for other clocks."""
    if clock != "emulated timer":
        return None
    return EMULATED_NOTE if harness is None or harness["xip_per_token"] else EMULATED_NOTE_NO_XIP


# ---------------------------------------------------------------------------------------------
# text helpers

_SURROGATE = re.compile(r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])")


def piece_repr(piece: bytes | None) -> str:
    """A token piece shown safely: Python repr of its text, bytes that are not UTF-8 as \\xNN."""
    if piece is None:
        return ""
    return _SURROGATE.sub(r"\1\\x\2", repr(bytes(piece).decode("utf-8", "surrogateescape")))


def _fmt(v, nd: int = 0) -> str:
    if v is None:
        return "–"
    if nd == 0:
        return f"{v:,.0f}"
    return f"{v:,.{nd}f}"


def where(result_or_hello: RunResult | Hello | None) -> str:
    """'board X, clock Y' for a RunResult or a Hello (None: before the handshake)."""
    if isinstance(result_or_hello, RunResult):
        return f"board {result_or_hello.board}, {result_or_hello.clock}"
    h = result_or_hello
    if h is None:
        return f"board ?, {clock_name(None)}"
    return f"board {h.board or '?'}, {clock_name(h.clock)}"


# ---------------------------------------------------------------------------------------------
# live view

def pass_label(t) -> str:
    """The forward pass a step came from, in a few characters: "1" (a pass of its own), "p4" (a
    prefill chunk of 4 tokens), "v5:3" (a verifying pass of 5 tokens that produced 3 steps)."""
    if t.kind == "verify":
        return f"v{t.chunk_len}:{t.chunk_used}"
    return f"p{t.chunk_len}" if t.kind == "prefill" else "1"


class LiveView:
    """Shows each TOKEN as it arrives: a rich ``Live`` table on a terminal, one line per step
    otherwise (pipes, CI logs).  Use as a context manager; pass ``on_token`` to Session.generate."""

    def __init__(self, console, hello=None, piece_of=None, prompt_text: str = "", max_rows: int | None = None,
                 ple: bool = False, draft: bool = False):
        self.console = console
        self.hello = hello
        self.ple = ple                    # the model has Per-Layer Embeddings: always show their column
        self.draft = draft                # speculative decoding: always show the drafting column
        self.piece_of = piece_of          # id -> bytes, for showing prompt steps' input tokens
        self.prompt_text = prompt_text
        self.tokens: list = []
        self.text = ""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._live = None
        self.max_rows = max_rows
        self._printed_header = False

    # rows ------------------------------------------------------------------------------------
    def _token_cell(self, t):
        from rich.text import Text
        if t.out_id is not None:
            return Text(piece_repr(t.piece))
        shown = None
        if self.piece_of is not None:
            try:
                shown = self.piece_of(t.in_id)
            except Exception:       # a display nicety must never break a run
                shown = None
        return Text(piece_repr(shown) if shown is not None else f"#{t.in_id}", style="dim")

    def _row(self, t, phases) -> list[str]:
        """step, pos, pass, then the step's share of its pass's µs per phase, total µs and bytes per
        tier, and its head rows."""
        sh = step_share(t)
        return ([str(t.step), str(t.pos), pass_label(t)] + [f"{sh['us'][PHASES.index(p)]:,.0f}" for p in phases]
                + [f"{sum(sh['us']):,.0f}"] + [f"{b:,.0f}" for b in sh["bytes"]] + [f"{t.head_rows:,}"])

    def render(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"per-step device time ({where(self.hello)})", title_justify="left",
                      expand=False)
        table.add_column("step", justify="right")
        table.add_column("pos", justify="right")
        table.add_column("pass", justify="right")
        table.add_column("token", overflow="ellipsis", max_width=18, no_wrap=True)
        phases = shown_phases(self.tokens, self.ple, self.draft)
        for p in phases:
            table.add_column(PHASE_HEADERS[p], justify="right")
        table.add_column("total µs", justify="right", style="bold")
        for tier in TIERS:
            table.add_column(f"{tier} B", justify="right")
        table.add_column("head rows", justify="right")
        rows = self.max_rows or max(5, (self.console.size.height or 30) - 12)
        for t in self.tokens[-rows:]:
            r = self._row(t, phases)
            style = "dim" if t.out_id is None else None
            table.add_row(r[0], r[1], r[2], self._token_cell(t), *r[3:], style=style)
        text = Text(self.prompt_text, style="dim")
        text.append(visible_text(self.text), style="bold")
        return Group(table, Panel(text, title="text", title_align="left"))

    # streaming -------------------------------------------------------------------------------
    def on_token(self, t) -> None:
        self.tokens.append(t)
        if t.out_id is not None:
            self.text += self._utf8.decode(bytes(t.piece))
        if self._live is not None:
            self._live.update(self.render())
        else:
            self._print_line(t)

    def _print_line(self, t) -> None:
        if not self._printed_header:   # the columns are fixed by the first step
            self._printed_header = True
            self._line_phases = shown_phases(self.tokens, self.ple, self.draft)
            head = (f"{'step':>5} {'pos':>5} {'pass':>6} {'token':<16} "
                    + " ".join(f"{PHASE_HEADERS[p]:>14}" for p in self._line_phases)
                    + f" {'total µs':>10} " + " ".join(f"{tier + ' B':>10}" for tier in TIERS)
                    + f" {'head rows':>9}   [{where(self.hello)}; µs and bytes: the step's share of its pass]")
            self.console.print(head, markup=False, highlight=False, soft_wrap=True)
        n = len(self._line_phases)
        r = self._row(t, self._line_phases)
        tok = self._token_cell(t).plain
        line = (f"{r[0]:>5} {r[1]:>5} {r[2]:>6} {tok[:16]:<16} " + " ".join(f"{v:>14}" for v in r[3:3 + n])
                + f" {r[3 + n]:>10} " + " ".join(f"{v:>10}" for v in r[4 + n:-1]) + f" {r[-1]:>9}")
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def __enter__(self) -> "LiveView":
        if self.console.is_terminal:
            from rich.live import Live
            self._live = Live(self.render(), console=self.console, refresh_per_second=8,
                              transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        self.text += self._utf8.decode(b"", final=True)
        if self._live is not None:
            self._live.update(self.render())
            self._live.stop()
            self._live = None
        elif self.tokens:
            from rich.text import Text
            t = Text("text: ", style="bold")
            t.append(self.prompt_text, style="dim")
            t.append(visible_text(self.text))
            self.console.print(t)


# ---------------------------------------------------------------------------------------------
# summary

def summary_renderables(result: RunResult) -> list:
    from rich.table import Table
    from rich.text import Text

    s = summarize(result)
    at = where(result)
    out = []
    table = Table(title=f"device µs per step — {at}", title_justify="left")
    table.add_column("phase", no_wrap=True)
    for grp in ("prefill", "decode"):
        table.add_column(f"{grp} steps (n={s[grp]['steps']})\np50 / p95 / mean", justify="right", no_wrap=True)
    for name in shown_phases(result.tokens) + ["total"]:
        label = PHASE_HEADERS.get(name, "total µs")
        cells = []
        for grp in ("prefill", "decode"):
            ph = s[grp]["phases"][name]
            cells.append(f"{_fmt(ph['p50'])} / {_fmt(ph['p95'])} / {_fmt(ph['mean'], 1)}")
        table.add_row(label, *cells, style="bold" if name == "total" else None)
    table.add_row("head rows (% of out_vocab)", *[_rows_cell(s[grp]["head_rows"]) for grp in ("prefill", "decode")])
    out.append(table)

    lines = []
    tps = s["tokens_per_s"]
    gen_us = s["decode"]["phases"]["total"]["sum"]
    draft_us = s["decode"]["phases"]["draft"]["sum"]
    lines.append(f"decode: {s['generated_tokens']} tokens in {gen_us:,} µs of device time"
                 + (f" (drafting {draft_us:,} µs)" if draft_us else "")
                 + (f" = {tps:,.2f} tok/s" if tps else "") + f"  [{at}]")
    pps = s["prefill_tok_per_s"]
    if s["prefill"]["steps"]:
        lines.append(f"prefill: {s['prefill']['steps']} prompt tokens in {s['prefill']['phases']['total']['sum']:,} µs"
                     + (f" = {pps:,.2f} tok/s" if pps else "") + f"  [{at}]")
    for grp in ("prefill", "decode"):
        b = s[grp]["bytes"]
        if b["flash"] is not None:
            lines.append(f"bytes read per {grp} token: "
                         + ", ".join(f"{tier} {b[tier]:,.0f}" for tier in TIERS) + f"  [{at}]")
    lines += pass_lines(s["passes"], at)
    h = s.get("harness")
    if h is not None:
        hb, eb = h["harness_bytes_per_token"], s["bytes_per_token"]
        lines.append("emulator harness, bytes the core read per decode token: "
                     + ", ".join(f"{tier} {hb[tier]:,.0f} (engine {eb[tier]:,.0f})" for tier in TIERS
                                 if hb[tier] is not None and eb[tier] is not None)
                     + f" — agree on {h['agree_steps']}/{h['steps']} steps")
        x = h["xip_per_token"]
        if x is not None:
            lines.append(f"XIP cache per decode token: p50 {_fmt(x['hits']['p50'])} hits, {_fmt(x['misses']['p50'])} "
                         f"misses ({_fmt(x['fetch_misses']['p50'])} of them instruction fetches) stalling "
                         f"{_fmt(x['stall_cycles']['p50'])} cycles = {x['stall_share'] * 100:.1f} % of the token "
                         f"(one miss {x['miss_cycles']} cycles)")
        lines.append(f"emulated cycles per decode token: p50 {_fmt(h['cycles_per_token']['p50'])} "
                     f"({_fmt(h['emulated_us_per_token']['p50'])} µs emulated, XIP model "
                     f"{'on' if x is not None else 'off'}); emulator wall time per token: "
                     f"p50 {_fmt(h['wall_ms_per_token']['p50'], 1)} ms (host clock)")
    if s["device_total_us"] is not None:
        lines.append(f"device total (DONE): {s['device_total_us']:,} µs, stop reason {s['reason']}  [{at}]")
    lines.append(f"host wall time: {s['host_wall_s']:.3f} s (host clock, includes the serial link)")
    out.extend(Text(line) for line in lines)
    if result.hello is not None:
        out.append(bit_exact_line(result.hello))
    if h is not None and h["mismatch_steps"]:
        out.append(Text(f"harness and engine byte counters differ on step(s) {h['mismatch_steps'][:20]}",
                        style="bold yellow"))
    if s.get("timing_note"):
        out.append(Text(f"note: {s['timing_note']}", style="dim"))
    if s["missing_steps"] or s["frame_gaps"] or s["bad_frames"]:
        steps = s["missing_steps"]
        shown = ", ".join(map(str, steps[:20])) + (" ..." if len(steps) > 20 else "")
        out.append(Text(f"link: {len(steps)} step(s) lost [{shown or 'none'}], {s['frame_gaps']} seq gap(s), "
                        f"{s['bad_frames']} bad frame(s) — numbers above cover the steps that arrived",
                        style="bold yellow"))
    if result.interrupted:
        out.append(Text("interrupted: STOP sent, showing what arrived", style="yellow"))
    return out


def pass_lines(pa: dict, at: str) -> list[str]:
    """The summary's lines on forward passes: prefill chunks, and speculative decoding."""
    out = []
    pre, dec = pa["prefill"], pa["decode"]

    def tiers(b):
        return ", ".join(f"{tier} {b[tier]:,.0f}" for tier in TIERS if b[tier])
    if pre["passes"] and pre["tokens"] > pre["passes"]:
        out.append(f"prefill in {pre['passes']} pass{'es' * (pre['passes'] != 1)} of {pre['tokens_per_pass']:.1f} tokens "
                   f"(up to {pa['batch']}): {pre['us_per_pass']:,.0f} µs and {tiers(pre['bytes_per_pass'])} "
                   f"bytes per pass; per prompt token {pre['us_per_token']:,.0f} µs, {tiers(pre['bytes_per_token'])} "
                   f"bytes  [{at}]")
    if dec["verify_passes"]:
        out.append(f"speculative decoding ({pa['speculate']}): {dec['accepted']}/{dec['drafted']} drafts accepted "
                   f"({100 * dec['acceptance']:.0f} %), {dec['tokens_per_verify_pass']:.2f} tokens per verifying "
                   f"pass, {dec['tokens_per_pass']:.2f} per decode pass; per emitted token {dec['us_per_token']:,.0f} µs "
                   f"(drafting {dec['draft_us_per_token']:,.0f}) and {tiers(dec['bytes_per_token'])} bytes"
                   + (f" (drafting {tiers(dec['draft_bytes_per_token']) or '0'})" if dec["draft_bytes_per_token"] else "")
                   + f"  [{at}]")
    return out


def bit_exact_line(hello):
    """The board's golden check as one line: loud when it is not bit-exact with the reference."""
    from rich.text import Text
    style = {"exact": "green", "differs": "bold red"}.get(hello.golden, "yellow")
    return Text(f"bit-exact with the reference: {hello.bit_exact}  [board {hello.board}]", style=style)


def _rows_cell(h: dict) -> str:
    if h["mean"] is None:
        return "–"
    pct = f" ({h['pct_of_out_vocab']:.1f} %)" if h["pct_of_out_vocab"] is not None else ""
    return f"{h['mean']:,.1f}{pct}"


def print_summary(console, result: RunResult) -> None:
    from rich.text import Text
    for r in summary_renderables(result):
        console.print(r, soft_wrap=isinstance(r, Text))


# ---------------------------------------------------------------------------------------------
# files (all atomic: temp file in the same directory, fsync, os.replace)

def atomic_write_bytes(path, data: bytes) -> Path:
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:      # name the file the user asked for, not our temporary one
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _hello_dict(h) -> dict | None:
    if h is None:
        return None
    return {"proto_version": h.proto_version, "image_ok": bool(h.image_ok),
            "model_hash": bytes(h.model_hash).hex(), "layout_id": h.layout_id,
            "vocab_size": h.vocab_size, "out_vocab": h.out_vocab, "max_seq_len": h.max_seq_len, "clock": h.clock,
            "clock_name": clock_name(h.clock), "fw_version": h.fw_version, "board": h.board, "batch": h.batch,
            "golden": {"state": h.golden, "checked_steps": h.golden_checked, "total_steps": h.golden_total,
                       "first_diff_step": h.golden_first_diff, "bit_exact": h.bit_exact}}


def _token_dict(t) -> dict:
    """A step: its ids, its pass's figures as the TOKEN carried them (us, bytes_read, draft_*: the whole
    pass's) and the step's share of them (share_us, share_bytes, total_us)."""
    sh = step_share(t)
    return {"step": t.step, "pos": t.pos, "in_id": t.in_id, "out_id": t.out_id,
            "kind": "prefill" if t.out_id is None else "decode",
            "piece": bytes(t.piece).decode("utf-8", "replace"), "piece_hex": bytes(t.piece).hex(),
            "pass": {"first": t.chunk, "tokens": t.chunk_len, "steps": t.chunk_used, "kind": t.kind},
            "us": dict(zip(PHASES, map(int, t.us))), "bytes_read": dict(zip(TIERS, map(int, t.bytes_read))),
            "share_us": dict(zip(PHASES, sh["us"])), "share_bytes": dict(zip(TIERS, sh["bytes"])),
            "total_us": step_total(t), "head_rows": t.head_rows, "logits_crc": t.logits_crc}


def result_dict(result: RunResult) -> dict:
    d = result.done
    return {
        "format": "flashlm-run", "version": 1,
        "hello": _hello_dict(result.hello),
        "params": {"prompt_ids": list(result.prompt_ids), "prompt_text": result.prompt_text,
                   "max_new_tokens": result.max_new_tokens,
                   "temperature": result.temperature, "top_p": result.top_p, "seed": result.seed,
                   "slide": bool(result.slide), "all_logits": bool(result.all_logits),
                   "batch": result.batch, "speculate": result.speculate, "draft_k": result.draft_k},
        "done": None if d is None else {"steps": d.steps, "generated": d.generated, "reason": d.reason,
                                        "total_us": d.total_us, "phase_us": dict(zip(PHASES, map(int, d.phase_us))),
                                        "passes": d.passes, "verify_passes": d.verify_passes,
                                        "drafted": d.drafted, "accepted": d.accepted,
                                        "bytes_read": dict(zip(TIERS, map(int, d.bytes_read))),
                                        "draft_bytes": dict(zip(TIERS, map(int, d.draft_bytes)))},
        "text": result.text_bytes.decode("utf-8", "replace"),
        "generated_ids": result.generated_ids,
        "tokens": [_token_dict(t) for t in result.tokens],
        "missing_steps": list(result.missing_steps),
        "link": {"stats": result.stats, "run": result.run_stats, "gaps": [list(g) for g in result.gap_pairs],
                 "resent_steps": list(getattr(result, "resent_steps", [])),
                 "resend_requests": getattr(result, "resend_requests", 0),
                 "device_errors": list(getattr(result, "device_errors", []))},
        "recoveries": list(getattr(result, "recoveries", [])),
        "notes": list(getattr(result, "notes", [])),
        "interrupted": bool(result.interrupted),
        "logs": list(result.logs),
        "logits": {str(k): [float(x) for x in v] for k, v in result.logits.items()},
        "harness_steps": harness_rows(result),
        "summary": summarize(result),
    }


def write_json(result: RunResult, path) -> Path:
    text = json.dumps(result_dict(result), indent=1, allow_nan=False, default=_json_default)
    return atomic_write_bytes(path, (text + "\n").encode("utf-8"))


def _json_default(o):
    if isinstance(o, (bytes, bytearray)):
        return bytes(o).hex()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


CSV_FIELDS = (["step", "pos", "kind", "in_id", "out_id", "piece"] + [f"{p}_us" for p in PHASES]
              + ["total_us"] + [f"{t}_bytes" for t in TIERS] + ["head_rows", "logits_crc", "board", "clock"]
              + ["pass_first", "pass_tokens", "pass_steps", "pass_kind"])


def write_csv(result: RunResult, path) -> Path:
    """One row per step, lost steps included (kind "missing", empty numbers). The µs and bytes are
    the forward pass's the step came from, as its TOKEN carried them (pass_first, pass_tokens: the
    pass; a step's share is them divided by pass_steps)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    rows = {int(t.step): t for t in result.tokens}
    board, clock = result.board, result.clock
    for step in sorted(set(rows) | set(result.missing_steps)):
        t = rows.get(step)
        if t is None:
            w.writerow({"step": step, "kind": "missing", "board": board, "clock": clock})
            continue
        row = {"step": t.step, "pos": t.pos, "kind": "prefill" if t.out_id is None else "decode",
               "in_id": t.in_id, "out_id": "" if t.out_id is None else t.out_id,
               "piece": piece_repr(t.piece)[1:-1] if t.out_id is not None else "",
               "total_us": int(sum(t.us)), "head_rows": t.head_rows, "logits_crc": t.logits_crc, "board": board,
               "clock": clock, "pass_first": t.chunk, "pass_tokens": t.chunk_len, "pass_steps": t.chunk_used,
               "pass_kind": t.kind}
        row.update({f"{p}_us": int(u) for p, u in zip(PHASES, t.us)})
        row.update({f"{tier}_bytes": int(b) for tier, b in zip(TIERS, t.bytes_read)})
        w.writerow(row)
    return atomic_write_bytes(path, buf.getvalue().encode("utf-8"))


def plot_png(result: RunResult, path) -> Path:
    buf = io.BytesIO()
    run_figure(result).savefig(buf, format="png")
    return atomic_write_bytes(path, buf.getvalue())


def run_figure(result: RunResult):
    """Stacked bars of per-phase device µs per step (a step's share of its forward pass), prefill
    steps hatched and paler on a grey band, dotted lines where a pass of several tokens begins; a
    line (right axis) gives the output-layer rows each step computed, % of out_vocab."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    toks = sorted(result.tokens, key=lambda t: t.step)
    n = max([t.step for t in toks] + list(result.missing_steps) + [0]) + 1
    fig = Figure(figsize=(min(18.0, max(7.0, 3.0 + 0.12 * n)), 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    groups = [("prefill", [t for t in toks if t.out_id is None]),
              ("decode", [t for t in toks if t.out_id is not None])]
    top = 0.0
    for kind, ts in groups:
        if not ts:
            continue
        xs = [t.step for t in ts]
        shares = [step_share(t) for t in ts]
        bottom = [0.0] * len(ts)
        for i, p in enumerate(PHASES):
            vals = [sh["us"][i] for sh in shares]
            ax.bar(xs, vals, bottom=bottom, width=0.85, color=PHASE_COLORS[p],
                   alpha=0.45 if kind == "prefill" else 0.95,
                   hatch="//" if kind == "prefill" else None, edgecolor="white", linewidth=0.3)
            bottom = [b + v for b, v in zip(bottom, vals)]
        top = max([top] + bottom)
    for t in toks:
        if t.chunk == t.step and t.chunk_len > 1:
            ax.axvline(t.step - 0.5, color="0.55", linestyle=":", linewidth=0.8)
    prompt_steps = [t.step for t in toks if t.out_id is None]
    if prompt_steps:
        ax.axvspan(min(prompt_steps) - 0.5, max(prompt_steps) + 0.5, color="0.92", zorder=0)
    for s in result.missing_steps:
        ax.axvline(s, color="0.4", linestyle=":", linewidth=1)
    handles = [Patch(color=PHASE_COLORS[p], label=PHASE_HEADERS[p].replace(" µs", "")) for p in shown_phases(toks)]
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label="prefill step"))
    out_vocab = result.hello.out_vocab if result.hello is not None else 0
    if toks and out_vocab:
        rows = ax.twinx()
        rows.plot([t.step for t in toks], [100.0 * t.head_rows / out_vocab for t in toks], color="0.25",
                  linewidth=1, marker=".", markersize=3)
        rows.set_ylim(0, 105)
        rows.set_ylabel("head rows, % of out_vocab")
        handles.append(Line2D([], [], color="0.25", marker=".", label="head rows %"))
    if result.missing_steps:
        handles.append(Patch(facecolor="white", edgecolor="0.4", linestyle=":", label="lost step"))
    ncol = min(len(handles), 6)         # rows of at most 6: nothing cut at the figure's edges
    rows_of_keys = -(-len(handles) // ncol)
    fig.legend(handles=handles, fontsize=8, ncol=ncol, loc="lower center", frameon=False)
    s = summarize(result)
    speeds = [f"{kind} {s[key]:,.1f} tok/s" for kind, key in (("decode", "tokens_per_s"),
                                                               ("prefill", "prefill_tok_per_s")) if s[key]]
    head = f"{result.board} — {result.clock}: device µs per step (its share of its pass)"
    ax.set_title(fitted_title(fig, 10, head, ", ".join(speeds)), fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(f"µs ({result.clock})")
    ax.set_xlim(-0.75, n - 0.25)
    ax.set_ylim(0, (top or 1.0) * 1.08)   # the tallest bar whole (the twin axis must not rescale it)
    fig.tight_layout(rect=(0, 0.045 + 0.04 * rows_of_keys, 1, 1))
    return fig


def fitted_title(fig, fontsize: float, *lines: str) -> str:
    """The lines (empty ones dropped), each wrapped to what the axes' width holds: a short run's
    figure is 7 in wide and a one-line title with the speeds ran past both of its edges. The axes
    are about 1.3 in narrower than the figure (the two y axes' labels); a character of the default
    sans font is at most ~0.6 em wide on average."""
    chars = int((fig.get_figwidth() - 1.3) * 72 / (0.6 * fontsize))
    return "\n".join(textwrap.fill(line, chars) for line in lines if line)
