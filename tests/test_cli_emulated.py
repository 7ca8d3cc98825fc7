"""The CLI on the emulated RP2040 the way users type it: ``flashlm`` started as a program, paths
relative to where it runs (the repo root, or another folder), Ctrl-C from the terminal (SIGINT to
the process group). The harness runs in host/emu, so a path it was given as typed pointed nowhere;
its byte counts are the core's loads, which lack the row padding the engine counts."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from converter.llama2c import write_llama2c
from emuboard import require_emulator
from host.cli.main import main
from modelzoo import random_model

ROOT = Path(__file__).resolve().parent.parent
FLASHLM = [sys.executable, "-m", "host.cli"]
pytestmark = [pytest.mark.native, pytest.mark.cross, pytest.mark.emulated, pytest.mark.slow]


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> Path:
    """A converted model whose rows are padded (48 columns in groups of 32: a row's two multipliers
    padded to 4 bytes), so the engine's byte counts exceed the core's loads."""
    require_emulator()
    d = tmp_path_factory.mktemp("cli-emu")
    _, ir = random_model(seed=3, dim=48, n_heads=4, n_kv_heads=2, hidden_dim=80, vocab_size=64)
    write_llama2c(ir, d / "model.bin", version=1)
    assert main(["convert", str(d / "model.bin"), "-o", str(d / "model"), "--no-report"]) == 0
    return d / "model"


def rel(path: Path, cwd: Path) -> str:
    return os.path.relpath(path, cwd)


def flashlm(args, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(FLASHLM + args, cwd=cwd, capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_run_with_a_relative_model_path_and_like_for_like_byte_counts(padded, where, tmp_path):
    cwd = ROOT if where == "root" else tmp_path
    r = flashlm(["run", "--board", "rp2040-emu", "--model", rel(padded, cwd), "--prompt-ids", "1,5,9,13,17",
                 "--max-tokens", "4", "--json", rel(tmp_path / "run.json", cwd)], cwd)
    assert r.returncode == 0, r.stderr
    assert "differ" not in r.stdout + r.stderr
    h = json.loads((tmp_path / "run.json").read_text())["summary"]["harness"]
    # the prompt's passes of 4 tokens copy whole rows (padding loaded), one-token passes do not
    assert h["steps"] == h["agree_steps"] == h["compared_steps"] == 5 and not h["mismatch_steps"]
    assert h["padding_per_token"]["flash"] > 0
    assert "less the row padding the engine counts" in r.stdout


def test_compare_run_with_a_relative_model_path(padded, tmp_path):
    r = flashlm(["compare", rel(padded, tmp_path), "--board", "rp2040-emu", "--layout", "flash", "--layout", "auto",
                 "--run", "--prompt-ids", "1,2", "--max-tokens", "2"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "bit-identical logits" in r.stdout


def test_demo_from_another_folder(tmp_path):
    require_emulator()
    r = flashlm(["demo", "--board", "rp2040-emu", "-o", "out/demo", "--max-tokens", "2"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out/demo/run.json").is_file()


def _ctrl_c(p: subprocess.Popen, times: int, gap: float) -> None:
    for _ in range(times):
        os.killpg(p.pid, signal.SIGINT)     # what a terminal sends: the whole foreground group
        time.sleep(gap)


def _until(p: subprocess.Popen, text: str) -> str:
    """stdout lines until one holds ``text`` (that line)."""
    for line in p.stdout:
        if text in line:
            return line
    raise AssertionError(f"the command ended before printing {text!r}: {p.stderr.read()}")


def test_run_stopped_with_ctrl_c_three_times_still_reports_writes_and_cleans_up(padded, tmp_path):
    tmp = tmp_path / "tmp"             # the harness's counts file goes here (TMPDIR)
    tmp.mkdir()
    p = subprocess.Popen(FLASHLM + ["run", "--board", "rp2040-emu", "--model", rel(padded, tmp_path),
                                    "--prompt-ids", "1,2", "--max-tokens", "100000", "--slide",
                                    "--json", "run.json"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=dict(os.environ, TMPDIR=str(tmp)))
    try:
        _until(p, "generating up to")
        time.sleep(2.0)
        _ctrl_c(p, 3, 0.3)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted: STOP sent, showing what arrived" in out and "Ctrl-C is ignored" in err
    d = json.loads((tmp_path / "run.json").read_text())
    assert d["interrupted"] and d["tokens"]
    assert list(tmp.iterdir()) == []


def test_serve_with_relative_paths_stopped_with_ctrl_c_twice_leaves_nothing_behind(padded, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.Popen(FLASHLM + ["serve", "--board", "rp2040-emu", "--model", rel(padded, tmp_path)],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=dict(os.environ, TMPDIR=str(tmp), COLUMNS="400"))
    try:
        port = _until(p, "serving on").split("serving on ")[1].split()[0]
        r = flashlm(["run", "--port", port, "--model", rel(padded, tmp_path), "--prompt-ids", "1,2",
                     "--max-tokens", "3"], tmp_path)
        assert r.returncode == 0, r.stderr
        assert [f.suffix for f in tmp.iterdir()] == [".jsonl"]     # the harness's counts while it serves
        _ctrl_c(p, 2, 0.2)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0
    assert list(tmp.iterdir()) == []
