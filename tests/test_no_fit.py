"""A model and a board that do not go together as they are, the way a user meets it: ``build`` and
``run`` say what ``plan`` says (one planner, with the blob's own KV cache format and batch), the
convert or plan line they end with works when typed from the folder the user is in, and a build for a
real board says when the blob's layout was not planned for it."""
import re
import shlex

import pytest

from converter.llama2c import write_llama2c
from host.cli.main import main
from modelzoo import random_model


@pytest.fixture
def big(tmp_path, monkeypatch):
    """stories260K's shape (5 layers, 4 KV heads of 8, context 512) converted as a user would, from
    tmp_path with relative paths: its k12 KV cache alone is 328 KB, more than a Pico's SRAM budget."""
    monkeypatch.chdir(tmp_path)
    _, ir = random_model(seed=2, dim=64, n_layers=5, n_heads=8, n_kv_heads=4, hidden_dim=172, vocab_size=512,
                         max_seq_len=512)
    write_llama2c(ir, tmp_path / "ckpt.bin", version=1)
    assert main(["convert", "ckpt.bin", "-o", "out/m", "--no-report", "--head-index", "off"]) == 0
    return "out/m"


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("flashlm: error: "), err
    return err[0]


def _short(msg: str) -> str:
    return re.search(r"sram short by [\d.]+ KB", msg).group(0)


@pytest.mark.parametrize("board", ["pico", "rp2040-emu"])
def test_build_says_what_plan_says_and_names_the_convert_line(big, board, capsys):
    planned = _error(capsys, ["plan", big, "--board", board])
    built = _error(capsys, ["build", "--board", board, "--model", big])
    assert _short(built) == _short(planned)          # the blob's k12 KV cache and batch of 4, not f32 and 1
    assert "flashlm plan --ctx" not in built
    cmd = built.split("to convert it so: ")[1]
    ctx = int(re.search(r"a context of (\d+) tokens fits", built).group(1))
    assert shlex.split(cmd) == ["flashlm", "convert", "ckpt.bin", "-o", big, "--ctx", str(ctx), "--head-index", "off"]
    assert planned.endswith(cmd)


@pytest.mark.cross
@pytest.mark.slow
@pytest.mark.parametrize("board", ["pico", "rp2040-emu"])
def test_the_suggested_convert_line_builds_when_typed(big, board, capsys):
    cmd = _error(capsys, ["build", "--board", board, "--model", big]).split("to convert it so: ")[1]
    assert main(shlex.split(cmd)[1:]) == 0
    capsys.readouterr()
    assert main(["build", "--board", board, "--model", big]) == 0, capsys.readouterr().err


@pytest.mark.cross
def test_build_for_a_real_board_says_when_the_layout_was_not_planned_for_it(tmp_path, monkeypatch, capsys):
    """convert's layout reads every tensor from flash: a build for the ESP32-S3 says so with both
    predictions and the plan --apply line; once applied, it says nothing; another board's plan that does
    not fit the Pico's RAM names the command for this model folder."""
    monkeypatch.chdir(tmp_path)
    _, ir = random_model(seed=4, dim=128, n_layers=4, n_heads=4, n_kv_heads=1, hidden_dim=352, vocab_size=1024,
                         max_seq_len=128)      # the shipped model's shape: the S3 plan stages most of it in PSRAM
    write_llama2c(ir, tmp_path / "ckpt.bin", version=1)
    assert main(["convert", "ckpt.bin", "-o", "m", "--no-report", "--head-index", "off"]) == 0
    capsys.readouterr()
    assert main(["build", "--board", "esp32s3-n16r8", "--model", "m", "-o", "s3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "layout: the blob's own (convert's: every tensor read from flash), not planned for esp32s3-n16r8" in out
    assert re.search(r"predicted [\d.]+ tok/s as built, [\d.]+ tok/s placed for esp32s3-n16r8 "
                     r"\('flashlm plan m --board esp32s3-n16r8 --apply', then build again", out), out
    assert main(["plan", "m", "--board", "esp32s3-n16r8", "--apply"]) == 0
    capsys.readouterr()
    assert main(["build", "--board", "esp32s3-n16r8", "--model", "m", "-o", "s3"]) == 0
    assert "not planned for" not in capsys.readouterr().out
    err = _error(capsys, ["build", "--board", "pico", "--model", "m", "-o", "pico"])
    assert "does not fit pico's RAM" in err and err.endswith("'flashlm plan m --board pico --apply' places it within "
                                                             "the budgets")
