"""User errors through ``host.cli.main``: one ``flashlm: error:`` line on stderr, exit 2, no traceback."""
from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from host.boards import virtual
from host.commands import demo as demo_command, run as run_command
from host.model_dir import ModelDir
from host.cli.main import main
from host.errors import UserError


def _fails(capsys, argv, *needles, code=2):
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == code, (rc, out.out, out.err)
    assert "Traceback" not in out.err and "Traceback" not in out.out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flashlm: error: "), out.err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _model_dir(tmp_path, max_seq_len=8, vocab=32, tokenizer=None):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "manifest.json").write_text(json.dumps({
        "blob": "model.flmb", "tokenizer": tokenizer, "model_hash": "00" * 16, "layout_id": 1,
        "config": {"max_seq_len": max_seq_len, "vocab_size": vocab}}))
    return d


# -- argument parsing ---------------------------------------------------------------------------

def test_no_command(capsys):
    _fails(capsys, [], "choose a command")


def test_unknown_command(capsys):
    _fails(capsys, ["frobnicate"], "invalid choice")


def test_unknown_option(capsys, tmp_path):
    _fails(capsys, ["run", "--port", "x", "--model", str(tmp_path), "--bogus"], "unrecognized arguments: --bogus")


def test_run_needs_a_target(capsys, tmp_path):
    _fails(capsys, ["run", "--model", str(tmp_path), "--prompt-ids", "1"], "--board", "--port")


def test_bad_numbers(capsys, tmp_path):
    _fails(capsys, ["run", "--port", "x", "--model", str(tmp_path), "--max-tokens", "0"], "at least 1")
    _fails(capsys, ["run", "--port", "x", "--model", str(tmp_path), "--top-p", "1.5"], "[0, 1]")
    _fails(capsys, ["run", "--port", "x", "--model", str(tmp_path), "--temperature", "nan"], "number >= 0")


def test_help_is_not_an_error(capsys):
    assert main(["--help"]) == 0
    assert "convert" in capsys.readouterr().out


def test_board_options_list_the_boards_in_their_help(capsys):
    from converter.boards import board_names
    every = board_names()
    for command, boards in (("demo", ["native", "rp2040-emu"]), ("run", ["native", "rp2040-emu"]),
                            ("serve", ["native", "rp2040-emu"]), ("build", every), ("plan", every),
                            ("compare", every)):
        assert main([command, "--help"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        listed = out.split("--board")[-1]
        assert all(f" {b}," in listed or f" {b} " in listed for b in boards), (command, listed)
        assert ("pico" in listed) == (boards is every), (command, listed)


# -- convert ------------------------------------------------------------------------------------

def test_convert_missing_checkpoint(capsys, tmp_path):
    _fails(capsys, ["convert", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "o")], "nope.pt", "does not exist")


def test_convert_missing_tokenizer(capsys, tmp_path):
    ck = tmp_path / "m.bin"
    ck.write_bytes(b"\0" * 64)
    _fails(capsys, ["convert", str(ck), "--tokenizer", str(tmp_path / "t.json")], "t.json", "does not exist")


def test_convert_with_a_wrong_tokenizer_blames_the_tokenizer(capsys, tmp_path, monkeypatch):
    """The checkpoint itself given as --tokenizer (or a .json that is not a tokenizer): the error is the
    tokenizer's, not a corrupt checkpoint's."""
    from converter.llama2c import write_llama2c
    from modelzoo import random_model
    monkeypatch.chdir(tmp_path)
    write_llama2c(random_model(seed=1, vocab_size=64)[1], tmp_path / "m.bin", version=1)
    (tmp_path / "t.json").write_text("[1, 2]")
    for tok, why in (("m.bin", "neither a llama2.c tokenizer.bin nor a tokenizer.json"), ("t.json", "not a BPE")):
        line = _fails(capsys, ["convert", "m.bin", "--tokenizer", tok, "-o", "out"], f"tokenizer {tok}: ", why)
        assert "checkpoint" not in line


def test_convert_bad_quant_override(capsys, tmp_path):
    pytest.importorskip("converter.quantize")
    ck = tmp_path / "m.bin"
    ck.write_bytes(b"\0" * 64)
    _fails(capsys, ["convert", str(ck), "--quant", "layers.*.ffn=q3"], "--quant")
    _fails(capsys, ["convert", str(ck), "--group-size", "5000"], "group size 5000")


def test_convert_garbage_checkpoint(capsys, tmp_path):
    pytest.importorskip("converter.load")
    ck = tmp_path / "garbage.bin"
    ck.write_bytes(b"definitely not a model" * 10)
    _fails(capsys, ["convert", str(ck), "-o", str(tmp_path / "o"), "--no-report"], "garbage.bin")
    assert not (tmp_path / "o" / "manifest.json").exists()


# -- run: model directory and prompt ------------------------------------------------------------

def test_run_missing_model_dir(capsys, tmp_path):
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(tmp_path / "nope"), "--prompt-ids", "1"],
           "does not exist", "flashlm convert")


def test_run_dir_without_manifest(capsys, tmp_path):
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(tmp_path), "--prompt-ids", "1"], "no manifest.json")


def test_run_bad_manifest(capsys, tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(tmp_path), "--prompt-ids", "1"], "not valid JSON")
    (tmp_path / "manifest.json").write_text(json.dumps({"blob": "x"}))
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(tmp_path), "--prompt-ids", "1"], "lacks")


def test_run_prompt_too_long_refused_before_the_board(capsys, tmp_path):
    d = _model_dir(tmp_path, max_seq_len=4)
    # the port does not exist either: the prompt is refused first, before anything is opened
    _fails(capsys, ["run", "--port", "/dev/ttyNOPE", "--model", str(d), "--prompt-ids", "1,2,3,4,5,6"],
           "prompt is 6 tokens", "context is 4 tokens")


def test_run_prompt_too_long_text(capsys, tmp_path):
    pytest.importorskip("converter.tokenizer")
    import struct
    pieces = [b"<unk>", b"<s>", b"</s>"] + [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz "]
    tok = tmp_path / "model" / "tokenizer.bin"
    tok.parent.mkdir()
    tok.write_bytes(struct.pack("<i", 5) + b"".join(struct.pack("<fi", 0.0, len(p)) + p for p in pieces))
    d = _model_dir(tmp_path, max_seq_len=8, vocab=len(pieces), tokenizer="tokenizer.bin")
    line = _fails(capsys, ["run", "--port", "/dev/ttyNOPE", "--model", str(d), "--prompt", "a long prompt here"],
                  "tokens but the model's context is 8 tokens")
    assert "prompt is" in line


def test_run_bad_prompt_ids(capsys, tmp_path):
    d = _model_dir(tmp_path)
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(d), "--prompt-ids", "1,x"], "'x'")
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(d), "--prompt-ids", "1,99"], "99", "vocabulary of 32")
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(d), "--prompt-ids", ","], "empty")


def test_run_text_prompt_without_tokenizer(capsys, tmp_path):
    d = _model_dir(tmp_path)
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(d), "--prompt", "hi"], "--prompt-ids")


def test_run_no_prompt(capsys, tmp_path):
    d = _model_dir(tmp_path)
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(d)], "--prompt")


def test_run_port_errors(capsys, tmp_path):
    d = _model_dir(tmp_path)
    _fails(capsys, ["run", "--port", str(tmp_path / "ttyX"), "--model", str(d), "--prompt-ids", "1"],
           "serial port", "ttyX", "does not exist")
    _fails(capsys, ["run", "--port", str(d / "manifest.json"), "--model", str(d), "--prompt-ids", "1"],
           "not a serial port")
    _fails(capsys, ["run", "--port", "/dev/null", "--model", str(d), "--prompt-ids", "1"], "not a tty")


def test_run_real_board_needs_port(capsys, tmp_path):
    d = _model_dir(tmp_path)
    _fails(capsys, ["run", "--board", "esp32s3-n16r8", "--model", str(d), "--prompt-ids", "1"], "real board", "--port")


def test_run_unknown_board_says_unknown(capsys, tmp_path):
    """Not 'build --board foo': there is no board foo to build for."""
    d = _model_dir(tmp_path)
    line = _fails(capsys, ["run", "--board", "foo", "--model", str(d), "--prompt-ids", "1"], "unknown board 'foo'",
                  "esp32s3-n16r8")
    assert "build --board foo" not in line


def test_missing_emulator_is_refused_before_any_build(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(virtual, "emulator_missing", lambda board: "rp2040js is not installed: run 'make emu-deps'")
    monkeypatch.setattr(run_command, "ensure_firmware", lambda *a, **k: pytest.fail("built before checking"))
    d = _model_dir(tmp_path)
    for argv in (["run", "--board", "rp2040-emu", "--model", str(d), "--prompt-ids", "1"],
                 ["serve", "--board", "rp2040-emu", "--model", str(d)],
                 ["demo", "--board", "rp2040-emu", "-o", str(tmp_path / "demo")]):
        _fails(capsys, argv, "make emu-deps")
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("board,program", [("esp32c3-isa-qemu", "qemu-system-riscv32"),
                                           ("esp32s3-isa-qemu", "qemu-system-xtensa")])
def test_missing_qemu_names_what_to_install(capsys, tmp_path, monkeypatch, board, program):
    import shutil

    from host.boards import qemu
    which = shutil.which
    monkeypatch.setattr(qemu.shutil, "which", lambda p: None if p == program else which(p))
    monkeypatch.setattr(run_command, "ensure_firmware", lambda *a, **k: pytest.fail("built before checking"))
    d = _model_dir(tmp_path)
    _fails(capsys, ["run", "--board", board, "--model", str(d), "--prompt-ids", "1"], program,
           "apt-get install qemu-system-misc", "make emu-deps")


@pytest.mark.parametrize("board,tool,package", [("esp32c3-isa-qemu", "riscv64-unknown-elf-gcc", "gcc-riscv64-unknown-elf"),
                                                ("esp32s3-isa-qemu", "clang-22", "clang-22"),
                                                ("esp32s3-isa-qemu", "xtensa-lx106-elf-ld", "binutils-xtensa-lx106")])
def test_missing_cross_compiler_names_what_to_install(capsys, tmp_path, monkeypatch, board, tool, package):
    """`flashlm build --board` of a QEMU board on a machine without its compiler: one line."""
    import shutil

    from converter.blob import write_blob
    from converter.quantize import quantize
    from firmware import baremetal
    from modelzoo import random_model
    which = shutil.which
    monkeypatch.setattr(baremetal.shutil, "which", lambda p: None if p == tool else which(p))
    d = tmp_path / "model"
    d.mkdir()
    info = write_blob(quantize(random_model(3)[1], "q8", 32), d / "model.flmb")
    (d / "manifest.json").write_text(json.dumps({"blob": "model.flmb", "tokenizer": None,
                                                 "model_hash": bytes(info.model_hash).hex(),
                                                 "layout_id": info.layout_id,
                                                 "config": {"max_seq_len": 48, "vocab_size": 97}}))
    _fails(capsys, ["build", "--board", board, "--model", str(d), "-o", str(tmp_path / "fw")], tool, package)


def test_serve_defaults_to_the_native_board():
    from host.cli.main import build_parser
    assert build_parser().parse_args(["serve", "--model", "m"]).board == "native"


# -- outputs go where the user says, checked before any work ------------------------------------

def test_output_file_in_a_missing_folder_creates_nothing(capsys, tmp_path):
    d = _model_dir(tmp_path)
    for opt in ("--json", "--csv", "--png"):
        _fails(capsys, ["run", "--port", "/dev/null", "--model", str(d), "--prompt-ids", "1", opt,
                        str(tmp_path / "nope" / "x.out")], opt, "does not exist")
    _fails(capsys, ["plan", "shape:ple-28m", "--board", "pico", "--png", str(tmp_path / "nope" / "x.png")], "--png")
    assert not (tmp_path / "nope").exists()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_output_in_an_unwritable_folder_names_the_file(capsys, tmp_path):
    """/proc exists but takes no new files (the kernel answers ENOENT): the reason is said of the
    file, not as if the folder were missing."""
    line = _fails(capsys, ["eval", "model.pt", "--json", "/proc/x.json"], "/proc/x.json")
    assert ".tmp" not in line
    for argv, opt, path in ((["run", "--board", "native", "--model", "m", "--json"], "--json", "/proc/x.json"),
                            (["run", "--board", "native", "--model", "m", "--png"], "--png", "/proc/x.png"),
                            (["convert", "model.pt", "-o"], "-o/--output", "/proc/a/b")):
        line = _fails(capsys, argv + [path], opt, f"cannot write {path}: No such file or directory; "
                                                  f"/proc takes no new files")
        assert "folder /proc" not in line
    from host.files import atomic_write_bytes
    with pytest.raises(OSError) as e:
        atomic_write_bytes("/proc/y.json", b"{}")
    assert e.value.filename == "/proc/y.json"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_convert_to_an_unwritable_folder_fails_before_loading(capsys):
    model = Path(__file__).resolve().parent.parent / "models" / "default" / "model.pt"
    rc = main(["convert", str(model), "-o", "/proc/flashlm-out"])
    out = capsys.readouterr()
    assert rc == 2 and "-o/--output" in out.err and "loading" not in out.out and "quantizing" not in out.out


def test_plan_writes_no_png_unasked(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "shape:ple-28m", "--board", "esp32s3-n16r8"]) == 0
    assert "wrote" not in capsys.readouterr().out and list(tmp_path.iterdir()) == []


def test_a_train_folder_stands_for_its_checkpoint(capsys, tmp_path):
    """`flashlm plan models/default` (a train folder: model.pt, no manifest) plans its checkpoint, as
    convert does; a folder with neither is still a one-line error."""
    from host.model_dir import checkpoint_of
    root = Path(__file__).resolve().parent.parent
    assert checkpoint_of(root / "models" / "default") == root / "models" / "default" / "model.pt"
    assert checkpoint_of(tmp_path) == tmp_path
    assert main(["plan", str(root / "models" / "default"), "--board", "pico"]) == 0
    assert "predicted" in capsys.readouterr().out
    _fails(capsys, ["plan", str(tmp_path), "--board", "pico"], "manifest.json")


def test_piped_tables_are_printed_whole(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["plan", "shape:ple-28m", "--board", "esp32s3-n16r8"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and "ple.table" in out


def test_convert_a_torch_file_that_is_no_checkpoint(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"a": 1}, tmp_path / "dict.pt")
    line = _fails(capsys, ["convert", str(tmp_path / "dict.pt"), "-o", str(tmp_path / "o")], "dict.pt",
                  "flashlm train")
    assert "state_dict_to_ir" not in line


@pytest.mark.parametrize("name", ["some.zip", "model.pt"])
def test_convert_a_zip_archive_that_is_no_torch_file(capsys, tmp_path, name):
    """torch.load would say '[enforce fail at inline_container.cc:180] . file in archive is not in
    a subdirectory'; the user hears what the file is."""
    pytest.importorskip("torch")
    import zipfile
    with zipfile.ZipFile(tmp_path / name, "w") as z:
        z.writestr("notes.txt", "hello")
    line = _fails(capsys, ["convert", str(tmp_path / name), "-o", str(tmp_path / "o")],
                  f"not a llama2.c or flashlm checkpoint: {tmp_path / name}: a zip archive")
    assert "enforce" not in line and "inline_container" not in line


# -- run --board native: the virtual board's failure modes --------------------------------------

def _script(tmp_path, body: str) -> Path:
    p = tmp_path / "fw"
    p.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


@pytest.fixture
def native(monkeypatch, tmp_path):
    """Point `run --board native` at a given binary instead of building one."""
    d = _model_dir(tmp_path)
    (d / "model.flmb").write_bytes(b"FLMB")

    def use(binary):
        monkeypatch.setattr(run_command, "ensure_firmware", lambda console, model, board="native": binary)
        return ["run", "--board", "native", "--model", str(d), "--prompt-ids", "1", "--timeout", "1"]
    return use


def test_native_binary_missing(capsys, native, tmp_path):
    _fails(capsys, native(tmp_path / "nope"), "does not exist")


def test_native_binary_dies(capsys, native, tmp_path):
    fw = _script(tmp_path, """
        import sys
        print("blob: bad magic", file=sys.stderr)
        sys.exit(3)
    """)
    _fails(capsys, native(fw), "exited with code 3", "bad magic")


def test_native_binary_prints_nothing(capsys, native, tmp_path):
    fw = _script(tmp_path, """
        import time
        time.sleep(30)
    """)
    import time
    t0 = time.monotonic()
    _fails(capsys, native(fw), "printed nothing within 1 s")
    assert time.monotonic() - t0 < 5


def test_native_binary_prints_garbage(capsys, native, tmp_path):
    fw = _script(tmp_path, """
        print("hello world", flush=True)
        import time; time.sleep(30)
    """)
    _fails(capsys, native(fw), "'hello world'", "expected 'pty")


def test_native_binary_not_executable(capsys, native, tmp_path):
    f = tmp_path / "plain"
    f.write_text("")
    _fails(capsys, native(f), "not an executable")


# -- build / demo / train / Ctrl-C --------------------------------------------------------------

def test_build_unknown_board(capsys, tmp_path):
    pytest.importorskip("firmware.build")
    d = _model_dir(tmp_path)
    rc = main(["build", "--board", "no-such-board", "--model", str(d), "-o", str(tmp_path / "b")])
    out = capsys.readouterr()
    assert rc == 2 and "no-such-board" in out.err and "building" not in out.out   # nothing announced,
    assert not (tmp_path / "b").exists()                                          # nothing created


def test_build_without_model(capsys, tmp_path):
    _fails(capsys, ["build", "--board", "native", "-o", str(tmp_path / "b")], "--model")


def test_demo_without_default_model(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(demo_command, "DEFAULT_MODEL", tmp_path / "models" / "default" / "model.pt")
    _fails(capsys, ["demo", "-o", str(tmp_path / "demo")], "default model", "model.pt")


def test_eval_missing_and_damaged_inputs(capsys, tmp_path):
    _fails(capsys, ["eval", str(tmp_path / "nope")], "nope: no such file or directory")
    _fails(capsys, ["eval", str(tmp_path)], "no model.pt in this directory")
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint")
    _fails(capsys, ["eval", str(tmp_path)], "eval.txt: no such file", "--text")
    (tmp_path / "eval.txt").write_text("To be, or not to be\n")
    _fails(capsys, ["eval", str(tmp_path)], "model.pt: cannot load as a flashlm checkpoint")
    _fails(capsys, ["eval", str(tmp_path), "--targets", "x"], "not an integer")


def test_train_bad_option(capsys):
    rc = main(["train", "--preset", "no-such-preset"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "no-such-preset" in err


def test_ctrl_c_exits_130(capsys, monkeypatch, tmp_path):
    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(ModelDir, "open", boom)
    rc = main(["run", "--port", "/dev/null", "--model", str(tmp_path), "--prompt-ids", "1"])
    err = capsys.readouterr().err
    assert rc == 130 and "Traceback" not in err and "interrupted" in err


def test_debug_env_reraises(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHLM_DEBUG", "1")
    with pytest.raises(UserError):
        main(["run", "--port", "/dev/null", "--model", str(tmp_path / "nope"), "--prompt-ids", "1"])
    monkeypatch.delenv("FLASHLM_DEBUG")
    assert os.environ.get("FLASHLM_DEBUG") is None
