"""``flashlm pull`` and model names, the way a user meets them, with no network: huggingface_hub
pointed (``HF_ENDPOINT``) at a loopback hub serving the shared stories260K, a corrupted copy, an
unreachable endpoint, offline mode, and a repository the catalogue has no sha256 for (trusted on
first download, then held to it). Each command runs as a program from a folder of its own, with
relative paths."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hubserver import COMMIT, HubServer
from modelzoo import shared_model

ROOT = Path(__file__).resolve().parent.parent
SHARED = shared_model("stories260K")
TINYLLAMAS = "karpathy/tinyllamas"
needs_shared = pytest.mark.skipif(not (SHARED / "stories260K.bin").is_file(),
                                  reason=f"{SHARED} is absent (the shared stories260K, not in a user's clone)")


def flashlm(cwd: Path, home: Path, *args, endpoint: str | None = None, offline: bool = False):
    env = {**os.environ, "HF_HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "host.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def one_error(r) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("flashlm: ")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def stories(corrupt: bool = False) -> dict:
    ckpt = (SHARED / "stories260K.bin").read_bytes()
    if corrupt:
        ckpt = ckpt[:1000] + bytes([ckpt[1000] ^ 1]) + ckpt[1001:]
    return {TINYLLAMAS: {"stories260K/stories260K.bin": ckpt,
                         "stories260K/tok512.bin": (SHARED / "tok512.bin").read_bytes()}}


def cached(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "hub").rglob("*") if p.is_file() and "blobs" in p.parts)


@needs_shared
def test_pull_then_convert_by_name_offline(tmp_path):
    home, work = tmp_path / "hf", tmp_path / "work"
    work.mkdir()
    with HubServer(stories()) as hub:
        r = flashlm(work, home, "pull", "stories260K", endpoint=hub.url)
        assert r.returncode == 0, r.stderr
        assert "flashlm convert stories260K" in r.stdout
        assert sorted(hub.requests) == ["stories260K/stories260K.bin", "stories260K/tok512.bin"]
    # the cache holds both files under their sha256; from here on no network is needed
    assert cached(home) == ["037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312",
                            "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696"]
    r = flashlm(work, home, "convert", "stories260K", "-o", "out/s", "--no-report", offline=True)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((work / "out/s/manifest.json").read_text())
    assert manifest["config"]["vocab_size"] == 512 and manifest["tokenizer"] == "tokenizer.bin"
    assert manifest["convert"]["checkpoint"] == "stories260K"       # the line it suggests names the model
    r = flashlm(work, home, "plan", "stories260K", "--board", "esp32s3-n16r8", offline=True)
    assert r.returncode == 0, r.stderr


def test_a_path_that_exists_is_the_path_not_the_name(tmp_path, monkeypatch):
    from host.commands.pull import is_model_name
    monkeypatch.chdir(tmp_path)
    assert is_model_name("stories260K") and is_model_name("hf:a/b")
    (tmp_path / "stories260K").mkdir()
    assert not is_model_name("stories260K") and not is_model_name("out/x")


@needs_shared
def test_a_corrupted_download_is_deleted_and_said(tmp_path):
    home = tmp_path / "hf"
    with HubServer(stories(corrupt=True)) as hub:
        err = one_error(flashlm(tmp_path, home, "convert", "stories260K", "-o", "out/s", endpoint=hub.url))
    assert "stories260K/stories260K.bin" in err and "sha256" in err and "deleted" in err, err
    assert "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696" in err
    assert cached(home) == []            # the checkpoint comes first: nothing kept
    assert not (tmp_path / "out").exists()


def test_offline_without_the_file_is_one_line_naming_it(tmp_path):
    err = one_error(flashlm(tmp_path, tmp_path / "hf", "pull", "stories260K", offline=True))
    assert "karpathy/tinyllamas/stories260K/stories260K.bin" in err and "HF_HUB_OFFLINE" in err, err


@pytest.mark.slow
def test_an_unreachable_hub_is_one_line_naming_the_file_and_endpoint(tmp_path):
    # huggingface_hub retries a refused connection five times (about 23 s) before it gives up
    err = one_error(flashlm(tmp_path, tmp_path / "hf", "demo", "--model", "stories260K",
                            endpoint="http://127.0.0.1:9"))
    assert "stories260K/stories260K.bin" in err and "http://127.0.0.1:9 cannot be reached" in err, err


def test_unknown_names_are_one_line(tmp_path):
    err = one_error(flashlm(tmp_path, tmp_path / "hf", "pull", "stories1B", offline=True))
    assert "stories260K" in err and "hf:OWNER/NAME" in err
    err = one_error(flashlm(tmp_path, tmp_path / "hf", "convert", "hf:nothing", offline=True))
    assert "hf:OWNER/NAME" in err


def test_a_repository_without_pinned_hashes_is_trusted_once_then_held_to_it(tmp_path):
    home = tmp_path / "hf"
    repo = {"someone/tiny": {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"weights v1",
                             "README.md": b"not fetched"}}
    with HubServer(repo) as hub:
        r = flashlm(tmp_path, home, "pull", "hf:someone/tiny", endpoint=hub.url)
        assert r.returncode == 0, r.stderr
        assert sorted(hub.requests) == ["config.json", "model.safetensors"]
    pins = json.loads((home / "flashlm" / "pins.json").read_text())["files"]
    assert set(pins) == {f"someone/tiny@{COMMIT}/config.json", f"someone/tiny@{COMMIT}/model.safetensors"}
    # the same commit served with other bytes after the cache was cleared: refused, and deleted
    shutil.rmtree(home / "hub")
    repo["someone/tiny"]["model.safetensors"] = b"weights v2"
    with HubServer(repo) as hub:
        err = one_error(flashlm(tmp_path, home, "pull", f"hf:someone/tiny@{COMMIT}", endpoint=hub.url))
    assert "model.safetensors" in err and "recorded at first download" in err and "deleted" in err, err
