"""``flashlm build``: render and build the firmware for a board, sized for a model, and record the
build so that ``run --board`` reuses it (host/boards/builds.py)."""
from __future__ import annotations

from pathlib import Path

from converter.blob import read_header
from converter.boards import load_board
from converter.costmodel import ModelSpec
from converter.planner import default_pos, plan
from converter.timing import predict
from firmware.fits import board_arena

from ..boards.builds import build, build_dir_for, record_build
from ..model_dir import ModelDir
from ..output.console import step


def build_firmware(console, model_path, board: str, out: Path | None = None) -> int:
    """Build for the model folder at ``model_path`` into ``out`` (default: MODEL/build/BOARD)."""
    prof = load_board(board)      # an unknown board is refused before anything is written
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
    if prof.get("build") == "platformio" and model.planned_for != board:
        layout_note(console, model, board, prof)
    return 0


def layout_note(console, model: ModelDir, board: str, prof: dict) -> None:
    """A real board's firmware runs the placement the blob records: say when that was not planned for
    this board, with the planner's prediction as built and once planned for it (the command that does
    it), unless planning would place nothing differently."""
    h = read_header(model.blob)
    spec, st = ModelSpec.from_header(h), h.state_tiers
    regions = st.regions(board_arena(prof, h).tier_name)
    as_built = predict(spec, prof, h.tiers, regions, default_pos(h.config.max_seq_len), st.kv)
    best = plan(spec, prof, kv=st.kv, batch=st.batch)
    if best.tiers == {t.name: h.tiers[t.name] for t in spec.tensors} and best.regions == regions:
        return
    whose = f"planned for {model.planned_for}" if model.planned_for else "convert's: every tensor read from flash"
    console.print(f"[yellow]layout[/]: the blob's own ({whose}), not planned for {board}: predicted "
                  f"{as_built.tok_s:,.2f} tok/s as built, {best.prediction.tok_s:,.2f} tok/s placed for {board} "
                  f"('flashlm plan {model.path} --board {board} --apply', then build again; predictions from the "
                  f"board profile)", soft_wrap=True)
