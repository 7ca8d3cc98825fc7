"""Whether a blob's own layout fits a board's RAM, decided before anything is written: the
bare-metal build links its arenas statically in SRAM (and PSRAM); a PlatformIO board allocates one arena, in the
tier ``board_arena`` chooses; the native board has room for any. A layout that does not fit is a
BuildError naming the shortfall per tier (``no_fit_error``)."""
from __future__ import annotations

from dataclasses import dataclass

from converter.costmodel import ModelSpec
from converter.footprint import STATIC_ARENA_BUILDS, layout_needs
from converter.planner import NoFit, plan

from .build_meta import BuildError

TIER_PSRAM, TIER_SRAM = 1, 2     # blob.h's FLM_TIER_*
OTHER_RAM = {"sram": "psram", "psram": "sram"}


def budget(prof: dict, tier: str) -> int:
    """What flashlm may use of a RAM tier (the profile's budget, else its capacity; 0: none)."""
    t = prof.get("tiers", {}).get(tier)
    if not t:
        return 0
    return int(t.get("budget", t.get("capacity", 0)))


class NoFitError(BuildError):
    """A blob that fits no placement on the board: the planner's one-line summary, and its NoFit
    (``nofit``: the shortfall per tier and the suggestions with the convert options of each)."""

    def __init__(self, nofit: NoFit):
        super().__init__(str(nofit))
        self.nofit = nofit


class LayoutNoFitError(BuildError):
    """The blob's own layout does not fit the board's RAM though a placement of the model does:
    ``text(model)`` is the error naming the command that places it (for the model folder ``model``)."""

    def __init__(self, board: str, layout_id: int, shortfall: dict):
        self.board, self.layout_id, self.shortfall = board, layout_id, shortfall
        super().__init__(self.text("MODEL"))

    def text(self, model) -> str:
        parts = [f"{t} needs {n:,} bytes, budget {b:,}: short by {n - b:,}" for t, (n, b) in self.shortfall.items()]
        return (f"the blob's layout {self.layout_id} does not fit {self.board}'s RAM ({'; '.join(parts)}); "
                f"'flashlm plan {model} --board {self.board} --apply' places it within the budgets")


def no_fit_error(prof: dict, header, shortfall: dict) -> BuildError:
    """The error for a blob whose own layout does not fit the board's RAM budgets (``shortfall``:
    tier -> (need, budget)): when no placement of the model fits, the planner's shortfall per tier and
    what would fit, planned as the blob runs (its KV cache format and batch); else the layout's
    shortfall and the command that places the model within the budgets."""
    st = header.state_tiers
    try:
        plan(ModelSpec.from_header(header), prof, kv=st.kv, batch=st.batch)
    except NoFit as e:
        return NoFitError(e)
    return LayoutNoFitError(prof["name"], header.layout_id, shortfall)


@dataclass(frozen=True)
class Arena:
    tier: int           # TIER_SRAM or TIER_PSRAM: where main.c asks the HAL for it
    bytes: int          # everything the blob's layout puts in that tier
    other: int          # what the layout puts in the other RAM tier (the HAL's staging pool there)

    @property
    def tier_name(self) -> str:
        return "psram" if self.tier == TIER_PSRAM else "sram"


def board_arena(prof: dict, header) -> Arena:
    """The arena of a PlatformIO build running the blob ``header`` (its own placement, applied by
    ``flashlm plan --apply`` or the converter's default): one block holding everything the layout
    puts in its tier (staged tensors, state regions, prompt), in SRAM when the state's default home
    fits the SRAM budget, else in PSRAM. The budgets are the profile's: for SRAM the largest block
    the firmware can allocate. A layout that fits neither is an error naming the shortfall per tier."""
    budgets = {"sram": budget(prof, "sram"), "psram": budget(prof, "psram")}
    shortfalls = []
    for default in ["sram"] + (["psram"] if budgets["psram"] else []):
        need = layout_needs(header, default)
        short = {t: (need[t], budgets[t]) for t in need if need[t] > budgets[t]}
        if not short:   # the arena: the default tier, unless the layout puts nothing there
            home = default if need[default] or not need[OTHER_RAM[default]] else OTHER_RAM[default]
            return Arena(TIER_PSRAM if home == "psram" else TIER_SRAM, need[home], need[OTHER_RAM[home]])
        shortfalls.append(short)
    raise no_fit_error(prof, header, min(shortfalls, key=lambda s: sum(n - b for n, b in s.values())))


def check_fits(prof: dict, header) -> None:
    """Refuse a blob whose own layout does not fit the board's RAM budgets."""
    if prof.get("build") == "platformio":
        board_arena(prof, header)
    elif prof.get("build") in STATIC_ARENA_BUILDS:
        need = layout_needs(header)
        short = {t: (need[t], budget(prof, t)) for t in ("sram", "psram") if need[t] > budget(prof, t)}
        if short:            # the planner's shortfall, not the linker's overflow
            raise no_fit_error(prof, header, short)
