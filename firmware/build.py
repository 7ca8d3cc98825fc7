"""Render a firmware project for a board from the Jinja templates, and build it where this
machine can (the native board: the system C compiler through the rendered Makefile)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import jinja2

from converter.boards import load_board
from converter.errors import FlashlmError
from converter.footprint import arena_bytes, build_arenas
from converter.blob import read_header
from converter.tokenizer_enc import section_info
from converter.ir import ModelConfig

FW_DIR = Path(__file__).resolve().parent
ENGINE_DIR = FW_DIR / "engine"
FW_VERSION = "0.1.0"


class BuildError(FlashlmError, RuntimeError):
    """The firmware could not be rendered or compiled; the message is for the user."""


@dataclass(frozen=True)
class BuildResult:
    board: str
    project_dir: Path
    binary: Path | None
    size_text: str


def no_fit_error(prof: dict, header, shortfall: dict) -> BuildError:
    """The error for a blob whose own layout does not fit the board's RAM budgets (``shortfall``:
    tier -> (need, budget)): the planner's shortfall per tier and what would fit when no placement
    fits, else the layout's shortfall and the command that places the model within the budgets."""
    from converter.costmodel import ModelSpec
    from converter.planner import NoFit, plan
    try:
        plan(ModelSpec.from_header(header), prof)
    except NoFit as e:
        return BuildError(str(e))
    parts = [f"{t} needs {n:,} bytes, budget {b:,}: short by {n - b:,}" for t, (n, b) in shortfall.items()]
    return BuildError(f"the blob's layout {header.layout_id} does not fit {prof['name']}'s RAM ({'; '.join(parts)}); "
                      f"'flashlm plan MODEL --board {prof['name']} --apply' places it within the budgets")


def check_fits(prof: dict, header) -> None:
    """Refuse, before anything is written, a blob whose own layout does not fit the board's RAM
    budgets: the bare-metal build links its arena statically in SRAM, the PlatformIO boards
    allocate one arena (firmware.platformio.board_arena); the native board has room for any."""
    if prof.get("build") == "platformio":
        from .platformio import board_arena
        board_arena(prof, header)
    elif prof.get("build") == "arm-gcc":
        from converter.footprint import layout_needs
        need, budget = layout_needs(header)["sram"], int(prof["tiers"]["sram"]["budget"])
        if need > budget:      # the planner's shortfall, not the linker's overflow
            raise no_fit_error(prof, header, {"sram": (need, budget)})


def engine_sources() -> list[str]:
    return sorted(p.name for p in ENGINE_DIR.glob("*.c"))


def render_project(board: str, out_dir, config: ModelConfig, min_group: int, header=None, text_bytes: int = 0) -> Path:
    """Write a complete project for ``board`` sized for a model of ``config`` into out_dir
    (with ``header``, the blob's BlobHeader, sized for its placement too — its batch and draft model
    included; ``text_bytes``: the longest text prompt the device encoder takes, which the receive
    buffer must hold)."""
    prof = load_board(board)
    out = Path(out_dir)
    src = out / "src"
    for d in (src / "engine", src / "hal"):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    for p in ENGINE_DIR.iterdir():
        if p.suffix in (".c", ".h"):
            shutil.copy2(p, src / "engine" / p.name)
    hal_dir = FW_DIR / "hal" / prof["hal"]
    hal_sources = sorted(p.name for p in hal_dir.glob("*.c"))
    for p in hal_dir.iterdir():
        shutil.copy2(p, src / "hal" / p.name)
    from .exact_float import copy_sources
    copy_sources(prof, src / "hal")      # boards without an FPU: flashlm's float arithmetic
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(FW_DIR / "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    c = config
    if header is None:
        arena, psram_arena = arena_bytes(c, min_group), 0
    elif prof.get("build") == "platformio":      # one arena in the tier board_arena chose
        from .platformio import TIER_SRAM, board_arena
        a = board_arena(prof, header)
        arena, psram_arena = a.bytes, a.other if a.tier == TIER_SRAM else 0
    else:
        arena, psram_arena = build_arenas(header, prof)
    n_entries = len(header.entries) if header is not None else 0
    ctx = dict(board=prof, fw_version=FW_VERSION, max_layers=c.n_layers,
               arena_bytes=arena, psram_arena_bytes=psram_arena,
               rx_cap=64 + max(32 + 4 * c.max_seq_len, 12 + n_entries, 30 + text_bytes + text_bytes // 254),
               engine_sources=engine_sources(), hal_sources=hal_sources,
               model_summary=(f"dim {c.dim}, {c.n_layers} layers, {c.n_heads}/{c.n_kv_heads} heads, "
                              f"hidden {c.hidden_dim}, vocab {c.vocab_size}, context {c.max_seq_len}"))
    (out / "flm_config.h").write_text(env.get_template("flm_config.h.j2").render(ctx))
    (src / "main.c").write_text(env.get_template("main.c.j2").render(ctx))
    if prof.get("build") == "make":
        (out / "Makefile").write_text(env.get_template("Makefile.j2").render(ctx))
    return out


def build_firmware(board: str, out_dir, blob) -> BuildResult:
    """Render and build the project for ``board`` sized for the model in the blob file ``blob``."""
    prof = load_board(board)
    h = read_header(blob)
    check_fits(prof, h)
    min_group = min(e.group_size for e in h.entries if e.fmt in ("q8", "q4"))
    enc = section_info(blob, h)
    out = render_project(board, out_dir, h.config, min_group, h,
                         enc.text_capacity(h.config.max_seq_len) if enc is not None else 0)
    if prof.get("build") == "arm-gcc":
        from .build_arm import build_arm
        return build_arm(board, prof, out, blob, h, min_group)
    if prof.get("build") == "platformio":
        from .platformio import build_platformio
        return build_platformio(board, prof, out, blob, h)
    if prof.get("build") != "make":
        return BuildResult(board, out, None, "")
    if shutil.which("make") is None or shutil.which("cc") is None:
        raise BuildError("building the native board needs make and a C compiler (apt-get install build-essential)")
    r = subprocess.run(["make", "-s", "-C", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"firmware build failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    binary = out / "firmware"
    size = subprocess.run(["size", str(binary)], capture_output=True, text=True).stdout.strip()
    return BuildResult(board, out, binary, size)
