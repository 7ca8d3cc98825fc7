"""The engine for the ESP32-S3's instruction set (Xtensa LX7) with Debian's clang/LLVM 22, run on
QEMU's Xtensa sim machine with the de233_fpu core.

Compiler: clang-22 --target=xtensa with the target features given one by one (LLVM's Xtensa CPUs
are esp32 and esp8266 only: none is the S3's LX7). FEATURES are the options the ESP32-S3's LX7 and
QEMU's de233_fpu core (an LX7.1.3 configuration) both have: code density, windowed registers,
zero-overhead loops, NSA, MIN/MAX, SEXT, CLAMPS, MUL16, MUL32, DIV32, MAC16, booleans and the
single-precision FPU (coprocessor 0). Left out: mul32high (MULSH/MULUH: the S3 has it, de233_fpu
does not, so 32 x 32 -> 64-bit products are calls of __muldi3 here), and the S3's PIE SIMD (no
compiler here emits it). SYSTEM_FEATURES only let the assembler take the start-up's special
registers and instructions (they change no generated code). -ffp-contract=off: no fused multiply-add (the S3's FPU has MADD.S,
which rounds once: a contracted a*b+c is not the reference's).

Assembler: LLVM 22's integrated assembler fails on Xtensa objects with several functions whose
literals it places ("fixup value must be 4-byte aligned": a function's literal pool after the
previous function's last, 2-byte, instruction is not word aligned, and L32R needs it to be).
So each file is compiled to assembly, a `.p2align 2` is put before every `.literal_position`, and
llvm-mc-22 assembles it.

Linker: ld.lld refuses Xtensa; binutils-xtensa-lx106's ld (the ESP8266's binutils) links these
objects. No C library or compiler runtime exists for the windowed ABI here: the HAL folder brings
string.h/math.h and flm_libc.c, and xtensa_rt.c the helpers LLVM calls (integer 64-bit multiply and
divide, float divide) on flashlm's own integer-only soft-float (firmware/hal/softfloat.c) where the
S3's libgcc would otherwise supply them.

QEMU: qemu-system-xtensa -M sim -cpu de233_fpu -semihosting -icount shift=5 (shift 5: an
instruction is 32 ns of virtual time, which the HAL's clock needs; hal_qemu_xtensa.c)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from firmware.build import FW_DIR, BuildError

from .build import BASE_CFLAGS, _run, sources

CLANG = "clang-22"
LLVM_MC = "llvm-mc-22"
LD = "xtensa-lx106-elf-ld"
APT = "apt-get install clang-22 llvm-22 binutils-xtensa-lx106"

FEATURES = ("density", "windowed", "loop", "nsa", "minmax", "sext", "clamps", "mul16", "mul32", "div32",
            "mac16", "bool", "fp")
SYSTEM_FEATURES = ("exception", "interrupt", "highpriinterrupts", "rvector", "timers1", "timers2", "timers3",
                   "debug", "prid", "miscsr", "s32c1i", "threadptr", "coprocessor")
# the files that must not become calls of themselves
NO_BUILTIN = ("flm_libc.c", "xtensa_rt.c")

QEMU = "qemu-system-xtensa"
BLOB = 0x02000000      # qemu_xtensa.ld BLOB
EXCCAUSE = {0: "illegal instruction", 2: "instruction fetch error", 3: "load/store error",
            6: "integer divide by zero", 9: "unaligned load or store", 12: "instruction fetch (PIF) error",
            13: "load/store (PIF) error", 20: "instruction fetch prohibited", 28: "load prohibited",
            29: "store prohibited", 32: "coprocessor 0 (FPU) disabled"}


def clang_flags(defines=(), cflags=None) -> list[str]:
    # the system features too: the HAL's inline assembly reads CCOUNT (timers) and issues SIMCALL
    feats = [x for f in FEATURES + SYSTEM_FEATURES for x in ("-Xclang", "-target-feature", "-Xclang", f"+{f}")]
    # no -g: llvm-mc 22 cannot parse the .cfi directives clang writes for Xtensa (it names the frame
    # register `a7`), nor unwind tables for the same reason. No -ffreestanding: it implies -fno-builtin,
    # and then every memcpy(&f, &u, 4) of the engine's float bit casts is a call (the fixed-size
    # copies must become one load and one store); flm_libc.c and xtensa_rt.c alone take -fno-builtin.
    base = [f for f in (cflags or BASE_CFLAGS) if f != "-g"]
    return ["--target=xtensa", *feats, *base, "-fno-asynchronous-unwind-tables", "-fno-unwind-tables",
            *[f"-D{d}" for d in defines], "-include", "flm_config.h", "-Isrc/engine", "-Isrc/hal"]


def mc_flags() -> list[str]:
    return ["--triple=xtensa", "-mattr=" + ",".join(f"+{f}" for f in FEATURES + SYSTEM_FEATURES)]


def align_literals(asm: str) -> str:
    """`.p2align 2` before each `.literal_position` (the integrated assembler's alignment fault)."""
    return re.sub(r"^(\s*)\.literal_position", r"\1.p2align 2\n\1.literal_position", asm, flags=re.M)


def fuse_multiply_adds(ll: str) -> str:
    """LLVM IR whose every a*b+c the C source lets fuse (clang -ffp-contract=on: llvm.fmuladd, "fuse
    when profitable") fused (llvm.fma: one rounding, MADD.S). LLVM 22's Xtensa backend never finds a
    fusion profitable, so -ffp-contract=fast alone changes no instruction; this is the build GCC
    makes for the S3 unless told -ffp-contract=off (GCC's default in GNU C is fast, and its Xtensa
    port has MADD.S): the golden check's negative control."""
    return ll.replace("@llvm.fmuladd.f32", "@llvm.fma.f32")


def build_xtensa(out: Path, defines=(), cflags=None, fused=False) -> Path:
    """``fused``: every multiply-add the C allows fused into MADD.S (fuse_multiply_adds)."""
    missing = [t for t in (CLANG, LLVM_MC, LD) if shutil.which(t) is None]
    if missing:
        raise BuildError(f"the ESP32-S3-ISA board needs {', '.join(missing)} ({APT})")
    shutil.copy2(FW_DIR / "hal" / "softfloat.c", out / "src" / "hal" / "softfloat.c")   # xtensa_rt.c's divide
    objs = out / "obj"
    objs.mkdir(exist_ok=True)
    flags = clang_flags(defines, cflags)
    obj_files = []
    for src in sources(out):
        rel = str(src.relative_to(out))
        asm = objs / (src.name + ".s")
        if src.suffix == ".S":
            _run([CLANG, "--target=xtensa", "-E", "-P", "-x", "assembler-with-cpp", rel, "-o", str(asm)], out,
                 f"preprocessing {src.name}")
        elif fused:
            ll = objs / (src.name + ".ll")
            extra = ["-fno-builtin"] if src.name in NO_BUILTIN else []
            _run([CLANG, *flags, *extra, "-ffp-contract=on", "-S", "-emit-llvm", rel, "-o", str(ll)], out,
                 f"compiling {src.name} for Xtensa")
            ll.write_text(fuse_multiply_adds(ll.read_text()))
            _run([CLANG, *flags[:flags.index("-include")], "-Wno-override-module", "-S", str(ll), "-o", str(asm)],
                 out, f"compiling {src.name}'s fused IR for Xtensa")
        else:
            extra = ["-fno-builtin"] if src.name in NO_BUILTIN else []
            _run([CLANG, *flags, *extra, "-S", rel, "-o", str(asm)], out, f"compiling {src.name} for Xtensa")
        asm.write_text(align_literals(asm.read_text()))
        obj = objs / (src.name + ".o")
        _run([LLVM_MC, *mc_flags(), "-filetype=obj", str(asm), "-o", str(obj)], out, f"assembling {src.name}")
        obj_files.append(str(obj))
    elf = out / "firmware.elf"
    _run([LD, "-T", "src/hal/qemu_xtensa.ld", "--gc-sections", "--no-warn-rwx-segments", "-z", "noexecstack",
          "-Map", "firmware.map", "-o", str(elf), *obj_files], out, "linking the Xtensa image")
    return elf


def qemu_command(elf: Path, blob: Path) -> list[str]:
    return [QEMU, "-M", "sim", "-cpu", "de233_fpu", "-m", "64M", "-semihosting", "-icount", "shift=5",
            "-display", "none", "-monitor", "none", "-kernel", str(elf),
            "-device", f"loader,file={blob},addr={BLOB:#x},force-raw=on"]


def exit_reason(rc: int) -> str:
    if 100 <= rc < 164:
        return f"exception: {EXCCAUSE.get(rc - 100, f'EXCCAUSE {rc - 100}')}"
    return ""
