"""``flashlm plan`` and ``flashlm compare``: where a model's tensors go on a board, what a token is
predicted to cost there, and (``compare --run``) what it measures, layout by layout, on one board
switched with LAYOUT frames instead of reflashing.

MODEL may be a model directory written by ``flashlm convert`` (manifest.json + model.flmb), a
``.flmb`` blob, a checkpoint (llama2.c / flashlm ``.pt`` / a Hugging Face folder), which is quantized in memory with
``--format/--group-size/--quant/--scales`` as ``convert`` would, or ``shape:NAME``, a named shape
from converter/shapes.py planned with its own recipe (``--quant`` applies on top).
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from .args import add_generation_args, nonneg_int, output_file, positive_int
from .errors import UserError
from .model_dir import checkpoint_of, load_manifest
from .plan_roofline import add_roofline_args, check_args, roofline

PHASE_LABEL = {"embed": "embed", "attention": "attention", "ffn": "FFN", "ple": "PLE", "output": "output",
               "sampling": "sampling"}
KIND_COLORS = {"embedding": "#4c72b0", "head": "#c44e52", "head_index": "#e8a0a2", "attention": "#dd8452", "ffn": "#55a868",
               "ple_table": "#2f4b7c", "ple": "#a3845f",
               "norm": "#937860", "rope": "#8172b3", "tokenizer": "#8c8c8c", "kv": "#da8bc3",
               "logits": "#ccb974", "scratch": "#64b5cd", "other": "#999999"}


# ---------------------------------------------------------------------------------------------
# the model argument

SHAPE_PREFIX = "shape:"


def load_spec(model, fmt: str = "q8", group_size: int = 32, quant=(), tokenizer=None, scales: str | None = None,
              context: int | None = None):
    """(ModelSpec, info) for a model dir, a blob, a checkpoint (a Hugging Face folder too) or a
    named shape. ``info`` says which, and holds the model dir / manifest / blob path where there is
    one. ``context``: a checkpoint is loaded holding that many positions."""
    from converter.blob import read_header
    from converter.costmodel import ModelSpec
    from converter.hf_import import is_hf_dir

    if str(model).startswith(SHAPE_PREFIX):
        from converter.shapes import shape_spec
        spec = shape_spec(str(model)[len(SHAPE_PREFIX):])
        return (spec.with_formats(list(quant)) if quant else spec), dict(kind="shape")
    p = checkpoint_of(model)
    if (p.is_dir() and not is_hf_dir(p)) or p.name == "manifest.json":
        d, manifest = load_manifest(p)
        blob = d / manifest["blob"]
        h = read_header(blob)
        return ModelSpec.from_header(h, str(d)), dict(kind="dir", model_dir=d, manifest=manifest, blob=blob,
                                                      header=h)
    if not p.exists():
        from converter.shapes import SHAPES
        raise UserError(f"{p} does not exist (give a model directory from 'flashlm convert', a .flmb "
                        f"blob, a checkpoint or a shape: {', '.join(SHAPE_PREFIX + n for n in sorted(SHAPES))})")
    with (p / "config.json" if p.is_dir() else p).open("rb") as f:
        magic = f.read(4)
    if magic == b"FLMB":
        h = read_header(p)
        return ModelSpec.from_header(h, str(p)), dict(kind="blob", blob=p, header=h)
    from converter import quantize as Q
    from converter.load import load_model
    tok = tokenizer
    if tok is None and (p.parent / "tokenizer.json").is_file() and p.suffix == ".pt":
        tok = p.parent / "tokenizer.json"
    ir = load_model(str(p), tokenizer_path=str(tok) if tok else None, context=context)
    qm = Q.quantize(ir, default_format=fmt, group_size=group_size, overrides=list(quant or ()), scales=scales)
    from converter import headcalib
    qm.head_index = headcalib.calibrate(qm)[0]       # convert's decision (--head-index auto)
    return ModelSpec.from_quant(qm, str(p)), dict(kind="checkpoint", qm=qm, path=p)


# ---------------------------------------------------------------------------------------------
# tables

def _mb(n) -> str:
    from converter.planner import fmt_bytes
    return fmt_bytes(n)


def group_rows(rows: list[dict]) -> list[dict]:
    """Collapse per-layer rows that agree in format, size, tier and bytes read: layers.*.X ×N."""
    out, groups = [], {}
    for r in rows:
        m = re.match(r"layers\.(\d+)\.(.+)$", r["name"])
        if not m:
            out.append(dict(r, count=1))
            continue
        key = (m.group(2), r["format"], r["bytes"], r["tier"], r["read"], tuple(r["shape"]))
        if key in groups:
            groups[key]["count"] += 1
            groups[key]["layers"].append(int(m.group(1)))
        else:
            g = dict(r, name=f"layers.*.{m.group(2)}", count=1, layers=[int(m.group(1))])
            groups[key] = g
            out.append(g)
    for g in out:
        if g.get("layers") is not None and g["count"] == 1:
            g["name"] = f"layers.{g['layers'][0]}.{g['name'].split('.', 2)[2]}"
        elif g.get("layers") is not None:
            ls = g["layers"]
            span = f"{ls[0]}-{ls[-1]}" if ls == list(range(ls[0], ls[-1] + 1)) else ",".join(map(str, ls))
            g["name"] = g["name"].replace("layers.*.", f"layers.[{span}].")
    return out


def print_plan(console, plan, collapse: bool = True) -> None:
    from rich.table import Table

    p = plan.prediction
    c = plan.config
    head = (f"[bold]{plan.board}[/] ({plan.prof.get('description', '')}): context {c.max_seq_len}, KV {plan.kv}, "
            f"batch {plan.batch}, layout {plan.layout_id}" + (f", base {plan.base}" if plan.base != "auto" else ""))
    console.print(head, soft_wrap=True)
    rows = plan.rows()
    if collapse:
        rows = group_rows(rows)
    t = Table(title=f"placement (bytes read per token at position {plan.pos})", title_justify="left")
    for col, just in (("tensor", "left"), ("shape", "left"), ("format", "left"), ("bytes", "right"),
                      ("tier", "left"), ("read/token", "right")):
        t.add_column(col, justify=just)
    for r in rows:
        n = r.get("count", 1)
        shape = "x".join(map(str, r["shape"])) if r["shape"] else "-"
        mult = f" ×{n}" if n > 1 else ""
        t.add_row(r["name"], shape, r["format"], f"{r['bytes'] * n:,}" + mult, r["tier"],
                  f"{r['read'] * n:,}" if r["read"] else "-")
    console.print(t)
    u = Table(title="tiers (usable budget from the board profile)", title_justify="left")
    for col in ("tier", "placed", "budget", "free", "read/token"):
        u.add_column(col, justify="left" if col == "tier" else "right")
    for tier in ("flash", "psram", "sram"):
        if tier not in plan.budget:
            continue
        placed, bud = plan.need.get(tier, 0), plan.budget[tier]
        u.add_row(tier + (" (whole blob)" if tier == "flash" else ""), _mb(placed), _mb(bud), _mb(bud - placed),
                  f"{p.bytes_read[tier]:,}")
    console.print(u)
    ph = Table(title=f"predicted cost per token at position {plan.pos} ({plan.board} profile; a prediction, "
                     f"not a measurement)", title_justify="left")
    for col in ("phase", "memory µs", "compute µs", "total µs"):
        ph.add_column(col, justify="left" if col == "phase" else "right")
    for k in p.phase_us:
        ph.add_row(PHASE_LABEL[k], f"{p.memory_us[k]:,.0f}", f"{p.compute_us[k]:,.0f}", f"{p.phase_us[k]:,.0f}")
    ph.add_row("[bold]token[/]", f"{sum(p.memory_us.values()):,.0f}", f"{sum(p.compute_us.values()):,.0f}",
               f"[bold]{p.total_us:,.0f}[/]")
    console.print(ph)
    from converter.planner import output_label
    console.print(f"output layer: {output_label(plan.head, plan.spec)}", soft_wrap=True, style="dim")
    console.print(f"predicted [bold]{p.tok_s:,.2f} tok/s[/] on {plan.board}", soft_wrap=True)


def print_no_fit(console, e) -> None:
    console.print("[bold red]does not fit[/]")
    for line in e.details:
        console.print(f"  {line}", soft_wrap=True)
    if e.suggestions:
        console.print("changes that would fit:")
        for s in e.suggestions:
            console.print(f"  - {s}", soft_wrap=True)


# ---------------------------------------------------------------------------------------------
# PNGs

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
    sizes = _state_sizes(plan)
    present = set()
    for ax, tier in zip(axes[:, 0], tiers):
        x = 0.0
        segs = []
        if tier == "flash":
            for t in plan.spec.tensors:
                segs.append((t.name, t.kind, t.length, plan.tiers[t.name] != "flash"))
        else:
            for t in plan.spec.tensors:
                if plan.tiers[t.name] == tier:
                    segs.append((t.name, t.kind, t.length, False))
            for r, rt in plan.regions.items():
                if rt == tier:
                    segs.append((r, r, sizes[r], False))
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
        ax.set_title(f"{tier}: {_mb(x)} of {_mb(bud)} budget"
                     + (" (pale: staged copies read from RAM)" if tier == "flash" else ""), fontsize=9, loc="left")
        span = max(bud, x) * 1.02          # ticks a power of two bytes apart, at most eight
        ax.xaxis.set_major_locator(MultipleLocator(1 << max(0, int(span / 8 - 1).bit_length())))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _mb(v) if v else "0"))
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


def _state_sizes(plan) -> dict:
    from converter.costmodel import state_sizes
    return state_sizes(plan.spec, plan.kv)


def compare_png(entries, path, key: dict | None = None) -> Path:
    """Stacked per-phase ms per token, one group per (board, layout): predicted (hatched), and
    measured (solid) when there is one. ``entries``: list of dict(label, predicted: {phase: µs},
    measured: {phase: µs}|None); ``key``: short layout name -> the layout it stands for, printed
    under the bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from .report import PHASE_COLORS
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


# ---------------------------------------------------------------------------------------------
# applying a plan to the blob

def apply_plan(console, info: dict, plan) -> None:
    """Record the placement in the model dir's blob header (and a shorter context, if planned)."""
    from converter import blob as B

    from .report import atomic_write_bytes
    if info["kind"] != "dir":
        raise UserError("--apply rewrites a model directory; convert the checkpoint first "
                        "('flashlm convert CHECKPOINT -o DIR') and plan DIR")
    d, manifest, blob_path = info["model_dir"], info["manifest"], info["blob"]
    data = blob_path.read_bytes()
    h = info["header"]
    if plan.config.max_seq_len != h.config.max_seq_len:
        qm = B.read_blob(data)
        ctx = plan.config.max_seq_len
        qm = replace(qm, config=replace(qm.config, max_seq_len=ctx), rope_cos=qm.rope_cos[:ctx].copy(),
                     rope_sin=qm.rope_sin[:ctx].copy())
        new = B.build_blob(qm, plan.tiers, plan.state_tiers)
    else:
        new = B.retier_blob(data, plan.tiers, plan.state_tiers)
    atomic_write_bytes(blob_path, new)
    nh = B.parse_header(new, str(blob_path))
    manifest.update(blob_size=len(new), blob_crc=nh.crc, model_hash=bytes(nh.model_hash).hex(),
                    layout_id=nh.layout_id, kv=plan.kv, batch=plan.batch)
    manifest["config"]["max_seq_len"] = nh.config.max_seq_len
    manifest["layout"] = {"board": plan.board, "layout_id": nh.layout_id, "kv": plan.kv, "batch": plan.batch,
                          "regions": dict(plan.regions),
                          "overrides": [o.text for o in plan.overrides], "base": plan.base}
    atomic_write_bytes(d / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
    console.print(f"[green]applied[/] layout {nh.layout_id} to {blob_path} (model {manifest['model_hash'][:16]})")


# ---------------------------------------------------------------------------------------------
# commands

def _plan_or_explain(console, spec, board, **kw):
    from converter.planner import NoFit, plan
    try:
        return plan(spec, board, **kw)
    except NoFit as e:
        print_no_fit(console, e)
        raise UserError(str(e)) from None


def kv_of(args, info) -> str:
    """--kv, else the blob's own KV cache format, else convert's default (int8)."""
    if args.kv:
        return args.kv
    return info["header"].state_tiers.kv if "header" in info else "int8"


def plan_batch(args, info) -> int:
    """--batch, else the batch the model's blob header names, else 1."""
    if args.batch:
        return args.batch
    return info["header"].state_tiers.batch if "header" in info else 1


def cmd_plan(args, console) -> int:
    from converter.planner import parse_layout
    check_args(args)
    spec, info = load_spec(args.model, args.format, args.group_size, args.quant, args.tokenizer, args.scales,
                           args.ctx)
    if args.ctx:
        spec = spec.with_context(args.ctx)
    base, places = parse_layout(",".join(["auto" if not args.flash_only else "flash"] + list(args.place)))
    plan_kw = dict(overrides=places, base=base, kv=kv_of(args, info), pos=args.pos, line=args.line)
    pl = _plan_or_explain(console, spec, args.board, batch=plan_batch(args, info), **plan_kw)
    print_plan(console, pl, collapse=not args.all)
    out = pl.to_dict()
    if args.roofline:       # --png is the roofline's
        out["roofline"] = roofline(console, args, spec, info, plan_kw, args.png or Path(f"roofline-{pl.board}.png"))
    elif args.png:
        memory_map_png(pl, args.png)
        console.print(f"[green]wrote[/] memory map {args.png}")
    if args.json:
        from .report import atomic_write_bytes
        atomic_write_bytes(args.json, (json.dumps(out, indent=1) + "\n").encode())
        console.print(f"[green]wrote[/] JSON {args.json}")
    if args.apply:
        apply_plan(console, info, pl)
    return 0


def _n(us: float) -> str:
    """µs in at most 6 characters."""
    if us < 10000:
        return f"{us:,.0f}"
    if us < 1e6:
        return f"{us / 1000:,.0f}k"
    return f"{us / 1e6:,.1f}M"


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f}" if n < 10240 else f"{n / 1024:,.0f}"


ROW_LABELS = [PHASE_LABEL[k] + " µs" for k in PHASE_LABEL] + ["token µs", "tok/s", "flash KB/tok",
                                                                 "psram KB/tok", "sram KB/tok"]


def _column(phase_us: dict, bytes_read: dict | None) -> list[str]:
    tot = sum(phase_us.values())
    col = [_n(phase_us[k]) for k in PHASE_LABEL] + [_n(tot), f"{1e6 / tot:,.2f}" if tot else "-"]
    col += [_kb(bytes_read[t]) for t in ("flash", "psram", "sram")] if bytes_read else ["", "", ""]
    return col


def _side_by_side(console, title: str, columns: list[tuple[str, list[str]]]) -> None:
    from rich.table import Table
    t = Table(title=title, title_justify="left")
    t.add_column("")
    for name, _ in columns:
        t.add_column(name, justify="right")
    for i, label in enumerate(ROW_LABELS):
        t.add_row(label, *[col[i] for _, col in columns])
    console.print(t)


def cmd_compare(args, console) -> int:
    from converter.planner import PlanError, plan_layout
    spec, info = load_spec(args.model, args.format, args.group_size, args.quant, args.tokenizer, args.scales,
                           args.ctx)
    if args.ctx:
        spec = spec.with_context(args.ctx)
    boards = args.board or ["native"]
    layouts = args.layout or ["flash", "auto"]
    names = {lay: f"L{i + 1}" for i, lay in enumerate(layouts)}
    for lay in layouts:
        console.print(f"  {names[lay]} = {lay}", soft_wrap=True)
    plans, entries = {}, []
    for b in boards:
        cols = []
        for lay in layouts:
            try:
                pl = plan_layout(spec, b, lay, kv=kv_of(args, info), pos=args.pos, line=args.line, suggest=False,
                                 batch=plan_batch(args, info))
            except PlanError as e:   # does not fit, or an override this board cannot honour
                console.print(f"  {b} {names[lay]}: refused: {e}", soft_wrap=True)
                continue
            plans[(b, lay)] = pl
            cols.append((names[lay], _column(pl.prediction.phase_us, pl.prediction.bytes_read)))
            entries.append(dict(label=f"{b}\n{names[lay]}", predicted=dict(pl.prediction.phase_us), measured=None))
        if cols:
            pos = next(pl.pos for (bb, _), pl in plans.items() if bb == b)
            _side_by_side(console, f"{b}: predicted per token at position {pos} (from the board profile; "
                                   f"a prediction, not a measurement)", cols)
    results = {}
    if args.run:
        if len(boards) != 1:
            raise UserError("--run measures on one board: give a single --board (and --port for a real one)")
        results = run_layouts(console, args, spec, info, boards[0], layouts, plans, names)
        entries = []
        for lay in layouts:
            pl = plans.get((boards[0], lay))
            if pl is None:
                continue
            r = results.get(lay)
            ok = r is not None and "error" not in r
            entries.append(dict(label=f"{boards[0]}\n{names[lay]}",
                                predicted=r["predicted"] if ok else dict(pl.prediction.phase_us),
                                measured=r["measured"] if ok else None))
    if entries and args.png:
        compare_png(entries, args.png, key={short: lay for lay, short in names.items()})
        console.print(f"[green]wrote[/] {args.png}")
    if args.json:
        from .report import atomic_write_bytes
        out = {"layouts": names, "predicted": {f"{b}/{lay}": pl.to_dict() for (b, lay), pl in plans.items()},
               "runs": results}
        atomic_write_bytes(args.json, (json.dumps(out, indent=1, default=str) + "\n").encode())
        console.print(f"[green]wrote[/] JSON {args.json}")
    return 0


# ---------------------------------------------------------------------------------------------
# compare --run

def measure_layouts(sess, plans: dict, prompt_ids, max_tokens: int, temperature=0.0, top_p=0.0, seed=0,
                    on_layout=None) -> dict:
    """For each (name, Plan): LAYOUT, then GENERATE the same prompt with the same seed. Returns
    name -> dict(hello, result, measured per-phase mean µs over generated steps, predicted per-phase
    mean µs at the same positions, bytes_match steps). A refused layout gives dict(error=...)."""
    from statistics import mean

    from .protocol import PHASES
    from .session import DeviceError
    out = {}
    for name, pl in plans.items():
        try:
            hello = sess.set_layout(pl.layout_id, pl.state_tiers.to_u32(), pl.tier_codes)
        except DeviceError as e:
            out[name] = dict(error=str(e))
            continue
        # one-token passes: what the planner predicts step by step
        res = sess.generate(prompt_ids, max_tokens, temperature=temperature, top_p=top_p, seed=seed, batch=1)
        sampling = "greedy" if temperature <= 0 else "temperature"
        gen = res.generated_steps
        preds = {t.step: pl.predict_at(t.pos, sampling, step_head(t, sampling)) for t in res.tokens}
        measured = {ph: mean(t.us[i] for t in gen) for i, ph in enumerate(PHASES)} if gen else {}
        predicted = {ph: mean(preds[t.step].phase_us.get(ph, 0.0) for t in gen) for ph in PHASES} if gen else {}  # (draft: not predicted, 0)
        tiers = ("flash", "psram", "sram")
        mbytes = {k: mean(t.bytes_read[i] for t in gen) for i, k in enumerate(tiers)} if gen else {}
        pbytes = {k: mean(preds[t.step].bytes_read[k] for t in gen) for k in tiers} if gen else {}
        match = sum(1 for t in res.tokens
                    if tuple(t.bytes_read) == tuple(preds[t.step].bytes_read[k] for k in ("flash", "psram", "sram")))
        out[name] = dict(layout_id=hello.layout_id, result=res, measured=measured, predicted=predicted,
                         measured_bytes=mbytes, predicted_bytes=pbytes,
                         bytes_match=match, steps=len(res.tokens), tokens=res.generated_ids,
                         crcs=[t.logits_crc for t in res.tokens])
        if on_layout is not None:
            on_layout(name, out[name])
    return out


def step_head(t, sampling: str) -> str | int:
    """The output layer a TOKEN's step computed (a generation without ALL_LOGITS): skipped on a
    prompt step (head_rows 0), whole when sampling, else the rows of the greedy step."""
    if t.head_rows == 0:
        return "skip"
    return "full" if sampling != "greedy" else int(t.head_rows)


def run_layouts(console, args, spec, info, board, layouts, plans, names) -> dict:
    from contextlib import ExitStack

    from .cmd_build import ensure_native_binary
    from .cmd_run import check_virtual_board
    from .protocol import Link
    from .session import Session, open_port
    if info["kind"] != "dir":
        raise UserError("--run needs a model directory from 'flashlm convert' (the board must hold its blob)")
    model_dir, manifest = info["model_dir"], info["manifest"]
    if spec.config.max_seq_len != info["header"].config.max_seq_len:
        raise UserError("--run with --ctx: apply the shorter context first ('flashlm plan --ctx N --apply')")
    import argparse

    from .prompt import DEFAULT_PROMPT, encode_prompt
    prompt, prompt_ids = args.prompt, args.prompt_ids
    if prompt is None and prompt_ids is None:
        if manifest.get("tokenizer"):
            prompt = DEFAULT_PROMPT
        else:
            prompt_ids = "1"
    ids, _ = encode_prompt(argparse.Namespace(prompt=prompt, prompt_ids=prompt_ids), model_dir, manifest)
    todo = {lay: plans[(board, lay)] for lay in layouts if (board, lay) in plans}
    emulated = None
    with ExitStack() as stack:
        if args.port is None:
            emulated = check_virtual_board(board)   # a real board: flash it and pass --port
            binary = ensure_native_binary(console, model_dir, manifest, board=board)
            blob = model_dir / manifest["blob"]
            if emulated:
                from .virtual import start_emulated_board
                vb = stack.enter_context(start_emulated_board(binary, blob, board=board, timeout=args.timeout,
                                                              xip_model=args.xip_model == "on"))
            else:
                from .virtual import start_native_board
                vb = stack.enter_context(start_native_board(binary, blob, timeout=args.timeout))
            port = vb.port
        else:
            port = args.port
        ser = open_port(port, args.baud)
        stack.callback(ser.close)
        sess = Session(Link(ser), name=port, frame_timeout=args.timeout)
        hello = sess.handshake(timeout=args.timeout)
        sess.check_model(hello, manifest["model_hash"])
        memory = f", XIP model {args.xip_model}" if emulated else ""
        console.print(f"measuring {len(todo)} layout(s) on {hello.board} ({hello.clock_name}{memory}), "
                      f"{len(ids)}-token prompt, {args.max_tokens} tokens, seed {args.seed}")
        res = measure_layouts(sess, todo, ids, args.max_tokens, args.temperature, args.top_p, args.seed)
    cols, first = [], None
    for lay, r in res.items():
        if "error" in r:
            console.print(f"  {names[lay]}: refused by the board: {r['error']}", soft_wrap=True)
            continue
        cols.append((f"{names[lay]} meas.", _column(r["measured"], r["measured_bytes"])))
        cols.append((f"{names[lay]} pred.", _column(r["predicted"], r["predicted_bytes"])))
        console.print(f"  {names[lay]}: bytes per tier equal the plan's on {r['bytes_match']}/{r['steps']} steps",
                      soft_wrap=True)
        if first is None:
            first = r
        elif r["tokens"] != first["tokens"] or r["crcs"] != first["crcs"]:
            console.print(f"[red]layout {names[lay]} produced different tokens/logits from the first layout[/]")
    if cols:
        _side_by_side(console, f"measured ({hello.clock_name}) vs predicted ({board} profile): mean per "
                               f"generated token", cols)
    if first is not None and all("error" not in r and r["crcs"] == first["crcs"] for r in res.values()):
        console.print("every layout produced bit-identical logits (crc32 per step) and the same tokens")
    return {lay: {k: v for k, v in r.items() if k != "result"} for lay, r in res.items()}


# ---------------------------------------------------------------------------------------------
# argument parsing (called from host/parser.py)

def add_commands(sub) -> None:
    def model_opts(p):
        p.add_argument("model", metavar="MODEL",
                       help="model dir from 'flashlm convert', a .flmb blob, a checkpoint, or shape:NAME (e.g. shape:ple-28m)")
        p.add_argument("--ctx", type=positive_int, metavar="N", help="plan for a shorter context than the model's")
        p.add_argument("--kv", choices=("f32", "int8"),
                       help="KV cache format (default: the blob's, or for a checkpoint or shape int8 as convert "
                            "writes; int8: a scale and int8 codes per row; --apply records it)")
        p.add_argument("--batch", type=positive_int, metavar="T",
                       help="the most tokens one forward pass runs (batched prefill, speculative verification); "
                            "scratch RAM grows with it (default: the model's own, else 1; --apply records it)")
        p.add_argument("--pos", type=nonneg_int, metavar="P", help="position to quote per-token figures at (default: mid-context)")
        p.add_argument("--line", type=positive_int, metavar="BYTES", help="cache line size (boards with seq_read_MBps_by_line)")
        p.add_argument("--format", choices=("q8", "q4"), default="q8", help="for a checkpoint: quantize like convert")
        p.add_argument("--group-size", type=positive_int, default=32, metavar="N")
        p.add_argument("--quant", action="append", default=[], metavar="PATTERN=FMT[:G]")
        p.add_argument("--scales", choices=("row", "f32", "f16"), default=None,
                       help="for a checkpoint: group scales as convert's --scales")
        p.add_argument("--tokenizer", metavar="PATH")
        p.add_argument("--png", metavar="FILE", type=output_file, help="write a PNG (plan: the memory map, with "
                       "--roofline the roofline; compare: the layouts side by side)")
        p.add_argument("--json", metavar="FILE", type=output_file)

    p = sub.add_parser("plan", help="place a model's tensors on a board's memory tiers; predict per-token cost")
    model_opts(p)
    p.add_argument("--board", required=True)
    p.add_argument("--place", action="append", default=[], metavar="PATTERN=TIER",
                   help="pin tensors or buffers: 'head=psram', 'layers.*.ffn=sram', 'kv=psram' (repeatable)")
    p.add_argument("--flash-only", action="store_true", help="leave every tensor not --place'd in flash")
    p.add_argument("--all", action="store_true", help="one table row per tensor (no grouping of layers)")
    p.add_argument("--apply", action="store_true", help="record the placement in the model dir's blob header")
    add_roofline_args(p)
    p.set_defaults(func=cmd_plan)

    c = sub.add_parser("compare", help="layouts side by side: predicted, and with --run measured on a board")
    model_opts(c)
    c.add_argument("--board", action="append", metavar="B", help="board profile (repeatable; default native)")
    c.add_argument("--layout", action="append", metavar="L",
                   help="auto | flash | PATTERN=TIER[,...] (repeatable; default: flash and auto)")
    c.add_argument("--run", action="store_true", help="also measure each layout on the board (LAYOUT, no reflash)")
    c.add_argument("--port", metavar="PATH", help="serial port of a flashed board (default: start the native board)")
    add_generation_args(c, max_tokens=16)
    c.set_defaults(func=cmd_compare)
