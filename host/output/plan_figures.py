"""The figures of ``flashlm plan`` (the memory map: each tier filled by what is placed there) and
of ``flashlm compare`` (layouts side by side, predicted and measured)."""
from __future__ import annotations

from pathlib import Path

from converter.costmodel import state_sizes
from converter.formats import up64

from .labels import PHASE_COLORS
from .plan_tables import PHASE_LABEL, mb

KIND_COLORS = {"embedding": "#4c72b0", "head": "#c44e52", "head_index": "#e8a0a2", "attention": "#dd8452", "ffn": "#55a868",
               "ple_table": "#2f4b7c", "ple": "#a3845f",
               "norm": "#937860", "rope": "#8172b3", "tokenizer": "#8c8c8c", "kv": "#da8bc3",
               "logits": "#ccb974", "scratch": "#64b5cd", "other": "#999999"}


def memory_map_segments(plan, tier: str) -> list[tuple[str, str, int, bool]]:
    """(name, kind, bytes, pale) of what ``plan`` puts in ``tier``, as the planner counts it: in
    flash every tensor of the blob (pale: staged, read from RAM); in a RAM tier the tensors staged
    there (each rounded up to 64 bytes) and the state regions there, sized for the plan's KV cache
    format and batch (the prompt buffer with scratch). A RAM tier's segments add up to the plan's
    need there."""
    if tier == "flash":
        return [(t.name, t.kind, t.length, plan.tiers[t.name] != "flash") for t in plan.spec.tensors]
    sizes = state_sizes(plan.spec, plan.kv, plan.batch)
    return ([(t.name, t.kind, up64(t.length), False) for t in plan.spec.tensors if plan.tiers[t.name] == tier]
            + [(r, r, sizes[r], False) for r, rt in plan.regions.items() if rt == tier])


def memory_map_png(plan, path) -> Path:
    """Tiers as bars filled by the tensors and buffers placed there (flash: the whole blob, with
    what is read elsewhere drawn pale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    tiers = [t for t in ("flash", "psram", "sram") if t in plan.budget]
    fig, axes = plt.subplots(len(tiers), 1, figsize=(11, 1.9 + 1.35 * len(tiers)), squeeze=False)
    present = set()
    for ax, tier in zip(axes[:, 0], tiers):
        x = 0.0
        segs = memory_map_segments(plan, tier)
        for name, kind, n, pale in segs:
            present.add(kind if kind in KIND_COLORS else "other")
            ax.barh(0, n, left=x, height=0.6, color=KIND_COLORS.get(kind, "#999999"),
                    alpha=0.25 if pale else 0.95, edgecolor="white", linewidth=0.3)
            x += n
        if tier == "flash":
            x = float(plan.spec.blob_bytes)
        bud = plan.budget[tier]
        ax.axvline(bud, color="black", linestyle="--", linewidth=1)
        ax.set_xlim(0, max(bud, x) * 1.02)
        ax.set_yticks([])
        ax.set_ylabel(tier, rotation=0, ha="right", va="center")
        ax.set_title(f"{tier}: {mb(x)} of {mb(bud)} budget"
                     + (" (pale: staged copies read from RAM)" if tier == "flash" else ""), fontsize=9, loc="left")
        span = max(bud, x) * 1.02          # ticks a power of two bytes apart, at most eight
        ax.xaxis.set_major_locator(MultipleLocator(1 << max(0, int(span / 8 - 1).bit_length())))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: mb(v) if v else "0"))
    axes[-1, 0].set_xlabel("bytes placed in the tier (the dashed line: its budget)")
    kinds = [k for k in KIND_COLORS if k in present]
    ncol = min(len(kinds), 7)
    fig.legend(handles=[Patch(color=KIND_COLORS[k], label=k.replace("_", " ")) for k in kinds], loc="lower center",
               ncol=ncol, fontsize=8, frameon=False)
    p = plan.prediction
    fig.suptitle(f"{plan.board}: layout {plan.layout_id}, predicted {p.tok_s:.2f} tok/s at position {plan.pos} "
                 f"(prediction)", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * -(-len(kinds) // ncol), 1, 0.95))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def compare_png(entries, path, key: dict | None = None) -> Path:
    """Stacked per-phase ms per token, one group per (board, layout): predicted (hatched), and
    measured (solid) when there is one. ``entries``: list of dict(label, predicted: {phase: µs},
    measured: {phase: µs}|None); ``key``: short layout name -> the layout it stands for, printed
    under the bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    phases = list(PHASE_LABEL)
    measured_any = any(e.get("measured") is not None for e in entries)
    fig, ax = plt.subplots(figsize=(max(7.5, 1.7 * len(entries) * (2 if measured_any else 1) + 3.5), 5.2))
    xs, labels, top, used = [], [], 0.0, set()
    for i, e in enumerate(entries):
        bars = [("predicted", e["predicted"], "//")]
        if e.get("measured") is not None:
            bars.append(("measured", e["measured"], None))
        for j, (kind, vals, hatch) in enumerate(bars):
            x = i * (3 if measured_any else 1.3) + j
            bottom = 0.0
            for ph in phases:
                v = float(vals.get(ph, 0.0)) / 1000.0
                if v > 0:
                    used.add(ph)
                ax.bar(x, v, bottom=bottom, color=PHASE_COLORS[ph], hatch=hatch, edgecolor="white")
                bottom += v
            top = max(top, bottom)
            xs.append(x)
            labels.append(f"{e['label']}\n{kind}" if measured_any else e["label"])
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, (top or 1.0) * 1.08)      # the tallest bar whole
    ax.set_ylabel("ms per token")
    handles = [Patch(color=PHASE_COLORS[ph], label=PHASE_LABEL[ph]) for ph in phases if ph in used]
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label="predicted (board profile)"))
    if measured_any:
        handles.append(Patch(facecolor="0.5", label="measured (device clock)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("layouts side by side: " + ("predicted and measured" if measured_any else
                                             "predicted from the board profiles (nothing measured)"), fontsize=10)
    if key:
        fig.text(0.01, 0.01, "   ".join(f"{k} = {v}" for k, v in key.items()), fontsize=8, ha="left", va="bottom",
                 wrap=True)
    fig.tight_layout(rect=(0, 0.06 if key else 0, 1, 1))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
