"""The real Pico's floats: its PlatformIO project carries flashlm's exact soft-float and a post-script
that keeps Arduino-Pico from wrapping the single-precision run-time ABI to the boot ROM (which
flushes subnormals), so the engine links to the soft-float the emulated RP2040 runs and
tests/test_kernels.py checks bit for bit. The Pico 2 (Cortex-M33 FPU) needs none of it: its engine
is FPU instructions, none fused. Checked here with the real cross compiler and linker."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from converter.blob import write_blob
from converter.quantize import quantize
from firmware import exact_float as X
from firmware.build import build_firmware

sys.path.insert(0, str(Path(__file__).parent))
from modelzoo import random_model  # noqa: E402

ARM = shutil.which("arm-none-eabi-gcc")
needs_arm = pytest.mark.skipif(ARM is None, reason="arm-none-eabi-gcc is not installed")


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact-float")
    blob = root / "model.flmb"
    write_blob(quantize(random_model(3)[1], "q8", 32), blob)
    return {b: build_firmware(b, root / b, blob).project_dir for b in ("pico", "pico2")}


def nm(objs, *flags) -> list[tuple[str, str]]:
    out = subprocess.run(["arm-none-eabi-nm", *flags, *map(str, objs)], capture_output=True, text=True,
                         check=True).stdout
    return [(p[-2], p[-1]) for p in (ln.split() for ln in out.splitlines()) if len(p) >= 2]


def test_only_the_rp2040_project_carries_the_soft_float(projects):
    pico, pico2 = projects["pico"], projects["pico2"]
    for f in X.SOFT_FLOAT_FILES:
        assert (pico / "src" / "hal" / f).read_bytes() == (X.SOFT_FLOAT_DIR / f).read_bytes()
        assert not (pico2 / "src" / "hal" / f).exists()
    ini = (pico / "platformio.ini").read_text()
    assert "extra_scripts = post:flm_exact_float.py" in ini
    assert "build_src_flags = -Wall -Wextra -include ${PROJECT_DIR}/src/hal/softfloat_m0.h" in ini
    assert (pico / X.SCRIPT).is_file() and not (pico2 / X.SCRIPT).exists()
    assert "extra_scripts" not in (pico2 / "platformio.ini").read_text()


@needs_arm
def test_symbol_list_is_what_the_soft_float_defines(tmp_path):
    objs = []
    for src in ("softfloat.c", "softfloat_m0.s"):
        o = tmp_path / (src + ".o")
        subprocess.run([ARM, "-mcpu=cortex-m0plus", "-mthumb", "-O2", "-c", str(X.SOFT_FLOAT_DIR / src), "-o", str(o)],
                       check=True)
        objs.append(o)
    defined = {s for t, s in nm(objs) if t == "T" and s.startswith("__aeabi_")}
    assert defined == set(X.SYMBOLS)


@needs_arm
def test_engine_calls_no_float_helper_but_the_soft_floats(projects):
    """Every float helper the Pico's engine objects call is one the soft-float defines (none is
    left to the ROM's wraps or libgcc); the Pico 2's engine calls none and fuses nothing."""
    objs = sorted((projects["pico"] / ".flashlm-check").glob("*.o"))
    assert any(o.name == "softfloat_m0.o" for o in objs) and any(o.name == "engine.o" for o in objs)
    called = {s for t, s in nm(objs, "-u")}
    float_helpers = {s for s in called if s.startswith(("__aeabi_f", "__aeabi_i2f", "__aeabi_ui2f", "__aeabi_l2f",
                                                        "__aeabi_ul2f", "__aeabi_cf", "__aeabi_d"))
                     or s.endswith(("sf3", "sf2", "sisf", "sfsi"))}
    defined = {s for t, s in nm(objs) if t == "T"}
    assert float_helpers <= defined and {s for s in defined if s.startswith("__aeabi_")} == set(X.SYMBOLS)
    m33 = sorted((projects["pico2"] / ".flashlm-check").glob("*.o"))
    assert not [s for t, s in nm(m33, "-u") if s.startswith("__aeabi_f") or s.endswith("sf3")]
    dis = subprocess.run(["arm-none-eabi-objdump", "-d", *map(str, m33)], capture_output=True, text=True).stdout
    assert "vadd.f32" in dis and "vdiv.f32" in dis
    assert not [ln for ln in dis.splitlines() if any(f"\t{op}" in ln for op in ("vfma", "vfms", "vfnm", "vmla",
                                                                               "vmls", "vnmla", "vnmls"))]


class FakeEnv:
    """What the post-script uses of PlatformIO's SCons environment."""

    def __init__(self, linkflags, build_dir):
        self.d = {"LINKFLAGS": list(linkflags)}
        self.build_dir = str(build_dir)

    def get(self, k, default=None):
        return self.d.get(k, default)

    def subst(self, s):
        return s.replace("$BUILD_DIR", self.build_dir)

    def Replace(self, **kw):  # noqa: N802 (SCons's name)
        self.d.update(kw)


def run_script(project: Path, env: FakeEnv, capsys) -> str:
    code = (project / X.SCRIPT).read_text()
    exec(compile(code, X.SCRIPT, "exec"), {"Import": lambda name: None, "env": env})
    return capsys.readouterr().out


WRAPS = ["-Wl,--wrap=__aeabi_dadd", "-Wl,--wrap=__aeabi_fadd", "-Wl,--wrap=__aeabi_fcmpun", "-Wl,--wrap=__aeabi_fdiv",
         "-Wl,--wrap=__aeabi_fmul", "-Wl,--wrap=__aeabi_fsub", "-Wl,--wrap=__aeabi_i2f", "-Wl,--wrap=__aeabi_f2iz",
         "-Wl,--wrap=sqrtf", "-Wl,--wrap=memcpy", "", "-Wl,--wrap=malloc"]


def test_post_script_unwraps_exactly_the_soft_floats_entry_points(projects, tmp_path, capsys):
    wrap = tmp_path / "lib" / "rp2040" / "platform_wrap.txt"
    wrap.parent.mkdir(parents=True)
    wrap.write_text("\n".join(WRAPS) + "\n")
    other = tmp_path / "core_wrap.txt"
    other.write_text("-Wl,--wrap=printf\n")
    env = FakeEnv([f"@{wrap}", f"@{other}", "-Wl,--wrap=__aeabi_fcmplt", "-u_printf_float", "-Wl,--gc-sections"],
                  tmp_path / "build")
    out = run_script(projects["pico"], env, capsys)
    flags = env.d["LINKFLAGS"]
    copy = tmp_path / "build" / "flm_platform_wrap.txt"
    assert flags == [f"@{copy}", f"@{other}", "-u_printf_float", "-Wl,--gc-sections"]
    kept = copy.read_text().split()
    assert kept == ["-Wl,--wrap=__aeabi_dadd", "-Wl,--wrap=__aeabi_fcmpun", "-Wl,--wrap=sqrtf",
                    "-Wl,--wrap=memcpy", "-Wl,--wrap=malloc"]
    assert "(7 ROM wrap(s) left out)" in out
    assert wrap.read_text() == "\n".join(WRAPS) + "\n"        # the core's own file is untouched


@needs_arm
def test_linked_with_the_scripts_wraps_the_engine_calls_the_soft_float(projects, tmp_path, capsys):
    """The real linker: with the core's wrap list the engine's float calls go to the ROM shims
    (__wrap___aeabi_*, undefined here); with the script's copy they bind to the soft-float."""
    objs = sorted((projects["pico"] / ".flashlm-check").glob("*.o"))
    wrap = tmp_path / "platform_wrap.txt"
    wrap.write_text("\n".join(WRAPS + [f"-Wl,--wrap={s}" for s in X.SYMBOLS]) + "\n")
    env = FakeEnv([f"@{wrap}"], tmp_path / "build")
    run_script(projects["pico"], env, capsys)

    def link(flag, name):
        elf = tmp_path / name
        subprocess.run([ARM, "-mcpu=cortex-m0plus", "-mthumb", "-nostartfiles", "-nostdlib", "-Wl,-e,flm_main",
                        "-Wl,--gc-sections", "-Wl,--unresolved-symbols=ignore-all", flag, *map(str, objs),
                        "-o", str(elf)], check=True, capture_output=True)
        return nm([elf])

    rom = {s for t, s in link(f"@{wrap}", "rom.elf") if t in ("U", "w")}
    assert {"__wrap___aeabi_fadd", "__wrap___aeabi_fmul", "__wrap___aeabi_fdiv"} <= rom
    ours = link(env.d["LINKFLAGS"][0], "ours.elf")
    assert not [s for t, s in ours if s.startswith("__wrap___aeabi_f")]
    assert {"__aeabi_fadd", "__aeabi_fmul", "__aeabi_fdiv", "flm_group_term"} <= {s for t, s in ours if t == "T"}


def test_libgcc_soft_fp_is_ieee_exact_but_for_nan_to_int(tmp_path):
    """Evidence for the ESP32-C3 (rv32imc, no FPU: its float operations are libgcc's soft-fp, which
    ESP-IDF takes from the chip's ROM): GCC's soft-fp built for the Cortex-M0+, run on the emulated
    RP2040 against the host's IEEE arithmetic over the same operands as flashlm's soft-float (add,
    sub, mul, div, compares, int-to-float, float-to-int; subnormals, ties, overflow, infinities).
    It rounds to nearest even and keeps subnormals; only a NaN converted to an integer differs
    (INT_MAX, not 0), which the engine never does: it converts values it has clamped."""
    import bench.kernels as K
    from emuboard import require_emulator
    require_emulator()
    with K.Probe(K.build_probe(tmp_path, "libgcc"), tmp_path) as p:
        bad = K.check_float(p, per_mode=20000)
    operands = [int(line.split("(")[1].split(",")[0], 16) for line in bad]
    assert bad and all(line.startswith("f2iz(") for line in bad), bad[:5]
    assert all(((a << 1) & 0xFFFFFFFF) > 0xFF000000 for a in operands), bad[:5]
