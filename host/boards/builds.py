"""``flashlm build`` and ``flashlm flash``: firmware for a board, sized for a model. Without ``-o``
a build goes to MODEL/build/BOARD; with or without it, the model directory records the build
(MODEL/.flashlm-build-BOARD.json) so that ``run --board`` reuses it while model and firmware sources
are unchanged. A model directory that cannot be written uses ~/.cache/flashlm/build instead."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .console import step
from .errors import UserError
from .model_dir import load_manifest


def _firmware_digest() -> str:
    import firmware
    fw = Path(firmware.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(fw.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".c", ".h", ".j2", ".py", ".ld", ".txt"):
            st = p.stat()
            h.update(f"{p.relative_to(fw)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _build_key(board: str, manifest: dict) -> str:
    """What a recorded build must match to be reused: board, model, layout and firmware sources."""
    return hashlib.sha256(f"{board}|{manifest['model_hash']}|{manifest.get('layout_id')}|{_firmware_digest()}"
                          .encode()).hexdigest()


def _record_path(model_dir: Path, board: str) -> Path:
    """Where the last build of this model for ``board`` is recorded: which binary, built from what."""
    return _home(model_dir) / f".flashlm-build-{board}.json"


def _write_record(model_dir: Path, board: str, key: str, binary) -> None:
    from .report import atomic_write_bytes
    atomic_write_bytes(_record_path(model_dir, board),
                       json.dumps({"key": key, "binary": str(Path(binary).resolve())}).encode())


def _build(console, board: str, out_dir: Path, blob: Path):
    from firmware.build import build_firmware
    with console.status(f"building firmware for {board}"):
        return build_firmware(board, out_dir, blob)


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


def ensure_native_binary(console, model_dir: Path, manifest: dict, board: str = "native") -> Path:
    """Build the native firmware for this model unless an up-to-date build is recorded."""
    out = build_dir_for(model_dir, board)
    key = _build_key(board, manifest)
    try:
        rec = json.loads(_record_path(model_dir, board).read_text())
        if rec.get("key") == key and Path(rec["binary"]).is_file():
            console.print(f"  firmware up to date: {rec['binary']}")
            return Path(rec["binary"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    step(console, f"building {board} firmware into {out}")
    res = _build(console, board, out, model_dir / manifest["blob"])
    if res.binary is None:
        raise UserError(f"board {board} has no host-runnable binary; flash {res.project_dir} and use --port")
    _write_record(model_dir, board, key, res.binary)
    if res.size_text:
        console.print(res.size_text, markup=False)
    return Path(res.binary)


def cmd_build(args, console) -> int:
    if not args.model:
        raise UserError("building firmware needs the model it is sized for: pass --model OUTDIR")
    from converter.boards import load_board
    load_board(args.board)             # an unknown board is refused before anything is written
    model_dir, manifest = load_manifest(args.model)
    out = Path(args.output) if args.output else build_dir_for(model_dir, args.board)
    step(console, f"building firmware for {args.board} into {out}")
    res = _build(console, args.board, out, model_dir / manifest["blob"])
    if res.size_text:
        console.print(res.size_text, markup=False, soft_wrap=True)
    if res.binary is not None:
        console.print(f"[green]binary[/] {res.binary}")
        _write_record(model_dir, args.board, _build_key(args.board, manifest), res.binary)
    elif (res.project_dir / "platformio.ini").is_file():
        console.print(f"[green]project[/] {res.project_dir} (PlatformIO; build and flash it with "
                      f"'flashlm flash {res.project_dir}')", soft_wrap=True)
    else:
        console.print(f"[green]project[/] {res.project_dir} (build and flash it with the board's toolchain)")
    return 0


# ---------------------------------------------------------------------------------------------
# flash

def cmd_flash(args, console) -> int:
    from .flash import flash
    return flash(args.project, port=args.port, dry_run=args.dry_run,
                 echo=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
