"""The native board (the engine compiled for this computer): µs per phase (median over decode steps,
from the firmware's clock — the host's monotonic clock on this board), tok/s, and the bytes a
decode token reads per tier (the engine's own counters), for the default model at q8 and q4."""
from __future__ import annotations

import statistics
from pathlib import Path

from host.protocol import PHASES, TIERS
from host.virtual import start_native_board

from .model import FORMATS, blob_and_firmware, default_quant, prompt_ids, session


def native_run(qm, work: Path, new_tokens: int = 96) -> dict:
    blob, fw = blob_and_firmware(qm, "native", work)
    with start_native_board(fw.binary, blob) as board, session(board.port, 30) as s:
        res = s.generate(prompt_ids(qm), new_tokens)
    dec = res.generated_steps[1:]      # decode steps only (the first generated step ends the prompt)
    per_phase = {p: statistics.median(t.us[i] for t in dec) for i, p in enumerate(PHASES)}
    total_us = sum(sum(t.us) for t in dec)
    return dict(clock=res.clock, board=res.board, decode_steps=len(dec),
                us_median=per_phase, tok_per_s=len(dec) / (total_us / 1e6) if total_us else float("inf"),
                bytes_per_token={tier: dec[-1].bytes_read[i] for i, tier in enumerate(TIERS)},
                bytes_per_token_at_pos=dec[-1].pos)


def section(work: Path) -> dict:
    out = {f"native_{fmt}": native_run(default_quant(fmt), work / fmt) for fmt in FORMATS}
    q8, q4 = out["native_q8"], out["native_q4"]
    out["ratios"] = {"native q4/q8 tok/s": q4["tok_per_s"] / q8["tok_per_s"],
                     "q4/q8 flash bytes per token": q4["bytes_per_token"]["flash"] / q8["bytes_per_token"]["flash"]}
    return out
