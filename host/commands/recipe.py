"""How a checkpoint is quantized: the recipe convert, plan and compare take from --format,
--group-size, --quant and --scales."""
from __future__ import annotations

from dataclasses import dataclass

from converter.quantize import DEFAULT_GROUP   # --group-size when not given, per format (re-exported for the CLI)


@dataclass(frozen=True)
class Recipe:
    fmt: str = "q8"                     # the default weight format (q8 or q4)
    group_size: int = 32
    quant: tuple[str, ...] = ()         # per-tensor overrides, PATTERN=FMT[:G]
    scales: str | None = None           # row, f32 or f16 (None: row, or a llama2.c Q8_0's own)
