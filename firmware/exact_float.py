"""flashlm's exact IEEE soft-float on the boards without an FPU, in place of the toolchain's or the ROM's.

The Cortex-M0+ (RP2040) and the ESP32-C3's rv32imc have no FPU: every float operation of the
engine is a call into a helper (``__aeabi_fadd`` ... on Arm, libgcc's ``__addsf3`` ... on RISC-V).
Left to the vendor's build, those come from the chip's ROM: the RP2040 boot ROM's may flush
subnormal operands and results to zero, and nothing proves the ESP32-C3 ROM's copy of libgcc's
soft-fp the IEEE arithmetic the NumPy reference computes. Both boards run flashlm's own instead:
``firmware/hal/softfloat.c``, portable C on the floats' bits (round to nearest even, subnormals
kept), plus per instruction set:

- RP2040: ``rp2040/softfloat_aeabi.c``, ``softfloat_m0.s`` (the run-time ABI entry points, assembly
  fast paths), ``softfloat_m0.h`` (the assembly kernels' declarations, force-included into the
  engine) and ``kernels_arch.h`` (the Cortex-M0+ kernels, which use them), checked bit for bit
  against the host's IEEE arithmetic on the emulator. The bare-metal build (rp2040-emu) links them
  before libgcc. The real Pico's Arduino-Pico core links with its
  ``platform_wrap.txt``, which wraps the single-precision entry points (``-Wl,--wrap=__aeabi_fadd``
  ...) to the pico-sdk's shims into the ROM; ``flm_exact_float.py``, a PlatformIO post-script,
  links with a copy of every ``--wrap`` response file minus the wraps of the entry points the
  soft-float defines, so those resolve to it (the double-precision and libm wraps stay).
- ESP32-C3: ``softfloat_libgcc.c``, libgcc's single-precision helpers as ``__wrap___addsf3`` ...
  ESP-IDF binds ``__addsf3`` ... to the ROM by linker-script assignments (esp32c3.rom.libgcc.ld),
  which a plain definition would not reliably override; the project's component CMake links with
  ``-Wl,--wrap=__addsf3`` ... for exactly the functions the file defines, so every call of them in
  the firmware resolves to flashlm's. Checked here: the C bit for bit against the host's IEEE
  arithmetic (compiled for the host), and the engine cross-compiled and linked with the wraps by
  Debian's rv32 GCC and picolibc (tests/test_exact_float.py); not linked against ESP-IDF here (no
  SDK) nor run on the chip.

render_project copies the files into ``src/hal``; the PlatformIO projects take the link settings
from ``add_to_project``. The ESP32-S3 and the RP2350 (Pico 2) have a single-precision FPU: their
float operations are instructions, not calls; they need none of this.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .build_meta import FW_VERSION, HAL_DIR

CORE = HAL_DIR / "softfloat.c"
SCRIPT = "flm_exact_float.py"


@dataclass(frozen=True)
class SoftFloat:
    sources: tuple[Path, ...]   # copied into the project's src/hal
    header: str | None          # force-included into every source of the project
    symbols: tuple[str, ...]    # the float helpers it defines (RP2040) or wraps (ESP32-C3)
    wrap: bool                  # linked through -Wl,--wrap=SYMBOL: defines __wrap_SYMBOL


# tests/test_exact_float.py checks each list against the compiled objects, and that the engine calls
# no float helper outside it.
M0 = SoftFloat((CORE, HAL_DIR / "rp2040" / "softfloat_aeabi.c", HAL_DIR / "rp2040" / "softfloat_m0.s",
                HAL_DIR / "rp2040" / "softfloat_m0.h", HAL_DIR / "rp2040" / "kernels_arch.h",
                HAL_DIR / "rp2040" / "rs_lanes_rp2040.h"), "softfloat_m0.h",
               ("__aeabi_fadd", "__aeabi_fsub", "__aeabi_fmul", "__aeabi_fdiv", "__aeabi_i2f", "__aeabi_ui2f",
                "__aeabi_f2iz", "__aeabi_fcmpeq", "__aeabi_fcmplt", "__aeabi_fcmple", "__aeabi_fcmpgt",
                "__aeabi_fcmpge"), wrap=False)
RV32 = SoftFloat((CORE, HAL_DIR / "softfloat_libgcc.c"), None,
                 ("__addsf3", "__subsf3", "__mulsf3", "__divsf3", "__floatsisf", "__floatunsisf", "__fixsfsi",
                  "__fixunssfsi", "__eqsf2", "__nesf2", "__ltsf2", "__lesf2", "__gtsf2", "__gesf2", "__unordsf2"),
                 wrap=True)
# The ESP32-S3's instruction set in QEMU (hal qemu_xtensa) has the FPU, but no compiler run-time for
# the windowed ABI exists here: its xtensa_rt.c divides floats (__divsf3, where LLVM calls one) with
# the soft-float's flm_sf_div
XTENSA_RT = SoftFloat((CORE,), None, ("__divsf3",), wrap=False)
BY_CHIP = {"RP2040": M0, "ESP32-C3": RV32}
BY_HAL = {"qemu_xtensa": XTENSA_RT}


def soft_float(prof: dict) -> SoftFloat | None:
    """The soft-float a board runs: by its HAL where that decides, else by its chip; None for a chip
    with an FPU (or the host)."""
    return BY_HAL.get(prof.get("hal")) or BY_CHIP.get(prof.get("chip"))


def copy_sources(prof: dict, hal: Path) -> None:
    """Copy the board's soft-float, if it has one, into the project's ``src/hal``."""
    sf = soft_float(prof)
    for p in sf.sources if sf else ():
        shutil.copy2(p, Path(hal) / p.name)


_SCRIPT = '''# Generated by flashlm {version} for board "{board}" -- do not edit (firmware/exact_float.py).
# PlatformIO post-script: link the firmware's float arithmetic to flashlm's exact IEEE soft-float
# (src/hal/softfloat.c, softfloat_aeabi.c, softfloat_m0.s: round to nearest even, subnormals kept)
# instead of the boot ROM's float routines, which may flush subnormals to zero. Arduino-Pico's
# platform_wrap.txt redirects the single-precision run-time ABI to the ROM (-Wl,--wrap=__aeabi_fadd
# ...); the link here uses a copy of each such response file without the wraps of the entry points
# the soft-float defines.
import os

Import("env")  # noqa: F821 -- SCons

UNWRAP = {{"-Wl,--wrap=" + s for s in {symbols!r}}}


def unwrap(env):
    """Rewrite env's LINKFLAGS; returns how many wraps were left out."""
    build_dir = env.subst("$BUILD_DIR")
    flags, dropped = [], 0
    for flag in env.get("LINKFLAGS", []):
        text = str(flag).strip('"')
        if text in UNWRAP:
            dropped += 1
            continue
        path = env.subst(text[1:]) if text.startswith("@") else ""
        if path and os.path.isfile(path):
            with open(path) as f:
                args = f.read().split()
            keep = [a for a in args if a not in UNWRAP]
            if len(keep) != len(args):
                dropped += len(args) - len(keep)
                os.makedirs(build_dir, exist_ok=True)
                copy = os.path.join(build_dir, "flm_" + os.path.basename(path))
                with open(copy, "w") as f:
                    f.write("\\n".join(keep) + "\\n")
                flag = "@" + copy
        flags.append(flag)
    env.Replace(LINKFLAGS=flags)
    return dropped


n = unwrap(env)  # noqa: F821
print("flashlm: single-precision floats link to flashlm's exact soft-float (%d ROM wrap(s) left out)" % n)
'''


def add_to_project(prof: dict, out: Path) -> dict:
    """The PlatformIO project's soft-float settings: platformio.ini's ``extra_scripts`` and
    ``src_flags`` (the Arduino-Pico RP2040: the post-script, written here, and the forced header)
    and the component CMake's ``link_flags`` (the ESP32-C3's wraps); empty for other boards."""
    sf = soft_float(prof)
    if sf is M0 and prof.get("platformio", {}).get("framework") == "arduino":
        (Path(out) / SCRIPT).write_text(_SCRIPT.format(version=FW_VERSION, board=prof["name"], symbols=sf.symbols))
        return {"extra_scripts": [f"post:{SCRIPT}"], "src_flags": [f"-include ${{PROJECT_DIR}}/src/hal/{sf.header}"],
                "link_flags": []}
    wraps = [f"-Wl,--wrap={s}" for s in sf.symbols] if sf and sf.wrap else []
    return {"extra_scripts": [], "src_flags": [], "link_flags": wraps}


def cross_sources(prof: dict, out: Path) -> tuple[list[Path], list[str]]:
    """(sources, flags) to add when the engine is cross-compiled here: the board's soft-float as
    the project holds it, and its forced header."""
    sf = soft_float(prof)
    if sf is None:
        return [], []
    hal = Path(out) / "src" / "hal"
    srcs = [hal / p.name for p in sf.sources if p.suffix in (".c", ".s")]
    return srcs, (["-include", str(hal / sf.header)] if sf.header else [])
