"""Board profiles: one TOML file per board in boards/."""
from __future__ import annotations

import tomllib
from pathlib import Path

from .ir import ModelError

BOARDS_DIR = Path(__file__).resolve().parent.parent / "boards"


def board_names() -> list[str]:
    return sorted(p.stem for p in BOARDS_DIR.glob("*.toml"))


def _read(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


def load_board(name: str) -> dict:
    """The profile boards/NAME.toml, or the one listing NAME in its ``aliases``."""
    path = BOARDS_DIR / f"{name}.toml"
    if not path.is_file():
        path = next((p for p in sorted(BOARDS_DIR.glob("*.toml")) if name in _read(p).get("aliases", ())), None)
        if path is None:
            raise ModelError(f"unknown board {name!r}; known boards: {', '.join(board_names())}")
    prof = _read(path)
    prof.setdefault("name", path.stem)
    return prof


def stream_stride(prof: dict) -> int:
    """The widest row stride whose products (of any number of tokens) the board streams from flash
    into SRAM whole, padding and all ([flash].stream_chunk_bytes: the RP2040's stream_rp2040.c); 0: it
    streams none."""
    return int(prof.get("flash", {}).get("stream_chunk_bytes", 0))
