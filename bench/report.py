"""The bench report: results as readable tables, ratios measured in this run, and every figure beside
the previous run's (bench/results.json) with their ratio. Pure functions of the results dict; each
table is a ``Figures``, which the console prints (``print_report``) and bench/docs_page.py writes
into docs/bench.md."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from converter.costmodel import PHASES, TIERS

RESULTS = Path(__file__).resolve().parent / "results.json"     # the last full run's figures


def flatten(d: dict, prefix: str = "") -> dict:
    """Numbers of a nested dict under dotted keys (strings, lists and booleans are left out)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def ratio(now, before) -> float | None:
    """now / before, or None where there is no finite, non-zero ``before`` to divide by."""
    if not isinstance(before, (int, float)) or isinstance(before, bool) or not before or not math.isfinite(before):
        return None
    return now / before


def compare(now: dict, before: dict) -> list[tuple[str, float, float | None, float | None]]:
    """(key, now, previous, now/previous) for every figure of ``now`` (both flattened)."""
    return [(k, v, before.get(k), ratio(v, before.get(k))) for k, v in now.items()]


def num(v, digits: int = 4) -> str:
    """A figure for a table: whole and thousands separated from 1000 up, ``digits`` significant below."""
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if abs(v) >= 1000 or (float(v).is_integer() and abs(v) >= 1):
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def rat(v) -> str:
    """A ratio for a table: three decimals."""
    return "-" if v is None else f"{v:.3f}"


@dataclass(frozen=True)
class Figures:
    """A table as data: the first column labels the rows, the others hold figures (or text)."""
    title: str
    columns: list[str]
    rows: list[list]
    caption: str | None = None


def rich_table(f: Figures) -> Group:
    """The title and caption as lines of the console's width above and below the table."""
    t = Table()
    for i, c in enumerate(f.columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in f.rows:
        t.add_row(*[num(x) for x in r])
    return Group(Text("\n" + f.title, style="bold"), t, *([Text(f.caption)] if f.caption else []))


def phase_table(r: dict) -> Figures | None:
    """The default model per phase: native µs, emulated RP2040 cycles (decode and prefill), and the
    planner's prediction over the emulated time."""
    cols: list[tuple[str, dict, object]] = []     # header, {phase: value}, token total
    for fmt in ("q8", "q4"):
        n = r.get(f"native_{fmt}")
        if n:
            cols.append((f"native {fmt} µs", n["us_median"], 1e6 / n["tok_per_s"]))
    for fmt in ("q8", "q4"):
        e = r.get(f"rp2040_emu_{fmt}")
        if e:
            cols.append((f"emu {fmt} decode cycles", e["phase_cycles_median"], e["cycles_per_token"]))
            cols.append((f"emu {fmt} prefill cycles", e["prefill_phase_cycles_median"], e["prefill_cycles_per_step"]))
            cols.append((f"pred/emu {fmt}", {p: rat(v) for p, v in e["predicted_over_emulated"].items()},
                         rat(e["predicted_over_emulated_token"])))
    if not cols:
        return None
    rows = [[ph] + [c[1].get(ph) for c in cols] for ph in PHASES]
    rows.append(["token"] + [c[2] for c in cols])
    return Figures("default model per phase, median over steps (native: host clock; emu: rp2040js, firmware µs × "
                  "125 MHz, token row = the harness's cycle count; pred = planner, rp2040-emu profile)",
                  ["phase"] + [c[0] for c in cols], rows,
                  "native token = mean µs per decode token (1/tok/s); phases are medians, so they need not add up")


def bytes_table(r: dict) -> Figures | None:
    cols = []
    for fmt in ("q8", "q4"):
        n = r.get(f"native_{fmt}")
        if n:
            cols.append((f"native {fmt} engine\npos {n['bytes_per_token_at_pos']}", n["bytes_per_token"]))
        e = r.get(f"rp2040_emu_{fmt}")
        if e:
            at = f"\npos {e['bytes_per_token_at_pos']}"
            cols += [(f"emu {fmt} engine{at}", e["bytes_per_token"]), (f"emu {fmt} harness{at}", e["bytes_per_token_harness"]),
                     (f"emu {fmt} predicted{at}", e["bytes_per_token_predicted"])]
    if not cols:
        return None
    return Figures("bytes read per decode token per tier (engine counters; the emulator's count of the core's "
                  "loads; the planner's prediction for the same step)", ["tier"] + [c[0] for c in cols],
                  [[t] + [c[1].get(t) for c in cols] for t in TIERS],
                  "each the last decode step of its run: SRAM is the KV cache, which a step reads up to its position")


def callgrind_table(r: dict) -> Figures | None:
    runs = {fmt: r[f"callgrind_native_{fmt}"] for fmt in ("q8", "q4") if f"callgrind_native_{fmt}" in r}
    if not runs:
        return None
    first = next(iter(runs.values()))
    rows = [["per decode token"] + [x["ir_per_decode_token"] for x in runs.values()],
            ["per prefill step (flm_body_many)"] + [x["ir_per_prefill_step"] for x in runs.values()]]
    rows += [[f"  {f} (inclusive)"] + [x["inclusive_per_decode_token"][f] for x in runs.values()]
             for f in first["inclusive_per_decode_token"] if any(x["inclusive_per_decode_token"][f] for x in runs.values())]
    funcs = sorted({f for x in runs.values() for f in x["self_per_decode_token"]},     # ties by name: one order
                   key=lambda f: (-max(x["self_per_decode_token"].get(f, 0) for x in runs.values()), f))
    rows += [[f"  {f} (self)"] + [x["self_per_decode_token"].get(f) for x in runs.values()] for f in funcs]
    return Figures(f"callgrind: instructions of the native engine (x86-64 build, -O2) per step, decode tokens at "
                  f"positions {first['prompt_tokens']}..{first['prompt_tokens'] + first['decode_tokens'] - 1}",
                  ["figure"] + [f"{fmt} Ir" for fmt in runs], rows)


def predicted_table(r: dict) -> Figures | None:
    p = r.get("predicted")
    if not p:
        return None
    cols = [(b, m, v) for b, models in p.items() for m, v in models.items()]
    rows = [[ph] + [v["phase_ms"][ph] if v["fits"] else None for _, _, v in cols] for ph in PHASES]
    rows.append(["token"] + [v["total_ms"] if v["fits"] else "does not fit" for _, _, v in cols])
    rows.append(["tok/s"] + [v["tok_per_s"] if v["fits"] else None for _, _, v in cols])
    rows += [[f"{t} B/token"] + [v["bytes_per_token"][t] if v["fits"] else None for _, _, v in cols] for t in TIERS]
    return Figures("PREDICTED ms per decode token (the planner, from board profiles; not measured), the planner's "
                  "placement, mid-context, greedy head as converted (the tile scan at the calibration's expected rows; a "
                  "shape without weights has no head index: the whole head)", ["phase"] + [f"{b}\n{m}" for b, m, _ in cols],
                  rows)


def head_index_table(r: dict) -> Figures | None:
    res = r.get("head_index")
    if not res:
        return None
    measures = (("native_output_us", "native µs"), ("callgrind_head_instructions", "callgrind Ir"),
                ("emulated_output_cycles", "emulated cycles"))
    rows = []
    for name, m in res.items():
        i, w = m["index"], m["whole"]
        rows.append([name, "kept" if m["kept"] else "left out (forced below)", f"{i['head_rows_pct']:.1f} %"]
                    + [rat(i[k] / w[k]) if k in i else "-" for k, _ in measures])
    return Figures("greedy head: output phase with the head index / without (the whole head), one run; a model "
                  "convert left it out shows the forced index", ["model", "convert's index", "rows visited"]
                  + [label for _, label in measures], rows)


def ratios_table(r: dict, before: dict) -> Figures | None:
    prev = before.get("ratios", {})
    rows = [[k, rat(v), rat(prev.get(k)), rat(ratio(v, prev.get(k)))] for k, v in r.get("ratios", {}).items()]
    return Figures("ratios measured in this run", ["ratio", "now", "previous run's", "now/previous"], rows) if rows else None


def comparison_tables(now: dict, before: dict) -> list[Figures]:
    """One table per top-level entry but the ratios: every figure, the previous run's, and now/previous."""
    out, groups = [], {}
    for key, v, p, q in compare(flatten({k: v for k, v in now.items() if k != "ratios"}), flatten(before)):
        top, _, rest = key.partition(".")
        groups.setdefault(top, []).append([rest or top, v, p, rat(q)])
    for top, rows in groups.items():
        out.append(Figures(f"{top}: now vs previous run", ["figure", "now", "previous", "now/previous"], rows))
    return out


def print_report(console: Console, results: dict, previous: dict) -> None:
    for t in (phase_table(results), bytes_table(results), callgrind_table(results), predicted_table(results),
              head_index_table(results)):
        if t is not None:
            console.print(rich_table(t))
    console.print(f"previous run: {previous.get('when', 'none')}")
    for t in comparison_tables(results, previous):
        console.print(rich_table(t))
    t = ratios_table(results, previous)
    if t is not None:
        console.print(rich_table(t))
