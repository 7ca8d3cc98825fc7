"""The planner's PREDICTED cost of a decode token (from board profiles, nothing runs): ms per phase,
tok/s and bytes per tier for the default model at q8 and q4 and the ``ple-28m`` named shape on
the ESP32-S3 N16R8 and the Raspberry Pi Pico, each placed by the planner (``flashlm plan``), at
mid-context, the greedy head as converted (the default model: the tile scan at its calibration's
expected rows; the shape, without weights: the whole head and its argmax); plus the ple-28m
prediction beside its published ESP32-S3 measurement (bench/ple_seed.py)."""
from __future__ import annotations

from pathlib import Path

from converter.costmodel import PHASES, ModelSpec
from converter.planner import NoFit, plan
from converter.shapes import shape_spec

from . import ple_seed
from .model import FORMATS, default_quant

BOARDS = ("esp32s3-n16r8", "pico")


def specs() -> dict[str, ModelSpec]:
    out = {f"default_{fmt}": ModelSpec.from_quant(default_quant(fmt), f"models/default {fmt}") for fmt in FORMATS}
    out["ple_28m"] = shape_spec("ple-28m")
    return out


def predicted(spec: ModelSpec, board: str) -> dict:
    """One model on one board: the planner's placement and its predicted decode token."""
    try:
        pl = plan(spec, board)
    except NoFit as e:
        return dict(fits=0, why=str(e))
    p = pl.prediction
    return dict(fits=1, position=pl.pos, phase_ms={ph: p.phase_us[ph] / 1000 for ph in PHASES},
                total_ms=p.total_us / 1000, tok_per_s=p.tok_s, bytes_per_token=dict(p.bytes_read),
                staged={t: len(pl.staged(t)) for t in ("psram", "sram")})


def section(work: Path) -> dict:
    out = {b: {name: predicted(spec, b) for name, spec in specs().items()} for b in BOARDS}
    ratios = {}
    for b in BOARDS:
        q8, q4 = out[b]["default_q8"], out[b]["default_q4"]
        if q8["fits"] and q4["fits"]:
            ratios[f"predicted q4/q8 ms per token, {b}"] = q4["total_ms"] / q8["total_ms"]
    seed = ple_seed.seed_table()
    ratios["ple-28m predicted/published ms per token, esp32s3-n16r8"] = seed["ratio_total"]
    ratios["ple-28m predicted/best published ms per token, esp32s3-n16r8"] = seed["ratio_best"]
    return {"predicted": out, "ple_seed": seed, "ratios": ratios}
