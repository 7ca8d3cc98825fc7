"""Board profiles: one TOML file per board in boards/."""
from __future__ import annotations

import tomllib
from pathlib import Path

from .ir import ModelError

BOARDS_DIR = Path(__file__).resolve().parent.parent / "boards"


def board_names() -> list[str]:
    return sorted(p.stem for p in BOARDS_DIR.glob("*.toml"))


def load_board(name: str) -> dict:
    path = BOARDS_DIR / f"{name}.toml"
    if not path.is_file():
        raise ModelError(f"unknown board {name!r}; known boards: {', '.join(board_names())}")
    with path.open("rb") as f:
        prof = tomllib.load(f)
    prof.setdefault("name", name)
    return prof
