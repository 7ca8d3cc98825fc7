"""Real-board projects (PlatformIO): rendering, the engine cross-compiled for the boards' CPUs,
partition tables, UF2 images, and ``flashlm flash`` (dry run, missing PlatformIO / port, and the
commands it runs, against a stand-in ``pio``)."""
from __future__ import annotations

import json
import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

from converter.blob import write_blob
from converter.boards import load_board
from converter.quantize import quantize
from firmware import fits
from firmware import platformio as P
from firmware import uf2
from firmware.build import build_firmware
from firmware.build_meta import BuildError
from host.boards import flash as F
from host.cli.main import main
from host.output.console import make_console

sys.path.insert(0, str(Path(__file__).parent))
from modelzoo import random_model  # noqa: E402

# every test here uses the module's projects, cross-compiled for the boards
pytestmark = pytest.mark.cross

ESP_BOARDS = ["esp32s3-n16r8", "esp32s3-n8r2", "esp32c3-devkitm-1", "esp32p4-function-ev"]
RP_BOARDS = ["pico", "pico2", "pico-plus-2"]
BOARDS = ESP_BOARDS + RP_BOARDS
# the CPU each chip's engine objects are compiled for, and the compiler that does it here
CROSS = {"pico": ("cortex-m0plus", "arm-none-eabi-gcc"), "pico2": ("cortex-m33", "arm-none-eabi-gcc"),
         "esp32c3-devkitm-1": ("rv32imc", "riscv64-unknown-elf-gcc"),
         "esp32p4-function-ev": ("rv32imafc", "riscv64-unknown-elf-gcc")}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory as 'flashlm convert' writes it (blob + manifest), from a small random model."""
    d = tmp_path_factory.mktemp("model")
    _, ir = random_model(3)
    info = write_blob(quantize(ir, "q8", 32), d / "model.flmb")
    c = ir.config
    (d / "manifest.json").write_text(json.dumps({
        "blob": "model.flmb", "tokenizer": None, "model_hash": bytes(info.model_hash).hex(),
        "layout_id": info.layout_id, "config": {"max_seq_len": c.max_seq_len, "vocab_size": c.vocab_size}}))
    return d


@pytest.fixture(scope="module")
def projects(model_dir, tmp_path_factory):
    """Every real board's project, rendered (and cross-compiled where a compiler is here) once."""
    root = tmp_path_factory.mktemp("projects")
    return {b: build_firmware(b, root / b, model_dir / "model.flmb") for b in BOARDS}


# -- the engine cross-compiled for the boards' CPUs -------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("board", sorted(CROSS))
def test_engine_cross_compiles_without_warnings(projects, board):
    cpu, cc = CROSS[board]
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    text = projects[board].size_text
    print(text)                       # the sizes, in pytest -s / the build output
    assert f"cross-compiled for {cpu}" in text and "-Werror" in text and "no warnings" in text
    m = re.search(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+\d+\s+[0-9a-f]+\s+\(TOTALS\)", text, re.M)
    assert m, text
    text_bytes = int(m.group(1))
    assert 5_000 < text_bytes < 200_000, text
    for obj in ("engine.o", "kernels.o", "app.o", "main.o"):
        assert obj in text
    assert "not here" in text         # the HAL needs the vendor SDK


def test_cross_compile_failure_is_a_build_error(projects, tmp_path):
    if shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("arm-none-eabi-gcc is not installed")
    proj = tmp_path / "p"
    shutil.copytree(projects["pico2"].project_dir, proj)
    (proj / "src" / "engine" / "zz_warn.c").write_text("int f(int x) { int unused; return x; }\n")
    with pytest.raises(BuildError, match="does not compile for cortex-m33"):
        P.cross_compile(load_board("pico2"), proj)


def test_build_cli_prints_sizes_and_the_flash_step(model_dir, tmp_path, capsys):
    out = tmp_path / "pico2"
    assert main(["build", "--board", "pico2", "--model", str(model_dir), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PlatformIO project for pico2" in text and f"flashlm flash {out}" in text
    if shutil.which("arm-none-eabi-gcc"):
        assert "(TOTALS)" in text
    for f in ("platformio.ini", "flashlm.json", "model.flmb", "model.uf2", "src/main.c", "src/hal/flm_board.h",
              "src/hal/hal_arduino_pico.cpp", "src/engine/engine.c", "flm_config.h"):
        assert (out / f).is_file(), f


# -- platformio.ini through PlatformIO's own reader --------------------------------------------

@pytest.mark.parametrize("board", BOARDS)
def test_platformio_ini_parses_with_platformio(projects, board, monkeypatch):
    pytest.importorskip("platformio")
    from platformio.project.config import ProjectConfig
    proj = projects[board].project_dir
    monkeypatch.chdir(proj)           # as 'pio run -d PROJECT' does: ${PROJECT_DIR} is the cwd
    prof = load_board(board)
    lint = ProjectConfig.lint(str(proj / "platformio.ini"))
    assert lint["errors"] == [], lint
    cfg = ProjectConfig(str(proj / "platformio.ini"))
    assert cfg.validate(silent=True)
    assert cfg.envs() == [board] and cfg.default_envs() == [board]
    sec = f"env:{board}"
    for k in ("platform", "board", "framework"):
        got = cfg.get(sec, k)
        assert (got[0] if isinstance(got, list) else got) == prof["platformio"][k]
    flags = cfg.get(sec, "build_flags")
    assert "-ffp-contract=off" in flags
    if P.is_esp(prof):     # -O2 from sdkconfig (the app only); unflags would strip the bootloader's -Os too
        assert "-O2" not in flags and not cfg.get(sec, "build_unflags")
        assert "CONFIG_COMPILER_OPTIMIZATION_PERF=y" in (proj / "sdkconfig.defaults").read_text().splitlines()
    else:
        assert "-O2" in flags
    inc = next(f for f in flags if f.startswith("-include"))
    assert inc == f"-include {proj.resolve() / 'flm_config.h'}"
    if P.is_esp(prof):
        assert cfg.get(sec, "board_build.partitions") == "partitions.csv"
        assert cfg.get(sec, "board_upload.flash_size") == f"{prof['tiers']['flash']['capacity'] >> 20}MB"
    else:
        off, region = P.rp_blob_window(prof)
        assert int(cfg.get(sec, "board_build.filesystem_size")) == region
        assert cfg.get(sec, "board_build.core") == "earlephilhower"
        assert off + region + P.RP_EEPROM == prof["tiers"]["flash"]["capacity"]


# -- ESP32: partition table, sdkconfig, CMake --------------------------------------------------

def _read_partitions(path: Path) -> list[tuple[str, str, str, int, int]]:
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cols = [c.strip() for c in line.split(",")]
        rows.append((cols[0], cols[1], cols[2], int(cols[3], 0), int(cols[4], 0)))
    return rows


@pytest.mark.parametrize("board", ESP_BOARDS)
def test_partition_table_aligned_disjoint_and_fits(projects, board, model_dir):
    proj = projects[board].project_dir
    prof = load_board(board)
    flash = prof["tiers"]["flash"]["capacity"]
    rows = _read_partitions(proj / "partitions.csv")
    assert [r[0] for r in rows] == ["nvs", "factory", "model"]
    end_of_table = P.ESP_PT_OFFSET + 0x1000
    prev_end = end_of_table
    for name, typ, sub, off, size in sorted(rows, key=lambda r: r[3]):
        assert off % (0x10000 if typ == "app" else 0x1000) == 0, name
        assert size > 0 and size % 0x1000 == 0, name
        assert off >= prev_end, f"{name} overlaps the partition before it"
        prev_end = off + size
    assert prev_end <= flash
    model = next(r for r in rows if r[0] == "model")
    blob = (model_dir / "model.flmb").stat().st_size
    assert model[1] == "data" and int(model[2], 0) == P.BLOB_SUBTYPE
    assert model[3] % P.MMU_PAGE == 0 and blob <= model[4] < blob + P.MMU_PAGE     # sized to the blob
    assert model[3] == prof["flash"]["blob_offset"]
    info = json.loads((proj / "flashlm.json").read_text())
    assert info["blob_offset"] == model[3] and info["method"] == "esptool"
    assert (proj / "model.flmb").read_bytes() == (model_dir / "model.flmb").read_bytes()
    sdk = (proj / "sdkconfig.defaults").read_text()
    assert "CONFIG_PARTITION_TABLE_CUSTOM=y" in sdk and 'CONFIG_PARTITION_TABLE_CUSTOM_FILENAME="partitions.csv"' in sdk
    assert "CONFIG_PARTITION_TABLE_FILENAME" not in sdk      # no Kconfig prompt: ESP-IDF ignores it
    assert f"CONFIG_ESPTOOLPY_FLASHSIZE_{flash >> 20}MB=y" in sdk
    assert ("CONFIG_SPIRAM=y" in sdk) == ("psram" in prof["tiers"])
    assert "esp_partition" in (proj / "src" / "CMakeLists.txt").read_text()
    assert "project(" in (proj / "CMakeLists.txt").read_text()
    main_c = (proj / "src" / "main.c").read_text()
    assert "void app_main(void)" in main_c and "int main" not in main_c


def test_blob_too_big_for_the_flash_names_the_shortfall():
    c3 = load_board("esp32c3-devkitm-1")
    with pytest.raises(BuildError, match=r"does not fit esp32c3-devkitm-1's flash.*bytes short"):
        P.esp_partitions(c3, 4 << 20)
    parts = P.esp_partitions(c3, 3_000_000)          # the largest that fits: up to the flash's end
    assert parts[-1].end <= 4 << 20
    pico = load_board("pico")
    off, region = P.rp_blob_window(pico)
    assert (off, region) == (0x40000, (2 << 20) - 0x40000 - 4096)


def _ini(path: Path) -> dict[str, str]:
    """platformio.ini's top-level ``key = value`` lines (the env's; no continuation lines)."""
    return {ln.split("=", 1)[0].strip(): ln.split("=", 1)[1].strip()
            for ln in path.read_text().splitlines() if "=" in ln and not ln.startswith((";", "#", " "))}


LINES = {"qio": 4, "qout": 4, "dio": 2, "dout": 2, "quad": 4, "oct": 8, "hex": 16}


@pytest.mark.parametrize("board", BOARDS)
def test_generated_files_agree_with_the_profile(projects, board):
    """The profile is the one source of the clocks, flash mode and PSRAM settings its bandwidths
    assume; the generated platformio.ini and sdkconfig.defaults must say the same."""
    proj = projects[board].project_dir
    prof = load_board(board)
    ini = _ini(proj / "platformio.ini")
    assert ini["board_build.f_cpu"] == f"{prof['clock_mhz'] * 1_000_000}L"
    plat = prof["platformio"]["platform"]
    pinned = "@" in plat or "#" in plat or re.search(r"/releases/download/[0-9][^/]*/", plat)   # a release's zip
    assert pinned, f"{board}: platform {plat!r} is not pinned"
    assert ini["platform"] == plat
    if not P.is_esp(prof):
        return
    flash, psram = prof["tiers"]["flash"], prof["tiers"].get("psram")
    assert ini["board_build.flash_mode"] == flash["mode"]
    assert ini["board_build.f_flash"] == f"{flash['freq_mhz'] * 1_000_000}L"
    sdk = {ln.split("=", 1)[0]: ln.split("=", 1)[1] for ln in (proj / "sdkconfig.defaults").read_text().splitlines()
           if ln.startswith("CONFIG_")}
    assert sdk[f"CONFIG_ESP_DEFAULT_CPU_FREQ_MHZ_{prof['clock_mhz']}"] == "y"
    assert sdk[f"CONFIG_ESPTOOLPY_FLASHMODE_{flash['mode'].upper()}"] == "y"
    assert sdk[f"CONFIG_ESPTOOLPY_FLASHFREQ_{flash['freq_mhz']}M"] == "y"
    # the profile's flash bandwidth is what those pins can carry, not more
    assert flash["seq_read_MBps"] <= LINES[flash["mode"]] * flash["freq_mhz"] / 8
    if psram:
        assert sdk["CONFIG_SPIRAM"] == "y"
        assert sdk[f"CONFIG_SPIRAM_MODE_{psram['mode'].upper()}"] == "y"
        assert sdk[f"CONFIG_SPIRAM_SPEED_{psram['freq_mhz']}M"] == "y"
        ddr = 2 if psram["mode"] in ("oct", "hex") else 1
        assert psram["seq_read_MBps"] <= LINES[psram["mode"]] * psram["freq_mhz"] * ddr / 8
    else:
        assert "CONFIG_SPIRAM" not in sdk
    cache = prof.get("cache", {})
    if "dcache_kb" in cache:
        assert sdk[f"CONFIG_ESP32S3_DATA_CACHE_{cache['dcache_kb']}KB"] == "y"
        assert sdk[f"CONFIG_ESP32S3_DATA_CACHE_LINE_{cache['line_bytes']}B"] == "y"
        assert prof["tiers"]["flash"]["line_bytes"] == cache["line_bytes"]
    text = (proj / "sdkconfig.defaults").read_text().splitlines()
    assert "# CONFIG_ESP_TASK_WDT_EN is not set" in text
    assert not any(re.match(r"(# )?CONFIG_ESP_TASK_WDT[ =]", ln) for ln in text)   # the pre-5.0 name
    cmake = (proj / "src" / "CMakeLists.txt").read_text()
    for comp in ("esp_driver_uart", "esp_driver_usb_serial_jtag", "esp_partition"):
        assert comp in cmake      # ESP-IDF 6's driver no longer re-exports the first two


def test_s3_port_autodetect_knows_the_common_bridges(projects):
    from types import SimpleNamespace as Port
    ids = {(u["vid"], u["pid"]) for u in P.usb_ids(load_board("esp32s3-n16r8"))}
    assert {(0x10C4, 0xEA60), (0x303A, 0x1001), (0x1A86, 0x55D3), (0x1A86, 0x7523)} <= ids
    _, info = F.load_project(projects["esp32s3-n16r8"].project_dir)
    ch343 = Port(device="/dev/ttyACM0", vid=0x1A86, pid=0x55D3)
    other = Port(device="/dev/ttyS0", vid=None, pid=None)
    assert F.find_port(info, [other, ch343]) == "/dev/ttyACM0"
    assert F.find_port(info, [other]) is None
    with pytest.raises(F.FlashError, match="several serial ports.*ttyUSB0.*ttyACM0.*--port"):   # a bridge is
        F.find_port(info, [Port(device="/dev/ttyUSB0", vid=0x1A86, pid=0x7523), ch343])        # not a board


def _placed_blob(tmp_path, board, **cfg):
    """A blob placed by the planner for ``board`` (what 'flashlm plan --apply' writes)."""
    from converter.blob import build_blob, parse_header
    from converter.costmodel import ModelSpec
    from converter.planner import plan
    _, ir = random_model(5, **cfg)
    qm = quantize(ir, "q8", 32)
    data = build_blob(qm)
    pl = plan(ModelSpec.from_header(parse_header(data, "x")), board)
    path = tmp_path / f"{board}.flmb"
    path.write_bytes(build_blob(qm, pl.tiers, pl.state_tiers))
    return path, pl


def test_applied_layout_is_the_arena_everywhere(tmp_path):
    """plan --apply staging tensors in SRAM: one arena holds all of it, within the SRAM budget (the
    largest block the firmware can allocate), and flashlm.json, the platformio.ini header,
    flm_config.h, flm_board.h and the build summary all report that arena."""
    from converter.blob import read_header
    blob, pl = _placed_blob(tmp_path, "esp32s3-n16r8", dim=128, n_layers=4, n_heads=4, n_kv_heads=4,
                            hidden_dim=256, vocab_size=512, max_seq_len=64)
    assert pl.need["sram"] > 50_000 and any(t == "sram" for t in pl.tiers.values())
    prof = load_board("esp32s3-n16r8")
    assert pl.need["sram"] <= prof["tiers"]["sram"]["budget"]
    res = build_firmware("esp32s3-n16r8", tmp_path / "s3", blob)
    proj = res.project_dir
    info = json.loads((proj / "flashlm.json").read_text())
    a = fits.board_arena(prof, read_header(blob))
    assert (info["arena_tier"], info["arena_bytes"]) == ("sram", pl.need["sram"]) == (a.tier_name, a.bytes)
    assert info["layout_id"] == pl.layout_id and info["staging_bytes"] == pl.need.get("psram", 0)
    assert f"#define FLM_ARENA_BYTES {a.bytes}u" in (proj / "flm_config.h").read_text()
    assert f"#define FLM_ARENA_TIER {fits.TIER_SRAM}" in (proj / "src" / "hal" / "flm_board.h").read_text()
    assert f"arena {a.bytes:,} bytes in SRAM" in (proj / "platformio.ini").read_text()
    assert f"layout {pl.layout_id}: arena {a.bytes:,} bytes in SRAM" in res.size_text


def test_arena_goes_to_psram_or_names_the_shortfall(tmp_path, capsys):
    from converter.blob import read_header
    from converter.footprint import layout_needs
    big = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=96, vocab_size=97, max_seq_len=512)
    _, ir = random_model(6, **big)
    path = tmp_path / "m.flmb"
    write_blob(quantize(ir, "q8", 32), path)
    h = read_header(path)
    s3, c3 = load_board("esp32s3-n16r8"), load_board("esp32c3-devkitm-1")
    assert layout_needs(h)["sram"] > s3["tiers"]["sram"]["budget"]      # the KV cache alone: 512 KB
    a = fits.board_arena(s3, h)
    assert a.tier == fits.TIER_PSRAM and a.bytes == layout_needs(h, "psram")["psram"] and a.other == 0
    with pytest.raises(BuildError, match=r"does not fit on esp32c3-devkitm-1: sram short by .*context of \d+ tokens fits"):
        fits.board_arena(c3, h)
    d = _dir_for(tmp_path, path)
    for board in ("esp32c3-devkitm-1", "rp2040-emu", "pico"):   # the planner's shortfall, before anything is written
        assert main(["build", "--board", board, "--model", str(d), "-o", str(tmp_path / board)]) == 2
        assert not (tmp_path / board).exists()
    err = capsys.readouterr().err
    for board in ("esp32c3-devkitm-1", "rp2040-emu", "pico"):
        assert re.search(rf"does not fit on {board}: sram short by [\d.]+ KB; a context of \d+ tokens fits", err), err
    assert "fewer layers" not in err


def _dir_for(tmp_path, blob: Path) -> Path:
    from converter.blob import read_header
    h = read_header(blob)
    d = tmp_path / "modeldir"
    d.mkdir(exist_ok=True)
    shutil.copy(blob, d / "model.flmb")
    (d / "manifest.json").write_text(json.dumps({
        "blob": "model.flmb", "tokenizer": None, "model_hash": bytes(h.model_hash).hex(), "layout_id": h.layout_id,
        "config": {"max_seq_len": h.config.max_seq_len, "vocab_size": h.config.vocab_size}}))
    return d


# -- RP2040 / RP2350: UF2 ----------------------------------------------------------------------

@pytest.mark.parametrize("board", RP_BOARDS)
def test_model_uf2_puts_the_blob_at_its_xip_address(projects, board, model_dir):
    proj = projects[board].project_dir
    prof = load_board(board)
    blob = (model_dir / "model.flmb").read_bytes()
    blocks = uf2.parse_uf2((proj / "model.uf2").read_bytes())
    off, _ = P.rp_blob_window(prof)
    fam = uf2.FAMILY_RP2040 if prof["chip"] == "RP2040" else uf2.FAMILY_ABSOLUTE
    assert all(b["family"] == fam and b["flags"] & uf2.FLAG_FAMILY and b["size"] == 256 for b in blocks)
    assert [b["n"] for b in blocks] == list(range(len(blocks))) and {b["total"] for b in blocks} == {len(blocks)}
    assert [b["addr"] for b in blocks] == [uf2.XIP_BASE + off + 256 * i for i in range(len(blocks))]
    data = b"".join(b["payload"] for b in blocks)
    assert data[:len(blob)] == blob and set(data[len(blob):]) <= {0xFF}
    hdr = (proj / "src" / "hal" / "flm_board.h").read_text()
    assert f"#define FLM_BLOB_OFFSET {off:#x}u" in hdr
    main_c = (proj / "src" / "main.c").read_text()
    assert "void flm_main(void)" in main_c
    assert "void setup()" in (proj / "src" / "hal" / "hal_arduino_pico.cpp").read_text()


def test_combined_uf2():
    fw = uf2.bin_to_uf2(bytes(range(256)) * 3, uf2.XIP_BASE, uf2.FAMILY_RP2040)
    blob = b"FLMB" + bytes(600)
    one = uf2.parse_uf2(uf2.combine(fw, blob, uf2.XIP_BASE + 0x40000, uf2.FAMILY_RP2040))
    assert len(one) == 3 + 3
    assert [b["n"] for b in one] == list(range(6)) and {b["total"] for b in one} == {6}     # one download
    assert one[3]["addr"] == uf2.XIP_BASE + 0x40000 and one[3]["payload"][:4] == b"FLMB"
    # RP2350: the firmware's blocks (own numbering, other families) stay as they are
    fw2 = uf2.bin_to_uf2(bytes(512), uf2.XIP_BASE, uf2.FAMILY_RP2350_ARM_S)
    two = uf2.parse_uf2(uf2.combine(fw2, blob, uf2.XIP_BASE + 0x40000, uf2.FAMILY_ABSOLUTE))
    assert [(b["family"], b["n"], b["total"]) for b in two] == [
        (uf2.FAMILY_RP2350_ARM_S, 0, 2), (uf2.FAMILY_RP2350_ARM_S, 1, 2),
        (uf2.FAMILY_ABSOLUTE, 0, 3), (uf2.FAMILY_ABSOLUTE, 1, 3), (uf2.FAMILY_ABSOLUTE, 2, 3)]
    with pytest.raises(uf2.UF2Error, match="inside the blob region"):
        uf2.combine(fw, blob, uf2.XIP_BASE + 0x200, uf2.FAMILY_RP2040)
    with pytest.raises(uf2.UF2Error):
        uf2.parse_uf2(b"\0" * 512)


# -- flashlm flash -----------------------------------------------------------------------------

def _flash(capsys, argv):
    rc = main(["flash", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("board", BOARDS)
def test_flash_dry_run_prints_every_command(projects, board, capsys):
    proj = projects[board].project_dir
    info = json.loads((proj / "flashlm.json").read_text())
    rc, out, err = _flash(capsys, [str(proj), "--dry-run", "--port", "/dev/ttyFAKE0"])
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == f"pio run -d {proj} -e {board} -t upload --upload-port /dev/ttyFAKE0"
    if board in ESP_BOARDS:
        chip = {"ESP32-S3": "esp32s3", "ESP32-C3": "esp32c3", "ESP32-P4": "esp32p4"}[load_board(board)["chip"]]
        assert lines[1:] == [f"pio pkg exec -p tool-esptoolpy -- esptool.py --chip {chip} --port /dev/ttyFAKE0 "
                             f"--baud 460800 write_flash {info['blob_offset']:#x} {proj / 'model.flmb'}"]
    else:
        assert len(lines) == 4
        assert lines[1].startswith("# write ") and "flashlm-combined.uf2" in lines[1]
        assert lines[2].startswith("# open /dev/ttyFAKE0 at 1200 baud")
        assert lines[3] == f"pio pkg exec -- picotool load -v -x {proj / 'model.uf2'}"


def test_flash_dry_run_without_a_board(projects, capsys, monkeypatch):
    monkeypatch.setattr(F, "find_port", lambda info: None)
    rc, out, _ = _flash(capsys, [str(projects["esp32s3-n16r8"].project_dir), "--dry-run"])
    assert rc == 0 and "<PORT>" in out and "10c4:ea60" in out


def _one_line_error(rc, out, err, *needles):
    assert rc == 2 and "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashlm: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


def test_flash_without_platformio_is_a_one_line_error(projects, capsys, monkeypatch):
    monkeypatch.setattr(F, "find_pio", lambda: None)
    for board in ("esp32c3-devkitm-1", "pico"):
        _one_line_error(*_flash(capsys, [str(projects[board].project_dir), "--port", "/dev/ttyFAKE0"]),
                        "PlatformIO is not installed", "pip install platformio")


def test_flash_without_a_port_is_a_one_line_error(projects, capsys, monkeypatch):
    monkeypatch.setattr(F, "find_pio", lambda: "/bin/true")
    monkeypatch.setattr(F, "find_port", lambda info: None)
    _one_line_error(*_flash(capsys, [str(projects["esp32s3-n16r8"].project_dir)]),
                    "no serial port", "10c4:ea60", "--port")


def test_flash_not_a_project_is_a_one_line_error(tmp_path, capsys):
    _one_line_error(*_flash(capsys, [str(tmp_path)]), "not a flashlm PlatformIO project")


def _fake_pio(tmp_path) -> tuple[str, Path]:
    log = tmp_path / "calls.jsonl"
    pio = tmp_path / "pio"
    pio.write_text(f"#!{sys.executable}\nimport json, sys\n"
                   f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    pio.chmod(pio.stat().st_mode | stat.S_IEXEC)
    return str(pio), log


def test_flash_checks_the_port_before_building(projects, capsys, monkeypatch, tmp_path):
    ran = tmp_path / "pio-ran"
    pio = tmp_path / "pio"
    pio.write_text(f"#!/bin/sh\ntouch {ran}\n")
    pio.chmod(0o755)
    monkeypatch.setattr(F, "find_pio", lambda: str(pio))
    rc = main(["flash", str(projects["esp32s3-n16r8"].project_dir), "--port", "/dev/ttyNOPE"])
    err = capsys.readouterr().err
    assert rc == 2 and "/dev/ttyNOPE does not exist" in err and not ran.exists()


@pytest.mark.native
@pytest.mark.slow
def test_run_reuses_the_build_of_build_o(model_dir, tmp_path, monkeypatch, capsys):
    """'flashlm build -o DIR' is what 'run --board native' then uses; two models in one folder keep
    their own builds."""
    if not (shutil.which("cc") and shutil.which("make")):
        pytest.skip("no C toolchain for the native board")
    from host.boards import builds
    from host.model_dir import ModelDir
    m1 = tmp_path / "models" / "a"
    m2 = tmp_path / "models" / "b"
    for m in (m1, m2):
        shutil.copytree(model_dir, m)
    assert builds.build_dir_for(m1, "native") != builds.build_dir_for(m2, "native")
    assert main(["build", "--board", "native", "--model", str(m1), "-o", str(tmp_path / "fw")]) == 0
    capsys.readouterr()
    monkeypatch.setattr(builds, "build", lambda *a, **k: pytest.fail("rebuilt instead of reusing build -o"))
    assert builds.ensure_firmware(make_console(), ModelDir.open(m1)) == (tmp_path / "fw" / "firmware").resolve()


def test_flash_runs_pio_then_esptool(projects, capsys, monkeypatch, tmp_path):
    pio, log = _fake_pio(tmp_path)
    port = tmp_path / "ttyFAKE"
    port.write_text("")
    monkeypatch.setattr(F, "find_pio", lambda: pio)
    proj = projects["esp32c3-devkitm-1"].project_dir
    rc, out, err = _flash(capsys, [str(proj), "--port", str(port)])
    assert rc == 0, err
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert calls[0] == ["run", "-d", str(proj), "-e", "esp32c3-devkitm-1", "-t", "upload", "--upload-port", str(port)]
    assert calls[1][:4] == ["pkg", "exec", "-p", "tool-esptoolpy"]
    assert calls[1][-3:] == ["write_flash", "0x110000", str(proj / "model.flmb")]


def test_flash_rp_touches_the_port_and_loads_the_uf2(projects, capsys, monkeypatch, tmp_path):
    pio, log = _fake_pio(tmp_path)
    port = tmp_path / "ttyACMFAKE"
    port.write_text("")
    touched = []
    monkeypatch.setattr(F, "find_pio", lambda: pio)
    monkeypatch.setattr(F, "touch_1200", touched.append)
    monkeypatch.setattr(F.time, "sleep", lambda s: None)
    proj = projects["pico2"].project_dir
    fw = proj / ".pio" / "build" / "pico2"
    fw.mkdir(parents=True)
    (fw / "firmware.uf2").write_bytes(uf2.bin_to_uf2(bytes(1000), uf2.XIP_BASE, uf2.FAMILY_RP2350_ARM_S))
    rc, out, err = _flash(capsys, [str(proj), "--port", str(port)])
    assert rc == 0, err
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert calls == [["run", "-d", str(proj), "-e", "pico2", "-t", "upload", "--upload-port", str(port)],
                     ["pkg", "exec", "--", "picotool", "load", "-v", "-x", str(proj / "model.uf2")]]
    assert touched == [str(port)]
    combined = uf2.parse_uf2((proj / F.COMBINED_UF2).read_bytes())
    assert combined[0]["family"] == uf2.FAMILY_RP2350_ARM_S and combined[-1]["family"] == uf2.FAMILY_ABSOLUTE


def test_flash_reports_a_failing_command(projects, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(F, "find_pio", lambda: "/bin/false")
    _one_line_error(*_flash(capsys, [str(projects["esp32s3-n8r2"].project_dir), "--port", str(tmp_path)]),
                    "failed with exit code 1")
