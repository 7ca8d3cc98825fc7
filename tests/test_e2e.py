"""`flashlm convert` + `flashlm run --board native` over a real pty: what streams equals the reference."""
import csv
import zlib

import pytest

from converter.blob import read_blob, read_header
from converter.ir import Tokenizer
from converter.llama2c import write_llama2c
from converter.reference import FLAG_ALL_LOGITS, NO_TOKEN, generate
from converter.tokenizer import write_tokenizer_bin
from host.cli.main import main
from modelzoo import random_model


@pytest.fixture(scope="module")
def llama2c_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("l2c")
    _, ir = random_model(seed=9, vocab_size=64, tied=False, n_kv_heads=3)
    write_llama2c(ir, d / "model.bin", version=1)
    pieces = [b"<unk>", b"<s>", b"</s>"] + [bytes([97 + i % 26]) * (1 + i // 26) for i in range(61)]
    write_tokenizer_bin(Tokenizer(pieces, [float(-i) for i in range(64)], bos_id=1, eos_id=2), d / "tok.bin")
    return d


@pytest.mark.parametrize("fmt,temperature,top_p,seed,all_logits", [("q8", 0.0, 0.0, 0, True), ("q4", 0.9, 0.95, 77, True),
                                                                    ("q8", 0.0, 0.0, 0, False)])
@pytest.mark.native
@pytest.mark.slow
def test_cli_run_native_streams_the_reference_tokens(llama2c_files, tmp_path, capsys, fmt, temperature, top_p, seed,
                                                     all_logits):
    """Every step's logits CRC with --all-logits; the default mode's head rows and CRCs (prompt steps
    without the head, greedy steps pruned) otherwise."""
    out = tmp_path / "model"
    assert main(["convert", str(llama2c_files / "model.bin"), "--tokenizer", str(llama2c_files / "tok.bin"),
                 "-o", str(out), "--format", fmt, "--group-size", "16"]
                + (["--calibrate", "none"] if fmt == "q4" else [])) == 0     # q4's default trains for minutes
    prompt = [1, 10, 20, 30]
    rc = main(["run", "--board", "native", "--model", str(out), "--prompt-ids", ",".join(map(str, prompt)),
               "--max-tokens", "33", "--temperature", str(temperature), "--top-p", str(top_p),
               "--seed", str(seed), "--csv", str(tmp_path / "run.csv"), "--json", str(tmp_path / "run.json")]
              + (["--all-logits"] if all_logits else []))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    rows = list(csv.DictReader((tmp_path / "run.csv").open()))
    kv = read_header(out / "model.flmb").state_tiers.kv
    assert kv == "k12"                           # convert's default
    ref = generate(read_blob(out / "model.flmb"), prompt, 33, temperature, top_p, seed,
                   flags=FLAG_ALL_LOGITS if all_logits else 0, kv=kv)
    eos_stop = ref[-1]["out_id"] == 1      # a llama2.c import stops at BOS, as run.c
    assert len(rows) == len(ref) and (eos_stop or len(ref) == 36)
    for row, r in zip(rows, ref):
        assert int(row["in_id"]) == r["in_id"]
        assert (int(row["out_id"]) if row["out_id"] else NO_TOKEN) == r["out_id"]
        assert (int(row["logits_crc"]), int(row["head_rows"])) == (r["logits_crc"], r["head_rows"])
        if all_logits:
            assert r["logits_crc"] == zlib.crc32(r["logits"].tobytes())
        assert row["board"] == "native" and row["clock"] == "host clock"
    assert "Traceback" not in captured.err
