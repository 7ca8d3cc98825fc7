"""The native board (the engine compiled for this computer): µs per phase and tok/s from the
firmware's clock (the host's monotonic clock on this board) and the bytes a decode token reads per
tier (the engine's own counters), for the default model at q8 and q4.

Both boards run at once and generate the same prompt in turn, ``ROUNDS`` times, so a busy host
slows both alike; per decode step the fastest round counts (bench/speed.py ``fastest``)."""
from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

from host.link.messages import Generate, PHASES, TIERS
from host.boards.native import start_native_board

from .model import FORMATS, blob_and_firmware, default_quant, prompt_ids, session
from .speed import fastest

ROUNDS = 3
NEW_TOKENS = 96


def figures(runs: list) -> dict:
    """The figures of one model's rounds (decode steps only: the first generated step ends the prompt)."""
    last = runs[0].generated_steps[-1]
    per_step = fastest(runs, lambda t: sum(t.us), 1)
    return dict(clock=runs[0].clock, board=runs[0].board, decode_steps=len(per_step), rounds=len(runs),
                us_median={p: statistics.median(fastest(runs, lambda t: t.us[i], 1)) for i, p in enumerate(PHASES)},
                tok_per_s=len(per_step) / (sum(per_step) / 1e6) if sum(per_step) else float("inf"),
                bytes_per_token={tier: last.bytes_read[i] for i, tier in enumerate(TIERS)},
                bytes_per_token_at_pos=last.pos)


def section(work: Path) -> dict:
    runs: dict = {fmt: [] for fmt in FORMATS}
    with contextlib.ExitStack() as stack:
        sessions = {}
        for fmt in FORMATS:
            blob, fw = blob_and_firmware(default_quant(fmt), "native", work / fmt)
            board = stack.enter_context(start_native_board(fw.binary, blob))
            sessions[fmt] = stack.enter_context(session(board.port, 30))
        for _ in range(ROUNDS):
            for fmt, s in sessions.items():
                runs[fmt].append(s.generate(Generate(prompt_ids(default_quant(fmt)), NEW_TOKENS)))
    out = {f"native_{fmt}": figures(r) for fmt, r in runs.items()}
    q8, q4 = out["native_q8"], out["native_q4"]
    out["ratios"] = {"native q4/q8 tok/s": q4["tok_per_s"] / q8["tok_per_s"],
                     "q4/q8 flash bytes per token": q4["bytes_per_token"]["flash"] / q8["bytes_per_token"]["flash"]}
    return out
