"""A run saved as files: JSON (everything, with the summary), CSV (one row per step), and the\nfigure (figure.py): ``Outputs`` names which a run writes."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from .. import files
from ..link.messages import PHASES, TIERS, clock_name
from ..session.result import RunResult, step_share
from .experts import step_dict, step_label
from .figure import plot_png
from .labels import piece_repr, unit
from .stats import harness_rows, step_total, summarize

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
            "total_us": step_total(t), "head_rows": t.head_rows, "logits_crc": t.logits_crc, **step_dict(t)}


def result_dict(result: RunResult) -> dict:
    d, q = result.done, result.request
    return {
        "format": "flashlm-run", "version": 1,
        "hello": _hello_dict(result.hello),
        "params": {"prompt_ids": list(result.prompt_ids), "prompt_text": result.prompt_text,
                   "max_new_tokens": q.max_new_tokens,
                   "temperature": q.temperature, "top_p": q.top_p, "seed": q.seed,
                   "slide": bool(q.slide), "all_logits": bool(result.all_logits),
                   "batch": q.batch, "speculate": q.speculate, "draft_k": q.draft_k},
        "done": None if d is None else {"steps": d.steps, "generated": d.generated, "reason": d.reason,
                                        "total_us": d.total_us, "phase_us": dict(zip(PHASES, map(int, d.phase_us))),
                                        "passes": d.passes, "verify_passes": d.verify_passes,
                                        "drafted": d.drafted, "accepted": d.accepted,
                                        "bytes_read": dict(zip(TIERS, map(int, d.bytes_read))),
                                        "draft_bytes": dict(zip(TIERS, map(int, d.draft_bytes))),
                                        "stack_peak": d.stack_peak, "stack_size": d.stack_size},
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
    return files.write_json(path, result_dict(result), allow_nan=False, default=_json_default)


def _json_default(o):
    if isinstance(o, (bytes, bytearray)):
        return bytes(o).hex()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def csv_fields(clock: str | None) -> list[str]:
    """The CSV's columns; the per-phase ones named by the clock's unit (embed_us, or
    embed_instructions on an instruction-counting board)."""
    sfx = time_suffix(clock)
    return (["step", "pos", "kind", "in_id", "out_id", "piece"] + [f"{p}_{sfx}" for p in PHASES]
            + [f"total_{sfx}"] + [f"{t}_bytes" for t in TIERS] + ["head_rows", "logits_crc", "board", "clock"]
            + ["pass_first", "pass_tokens", "pass_steps", "pass_kind", "experts"])


def time_suffix(clock: str | None) -> str:
    return "us" if unit(clock) == "µs" else unit(clock)


def write_csv(result: RunResult, path) -> Path:
    """One row per step, lost steps included (kind "missing", empty numbers). The µs (or
    instructions) and bytes are the forward pass's the step came from, as its TOKEN carried them
    (pass_first, pass_tokens: the pass; a step's share is them divided by pass_steps); experts: its
    token's per layer (experts.py)."""
    buf = io.StringIO()
    sfx = time_suffix(result.clock)
    w = csv.DictWriter(buf, fieldnames=csv_fields(result.clock), lineterminator="\n")
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
               f"total_{sfx}": int(sum(t.us)), "head_rows": t.head_rows, "logits_crc": t.logits_crc, "board": board,
               "clock": clock, "pass_first": t.chunk, "pass_tokens": t.chunk_len, "pass_steps": t.chunk_used,
               "pass_kind": t.kind, "experts": step_label(t)}
        row.update({f"{p}_{sfx}": int(u) for p, u in zip(PHASES, t.us)})
        row.update({f"{tier}_bytes": int(b) for tier, b in zip(TIERS, t.bytes_read)})
        w.writerow(row)
    return files.atomic_write_bytes(path, buf.getvalue().encode("utf-8"))


@dataclass(frozen=True)
class Outputs:
    """The files a run writes (None: not that one)."""
    json: Path | None = None
    csv: Path | None = None
    png: Path | None = None

    def write(self, console, result: RunResult) -> None:
        for path, fn, what in ((self.json, write_json, "JSON"), (self.csv, write_csv, "CSV"),
                               (self.png, plot_png, "plot")):
            if path:
                fn(result, path)
                console.print(f"[green]wrote[/] {what} {path}")
