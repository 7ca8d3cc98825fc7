"""Fuzzing, short runs (``make fuzz`` runs the long ones, see tests/fuzz/):

* libFuzzer (clang, ASan + UBSan) on the firmware's own C: the frame receiver and command handling
  (tests/fuzz/fuzz_app.c) and the blob reader + engine (tests/fuzz/fuzz_blob.c) — every committed
  seed and regression input once, then a short seeded run of each;
* hypothesis on every file loader (tests/fuzz/loaders.py), under a memory cap, plus the inputs that
  once broke them (tests/fuzz/regressions/loaders/).
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "fuzz"))

import run as fuzzrun  # noqa: E402  (tests/fuzz/run.py)

from converter.blob import read_blob  # noqa: E402
from converter.formats import BlobError  # noqa: E402
from converter.ir import ModelError  # noqa: E402
from converter.tokenizer import load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def toolchain():
    try:
        fuzzrun.clang()
        for t in ("app", "blob"):
            fuzzrun.build(t)
    except fuzzrun.NoToolchain as e:
        pytest.skip(str(e))


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("target", fuzzrun.TARGETS)
def test_committed_fuzz_inputs_run_clean(toolchain, target):
    try:
        fuzzrun.build(target)
    except fuzzrun.NoToolchain as e:      # the 32-bit builds need i386 libraries
        pytest.skip(str(e))
    res = fuzzrun.replay(target)
    assert res["inputs"] >= 10
    assert res["returncode"] == 0 and res["sanitizer_reports"] == 0, res["log_tail"]


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("target,seconds", [("app", 4), ("blob", 2)])
def test_short_seeded_fuzz_run(toolchain, tmp_path, target, seconds):
    res = fuzzrun.fuzz(target, seconds, seed=1, work=tmp_path)
    assert res["crashes"] == 0 and res["sanitizer_reports"] == 0, res.get("log_tail")
    assert res["executions"] > 100 and res["coverage"] > 100


@pytest.mark.native
def test_firmware_refuses_nonfinite_sampling(toolchain):
    """Found by fuzz_app: a GENERATE with a NaN/inf temperature (or a denormal one, which made
    logits/T overflow) fed NaN to flm_expf's float-to-int conversion (undefined behaviour)."""
    exe = fuzzrun.build("app")
    stream = bytearray([1])
    for temp in (float("nan"), float("inf"), 2e-43):
        payload = struct.pack("<IffQIBBBBI", 3, temp, 0.5, 1, 0, 0, 0, 0, 0, 1) + struct.pack("<I", 1)
        stream += bytes([2, len(payload)]) + payload
    f = HERE.parent / "build" / "fuzz" / "nonfinite.bin"
    f.write_bytes(bytes(stream))
    env = dict(fuzzrun._env(), FLM_FUZZ_VERBOSE="1")
    r = subprocess.run([str(exe), "-runs=1", str(f)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("temperature must be a finite number") == 2   # nan and inf refused
    assert "type 0x83" in r.stderr                                      # the denormal one ran


# ---------------------------------------------------------------------------------------------
# loaders

@pytest.mark.slow
def test_loader_fuzz_short_run(tmp_path):
    out = tmp_path / "loaders.json"
    r = subprocess.run([sys.executable, str(HERE / "fuzz" / "loaders.py"), "--examples", "200", "--seed", "1",
                        "--mem-mb", "512", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads(out.read_text())
    assert res["examples"] == 200 and res["failures"] == 0
    assert all(k["examples"] > 0 for k in res["kinds"].values())


@pytest.mark.parametrize("path", sorted((HERE / "fuzz" / "regressions" / "loaders").iterdir()),
                         ids=lambda p: p.name)
def test_loader_regressions_give_one_line_errors(tmp_path, path):
    name = path.name.split("-", 2)[2]
    p = tmp_path / name
    p.write_bytes(path.read_bytes())
    with pytest.raises(ModelError) as e:
        (read_blob if name.endswith(".flmb") else load_tokenizer)(p)
    assert "\n" not in str(e.value) and name in str(e.value)


def test_blob_with_absurd_column_count_is_refused_at_once():
    """Found by the loader fuzz: a re-CRC'd blob whose entry claims 3e9 columns made the Python
    reader build a 800M-element list to check the row stride."""
    from converter.blob import build_blob
    from converter.quantize import quantize
    from loaders import _tiny_ir
    b = bytearray(build_blob(quantize(_tiny_ir(tied=True), "q8", 4)))
    n, table = struct.unpack_from("<II", b, 36)
    for i in range(n):
        e = table + 64 * i
        if b[e:e + 14] == b"tok_embeddings":
            struct.pack_into("<I", b, e + 40, 0xC2000000)
    struct.pack_into("<I", b, 12, zlib.crc32(memoryview(b)[16:]))
    with pytest.raises(BlobError, match="inconsistent quantized layout"):
        read_blob(bytes(b))


def test_read_blob_names_the_file(tmp_path):
    with pytest.raises(BlobError, match="no such file"):
        read_blob(tmp_path / "nope.flmb")
    with pytest.raises(BlobError, match="is a directory"):
        read_blob(tmp_path)
