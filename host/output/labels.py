"""How a run's numbers are named and shown everywhere (live view, summary, CSV, figures): phase
headers and colours, which phases a table shows, a token piece, and the board and clock a figure
was measured on."""
from __future__ import annotations

import re

from ..link.messages import PHASES, Hello, clock_name
from ..session.result import RunResult

PHASE_HEADERS = {"embed": "embed µs", "attention": "attention µs", "ffn": "FFN µs", "ple": "PLE µs",
                 "output": "output µs", "sampling": "sampling µs", "draft": "draft µs"}
PHASE_COLORS = {"embed": "#4c72b0", "attention": "#dd8452", "ffn": "#55a868", "ple": "#937860",
                "output": "#c44e52", "sampling": "#8172b3", "draft": "#8c8c8c"}
PLE_INDEX = PHASES.index("ple")
DRAFT_INDEX = PHASES.index("draft")


def shown_phases(tokens, ple: bool = False, draft: bool = False) -> list[str]:
    """The phases a table shows: all seven, without ``ple`` for a model that has no PLE (the caller
    says so, or every step so far spent 0 µs there), without ``draft`` when nothing was drafted
    (likewise). JSON and CSV always keep all seven."""
    ple = ple or any(t.us[PLE_INDEX] for t in tokens)
    draft = draft or any(t.us[DRAFT_INDEX] for t in tokens)
    return [p for p in PHASES if (p != "ple" or ple) and (p != "draft" or draft)]


_SURROGATE = re.compile(r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])")


def piece_repr(piece: bytes | None) -> str:
    """A token piece shown safely: Python repr of its text, bytes that are not UTF-8 as \\xNN."""
    if piece is None:
        return ""
    return _SURROGATE.sub(r"\1\\x\2", repr(bytes(piece).decode("utf-8", "surrogateescape")))


def fmt(v, nd: int = 0) -> str:
    if v is None:
        return "–"
    if nd == 0:
        return f"{v:,.0f}"
    return f"{v:,.{nd}f}"


def where(result_or_hello: RunResult | Hello | None) -> str:
    """'board X, clock Y' for a RunResult or a Hello (None: before the handshake)."""
    if isinstance(result_or_hello, RunResult):
        return f"board {result_or_hello.board}, {result_or_hello.clock}"
    h = result_or_hello
    if h is None:
        return f"board ?, {clock_name(None)}"
    return f"board {h.board or '?'}, {clock_name(h.clock)}"
