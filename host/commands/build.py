"""``flashlm build``: render and build the firmware for a board, sized for a model, and record the
build so that ``run --board`` reuses it (host/boards/builds.py)."""
from __future__ import annotations

from pathlib import Path

from converter.boards import load_board

from ..boards.builds import build, build_dir_for, record_build
from ..model_dir import ModelDir
from ..output.console import step


def build_firmware(console, model_path, board: str, out: Path | None = None) -> int:
    """Build for the model folder at ``model_path`` into ``out`` (default: MODEL/build/BOARD)."""
    load_board(board)             # an unknown board is refused before anything is written
    model = ModelDir.open(model_path)
    out = Path(out) if out else build_dir_for(model.path, board)
    step(console, f"building firmware for {board} into {out}")
    res = build(console, board, out, model)
    if res.size_text:
        console.print(res.size_text, markup=False, soft_wrap=True)
    if res.binary is not None:
        console.print(f"[green]binary[/] {res.binary}")
        record_build(model, board, res.binary)
    elif (res.project_dir / "platformio.ini").is_file():
        console.print(f"[green]project[/] {res.project_dir} (PlatformIO; build and flash it with "
                      f"'flashlm flash {res.project_dir}')", soft_wrap=True)
    else:
        console.print(f"[green]project[/] {res.project_dir} (build and flash it with the board's toolchain)")
    return 0
