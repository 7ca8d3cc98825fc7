"""The typed options of ``flashlm plan`` and ``flashlm compare``: what a plan is for besides the
board (``PlanQuery``) and, for ``plan --roofline``, what passes of several tokens to predict
(``Passes``). The command line builds them once (host/cli/plan.py, host/cli/compare.py); scripts
build them directly."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # the model loaders (numpy, torch): not for the command line's --help
    from .model_source import Source


@dataclass(frozen=True)
class PlanQuery:
    """``ctx``: plan for a shorter context than the model's; ``kv``: the KV cache format (None: the
    blob's, else int8 as convert writes); ``batch``: the most tokens one pass runs (None: the blob's,
    else 1); ``pos``: the position per-token figures are quoted at (None: mid-context); ``line``: the
    cache line size (boards with seq_read_MBps_by_line)."""
    ctx: int | None = None
    kv: str | None = None
    batch: int | None = None
    pos: int | None = None
    line: int | None = None

    def kv_for(self, source: Source) -> str:
        return self.kv or source.kv()

    def batch_for(self, source: Source) -> int:
        return self.batch or source.batch()


@dataclass(frozen=True)
class Passes:
    """``plan --roofline``: ``measured``, a ``flashlm run --json`` report shown beside its
    predictions; ``speculate``, the proposers to predict (empty: prompt lookup, and the draft model
    when the image has one); ``acceptance``, per draft position instead of a calibration (e.g.
    "0.8,0.6"); ``calibration``, the text whose greedy decoding measures acceptance (None: eval.txt
    beside the checkpoint); ``draft_k``, the most drafts a verification is quoted for."""
    measured: Path | None = None
    speculate: tuple[str, ...] = ()
    acceptance: str | None = None
    calibration: Path | None = None
    draft_k: int | None = None
