"""The floats of the boards without an FPU (firmware/exact_float.py). The real Pico: its PlatformIO
project carries flashlm's exact soft-float and a post-script that keeps Arduino-Pico from wrapping
the single-precision run-time ABI to the boot ROM (which flushes subnormals), so the engine links to
the soft-float the emulated RP2040 runs and tests/test_kernels.py checks bit for bit. The ESP32-C3:
its project carries the same portable soft-float with libgcc's helper names as __wrap_* and links
with -Wl,--wrap for exactly those; the C is checked bit for bit here against the host's IEEE
arithmetic, the link with Debian's rv32 GCC and picolibc. The Pico 2 (Cortex-M33 FPU) and the
ESP32-S3 need none of it. Checked here with the real cross compilers and linkers."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from converter.blob import write_blob
from converter.quantize import quantize
from firmware import exact_float as X
from firmware.build import build_firmware

sys.path.insert(0, str(Path(__file__).parent))
from modelzoo import random_model  # noqa: E402

# every test here uses the module's projects, cross-compiled for the boards
pytestmark = pytest.mark.cross

ARM = shutil.which("arm-none-eabi-gcc")
needs_arm = pytest.mark.skipif(ARM is None, reason="arm-none-eabi-gcc is not installed")
RV = shutil.which("riscv64-unknown-elf-gcc")
needs_rv = pytest.mark.skipif(RV is None, reason="riscv64-unknown-elf-gcc is not installed (make test-deps)")
CC = shutil.which("cc")
C3, S3 = "esp32c3-devkitm-1", "esp32s3-n16r8"


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact-float")
    blob = root / "model.flmb"
    write_blob(quantize(random_model(3)[1], "q8", 32), blob)
    return {b: build_firmware(b, root / b, blob).project_dir for b in ("pico", "pico2", C3, S3)}


def nm(objs, *flags) -> list[tuple[str, str]]:
    out = subprocess.run(["arm-none-eabi-nm", *flags, *map(str, objs)], capture_output=True, text=True,
                         check=True).stdout
    return [(p[-2], p[-1]) for p in (ln.split() for ln in out.splitlines()) if len(p) >= 2]


@pytest.mark.slow
def test_only_the_rp2040_project_carries_the_soft_float(projects):
    pico, pico2 = projects["pico"], projects["pico2"]
    for f in X.M0.sources:
        assert (pico / "src" / "hal" / f.name).read_bytes() == f.read_bytes()
        assert not (pico2 / "src" / "hal" / f.name).exists()
    ini = (pico / "platformio.ini").read_text()
    assert "extra_scripts = post:flm_exact_float.py" in ini
    assert "build_src_flags = -Wall -Wextra -include ${PROJECT_DIR}/src/hal/softfloat_m0.h" in ini
    assert (pico / X.SCRIPT).is_file() and not (pico2 / X.SCRIPT).exists()
    assert "extra_scripts" not in (pico2 / "platformio.ini").read_text()


@needs_arm
def test_symbol_list_is_what_the_soft_float_defines(tmp_path):
    objs = []
    for src in (p for p in X.M0.sources if p.suffix in (".c", ".s")):
        o = tmp_path / (src.name + ".o")
        subprocess.run([ARM, "-mcpu=cortex-m0plus", "-mthumb", "-O2", "-c", str(src), "-o", str(o)], check=True)
        objs.append(o)
    defined = {s for t, s in nm(objs) if t == "T" and s.startswith("__aeabi_")}
    assert defined == set(X.M0.symbols)


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
    assert float_helpers <= defined and {s for s in defined if s.startswith("__aeabi_")} == set(X.M0.symbols)
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
    wrap.write_text("\n".join(WRAPS + [f"-Wl,--wrap={s}" for s in X.M0.symbols]) + "\n")
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


@pytest.mark.native
@pytest.mark.emulated
@pytest.mark.slow
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


# -- the ESP32-C3: libgcc's helpers wrapped to the portable soft-float ---------------------------------

UNARY = {"__floatsisf", "__floatunsisf", "__fixsfsi", "__fixunssfsi"}


def host_glue(tmp: Path) -> ctypes.CDLL:
    """softfloat.c and softfloat_libgcc.c built for the host with a loop over operand arrays:
    flm_run(k, a, b, out, n) applies RV32.symbols[k] (as __wrap_*) to each pair."""
    cases = "\n".join(
        f"        case {k}: out[i] = (uint32_t)__wrap_{s}({'(int32_t)a[i]' if s == '__floatsisf' else 'a[i]'}"
        f"{'' if s in UNARY else ', b[i]'}); break;" for k, s in enumerate(X.RV32.symbols))
    (tmp / "run.c").write_text(f'''#include <stddef.h>
#include "softfloat_libgcc.c"
void flm_run(int k, const uint32_t *a, const uint32_t *b, uint32_t *out, size_t n);
void flm_run(int k, const uint32_t *a, const uint32_t *b, uint32_t *out, size_t n) {{
    for (size_t i = 0; i < n; i++) {{
        switch (k) {{
{cases}
        }}
    }}
}}
''')
    lib = tmp / "glue.so"
    subprocess.run([CC, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                    f"-I{X.HAL_DIR}", str(X.CORE), str(tmp / "run.c"), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def host_operands() -> tuple[np.ndarray, np.ndarray]:
    """The emulator probe's operands (bench/kernels.py: uniform bits, close exponents for
    cancellation and ties of add, short significands for exact ties of mul, quotients near the
    overflow and underflow boundaries) and every pair of its edge values (zeros, subnormals, the
    normal boundary, integers round 2^24 and 2^31, the largest finite, infinities, NaNs)."""
    import bench.kernels as K
    ea, eb = np.repeat(K.EDGES, len(K.EDGES)), np.tile(K.EDGES, len(K.EDGES))
    gen = [K.operands(mode, 0, 40000) for mode in range(K.MODES)]
    return (np.concatenate([ea] + [a for a, _ in gen]).astype(np.uint32),
            np.concatenate([eb] + [b for _, b in gen]).astype(np.uint32))


@pytest.mark.native
@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_libgcc_glue_is_the_hosts_ieee_arithmetic_bit_for_bit(tmp_path):
    """Each wrapped helper, compiled for the host, against NumPy's IEEE binary32: arithmetic and
    int-to-float bit for bit (a NaN result as any quiet NaN), float-to-int truncated, and each
    comparison by libgcc's convention: its result tested against 0 with the relation it is named
    for is the comparison's truth, false for a NaN operand (__nesf2: true), __unordsf2 nonzero
    iff a NaN."""
    lib = host_glue(tmp_path)
    a, b = host_operands()
    fa, fb = a.view(np.float32), b.view(np.float32)
    nan = np.isnan(fa) | np.isnan(fb)

    def run(sym):
        out = np.empty_like(a)
        p = ctypes.POINTER(ctypes.c_uint32)
        lib.flm_run(X.RV32.symbols.index(sym), a.ctypes.data_as(p), b.ctypes.data_as(p), out.ctypes.data_as(p),
                    ctypes.c_size_t(len(a)))
        return out

    def same_float(sym, want):
        got, w = run(sym), want.astype(np.float32).view(np.uint32)
        got_nan = (got & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        assert np.array_equal(got_nan, np.isnan(want)), sym
        assert np.all(got[got_nan] & np.uint32(0x00400000)), f"{sym}: a signalling NaN result"
        bad = np.flatnonzero(~got_nan & (got != w))
        assert not len(bad), [f"{sym}({a[k]:#010x}, {b[k]:#010x}) = {got[k]:#010x}, not {w[k]:#010x}"
                              for k in bad[:5]]

    with np.errstate(all="ignore"):
        same_float("__addsf3", fa + fb)
        same_float("__subsf3", fa - fb)
        same_float("__mulsf3", fa * fb)
        same_float("__divsf3", fa / fb)
        same_float("__floatsisf", a.view(np.int32).astype(np.float32))
        same_float("__floatunsisf", a.astype(np.float32))
        t = np.trunc(fa.astype(np.float64))
        fix = np.where(np.isnan(fa), 0, np.clip(t, -2.0**31, 2.0**31 - 1)).astype(np.int64)
        assert np.array_equal(run("__fixsfsi").view(np.int32), fix)
        fixuns = np.where(np.isnan(fa), 0, np.clip(t, 0, 2.0**32 - 1)).astype(np.int64)
        assert np.array_equal(run("__fixunssfsi").astype(np.int64), fixuns)
        for sym, truth, holds in (("__eqsf2", fa == fb, lambda r: r == 0), ("__nesf2", fa != fb, lambda r: r != 0),
                                  ("__ltsf2", fa < fb, lambda r: r < 0), ("__lesf2", fa <= fb, lambda r: r <= 0),
                                  ("__gtsf2", fa > fb, lambda r: r > 0), ("__gesf2", fa >= fb, lambda r: r >= 0),
                                  ("__unordsf2", nan, lambda r: r != 0)):
            assert np.array_equal(holds(run(sym).view(np.int32)), truth), sym
    assert nan.any() and (fa == fb).any() and (np.abs(fa) < np.float32(2.0**-126)).any()   # the cases are there


def defined_wraps(obj: Path, nm_tool: str = "nm") -> set[str]:
    out = subprocess.run([nm_tool, str(obj)], capture_output=True, text=True, check=True).stdout
    return {p[2] for p in (ln.split() for ln in out.splitlines()) if len(p) == 3 and p[1] == "T"}


def project_wraps(project: Path) -> list[str]:
    """The -Wl,--wrap= symbols of the project's component CMake, in order."""
    return re.findall(r'"-Wl,--wrap=(\w+)"', (project / "src" / "CMakeLists.txt").read_text())


@pytest.mark.native
@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_c3_project_wraps_exactly_what_the_glue_defines(projects, tmp_path):
    """The C3 project holds the soft-float and wraps each helper softfloat_libgcc.c defines (as
    __wrap_*), no more, no fewer; the S3 (FPU) project has none of it."""
    c3, s3 = projects[C3], projects[S3]
    for f in X.RV32.sources:
        assert (c3 / "src" / "hal" / f.name).read_bytes() == f.read_bytes()
        assert not (s3 / "src" / "hal" / f.name).exists()
    assert "--wrap" not in (s3 / "src" / "CMakeLists.txt").read_text()
    assert project_wraps(c3) == list(X.RV32.symbols)
    obj = tmp_path / "glue.o"
    subprocess.run([CC, "-std=c99", "-O2", "-c", str(c3 / "src" / "hal" / "softfloat_libgcc.c"), "-o", str(obj)],
                   check=True)
    assert defined_wraps(obj) == {"__wrap_" + s for s in X.RV32.symbols}


# libgcc's soft-float helper names (__addsf3, __ltdf2, __floatsisf, __fixdfsi, __extendsfdf2 ...)
FLOAT_HELPER = re.compile(r"^__(?!wrap_)(\w+[sdt]f[23]|float\w*[sdt]i[sdt]f|fix\w*[sdt]f[sdt]i|extend\w+|trunc\w+)$")


@needs_rv
def test_c3_engine_links_its_float_calls_to_the_wraps(projects, tmp_path):
    """Debian's rv32 GCC and picolibc link the C3 engine's objects (cross-compiled by the build)
    with the project's --wrap list: no float helper of libgcc's is linked in or left undefined,
    the engine's calls land on flashlm's __wrap_*. Without the wraps, libgcc's own would be linked
    (the control: ESP-IDF's link would take the ROM's)."""
    c3 = projects[C3]
    objs = sorted((c3 / ".flashlm-check").glob("*.o"))
    assert {"engine.o", "kernels.o", "softfloat.o", "softfloat_libgcc.o"} <= {o.name for o in objs}
    nm_tool = RV[: -len("gcc")] + "nm"
    called = {s for o in objs for t, s in (ln.split()[-2:] for ln in subprocess.run(
        [nm_tool, "-u", str(o)], capture_output=True, text=True, check=True).stdout.splitlines())}
    assert {"__addsf3", "__mulsf3", "__divsf3", "__floatsisf"} <= called
    assert {s for s in called if FLOAT_HELPER.match(s)} <= set(X.RV32.symbols)

    def link(flags, name):
        elf = tmp_path / name
        # picolibc's default linker script's flash region is smaller than the engine with libgcc's soft
        # float; this link is only read for its symbols, so the region is made 4 MB, the C3 module's flash
        subprocess.run([RV, "-march=rv32imc", "-mabi=ilp32", "--specs=picolibc.specs", "-nostartfiles",
                        "-Wl,-e,app_main", "-Wl,--gc-sections", "-Wl,--unresolved-symbols=ignore-all",
                        "-Wl,--defsym=__flash_size=0x400000", *flags,
                        *map(str, objs), "-o", str(elf)], check=True, capture_output=True)
        out = subprocess.run([nm_tool, str(elf)], capture_output=True, text=True, check=True).stdout
        return [(p[-2], p[-1]) for p in (ln.split() for ln in out.splitlines()) if len(p) >= 2]

    ours = link([f"-Wl,--wrap={s}" for s in project_wraps(c3)], "wrapped.elf")
    assert not [s for _, s in ours if FLOAT_HELPER.match(s)]
    assert {"__wrap_" + s for s in called if FLOAT_HELPER.match(s)} <= {s for t, s in ours if t == "T"}
    assert {s for t, s in ours if t == "U"} <= {"hal_blob", "hal_board_arena", "hal_board_name", "hal_clock_kind",
                                                 "hal_idle", "hal_init", "hal_serial_read", "hal_serial_write",
                                                 "hal_time_us", "hal_matmul", "hal_tier_arena"}
    plain = link([], "plain.elf")
    assert {"__addsf3", "__mulsf3"} <= {s for t, s in plain if t == "T"}
