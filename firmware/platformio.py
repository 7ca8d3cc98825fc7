"""PlatformIO projects for the real boards (profiles with ``build = "platformio"``).

``build_platformio`` completes the project ``render_project`` wrote (engine, HAL, config header)
into one PlatformIO can build and upload on the user's machine:

- ``platformio.ini``: platform, board, framework, flash/PSRAM settings, ``-ffp-contract=off`` (and
  ``-O2`` on the Arduino-Pico boards; ESP-IDF's comes from ``sdkconfig.defaults``);
- ``src/main.c``: the board's entry (``app_main`` under ESP-IDF, ``flm_main`` called from the
  Arduino-Pico core's ``setup()``), which asks the HAL for the arena in its tier;
- ``src/hal/flm_board.h``: where the blob is, which tier the arena lives in, the tier budgets;
- ESP32 (ESP-IDF): ``partitions.csv`` with a data partition sized to the blob, the CMake files
  ESP-IDF needs, ``sdkconfig.defaults`` (flash size, PSRAM, console, -O2, no task watchdog);
- RP2040/RP2350 (Arduino-Pico core): the blob at a fixed XIP flash offset, reserved through the
  core's filesystem region (``board_build.filesystem_size``), and ``model.uf2`` holding it;
- ``model.flmb`` (the blob) and ``flashlm.json`` (what ``flashlm flash`` needs).

Where a compiler for the board's CPU is installed here (arm-none-eabi-gcc for the RP2040/RP2350,
riscv64-unknown-elf-gcc for the ESP32-C3, an Xtensa gcc if any for the ESP32-S3), the engine, the
app and ``main.c`` are also cross-compiled to object files with ``-Wall -Wextra -Werror`` and their sizes
reported. The HALs need the vendor SDK and are compiled by PlatformIO only.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import exact_float, uf2
from .build_meta import FW_VERSION, TEMPLATES_DIR, BuildError, BuildResult
from .fits import TIER_PSRAM, Arena, board_arena, budget

TEMPLATES = TEMPLATES_DIR / "platformio"
PROJECT_FILE = "flashlm.json"
BLOB_FILE = "model.flmb"
UF2_FILE = "model.uf2"

# ESP32 flash layout (ESP-IDF): second-stage bootloader from 0 (0x1000 on the original ESP32),
# partition table at 0x8000 (one 4 KB sector), apps 64 KB aligned.
ESP_PT_OFFSET = 0x8000
ESP_NVS = (0x9000, 0x6000)
ESP_APP_OFFSET = 0x10000
ESP_DEFAULT_APP_SIZE = 0x100000
MMU_PAGE = 0x10000               # ESP32-S3/C3 flash MMU page: the blob partition is page aligned
BLOB_SUBTYPE = 0x40              # first custom data subtype
BLOB_PARTITION = "model"
# RP2040/RP2350 under Arduino-Pico: flash = [sketch][filesystem region][4 KB EEPROM sector]; the
# blob is the filesystem region, from a fixed offset to the EEPROM sector.
RP_DEFAULT_BLOB_OFFSET = 0x40000
RP_EEPROM = 4096

ESPTOOL_CHIP = {"ESP32-S3": "esp32s3", "ESP32-C3": "esp32c3", "ESP32-P4": "esp32p4", "ESP32": "esp32", "ESP32-S2": "esp32s2"}


@dataclass(frozen=True)
class Partition:
    name: str
    type: str
    subtype: str
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class CrossTarget:
    label: str                  # what the objects are built for, e.g. "cortex-m33"
    compilers: tuple[str, ...]  # candidates, first found wins
    flags: tuple[str, ...]


CROSS = {
    "RP2040": CrossTarget("cortex-m0plus (RP2040)", ("arm-none-eabi-gcc",), ("-mcpu=cortex-m0plus", "-mthumb")),
    # pico-sdk's RP2350 Arm flags
    "RP2350": CrossTarget("cortex-m33 (RP2350)", ("arm-none-eabi-gcc",),
                          ("-mcpu=cortex-m33", "-mthumb", "-march=armv8-m.main+fp+dsp", "-mfloat-abi=softfp")),
    "ESP32-C3": CrossTarget("rv32imc (ESP32-C3)", ("riscv32-esp-elf-gcc", "riscv64-unknown-elf-gcc"),
                            ("-march=rv32imc", "-mabi=ilp32")),
    "ESP32-P4": CrossTarget("rv32imafc (ESP32-P4)", ("riscv32-esp-elf-gcc", "riscv64-unknown-elf-gcc"),
                            ("-march=rv32imafc", "-mabi=ilp32f")),
    "ESP32-S3": CrossTarget("xtensa lx7 (ESP32-S3)", ("xtensa-esp32s3-elf-gcc", "xtensa-esp-elf-gcc"),
                            ("-mlongcalls",)),
}
# gnu17: the dialect ESP-IDF and Arduino-Pico compile with, whose GNU built-ins (significand, ...)
# a name of ours could clash with where -std=c99 hides them
CHECK_FLAGS = ("-std=gnu17", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off",
               "-ffunction-sections", "-fdata-sections")


def _up(n: int, a: int) -> int:
    return -(-n // a) * a


def _chip(prof: dict) -> str:
    chip = prof.get("chip")
    if not chip:
        raise BuildError(f"board {prof['name']} has no 'chip' in its profile")
    return chip


def is_esp(prof: dict) -> bool:
    return prof.get("platformio", {}).get("framework") == "espidf"


def flash_size(prof: dict) -> int:
    try:
        return int(prof["tiers"]["flash"]["capacity"])
    except (KeyError, TypeError, ValueError):
        raise BuildError(f"board {prof['name']}'s profile has no [tiers.flash] capacity") from None


# -- memory: partitions, blob window ---------------------------------------------

def esp_partitions(prof: dict, blob_size: int) -> list[Partition]:
    """nvs, the factory app, and the blob's data partition (MMU-page aligned, sized to the blob)."""
    size = flash_size(prof)
    off = int(prof.get("flash", {}).get("blob_offset", ESP_APP_OFFSET + ESP_DEFAULT_APP_SIZE))
    if off % MMU_PAGE or off <= ESP_APP_OFFSET:
        raise BuildError(f"board {prof['name']}: [flash] blob_offset {off:#x} must be a multiple of "
                         f"{MMU_PAGE:#x} above the app at {ESP_APP_OFFSET:#x}")
    part = _up(max(blob_size, 1), MMU_PAGE)
    if off + part > size:
        raise BuildError(f"the model's blob ({blob_size:,} bytes) does not fit {prof['name']}'s flash: "
                         f"the partition from {off:#x} would end at {off + part:#x}, the flash has "
                         f"{size:#x} ({off + part - size:,} bytes short); use q4 or a smaller model")
    return [Partition("nvs", "data", "nvs", *ESP_NVS),
            Partition("factory", "app", "factory", ESP_APP_OFFSET, off - ESP_APP_OFFSET),
            Partition(BLOB_PARTITION, "data", f"{BLOB_SUBTYPE:#x}", off, part)]


def partitions_csv(parts: list[Partition]) -> str:
    rows = ["# ESP-IDF Partition Table (generated by flashlm)",
            "# Name,   Type, SubType, Offset,   Size"]
    rows += [f"{p.name + ',':9} {p.type + ',':5} {p.subtype + ',':8} {p.offset:#x}, {p.size:#x}," for p in parts]
    return "\n".join(rows) + "\n"


def rp_blob_window(prof: dict) -> tuple[int, int]:
    """(flash offset, bytes) of the blob on an Arduino-Pico board."""
    size = flash_size(prof)
    off = int(prof.get("flash", {}).get("blob_offset", RP_DEFAULT_BLOB_OFFSET))
    if off % 4096 or not 0 < off < size - RP_EEPROM:
        raise BuildError(f"board {prof['name']}: [flash] blob_offset {off:#x} must be 4 KB aligned inside the flash")
    return off, size - RP_EEPROM - off


# -- rendering ---------------------------------------------------------------------------------

def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def _ini_value(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _sdk_line(k: str, v) -> str:
    if v in (False, "n", "no"):
        return f"# {k} is not set"
    if v in (True, "y", "yes"):
        return f"{k}=y"
    if isinstance(v, int):
        return f"{k}={v}"
    return f'{k}="{v}"' if not re.fullmatch(r"-?\d+|0x[0-9a-fA-F]+", str(v)) else f"{k}={v}"


# -- the profile as the one source of clocks, flash mode and PSRAM settings ---------------------

def _tier(prof: dict, name: str) -> dict:
    return (prof.get("tiers") or {}).get(name) or {}


def profile_board_build(prof: dict) -> dict:
    """platformio.ini's ``board_build.*`` from the profile: the CPU clock (``clock_mhz``; PlatformIO's
    own board files may say otherwise, e.g. 133 MHz for the Pico) and, where the profile names them,
    the flash mode and clock its bandwidth assumes."""
    out = {}
    if prof.get("clock_mhz"):
        out["f_cpu"] = f"{int(prof['clock_mhz']) * 1_000_000}L"
    flash = _tier(prof, "flash")
    if flash.get("freq_mhz"):
        out["f_flash"] = f"{int(flash['freq_mhz']) * 1_000_000}L"
    if flash.get("mode"):
        out["flash_mode"] = str(flash["mode"])
    return out


PSRAM_MODES = {"quad": "CONFIG_SPIRAM_MODE_QUAD", "oct": "CONFIG_SPIRAM_MODE_OCT", "hex": "CONFIG_SPIRAM_MODE_HEX"}


def esp_memory_sdkconfig(prof: dict) -> dict:
    """ESP-IDF Kconfig lines from the profile: CPU clock, flash mode and clock, PSRAM mode and clock,
    data cache size and line, so the chip runs as the profile's bandwidths assume."""
    sdk = {}
    if prof.get("clock_mhz"):
        sdk[f"CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_{int(prof['clock_mhz'])}"] = "y"
    flash = _tier(prof, "flash")
    if flash.get("mode"):
        sdk[f"CONFIG_ESPTOOLPY_FLASHMODE_{str(flash['mode']).upper()}"] = "y"
    if flash.get("freq_mhz"):
        sdk[f"CONFIG_ESPTOOLPY_FLASHFREQ_{int(flash['freq_mhz'])}M"] = "y"
    psram = _tier(prof, "psram")
    if psram:
        sdk["CONFIG_SPIRAM"] = "y"
        mode = psram.get("mode", "quad")
        if mode not in PSRAM_MODES:
            raise BuildError(f"board {prof['name']}: [tiers.psram] mode must be one of {', '.join(PSRAM_MODES)}, "
                             f"not {mode!r}")
        sdk[PSRAM_MODES[mode]] = "y"
        if psram.get("freq_mhz"):
            sdk[f"CONFIG_SPIRAM_SPEED_{int(psram['freq_mhz'])}M"] = "y"
    cache = prof.get("cache") or {}
    chip = re.sub(r"[^A-Z0-9]", "", str(prof.get("chip", "")).upper())     # ESP32-S3 -> ESP32S3
    if cache.get("dcache_kb"):
        sdk[f"CONFIG_{chip}_DATA_CACHE_{int(cache['dcache_kb'])}KB"] = "y"
    if cache.get("line_bytes"):
        sdk[f"CONFIG_{chip}_DATA_CACHE_LINE_{int(cache['line_bytes'])}B"] = "y"
    return sdk


def usb_ids(prof: dict) -> list[dict]:
    """The board's USB serial ids, the profile's [usb] first, then its alternatives."""
    u = prof.get("usb") or {}
    out = []
    if "vid" in u and "pid" in u:
        out.append({"vid": int(u["vid"]), "pid": int(u["pid"]), "note": u.get("note", "")})
    for a in u.get("alt", []) or []:
        ids = {"vid": int(a["vid"]), "pid": int(a["pid"]), "note": a.get("note", "")}
        if all((o["vid"], o["pid"]) != (ids["vid"], ids["pid"]) for o in out):
            out.append(ids)
    return out


def _esp_files(prof: dict, out: Path, ctx: dict, blob_size: int) -> dict:
    parts = esp_partitions(prof, blob_size)
    (out / "partitions.csv").write_text(partitions_csv(parts))
    blob_part = parts[-1]
    pio = prof["platformio"]
    console = (prof.get("usb") or {}).get("console", "uart0")
    if console not in ("uart0", "usb_serial_jtag"):
        raise BuildError(f"board {prof['name']}: [usb] console must be uart0 or usb_serial_jtag, not {console!r}")
    sdk = {"CONFIG_PARTITION_TABLE_CUSTOM": "y",
           "CONFIG_PARTITION_TABLE_CUSTOM_FILENAME": "partitions.csv",
           f"CONFIG_ESPTOOLPY_FLASHSIZE_{flash_size(prof) >> 20}MB": "y",
           "CONFIG_COMPILER_OPTIMIZATION_PERF": "y",
           "CONFIG_ESP_MAIN_TASK_STACK_SIZE": 16384,
           # the engine computes for seconds without yielding; the watchdog's report would land
           # in the middle of a frame on the console port
           "CONFIG_ESP_TASK_WDT_EN": "n", "CONFIG_ESP_TASK_WDT_INIT": "n",
           "CONFIG_LOG_DEFAULT_LEVEL_WARN": "y"}
    if console == "usb_serial_jtag":
        sdk["CONFIG_ESP_CONSOLE_USB_SERIAL_JTAG"] = "y"
    else:
        sdk["CONFIG_ESP_CONSOLE_UART_DEFAULT"] = "y"
        sdk["CONFIG_ESP_CONSOLE_UART_BAUDRATE"] = ctx["baud"]
    sdk.update(esp_memory_sdkconfig(prof))
    sdk.update(pio.get("sdkconfig", {}) or {})
    if sdk.get("CONFIG_SPIRAM") in ("y", True):
        sdk.setdefault("CONFIG_SPIRAM_USE_CAPS_ALLOC", "y")   # PSRAM only through heap_caps_malloc
    env = _env()
    (out / "sdkconfig.defaults").write_text(
        env.get_template("sdkconfig.defaults.j2").render(ctx, lines=[_sdk_line(k, v) for k, v in sdk.items()]))
    (out / "CMakeLists.txt").write_text(env.get_template("CMakeLists.txt.j2").render(ctx))
    (out / "src" / "CMakeLists.txt").write_text(env.get_template("src_CMakeLists.txt.j2").render(ctx))
    # a stale sdkconfig.<env> would win over the new defaults (PSRAM mode, flash size, partitions)
    stale = out / f"sdkconfig.{ctx['env']}"
    if stale.exists():
        stale.unlink()
    board_build = {"partitions": "partitions.csv", **profile_board_build(prof), **(pio.get("board_build") or {})}
    board_upload = {"flash_size": f"{flash_size(prof) >> 20}MB", **(pio.get("board_upload") or {})}
    return dict(board_build=board_build, board_upload=board_upload, blob_offset=blob_part.offset,
                blob_region=blob_part.size, partitions=[p.__dict__ for p in parts],
                defines={"FLM_CONSOLE_USB_SERIAL_JTAG": int(console == "usb_serial_jtag"),
                         "FLM_BLOB_PARTITION": f'"{BLOB_PARTITION}"', "FLM_BLOB_SUBTYPE": f"{BLOB_SUBTYPE:#x}"},
                entry="app_main", method="esptool", esptool_chip=ESPTOOL_CHIP.get(_chip(prof)))


def _rp_files(prof: dict, out: Path, ctx: dict, blob: bytes) -> dict:
    off, region = rp_blob_window(prof)
    if len(blob) > region:
        raise BuildError(f"the model's blob ({len(blob):,} bytes) does not fit {prof['name']}'s flash window "
                         f"of {region:,} bytes from {off:#x} ({len(blob) - region:,} bytes short); "
                         f"use q4 or a smaller model")
    family = uf2.family_for(_chip(prof))
    uf2.write_uf2(out / UF2_FILE, blob, uf2.XIP_BASE + off, family)
    pio = prof["platformio"]
    board_build = {**profile_board_build(prof), **(pio.get("board_build") or {})}
    if pio.get("framework") == "arduino":
        board_build.setdefault("core", "earlephilhower")
    # Arduino-Pico's flash layout: the "filesystem" ends at the EEPROM sector and starts where the
    # blob does, so the sketch can never grow into the blob (PlatformIO checks the program size)
    board_build["filesystem_size"] = region
    return dict(board_build=board_build, board_upload=dict(pio.get("board_upload") or {}), blob_offset=off,
                blob_region=region, defines={"FLM_XIP_BASE": f"{uf2.XIP_BASE:#x}u"}, entry="flm_main",
                method=prof.get("flash", {}).get("method", "picotool"), uf2=UF2_FILE, uf2_family=family)


def _board_header(prof: dict, arena: Arena, extra: dict) -> str:
    lines = [f'/* Generated by flashlm {FW_VERSION} for board "{prof["name"]}" from boards/{prof["name"]}.toml'
             " -- do not edit. */",
             "#ifndef FLM_BOARD_H", "#define FLM_BOARD_H",
             f"/* tier of the engine's arena ({arena.bytes:,} bytes, FLM_ARENA_BYTES in flm_config.h): "
             f"{arena.tier_name.upper()} */",
             f"#define FLM_ARENA_TIER {arena.tier}",
             f"#define FLM_BLOB_OFFSET {extra['blob_offset']:#x}u   /* flash offset of the weights blob */",
             f"#define FLM_BLOB_REGION {extra['blob_region']:#x}u   /* bytes of flash reserved for it */",
             "/* what flashlm may use in each RAM tier (the profile's budgets) */",
             f"#define FLM_SRAM_BUDGET {budget(prof, 'sram')}u",
             f"#define FLM_PSRAM_BUDGET {budget(prof, 'psram')}u",
             f"#define FLM_BAUD {extra['baud']}"]
    lines += [f"#define {k} {v}" for k, v in extra["defines"].items()]
    return "\n".join(lines + ["#endif", ""])


def render_platformio(prof: dict, out: Path, blob: bytes, header) -> dict:
    """Write the PlatformIO files into the project ``render_project`` made; returns flashlm.json's data."""
    if "platformio" not in prof or not all(k in prof["platformio"] for k in ("platform", "board", "framework")):
        raise BuildError(f"board {prof['name']}'s profile needs [platformio] platform, board and framework")
    out = Path(out)
    config = header.config
    arena = board_arena(prof, header)
    env_name = prof["name"]
    ctx = dict(board=prof, pio=prof["platformio"], env=env_name, fw_version=FW_VERSION,
               project_name=re.sub(r"[^A-Za-z0-9_]", "_", f"flashlm_{env_name}"),
               baud=int((prof.get("usb") or {}).get("baud", 115200)),
               model_summary=(f"dim {config.dim}, {config.n_layers} layers, vocab {config.vocab_size}, "
                              f"context {config.max_seq_len}, layout {header.layout_id}; {len(blob):,}-byte blob; "
                              f"arena {arena.bytes:,} bytes in {arena.tier_name.upper()}"
                              + (f", {arena.other:,} staged in {'SRAM' if arena.tier == TIER_PSRAM else 'PSRAM'}"
                                 if arena.other else "")))
    soft = exact_float.add_to_project(prof, out)
    ctx["link_flags"] = soft["link_flags"]
    extra = _esp_files(prof, out, ctx, len(blob)) if is_esp(prof) else _rp_files(prof, out, ctx, blob)
    extra["baud"] = ctx["baud"]
    env = _env()
    (out / "platformio.ini").write_text(env.get_template("platformio.ini.j2").render(
        ctx, board_build=[(k, _ini_value(v)) for k, v in extra["board_build"].items()],
        board_upload=[(k, _ini_value(v)) for k, v in extra["board_upload"].items()], esp=is_esp(prof),
        extra_scripts=soft["extra_scripts"], src_flags=soft["src_flags"]))
    src = out / "src"
    (src / "main.c").write_text(env.get_template("main.c.j2").render(ctx, entry=extra["entry"]))
    (src / "hal" / "flm_board.h").write_text(_board_header(prof, arena, extra))
    (out / BLOB_FILE).write_bytes(blob)
    info = {"format": "flashlm-project", "version": 1, "board": prof["name"], "env": env_name,
            "chip": _chip(prof), "framework": prof["platformio"]["framework"], "method": extra["method"],
            "blob": BLOB_FILE, "blob_offset": extra["blob_offset"], "blob_size": len(blob),
            "blob_region": extra["blob_region"], "layout_id": header.layout_id, "arena_tier": arena.tier_name,
            "arena_bytes": arena.bytes, "staging_bytes": arena.other, "usb": usb_ids(prof), "baud": ctx["baud"]}
    for k in ("esptool_chip", "uf2", "uf2_family", "partitions"):
        if k in extra:
            info[k] = extra[k]
    (out / PROJECT_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return info


# -- cross-compiling the engine here -----------------------------------------------------------

def _find_compiler(t: CrossTarget) -> str | None:
    for c in t.compilers:
        if shutil.which(c):
            return c
    return None


def _libc_flags(cc: str) -> list[str]:
    """Debian's riscv64-unknown-elf-gcc has its C headers in picolibc, reached through a specs file."""
    if "unknown-elf" not in cc or "riscv" not in cc:
        return []
    r = subprocess.run([cc, "-print-file-name=picolibc.specs"], capture_output=True, text=True)
    path = r.stdout.strip()
    return ["--specs=picolibc.specs"] if r.returncode == 0 and path and Path(path).is_file() else []


def cross_compile(prof: dict, out: Path) -> str:
    """Compile the engine, the app and main.c for the board's CPU where a compiler is installed here;
    returns the report (``size`` of each object, totals) or a line saying why it was skipped."""
    chip = prof.get("chip", "")
    t = CROSS.get(chip)
    if t is None:
        return f"engine not cross-compiled here: no compiler target for chip {chip!r}"
    cc = _find_compiler(t)
    if cc is None:
        return f"engine not cross-compiled here: no {' or '.join(t.compilers)} for {t.label}"
    out = Path(out).resolve()
    objdir = out / ".flashlm-check"
    if objdir.exists():
        shutil.rmtree(objdir)
    objdir.mkdir()
    soft_float, soft_flags = exact_float.cross_sources(prof, out)     # boards without an FPU
    src = out / "src"
    srcs = sorted((src / "engine").glob("*.c")) + sorted((src / "app").glob("*.c")) + [src / "main.c"] + soft_float
    cmd = [cc, *t.flags, *_libc_flags(cc), *CHECK_FLAGS, *soft_flags, "-include", str(out / "flm_config.h"),
           *(f"-I{src / d}" for d in ("engine", "app", "hal")), "-c", *map(str, srcs)]
    r = subprocess.run(cmd, cwd=objdir, capture_output=True, text=True)
    if r.returncode != 0:
        msg = next((ln for ln in (r.stderr or r.stdout).splitlines() if "error" in ln), (r.stderr or r.stdout).strip())
        raise BuildError(f"the engine does not compile for {t.label} with {cc}: {msg.strip()}")
    size_tool = cc[: -len("gcc")] + "size"
    if not shutil.which(size_tool):
        size_tool = "size"
    objs = sorted(p.name for p in objdir.glob("*.o"))
    s = subprocess.run([size_tool, "-t", *objs], cwd=objdir, capture_output=True, text=True)
    hals = sorted(p.name for p in (out / "src" / "hal").iterdir() if p.suffix in (".c", ".cpp") and p not in soft_float)
    head = (f"engine + main.c{' + soft-float' if soft_float else ''} cross-compiled for {t.label} with {cc} "
            f"({' '.join(t.flags)} {' '.join(CHECK_FLAGS)}): no warnings")
    note = f"HAL {', '.join(hals)}: needs the vendor SDK, compiled by PlatformIO (not here)"
    return "\n".join([head, s.stdout.rstrip(), note])


def build_platformio(board: str, prof: dict, out: Path, blob, header) -> BuildResult:
    data = Path(blob).read_bytes()
    info = render_platformio(prof, out, data, header)
    where = (f"blob {len(data):,} bytes in partition '{BLOB_PARTITION}' at {info['blob_offset']:#x}" if is_esp(prof)
             else f"blob {len(data):,} bytes at XIP {uf2.XIP_BASE + info['blob_offset']:#x} ({UF2_FILE})")
    lines = [f"PlatformIO project for {prof['name']} ({prof['platformio']['board']}, "
             f"{prof['platformio']['framework']}): {where}; layout {info['layout_id']}: arena "
             f"{info['arena_bytes']:,} bytes in {info['arena_tier'].upper()}"
             + (f", {info['staging_bytes']:,} bytes staged in the other RAM tier" if info["staging_bytes"] else ""),
             cross_compile(prof, out)]
    return BuildResult(board, Path(out), None, "\n".join(lines))
