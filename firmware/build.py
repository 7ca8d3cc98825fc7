"""Render a firmware project for a board from the Jinja templates, and build it where this
machine can: the native board with the system C compiler through the rendered Makefile, the
emulated boards' bare-metal firmware with baremetal (the Cortex-M0+, rv32 and Xtensa toolchains),
the PlatformIO boards with platformio (which leaves the compiling to the user's machine)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jinja2

from converter.blob import read_header
from converter.boards import load_board
from converter.errors import FlashlmError
from converter.footprint import arena_bytes, build_arenas
from converter.ir import ModelConfig
from converter.tokenizer_enc import section_info

from .baremetal import TOOLCHAINS, build_baremetal
from .build_meta import (APP_DIR, APP_SOURCES, ENGINE_DIR, ENGINE_SOURCES, FW_VERSION, HAL_DIR, TEMPLATES_DIR,
                         BuildError, BuildResult)
from .exact_float import copy_sources
from .fits import TIER_SRAM, board_arena, check_fits
from .platformio import build_platformio


def render_project(board: str, out_dir, config: ModelConfig, min_group: int, header=None, text_bytes: int = 0) -> Path:
    """Write a complete project for ``board`` sized for a model of ``config`` into out_dir
    (with ``header``, the blob's BlobHeader, sized for its placement too — its batch and draft model
    included; ``text_bytes``: the longest text prompt the device encoder takes, which the receive
    buffer must hold)."""
    prof = load_board(board)
    out = Path(out_dir)
    src = out / "src"
    for d in (src / "engine", src / "app", src / "hal"):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    for folder in (ENGINE_DIR, APP_DIR):
        for p in folder.iterdir():
            if p.suffix in (".c", ".h"):
                shutil.copy2(p, src / folder.name / p.name)
    hal_dir = HAL_DIR / prof["hal"]
    hal_sources = sorted(p.name for p in hal_dir.glob("*.c"))
    for p in hal_dir.iterdir():
        shutil.copy2(p, src / "hal" / p.name)
    copy_sources(prof, src / "hal")      # boards without an FPU: flashlm's float arithmetic
    copy_isa_kernels(prof, src / "hal")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    c = config
    if header is None:
        arena, psram_arena = arena_bytes(c, min_group), 0
    elif prof.get("build") == "platformio":      # one arena in the tier board_arena chose
        a = board_arena(prof, header)
        arena, psram_arena = a.bytes, a.other if a.tier == TIER_SRAM else 0
    else:
        arena, psram_arena = build_arenas(header, prof)
    n_entries = len(header.entries) if header is not None else 0
    models = [c] + ([header.draft.config] if header is not None and header.draft is not None else [])
    ctx = dict(board=prof, fw_version=FW_VERSION, max_layers=c.n_layers,
               max_experts=max(1, *(m.n_experts for m in models)), max_top_k=max(1, *(m.moe_top_k for m in models)),
               arena_bytes=arena, psram_arena_bytes=psram_arena,
               rx_cap=64 + max(32 + 4 * c.max_seq_len, 12 + n_entries, 30 + text_bytes + text_bytes // 254),
               engine_sources=[p.name for p in ENGINE_SOURCES], app_sources=[p.name for p in APP_SOURCES],
               hal_sources=hal_sources,
               model_summary=(f"dim {c.dim}, {c.n_layers} layers, {c.n_heads}/{c.n_kv_heads} heads, "
                              f"hidden {c.hidden_dim}" + (f" x {c.n_experts} experts (top {c.moe_top_k})" if c.n_experts else "")
                              + f", vocab {c.vocab_size}, context {c.max_seq_len}"))
    (out / "flm_config.h").write_text(env.get_template("flm_config.h.j2").render(ctx))
    (src / "main.c").write_text(env.get_template("main.c.j2").render(ctx))
    if prof.get("build") == "make":
        (out / "Makefile").write_text(env.get_template("Makefile.j2").render(ctx))
    return out


RS_SCALAR = "kernels_rs_scalar.h"    # the row-scaled rows the instruction sets' kernels share


def copy_isa_kernels(prof: dict, hal: Path) -> None:
    """The instruction set's kernels a profile names (``kernels = "rv32"``: firmware/hal/kernels_rv32.h),
    as the project's kernels_arch.h (kernel_hooks.h includes it), with the row-scaled rows they share
    (kernels_rs_scalar.h): one source per instruction set for every HAL that runs on it (the real
    chips' ESP-IDF HAL and their instruction sets in QEMU)."""
    name = prof.get("kernels")
    if not name:
        return
    src = HAL_DIR / f"kernels_{name}.h"
    if not src.is_file():
        raise BuildError(f"board {prof['name']}: no kernels {name!r} (firmware/hal/kernels_{name}.h)")
    if (hal / "kernels_arch.h").exists():
        raise BuildError(f"board {prof['name']}: HAL {prof['hal']} has kernels of its own; drop kernels = {name!r}")
    shutil.copy2(src, hal / "kernels_arch.h")
    shutil.copy2(HAL_DIR / RS_SCALAR, hal / RS_SCALAR)


def build_firmware(board: str, out_dir, blob) -> BuildResult:
    """Render and build the project for ``board`` sized for the model in the blob file ``blob``."""
    prof = load_board(board)
    h = read_header(blob)
    check_fits(prof, h)
    min_group = min(e.group_size for e in h.entries if e.fmt in ("q8", "q4"))
    enc = section_info(blob, h)
    out = render_project(board, out_dir, h.config, min_group, h,
                         enc.text_capacity(h.config.max_seq_len) if enc is not None else 0)
    if prof.get("build") in TOOLCHAINS:
        return build_baremetal(board, prof, out, blob, h, min_group)
    if prof.get("build") == "platformio":
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
