"""Build the bare-metal Arm firmware (board profiles with ``build = "arm-gcc"``, e.g. rp2040-emu):
the rendered project plus a Makefile for Debian's arm-none-eabi-gcc, producing firmware.elf and
firmware.bin (the flash image from the start of the XIP window; the weights blob is placed at the
board's ``[flash].blob_offset`` by whoever loads the flash — the emulator harness)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jinja2

from converter.footprint import arena_bytes, layout_needs

from .build_meta import APP_SOURCES, ENGINE_SOURCES, TEMPLATES_DIR, BuildError, BuildResult
from .fits import no_fit_error

CLOCK_KINDS = {"host clock": 0, "chip timer": 1, "emulated timer": 2}
APT_HINT = "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi"
ARENA_DEFINE = re.compile(r"#define FLM_ARENA_BYTES (\d+)u")
RAM_OVERFLOW = re.compile(r"region [`']?RAM'? overflowed by (\d+) bytes")


def blob_window(prof: dict) -> tuple[int, int]:
    """(offset, bytes) of the flash window the weights blob may occupy on this board."""
    off = int(prof["flash"]["blob_offset"])
    return off, int(prof["tiers"]["flash"]["capacity"]) - off


def render_makefile(prof: dict, out: Path) -> None:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    hal_dir = out / "src" / "hal"
    scripts = sorted(p.name for p in hal_dir.glob("*.ld"))
    if len(scripts) != 1:
        raise BuildError(f"HAL {prof['hal']} must hold exactly one linker script, found {scripts or 'none'}")
    ctx = dict(board=prof, cpu=prof.get("cpu", "cortex-m0plus"), linker_script=scripts[0],
               blob_offset=hex(blob_window(prof)[0]), baud=int(prof.get("uart_baud", 115200)),
               clock_kind=CLOCK_KINDS.get(prof.get("timer", "chip timer"), 1),
               engine_sources=[p.name for p in ENGINE_SOURCES], app_sources=[p.name for p in APP_SOURCES],
               hal_sources=sorted(p.name for p in hal_dir.iterdir() if p.suffix in (".c", ".s")))
    (out / "Makefile").write_text(env.get_template("Makefile-arm.j2").render(ctx))


def _ram_overflow(text: str) -> bool:
    return bool(RAM_OVERFLOW.search(text)) or "RAM overflow" in text


def _make(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(out)], capture_output=True, text=True)


def _set_arena(out: Path, n: int) -> None:
    cfg = out / "flm_config.h"
    cfg.write_text(ARENA_DEFINE.sub(f"#define FLM_ARENA_BYTES {n}u", cfg.read_text()))


def _arena_room(out: Path) -> int:
    """The most SRAM the arena can have beside the firmware's own data and the linker script's
    stack floor: linked with an arena of 8 bytes, the stack's room less its floor, plus those 8."""
    _set_arena(out, 8)
    if _make(out).returncode != 0:
        return 0
    syms = symbols(out / "firmware.elf")
    return (syms["__stack_free"] - syms["__stack_min"] + 8) & ~7


def _link_error(text: str, prof: dict, arena: int) -> str | None:
    """A one-line explanation of a failed link that is about memory, else None."""
    ram = int(prof["tiers"]["sram"]["capacity"])
    m = RAM_OVERFLOW.search(text)
    if _ram_overflow(text):
        over = f" ({int(m.group(1)):,} bytes over)" if m else ""
        return (f"the model does not fit in {prof['name']}'s {ram // 1024} KB of SRAM{over}: KV cache, "
                f"scratch and prompt buffer need {arena:,} bytes, plus the firmware's own data and an 8 KB "
                f"stack; use a shorter context, fewer layers or a smaller vocabulary")
    if "below the weights blob offset" in text or re.search(r"region [`']?FLASH'? overflowed", text):
        return f"the firmware code does not fit below the blob offset {blob_window(prof)[0]:#x} in flash"
    return None


def build_arm(board: str, prof: dict, out: Path, blob, header, min_group: int) -> BuildResult:
    """Compile the rendered project in ``out`` for the Cortex-M; check the blob fits the flash."""
    off, room = blob_window(prof)
    blob_size = Path(blob).stat().st_size
    if blob_size > room:
        raise BuildError(f"the model image is {blob_size:,} bytes but {board}'s flash holds {room:,} bytes "
                         f"for it ({int(prof['tiers']['flash']['capacity']) // 1024} KB chip, blob at "
                         f"offset {off:#x}); use int4 (--format q4) or a smaller model")
    render_makefile(prof, out)
    cc = "arm-none-eabi-gcc"
    if shutil.which("make") is None or shutil.which(cc) is None:
        raise BuildError(f"building {board} needs make and {cc} ({APT_HINT})")
    r = _make(out)
    m = ARENA_DEFINE.search((out / "flm_config.h").read_text())
    arena = int(m.group(1)) if m else arena_bytes(header.config, min_group, header.state_tiers.batch)
    if r.returncode != 0 and _ram_overflow((r.stderr or "") + (r.stdout or "")):
        # the firmware's own data grows with the model (the receive buffer holds a full-context
        # prompt): the arena takes what is left, if that holds the layout
        need, room = layout_needs(header)["sram"], _arena_room(out)
        if room < need:
            sram = {**prof["tiers"]["sram"], "budget": room}
            raise no_fit_error({**prof, "tiers": {**prof["tiers"], "sram": sram}}, header, {"sram": (need, room)})
        arena = room
        _set_arena(out, arena)
        r = _make(out)
    if r.returncode != 0:
        text = (r.stderr or "") + (r.stdout or "")
        why = _link_error(text, prof, arena)
        if why:
            raise BuildError(why)
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        raise BuildError(f"firmware build failed: {lines[-1] if lines else 'no output'} (in {out})")
    elf = out / "firmware.elf"
    size = subprocess.run(["arm-none-eabi-size", str(elf)], capture_output=True, text=True).stdout.strip()
    syms = symbols(elf)
    text_b = syms["__firmware_end"] - 0x10000000
    ram_used = syms["__bss_end"] - 0x20000000
    ram = int(prof["tiers"]["sram"]["capacity"])
    size += (f"\nflash: firmware {text_b:,} B + blob {blob_size:,} B at {0x10000000 + off:#x} (room {room:,} B)"
             f"\nRAM:   .data+.bss {ram_used:,} of {ram:,} B (arena {arena:,} B), stack {ram - ram_used:,} B")
    return BuildResult(board, out, out / "firmware.bin", size)


def symbols(elf: Path) -> dict[str, int]:
    """Name -> address of the symbols in ``elf`` (arm-none-eabi-nm; a Thumb function's with bit 0 clear)."""
    r = subprocess.run(["arm-none-eabi-nm", str(elf)], capture_output=True, text=True)
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[2]] = int(parts[0], 16)
    return out
