"""The tables of ``flashlm plan`` (placement, tiers, predicted cost per phase; what would fit
when nothing does) and of ``flashlm compare`` (layouts side by side)."""
from __future__ import annotations

import re

from rich.table import Table

from converter.planner import fmt_bytes, output_label

from .labels import unit

PHASE_LABEL = {"embed": "embed", "attention": "attention", "ffn": "FFN", "ple": "PLE", "output": "output",
               "sampling": "sampling"}


def mb(n) -> str:
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
                  f"{r['read'] * n:,.0f}" if r["read"] else "-")
    console.print(t)
    c = plan.spec.config
    if c.n_experts:
        use = plan.spec.expert_use
        console.print(f"experts: {c.moe_top_k} of {c.n_experts} a layer read per token; an expert's read/token is its "
                      f"bytes times the share of tokens choosing it ("
                      + (f"calibrated at convert time: {use.tokens} tokens" if use is not None
                         else "no calibration in this model: k/E each") + "; a prediction)", soft_wrap=True)
    u = Table(title="tiers (usable budget from the board profile)", title_justify="left")
    for col in ("tier", "placed", "budget", "free", "read/token"):
        u.add_column(col, justify="left" if col == "tier" else "right")
    for tier in ("flash", "psram", "sram"):
        if tier not in plan.budget:
            continue
        placed, bud = plan.need.get(tier, 0), plan.budget[tier]
        u.add_row(tier + (" (whole blob)" if tier == "flash" else ""), mb(placed), mb(bud), mb(bud - placed),
                  f"{p.bytes_read[tier]:,.0f}")
    console.print(u)
    un = unit(plan.prof.get("timer"))
    ph = Table(title=f"predicted cost per token at position {plan.pos} ({plan.board} profile; a prediction, "
                     f"not a measurement)", title_justify="left")
    cores = any(p.overlap_us.values())   # the board's cores share the products (converter/overlap.py)
    cols = ("phase", f"memory {un}", f"compute {un}") + ((f"cores save {un}",) if cores else ()) + (f"total {un}",)
    for col in cols:
        ph.add_column(col, justify="left" if col == "phase" else "right")
    for k in p.phase_us:
        saved = (f"{p.overlap_us[k]:,.0f}",) if cores else ()
        ph.add_row(PHASE_LABEL[k], f"{p.memory_us[k]:,.0f}", f"{p.compute_us[k]:,.0f}", *saved, f"{p.phase_us[k]:,.0f}")
    saved = (f"{sum(p.overlap_us.values()):,.0f}",) if cores else ()
    ph.add_row("[bold]token[/]", f"{sum(p.memory_us.values()):,.0f}", f"{sum(p.compute_us.values()):,.0f}", *saved,
               f"[bold]{p.total_us:,.0f}[/]")
    console.print(ph)
    console.print(f"output layer: {output_label(plan.head, plan.spec)}", soft_wrap=True, style="dim")
    if un == "µs":
        console.print(f"predicted [bold]{p.tok_s:,.2f} tok/s[/] on {plan.board}", soft_wrap=True)
    else:       # the board's clock counts instructions: no time, no rate
        console.print(f"predicted [bold]{p.total_us:,.0f} {un}[/] per token on {plan.board} ({plan.prof['timer']})",
                      soft_wrap=True)


def print_no_fit(console, e) -> None:
    console.print("[bold red]does not fit[/]")
    for line in e.details:
        console.print(f"  {line}", soft_wrap=True)
    if e.suggestions:
        console.print("changes that would fit:")
        for s in e.suggestions:
            console.print(f"  - {s}", soft_wrap=True)


def _n(us: float) -> str:
    """µs (or instructions) in at most 6 characters."""
    if us < 10000:
        return f"{us:,.0f}"
    if us < 1e6:
        return f"{us / 1000:,.0f}k"
    return f"{us / 1e6:,.1f}M"


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f}" if n < 10240 else f"{n / 1024:,.0f}"


def row_labels(un: str = "µs") -> list[str]:
    """The side-by-side table's rows, the per-phase ones in the board clock's unit ``un``."""
    short = "instr" if un != "µs" else un
    return ([f"{PHASE_LABEL[k]} {short}" for k in PHASE_LABEL]
            + [f"token {short}", "tok/s", "flash KB/tok", "psram KB/tok", "sram KB/tok"])


def column(phase_us: dict, bytes_read: dict | None, un: str = "µs") -> list[str]:
    """A layout's column; no tok/s from an instruction count (``un`` not µs)."""
    tot = sum(phase_us.values())
    col = [_n(phase_us[k]) for k in PHASE_LABEL] + [_n(tot), f"{1e6 / tot:,.2f}" if tot and un == "µs" else "-"]
    col += [_kb(bytes_read[t]) for t in ("flash", "psram", "sram")] if bytes_read else ["", "", ""]
    return col


def side_by_side(console, title: str, columns: list[tuple[str, list[str]]], un: str = "µs") -> None:
    t = Table(title=title + ("" if un == "µs" else f"; instr = {un}"), title_justify="left")
    t.add_column("")
    for name, _ in columns:
        t.add_column(name, justify="right")
    for i, label in enumerate(row_labels(un)):
        t.add_row(label, *[col[i] for _, col in columns])
    console.print(t)
