"""How a run's numbers are named and shown everywhere (live view, summary, CSV, figures): phase
headers and colours, the unit a clock counts in, which phases a table shows, a token piece, and the
board and clock a figure was measured on."""
from __future__ import annotations

import re

from ..link.messages import PHASES, Hello, clock_name
from ..session.result import RunResult

PHASE_NAMES = {"embed": "embed", "attention": "attention", "ffn": "FFN", "ple": "PLE", "output": "output",
               "sampling": "sampling", "draft": "draft"}
# the HELLO clock whose counts are instructions the emulator ran (the QEMU boards), not time: its
# figures are never called µs, and no tok/s is made from them
INSTRUCTION_CLOCK = "emulated instructions"
PHASE_COLORS = {"embed": "#4c72b0", "attention": "#dd8452", "ffn": "#55a868", "ple": "#937860",
                "output": "#c44e52", "sampling": "#8172b3", "draft": "#8c8c8c"}
PLE_INDEX = PHASES.index("ple")
DRAFT_INDEX = PHASES.index("draft")


def unit(clock: str | None) -> str:
    """What a board's per-phase figures count under the HELLO clock named ``clock``."""
    return "instructions" if clock == INSTRUCTION_CLOCK else "µs"


def phase_header(phase: str, clock: str | None) -> str:
    """A phase's column header: its name and the unit its figures count in ("attention µs")."""
    return f"{PHASE_NAMES.get(phase, phase)} {unit(clock)}"


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
