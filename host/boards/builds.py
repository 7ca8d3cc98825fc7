"""Firmware builds of a model for a board, and the record that lets a run reuse one. Without
``-o`` a build goes to MODEL/build/BOARD; with or without it, the model directory records the build
(MODEL/.flashlm-build-BOARD.json) so that ``run --board`` reuses it while model and firmware sources
are unchanged. A model directory that cannot be written uses ~/.cache/flashlm/build instead."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import firmware

from ..errors import UserError
from ..files import atomic_write_bytes
from ..model_dir import ModelDir
from ..output.console import step


def _firmware_digest() -> str:
    fw = Path(firmware.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(fw.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".c", ".h", ".s", ".S", ".j2", ".py", ".ld", ".txt"):
            st = p.stat()
            h.update(f"{p.relative_to(fw)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _build_key(board: str, model: ModelDir) -> str:
    """What a recorded build must match to be reused: board, model, layout and firmware sources."""
    return hashlib.sha256(f"{board}|{model.model_hash}|{model.layout_id}|{_firmware_digest()}"
                          .encode()).hexdigest()


def _record_path(model_dir: Path, board: str) -> Path:
    """Where the last build of this model for ``board`` is recorded: which binary, built from what."""
    return _home(model_dir) / f".flashlm-build-{board}.json"


def record_build(model: ModelDir, board: str, binary) -> None:
    """Record ``binary`` as the model's build for ``board`` (what ``ensure_firmware`` reuses)."""
    key = _build_key(board, model)
    atomic_write_bytes(_record_path(model.path, board),
                       json.dumps({"key": key, "binary": str(Path(binary).resolve())}).encode())


def build(console, board: str, out_dir: Path, model: ModelDir):
    """Render and build the firmware for ``board`` sized for the model's blob (firmware.build's
    result). A model whose own layout does not fit there is an error naming the plan command that
    places it; one that fits no placement, an error ending with the convert line that makes the
    planner's first suggestion, when the model folder recorded how it was converted."""
    # they load jinja2 and the planner: a run whose build is recorded never needs them
    from firmware.build import build_firmware
    from firmware.fits import LayoutNoFitError, NoFitError
    try:
        with console.status(f"building firmware for {board}"):
            return build_firmware(board, out_dir, model.blob)
    except LayoutNoFitError as e:
        raise UserError(e.text(model.path)) from None
    except NoFitError as e:
        fix = e.nofit.fixes[0] if e.nofit.fixes else {}
        cmd = model.convert_command(**fix) if fix else None
        if cmd is None:
            raise
        raise UserError(f"{e}; to convert it so: {cmd}") from None


def _home(model_dir: Path) -> Path:
    """The model directory, or, when it cannot be written, a cache folder of its own."""
    d = model_dir.resolve()
    if os.access(d, os.W_OK):
        return d
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashlm" / "build"
    return cache / hashlib.sha256(str(d).encode()).hexdigest()[:16]


def build_dir_for(model_dir: Path, board: str) -> Path:
    """The default build folder of a model for a board: MODEL/build/BOARD (one per model, so two
    models in one folder never overwrite each other's builds)."""
    return _home(model_dir) / "build" / board


def ensure_firmware(console, model: ModelDir, board: str = "native") -> Path:
    """The model's host-runnable firmware for ``board`` (native, or an emulated board's image):
    built unless an up-to-date build is recorded."""
    out = build_dir_for(model.path, board)
    key = _build_key(board, model)
    try:
        rec = json.loads(_record_path(model.path, board).read_text())
        if rec.get("key") == key and Path(rec["binary"]).is_file():
            console.print(f"  firmware up to date: {rec['binary']}")
            return Path(rec["binary"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    step(console, f"building {board} firmware into {out}")
    res = build(console, board, out, model)
    if res.binary is None:
        raise UserError(f"board {board} has no host-runnable binary; flash {res.project_dir} and use --port")
    record_build(model, board, res.binary)
    if res.size_text:
        console.print(res.size_text, markup=False)
    return Path(res.binary)
