"""The roofline PNG of ``flashlm plan --roofline``: a board's compute ceilings and tier roofs, each
phase of each pass as a point (filled: predicted; hollow: measured, joined to its prediction)."""
from __future__ import annotations

from pathlib import Path

from .labels import PHASE_COLORS

PASS_COLOR = "#222222"          # the whole pass
MARKERS = ("o", "s", "D", "^", "v", "P")
TIER_STYLE = {"flash": ("#8c564b", "--"), "psram": ("#9467bd", "-."), "sram": ("#17becf", ":")}
PHASE_NAMES = {"embed": "embed", "attention": "attention", "ffn": "FFN", "ple": "PLE", "output": "output layer",
               "sampling": "sampling", "pass": "whole pass"}


def _si(v: float) -> str:
    for unit, k in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= k:
            return f"{v / k:.3g} {unit}"
    return f"{v:.3g} "


def roofline_png(roofs, groups: list[tuple[str, list]], path, title: str, note: str = "",
                 label_passes: bool = True) -> Path:
    """``groups``: (pass label, points) in marker order. A predicted point is filled, its edge the colour
    of the tier it is read against; a measured one hollow, joined to its prediction (same group and phase)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    pts = [p for _, ps in groups for p in ps]
    xs = [p.intensity for p in pts] + [roofs.ridge(t) for t in roofs.bandwidth]
    lo, hi = min(xs) / 4, max(xs) * 4
    fig, ax = plt.subplots(figsize=(11, 6.6))
    ax.set_xscale("log")
    ax.set_yscale("log")
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for tier, bw in roofs.bandwidth.items():
        color, style = TIER_STYLE.get(tier, ("grey", "--"))
        ax.plot(grid, [min(bw * x, roofs.peak) for x in grid], color=color, linestyle=style, linewidth=1.6,
                label=f"{tier} roof: {_si(bw)}B/s")
    ax.axhline(roofs.mac_per_s, color="#555555", linewidth=1.6,
               label=f"int8 MAC ceiling: {_si(roofs.mac_per_s)}MAC/s")
    ax.axhline(roofs.flop_per_s, color="#555555", linewidth=1.0, linestyle=(0, (1, 1)),
               label=f"float-op ceiling: {_si(roofs.flop_per_s)}flop/s")
    for i, (label, ps) in enumerate(groups):
        mk = MARKERS[i % len(MARKERS)]
        pred = {p.phase: p for p in ps if not p.measured}
        for p in ps:
            c = PASS_COLOR if p.phase == "pass" else PHASE_COLORS.get(p.phase, "grey")
            size = 95 if p.phase == "pass" else 60
            if p.measured:
                ax.scatter(p.intensity, p.ops_per_s, s=size, marker=mk, facecolors="none", edgecolors=c,
                           linewidths=1.6, zorder=6)
                twin = pred.get(p.phase)
                if twin is not None:
                    ax.plot([twin.intensity, p.intensity], [twin.ops_per_s, p.ops_per_s], color=c,
                            linewidth=0.8, zorder=3)
            else:   # its edge: the tier whose roof it sits under
                ax.scatter(p.intensity, p.ops_per_s, s=size, marker=mk, color=c,
                           edgecolors=TIER_STYLE.get(p.tier, ("grey",))[0], linewidths=1.8, zorder=5)
                if p.phase == "pass" and label_passes:
                    ax.annotate(f"{p.tokens} token{'s' * (p.tokens > 1)}", (p.intensity, p.ops_per_s),
                                xytext=(7, -12), textcoords="offset points", fontsize=8, color=PASS_COLOR)
    ys = [p.ops_per_s for p in pts] + [roofs.mac_per_s, roofs.flop_per_s]
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(ys) / 3, roofs.peak * 2.5)
    ax.set_xlabel("arithmetic intensity: operations per byte moved from the phase's binding tier (ops/B)")
    ax.set_ylabel("operations per second (ops/s)")
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    ax.set_title(title, fontsize=10)
    roof_legend = ax.legend(loc="upper left", fontsize=8, title="roofs (board profile)", title_fontsize=8,
                            frameon=True, framealpha=0.9)
    ax.add_artist(roof_legend)
    phases = []
    for p in pts:
        if p.phase not in phases:
            phases.append(p.phase)
    handles = [Line2D([], [], linestyle="", marker="o", markersize=7,
                      color=PASS_COLOR if ph == "pass" else PHASE_COLORS.get(ph, "grey"), label=PHASE_NAMES.get(ph, ph))
               for ph in phases]
    handles += [Line2D([], [], linestyle="", marker=MARKERS[i % len(MARKERS)], markersize=7, color="#777777",
                       label=label) for i, (label, _) in enumerate(groups)]
    handles.append(Line2D([], [], linestyle="", marker="o", markersize=7, color="#777777", label="filled: predicted"))
    for tier in dict.fromkeys(p.tier for p in pts if not p.measured):
        handles.append(Line2D([], [], linestyle="", marker="o", markersize=7, markerfacecolor="white",
                              markeredgewidth=1.8, markeredgecolor=TIER_STYLE.get(tier, ("grey",))[0],
                              label=f"edge: bound by {tier} bytes"))
    if any(p.measured for p in pts):
        handles.append(Line2D([], [], linestyle="", marker="o", markersize=7, markerfacecolor="white",
                              markeredgecolor="#777777", label="hollow: measured (device clock)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              title="colour: phase; shape: pass", title_fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7.5, ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.07 if note else 0, 1, 1))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
