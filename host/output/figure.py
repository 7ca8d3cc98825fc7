"""The run's figure: per-phase device µs per step, stacked (a PNG)."""
from __future__ import annotations

import io
import textwrap
from pathlib import Path

from ..files import atomic_write_bytes
from ..link.messages import PHASES
from ..session.result import RunResult, step_share
from .labels import PHASE_COLORS, PHASE_NAMES, shown_phases, unit
from .stats import percentile, summarize

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
    totals: dict[int, float] = {}
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
        totals.update(zip(xs, bottom))
    cap = spike_cap(list(totals.values()))
    clipped = {x: v for x, v in totals.items() if cap is not None and v > cap}
    for x, v in clipped.items():      # a step past the axis keeps its figure, written where it leaves
        ax.text(x, cap, f"{v:,.0f} ↑", rotation=90, ha="center", va="top", fontsize=7, color="0.15")
    for t in toks:
        if t.chunk == t.step and t.chunk_len > 1:
            ax.axvline(t.step - 0.5, color="0.55", linestyle=":", linewidth=0.8)
    prompt_steps = [t.step for t in toks if t.out_id is None]
    if prompt_steps:
        ax.axvspan(min(prompt_steps) - 0.5, max(prompt_steps) + 0.5, color="0.92", zorder=0)
    for s in result.missing_steps:
        ax.axvline(s, color="0.4", linestyle=":", linewidth=1)
    handles = [Patch(color=PHASE_COLORS[p], label=PHASE_NAMES[p]) for p in shown_phases(toks)]
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
    un = unit(result.clock)
    head = f"{result.board} — {result.clock}: device {un} per step (its share of its pass)"
    note = (f"{len(clipped)} step{'s' * (len(clipped) != 1)} past {cap:,.0f} {un} cut at the top, each labelled "
            f"with its {un}" if clipped else "")
    ax.set_title(fitted_title(fig, 10, head, ", ".join(speeds), note), fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{unit(result.clock)} ({result.clock})")
    ax.set_xlim(-0.75, n - 0.25)
    # the tallest bar whole, unless it is a spike (the twin axis must not rescale it)
    ax.set_ylim(0, cap if clipped else (top or 1.0) * 1.08)
    fig.tight_layout(rect=(0, 0.045 + 0.04 * rows_of_keys, 1, 1))
    return fig


def spike_cap(totals: list[float]) -> float | None:
    """Where the µs axis stops when a few steps would flatten the rest (a host clock's process
    switch, a page fault: a step of the native board can take 100 times its neighbours): three
    times the 90th percentile of the steps' totals, when something is above it; None otherwise."""
    if len(totals) < 5:
        return None
    cap = 3.0 * percentile(totals, 90)
    return cap if cap > 0 and max(totals) > cap else None


def fitted_title(fig, fontsize: float, *lines: str) -> str:
    """The lines (empty ones dropped), each wrapped to what the axes' width holds: a short run's
    figure is 7 in wide and a one-line title with the speeds ran past both of its edges. The axes
    are about 1.3 in narrower than the figure (the two y axes' labels); a character of the default
    sans font is at most ~0.6 em wide on average."""
    chars = int((fig.get_figwidth() - 1.3) * 72 / (0.6 * fontsize))
    return "\n".join(textwrap.fill(line, chars) for line in lines if line)
