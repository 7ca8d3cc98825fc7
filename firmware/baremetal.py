"""Build the bare-metal firmware of the emulated boards: profiles whose ``build`` names one of the
toolchains below. The rendered project gets a Makefile from the toolchain's template
(``firmware/templates/Makefile-<build>.j2``) and ``make`` builds it, so a project can be rebuilt by
hand (or with a changed flag or ``#define``, as the golden check's negative controls are):

- ``arm-gcc`` (rp2040-emu): Debian's arm-none-eabi-gcc and newlib for the Cortex-M0+; writes
  firmware.elf and firmware.bin, the flash image from the start of the XIP window that rp2040js
  loads (the weights blob goes at the board's ``[flash].blob_offset``: the harness puts it there).
- ``rv32-gcc`` (esp32c3-isa-qemu, esp32p4-isa-qemu): Debian's riscv64-unknown-elf-gcc with
  picolibc for the profile's ``march``/``mabi``; firmware.elf, which QEMU loads.
- ``xtensa-clang`` (esp32s3-isa-qemu): clang-22's Xtensa backend, llvm-mc-22 and
  binutils-xtensa-lx106's ld (the template says why each); firmware.elf.

The linker scripts place the blob at the profile's address (``[flash].blob_address``, or the XIP
window's start plus ``blob_offset``), passed with ``--defsym``, and fail the link when .data and
.bss leave too little stack, which ``_link_error`` turns into one line."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import jinja2

from converter.footprint import arena_bytes, layout_needs

from .build_meta import APP_SOURCES, ENGINE_SOURCES, TEMPLATES_DIR, BuildError, BuildResult
from .exact_float import soft_float
from .fits import no_fit_error

CLOCK_KINDS = {"host clock": 0, "chip timer": 1, "emulated timer": 2, "emulated instructions": 3}
ARENA_DEFINE = re.compile(r"#define FLM_ARENA_BYTES (\d+)u")
RAM_OVERFLOW = re.compile(r"region [`']?RAM'? overflowed by (\d+) bytes")


@dataclass(frozen=True)
class Toolchain:
    tools: tuple[str, ...]      # the programs the Makefile runs
    apt: str                    # the Debian packages that bring them
    nm: str                     # lists the ELF's symbols
    image: str                  # what the emulator loads
    specs: str | None = None    # a specs file the compiler must find (the C library)


TOOLCHAINS = {
    "arm-gcc": Toolchain(("make", "arm-none-eabi-gcc"), "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi",
                         "arm-none-eabi-nm", "firmware.bin"),
    "rv32-gcc": Toolchain(("make", "riscv64-unknown-elf-gcc"),
                          "apt-get install gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf",
                          "riscv64-unknown-elf-nm", "firmware.elf", "picolibc.specs"),
    # clang-22 is in Debian 12's bookworm-security (and later releases); the lx106 binutils' ld is the
    # one linker here that takes Xtensa objects (ld.lld refuses them)
    "xtensa-clang": Toolchain(("make", "clang-22", "llvm-mc-22", "xtensa-lx106-elf-ld"),
                              "apt-get install clang-22 llvm-22 binutils-xtensa-lx106",
                              "xtensa-lx106-elf-nm", "firmware.elf"),
}


def toolchain(prof: dict) -> Toolchain:
    return TOOLCHAINS[prof["build"]]


def blob_window(prof: dict) -> tuple[int, int]:
    """(offset, bytes) of the flash window the weights blob may occupy on this board."""
    off = int(prof["flash"]["blob_offset"])
    return off, int(prof["tiers"]["flash"]["capacity"]) - off


def missing_tools(prof: dict) -> str | None:
    """Why this machine cannot build the board (one line naming what to install), or None."""
    tc = toolchain(prof)
    missing = [t for t in tc.tools if shutil.which(t) is None]
    if not missing and tc.specs:
        cc = next(t for t in tc.tools if t != "make")
        r = subprocess.run([cc, f"-print-file-name={tc.specs}"], capture_output=True, text=True)
        if r.returncode != 0 or not Path(r.stdout.strip()).is_file():
            missing = [tc.specs]
    if not missing:
        return None
    return f"building {prof['name']} needs {', '.join(missing)} ({tc.apt}; or 'make emu-deps')"


def render_makefile(prof: dict, out: Path) -> None:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    hal_dir = out / "src" / "hal"
    scripts = sorted(p.name for p in hal_dir.glob("*.ld"))
    if len(scripts) != 1:
        raise BuildError(f"HAL {prof['hal']} must hold exactly one linker script, found {scripts or 'none'}")
    off, room = blob_window(prof)
    address = int(prof["flash"].get("blob_address", 0))
    sf = soft_float(prof)
    ctx = dict(board=prof, wraps=sf.symbols if sf and sf.wrap else (), cpu=prof.get("cpu", "cortex-m0plus"), linker_script=scripts[0],
               blob_offset=hex(off), blob_start=hex(address), blob_end=hex(address + room),
               baud=int(prof.get("uart_baud", 115200)), clock_kind=CLOCK_KINDS.get(prof.get("timer", "chip timer"), 1),
               engine_sources=[p.name for p in ENGINE_SOURCES], app_sources=[p.name for p in APP_SOURCES],
               hal_sources=sorted(p.name for p in hal_dir.iterdir() if p.suffix in (".c", ".s", ".S")))
    (out / "Makefile").write_text(env.get_template(f"Makefile-{prof['build']}.j2").render(ctx))


def _ram_overflow(text: str) -> bool:
    return bool(RAM_OVERFLOW.search(text)) or "RAM overflow" in text


def _make(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(out)], capture_output=True, text=True)


def _set_arena(out: Path, n: int) -> None:
    cfg = out / "flm_config.h"
    cfg.write_text(ARENA_DEFINE.sub(f"#define FLM_ARENA_BYTES {n}u", cfg.read_text()))


def _arena_room(out: Path, prof: dict) -> int:
    """The most SRAM the arena can have beside the firmware's own data and the linker script's
    stack floor: linked with an arena of 8 bytes, the stack's room less its floor, plus those 8."""
    _set_arena(out, 8)
    if _make(out).returncode != 0:
        return 0
    syms = symbols(out / "firmware.elf", prof)
    return (syms["__stack_free"] - syms["__stack_min"] + 8) & ~7


def _link_error(text: str, prof: dict, arena: int) -> str | None:
    """A one-line explanation of a failed link that is about memory, else None."""
    m = RAM_OVERFLOW.search(text)
    if _ram_overflow(text):
        over = f" ({int(m.group(1)):,} bytes over)" if m else ""
        ram = int(prof["tiers"]["sram"]["capacity"])
        return (f"the model does not fit in {prof['name']}'s {ram // 1024} KB of SRAM{over}: KV cache, "
                f"scratch and prompt buffer need {arena:,} bytes, plus the firmware's own data and the "
                f"stack; use a shorter context, fewer layers or a smaller vocabulary")
    if "below the weights blob" in text or re.search(r"region [`']?FLASH'? overflowed", text):
        return f"the firmware code does not fit below the weights blob in {prof['name']}'s flash"
    return None


def build_baremetal(board: str, prof: dict, out: Path, blob, header, min_group: int) -> BuildResult:
    """Compile the rendered project in ``out`` with the board's toolchain; check the blob fits its flash."""
    off, room = blob_window(prof)
    blob_size = Path(blob).stat().st_size
    if blob_size > room:
        raise BuildError(f"the model image is {blob_size:,} bytes but {board}'s flash holds {room:,} bytes "
                         f"for it ({int(prof['tiers']['flash']['capacity']) // 1024} KB chip, blob at "
                         f"offset {off:#x}); use int4 (--format q4) or a smaller model")
    render_makefile(prof, out)
    why = missing_tools(prof)
    if why:
        raise BuildError(why)
    r = _make(out)
    m = ARENA_DEFINE.search((out / "flm_config.h").read_text())
    arena = int(m.group(1)) if m else arena_bytes(header.config, min_group, header.state_tiers.batch)
    if r.returncode != 0 and _ram_overflow((r.stderr or "") + (r.stdout or "")):
        # the firmware's own data grows with the model (the receive buffer holds a full-context
        # prompt): the arena takes what is left, if that holds the layout
        need, room = layout_needs(header)["sram"], _arena_room(out, prof)
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
        err = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no output")
        raise BuildError(f"firmware build failed: {err.strip()} (in {out})")
    syms = symbols(out / "firmware.elf", prof)
    text_b = syms["__firmware_end"] - syms["__flash_origin"]
    ram = syms["__stack_top"] - syms["__ram_origin"]
    ram_used = syms["__bss_end"] - syms["__ram_origin"]
    size = (f"flash: firmware {text_b:,} B + blob {blob_size:,} B at {syms['__flm_blob_start']:#x} (room {room:,} B)"
            f"\nRAM:   .data+.bss {ram_used:,} of {ram:,} B (arena {arena:,} B), stack {ram - ram_used:,} B")
    return BuildResult(board, out, out / toolchain(prof).image, size)


def symbols(elf: Path, prof: dict) -> dict[str, int]:
    """Name -> address of the symbols in ``elf`` (a Thumb function's with bit 0 clear)."""
    r = subprocess.run([toolchain(prof).nm, str(elf)], capture_output=True, text=True)
    out = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[2]] = int(parts[0], 16)
    return out


def rebuilt_with(image: Path, out: Path, defines: dict[str, str]) -> Path:
    """A copy of the project that built ``image`` (a firmware.bin / .elf in its project directory)
    in ``out``, rebuilt with ``defines`` added to the compiler's flags (e.g. FLM_RP2040_CORES=1: the
    RP2040 firmware on core 0 alone); returns the new image."""
    image = Path(image)
    shutil.copytree(image.parent, out)
    mk = out / "Makefile"
    flags = " ".join(f"-D{k}={v}" for k, v in defines.items())
    text = mk.read_text()
    if "\nCPPFLAGS = " not in text:
        raise BuildError(f"{mk}: no CPPFLAGS line to add {flags} to")
    mk.write_text(text.replace("\nCPPFLAGS = ", f"\nCPPFLAGS = {flags} ", 1))
    for f in out.glob("firmware.*"):
        if f.suffix in (".elf", ".bin"):
            f.unlink()
    r = _make(out)
    if r.returncode != 0:
        raise BuildError(f"rebuilding {out} with {flags} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return out / image.name
