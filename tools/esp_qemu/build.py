"""Build the engine for the ESP32-C3's or the ESP32-S3's instruction set, to run in QEMU.

The project is rendered exactly as for the real chip's board (firmware.build.render_project with
the chip's own profile: the same engine, main.c, arena sizes and, on the C3, the same soft-float),
then the ESP-IDF HAL is swapped for a bare-metal one (firmware/hal/qemu_rv32, firmware/hal/
qemu_xtensa) and everything is compiled here:

- rv32 (ESP32-C3: rv32imc, no FPU): Debian's riscv64-unknown-elf-gcc -march=rv32imc_zicsr
  -mabi=ilp32 with picolibc (its rv32imac/ilp32 libraries; the engine takes only memcpy, memset,
  memcmp and strlen from it, none of which uses an atomic instruction), the float operations
  linked to flashlm's soft-float through -Wl,--wrap=__addsf3 ... (firmware/exact_float.RV32), as
  the real C3's project does.
- xtensa (ESP32-S3: LX7, windowed ABI, single-precision FPU): see xtensa.py.

``build(isa, blob, out)`` returns the ELF; ``defines`` adds -D options (the golden check's negative
controls), ``cflags`` replaces the optimisation and float-contraction flags' defaults."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from converter.blob import read_header
from converter.boards import load_board
from converter.tokenizer_enc import section_info
from firmware import exact_float
from firmware.build import FW_DIR, BuildError, check_fits, render_project


@dataclass(frozen=True)
class Isa:
    key: str            # "rv32" or "xtensa"
    board: str          # the name the HAL reports in HELLO
    profile: str        # the real board whose project is rendered (arena, soft-float, model fit)
    hal: str            # firmware/hal/<hal>
    what: str           # one line for people


RV32 = Isa("rv32", "esp32c3-isa-qemu", "esp32c3-devkitm-1", "qemu_rv32",
           "the ESP32-C3's instruction set (rv32imc, soft-float) on QEMU's RISC-V virt machine")
XTENSA = Isa("xtensa", "esp32s3-isa-qemu", "esp32s3-n16r8", "qemu_xtensa",
             "the ESP32-S3's instruction set (Xtensa LX7, windowed ABI, single-precision FPU) on QEMU's "
             "Xtensa sim machine (core de233_fpu)")
ISAS = {i.key: i for i in (RV32, XTENSA)}

# -ffp-contract=off: no fused multiply-add (every float operation rounds as the reference's does)
BASE_CFLAGS = ("-std=c99", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
               "-ffunction-sections", "-fdata-sections")

RV_CC = "riscv64-unknown-elf-gcc"
RV_ARCH = ("-march=rv32imc_zicsr", "-mabi=ilp32")
RV_APT = "apt-get install gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf"


def render(isa: Isa, blob: Path, out: Path) -> Path:
    """The chip's project for the model in ``blob``, with the QEMU HAL in place of the ESP-IDF one."""
    prof = load_board(isa.profile)
    h = read_header(blob)
    check_fits(prof, h)
    min_group = min(e.group_size for e in h.entries if e.fmt in ("q8", "q4"))
    enc = section_info(blob, h)
    render_project(isa.profile, out, h.config, min_group, h,
                   enc.text_capacity(h.config.max_seq_len) if enc is not None else 0)
    return swap_hal(isa, out)


def swap_hal(isa: Isa, out: Path) -> Path:
    """Replace the rendered project's ESP-IDF HAL (it needs the SDK) by the QEMU one."""
    prof = load_board(isa.profile)
    hal = out / "src" / "hal"
    for p in (FW_DIR / "hal" / prof["hal"]).iterdir():
        (hal / p.name).unlink(missing_ok=True)
    for p in (FW_DIR / "hal" / isa.hal).iterdir():
        if p.is_file():
            shutil.copy2(p, hal / p.name)
    return out


def compile_image(isa: Isa, out: Path, defines=(), cflags=None, fused=False) -> Path:
    """Compile the rendered project in ``out``; returns the ELF."""
    if isa is RV32:
        return build_rv32(out, defines, cflags)
    from .xtensa import build_xtensa
    return build_xtensa(out, defines, cflags, fused)


def sources(out: Path) -> list[Path]:
    src = out / "src"
    return ([src / "main.c"] + sorted((src / "engine").glob("*.c"))
            + sorted(p for p in (src / "hal").iterdir() if p.suffix in (".c", ".S")))


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        text = (r.stderr or r.stdout).strip().splitlines()
        err = next((ln for ln in text if "error" in ln.lower()), text[-1] if text else "no output")
        raise BuildError(f"{what} failed: {err.strip()} (in {cwd})")


def build_rv32(out: Path, defines=(), cflags=None) -> Path:
    """Compile with -march=rv32imc_zicsr (GCC 12 follows the 2019 ISA spec, where the CSR
    instructions the HAL's clock reads are the separate Zicsr extension), link with -march=rv32imc:
    the multilib GCC picks for that name is rv32im/ilp32 (libgcc, and picolibc's, which has no
    rv32imc variant: rv32im is the largest subset of rv32imc it has; its rv32imac/ilp32 would link
    too but may use atomics the C3's core has, the rv32im ones surely none)."""
    if shutil.which(RV_CC) is None:
        raise BuildError(f"the ESP32-C3-ISA board needs {RV_CC} and picolibc ({RV_APT})")
    objs = out / "obj"
    objs.mkdir(exist_ok=True)
    flags = [*RV_ARCH, "--specs=picolibc.specs", *(cflags or BASE_CFLAGS), *[f"-D{d}" for d in defines],
             "-include", "flm_config.h", "-Isrc/engine", "-Isrc/hal"]
    obj_files = []
    for src in sources(out):
        obj = objs / (src.name + ".o")
        _run([RV_CC, *flags, "-c", str(src.relative_to(out)), "-o", str(obj)], out, f"compiling {src.name} for rv32imc")
        obj_files.append(str(obj))
    wraps = [f"-Wl,--wrap={s}" for s in exact_float.RV32.symbols]
    elf = out / "firmware.elf"
    _run([RV_CC, "-march=rv32imc", "-mabi=ilp32", "--specs=picolibc.specs", "-nostartfiles",
          "-T", "src/hal/qemu_rv32.ld", "-Wl,--gc-sections", *wraps, "-Wl,-Map=firmware.map",
          "-o", str(elf), *obj_files, "-lc", "-lgcc"], out, "linking the rv32imc image")
    return elf


def build(isa: str | Isa, blob, out, defines=(), cflags=None, fused=False) -> Path:
    """Render and compile the image for ``isa`` sized for the model in ``blob``; returns the ELF.
    ``fused`` (Xtensa): fused multiply-adds (the golden check's negative control, xtensa.py)."""
    isa = ISAS[isa] if isinstance(isa, str) else isa
    out = Path(out)
    render(isa, Path(blob), out)
    return compile_image(isa, out, defines, cflags, fused)
