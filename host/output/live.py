"""The live per-step table while a generation streams: a rich ``Live`` table on a terminal, one line
per step otherwise (pipes, CI logs)."""
from __future__ import annotations

import codecs

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from converter.tokenizer import visible_text

from ..link.messages import PHASES, TIERS, clock_name
from ..session.result import step_share
from .experts import step_label
from .labels import phase_header, piece_repr, shown_phases, unit, where

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
        self.piece_of = piece_of          # id -> bytes, for showing each step's input token
        self.prompt_text = prompt_text
        self.tokens: list = []
        self.text = ""
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._live = None
        self.max_rows = max_rows
        self._printed_header = False

    # rows ------------------------------------------------------------------------------------
    def _token_cells(self, t) -> tuple[Text, Text]:
        """The step's input token and the token it produced ("–": a prompt step's output is unused)."""
        shown = None
        if self.piece_of is not None:
            try:
                shown = self.piece_of(t.in_id)
            except Exception:       # a display nicety must never break a run
                shown = None
        given = Text(piece_repr(shown) if shown is not None else f"#{t.in_id}", style="dim")
        return given, Text(piece_repr(t.piece)) if t.out_id is not None else Text("–", style="dim")

    def _row(self, t, phases) -> list[str]:
        """step, pos, pass, then the step's share of its pass's µs per phase, total µs and bytes per
        tier, its head rows, and with experts its token's per layer."""
        sh = step_share(t)
        return ([str(t.step), str(t.pos), pass_label(t)] + [f"{sh['us'][PHASES.index(p)]:,.0f}" for p in phases]
                + [f"{sum(sh['us']):,.0f}"] + [f"{b:,.0f}" for b in sh["bytes"]] + [f"{t.head_rows:,}"]
                + ([step_label(t)] if t.n_experts else []))

    def _clock(self) -> str | None:
        return clock_name(self.hello.clock) if self.hello is not None else None

    def render(self):
        u = unit(self._clock())
        table = Table(title=f"per-step device {'time' if u == 'µs' else u} ({where(self.hello)})",
                      title_justify="left", expand=False)
        table.add_column("step", justify="right")
        table.add_column("pos", justify="right")
        table.add_column("pass", justify="right")
        table.add_column("in", overflow="ellipsis", max_width=14, no_wrap=True)
        table.add_column("out", overflow="ellipsis", max_width=14, no_wrap=True)
        phases = shown_phases(self.tokens, self.ple, self.draft)
        for p in phases:
            table.add_column(phase_header(p, self._clock()), justify="right")
        table.add_column(phase_header("total", self._clock()), justify="right", style="bold")
        for tier in TIERS:
            table.add_column(f"{tier} B", justify="right")
        table.add_column("head rows", justify="right")
        if any(t.n_experts for t in self.tokens):
            table.add_column("experts per layer", no_wrap=True)
        rows = self.max_rows or max(5, (self.console.size.height or 30) - 12)
        for t in self.tokens[-rows:]:
            r = self._row(t, phases)
            style = "dim" if t.out_id is None else None
            table.add_row(r[0], r[1], r[2], *self._token_cells(t), *r[3:], style=style)
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
            clock = self._clock()
            heads = [phase_header(p, clock) for p in self._line_phases + ["total"]]
            self._widths = [max(14, len(h)) for h in heads[:-1]] + [max(10, len(heads[-1]))]
            head = (f"{'step':>5} {'pos':>5} {'pass':>6} {'in':<12} {'out':<12} "
                    + " ".join(f"{h:>{w}}" for h, w in zip(heads, self._widths)) + " "
                    + " ".join(f"{tier + ' B':>10}" for tier in TIERS)
                    + f" {'head rows':>9}" + ("  experts per layer" if t.n_experts else "")
                    + f"   [{where(self.hello)}; {unit(clock)} and bytes: the step's share of its pass]")
            self.console.print(head, markup=False, highlight=False, soft_wrap=True)
        n = len(self._line_phases)
        r = self._row(t, self._line_phases)
        given, made = (c.plain for c in self._token_cells(t))
        line = (f"{r[0]:>5} {r[1]:>5} {r[2]:>6} {given[:12]:<12} {made[:12]:<12} "
                + " ".join(f"{v:>{w}}" for v, w in zip(r[3:4 + n], self._widths)) + " "
                + " ".join(f"{v:>10}" for v in r[4 + n:7 + n]) + f" {r[7 + n]:>9}"
                + (f"  {r[8 + n]}" if t.n_experts else ""))
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
            t = Text("text: ", style="bold")
            t.append(self.prompt_text, style="dim")
            t.append(visible_text(self.text))
            self.console.print(t)
