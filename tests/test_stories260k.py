"""stories260K, a real trained model (llama2.c's TinyStories 260K with its 512-piece tokenizer),
against outside facts: our fp32 forward pass writes the greedy text llama2.c's run.c is published to
write, and the default q8 model runs on the native board bit for bit as the reference computes it
(tokens and every step's logits CRC). Skipped where the shared copy is absent (a user's clone)."""
import csv
import os
import re

import numpy as np
import pytest

from converter.blob import read_blob, read_header
from converter.fidelity import Fp32Model
from converter.load import load_model
from converter.quantize import quantize
from converter.reference import FLAG_ALL_LOGITS, NO_TOKEN, generate
from converter.tokenizer import decode, encode, load_tokenizer
from host.cli.main import main
from emuboard import require_emulator
from hubserver import HubServer
from modelzoo import shared_model
from test_pull import flashlm, stories

SHARED = shared_model("stories260K")
pytestmark = pytest.mark.skipif(not (SHARED / "stories260K.bin").is_file(),
                                reason=f"{SHARED} is absent (the shared stories260K, not in a user's clone)")
# llama2.c's run.c, greedy (-t 0.0) from BOS: the text its README (../shared) gives
PUBLISHED = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, "
             "she saw a big, red ball. She wanted to play with it, but it was too high.")


@pytest.mark.slow
def test_fp32_reference_writes_the_published_greedy_text():
    ir = load_model(str(SHARED / "stories260K.bin"), tokenizer_path=str(SHARED / "tok512.bin"))
    qm = quantize(ir)                                   # for its RoPE tables only
    fp = Fp32Model(ir, qm.rope_cos, qm.rope_sin)
    tok, ids = ir.tokenizer, [ir.tokenizer.bos_id]
    for pos in range(200):
        ids.append(int(np.argmax(fp.forward(ids[-1], pos))))
    text = decode(tok, ids[1:]).decode("utf-8", "replace").strip()
    assert text.startswith(PUBLISHED), text[:300]


@pytest.mark.native
@pytest.mark.slow
def test_default_q8_runs_bit_exact_on_native(tmp_path, capsys, monkeypatch):
    """Converted and run the way a user types it: relative paths from the folder the user is in."""
    monkeypatch.chdir(tmp_path)
    ckpt, tok = os.path.relpath(SHARED / "stories260K.bin"), os.path.relpath(SHARED / "tok512.bin")
    assert main(["convert", ckpt, "--tokenizer", tok, "-o", "out/s260k", "--no-report"]) == 0
    prompt = "Once upon a time"
    assert main(["run", "--board", "native", "--model", "out/s260k", "--prompt", prompt, "--max-tokens", "60",
                 "--all-logits", "--csv", "run.csv"]) == 0, capsys.readouterr().err
    rows = list(csv.DictReader(open("run.csv")))
    blob = read_blob("out/s260k/model.flmb")
    kv = read_header("out/s260k/model.flmb").state_tiers.kv
    prompt_ids = encode(load_tokenizer(tok), prompt)
    ref = generate(blob, prompt_ids, 60, flags=FLAG_ALL_LOGITS, kv=kv)
    assert kv == "k12" and len(rows) == len(ref)
    for row, r in zip(rows, ref):
        assert int(row["in_id"]) == r["in_id"]
        assert (int(row["out_id"]) if row["out_id"] else NO_TOKEN) == r["out_id"]
        assert int(row["logits_crc"]) == r["logits_crc"]


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_demo_by_name_on_the_emulated_rp2040_fits_its_context(tmp_path):
    """``flashlm demo --model stories260K``: pulled once (from a loopback hub), then offline; its
    k12 KV cache for 512 positions does not fit the RP2040's SRAM beside convert's batch, so the demo
    converts the longest context the planner fits, and the board runs it bit-exact."""
    require_emulator()
    home = tmp_path / "hf"
    with HubServer(stories()) as hub:
        assert flashlm(tmp_path, home, "pull", "stories260K", endpoint=hub.url).returncode == 0
    r = flashlm(tmp_path, home, "demo", "--board", "rp2040-emu", "--model", "stories260K", "--max-tokens", "6",
                offline=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    ctx = int(re.search(r"context (\d+) of the model's 512 tokens: the longest that fits rp2040-emu's RAM", out)[1])
    assert 256 <= ctx < 512
    assert f"context {ctx}" in out and "bit-exact with the reference: yes" in out
    # with the SRAM full, the stack has little more than the link's 8 KB floor: the board's own measure
    # (a stack painted at reset) says the deepest prompt pass and decode step left some of it untouched
    peak, size = (int(x.replace(",", "")) for x in
                  re.search(r"stack: deepest ([\d,]+) B of the main stack's ([\d,]+) B since boot", out).groups())
    assert 8192 <= size < 12 * 1024 and 0 < peak < size
