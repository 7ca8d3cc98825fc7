"""``flashlm build`` and ``flashlm flash``: firmware for a board, sized for a model; the build
recorded beside the model so that a run reuses it while model and firmware sources are unchanged."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .console import step
from .errors import UserError
from .model_dir import load_manifest

BUILD_STAMP = ".flashlm-build.json"   # in a build dir: which model/firmware its binary was built from


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


def _write_build_stamp(out: Path, key: str, binary) -> None:
    from .report import atomic_write_bytes
    atomic_write_bytes(out / BUILD_STAMP, json.dumps({"key": key, "binary": str(Path(binary).resolve())}).encode())


def _build(console, board: str, out_dir: Path, blob: Path):
    from firmware.build import build_firmware
    with console.status(f"building firmware for {board}"):
        return build_firmware(board, out_dir, blob)


def build_dir_for(model_dir: Path, board: str) -> Path:
    base = model_dir.resolve().parent / "build"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base / board
    except OSError:
        pass
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashlm" / "build"
    return cache / board


def ensure_native_binary(console, model_dir: Path, manifest: dict, board: str = "native") -> Path:
    """Build the native firmware for this model unless an up-to-date build is recorded."""
    out = build_dir_for(model_dir, board)
    key = _build_key(board, manifest)
    try:
        rec = json.loads((out / BUILD_STAMP).read_text())
        if rec.get("key") == key and Path(rec["binary"]).is_file():
            console.print(f"  firmware up to date: {rec['binary']}")
            return Path(rec["binary"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    step(console, f"building {board} firmware into {out}")
    out.mkdir(parents=True, exist_ok=True)
    res = _build(console, board, out, model_dir / manifest["blob"])
    if res.binary is None:
        raise UserError(f"board {board} has no host-runnable binary; flash {res.project_dir} and use --port")
    _write_build_stamp(out, key, res.binary)
    if res.size_text:
        console.print(res.size_text, markup=False)
    return Path(res.binary)


def cmd_build(args, console) -> int:
    if not args.model:
        raise UserError("building firmware needs the model it is sized for: pass --model OUTDIR")
    model_dir, manifest = load_manifest(args.model)
    out = Path(args.output) if args.output else build_dir_for(model_dir, args.board)
    out.mkdir(parents=True, exist_ok=True)
    step(console, f"building firmware for {args.board} into {out}")
    res = _build(console, args.board, out, model_dir / manifest["blob"])
    if res.size_text:
        console.print(res.size_text, markup=False, soft_wrap=True)
    if res.binary is not None:
        console.print(f"[green]binary[/] {res.binary}")
        if not args.output:
            _write_build_stamp(out, _build_key(args.board, manifest), res.binary)
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
