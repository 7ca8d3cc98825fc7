"""GPTQ rounding (converter/gptq.py) and the calibration that feeds it (converter/calibrate.py): the
plain quantizer's scales and format, codes that lower the output error on the calibration inputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from converter import calibrate, gptq
from converter.llama2c import write_llama2c
from converter.quantize import quantize, quantize_matrix
from converter.reference import FLAG_LOGITS, generate
from host.cli.main import main
from host.model_dir import ModelDir
from modelzoo import random_model
from nativeboard import assert_matches_reference, native_link, run


def correlated_inputs(n: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, cols)) @ rng.standard_normal((cols, cols)) * 0.3
            + rng.standard_normal((n, 1))).astype(np.float32)


def test_uncorrelated_inputs_round_every_weight_to_its_nearest_code():
    w = np.random.default_rng(1).standard_normal((20, 70)).astype(np.float32)
    for rowscale in (False, True):
        plain = quantize_matrix(w, "q4", 32, rowscale=rowscale)
        same = quantize_matrix(w, "q4", 32, rowscale=rowscale, moments=np.eye(70) * 5.0)
        assert np.array_equal(plain.codes, same.codes)


def test_gptq_keeps_the_scales_and_lowers_the_output_error_on_its_inputs():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((24, 96)).astype(np.float32)
    x = correlated_inputs(400, 96)
    h = x.astype(np.float64).T @ x
    for fmt, rowscale in (("q4", True), ("q4", False), ("q8", True)):
        plain = quantize_matrix(w, fmt, 32, rowscale=rowscale)
        tuned = quantize_matrix(w, fmt, 32, rowscale=rowscale, moments=h)
        assert np.array_equal(plain.scales, tuned.scales) and not np.array_equal(plain.codes, tuned.codes)
        assert (plain.mult is None) == (tuned.mult is None) and (plain.mult is None or np.array_equal(plain.mult, tuned.mult))
        assert np.abs(tuned.codes).max() <= (7 if fmt == "q4" else 127)
        err = {k: np.linalg.norm(x @ (q.dequantize() - w).T) for k, q in (("plain", plain), ("gptq", tuned))}
        assert err["gptq"] < 0.9 * err["plain"], (fmt, rowscale, err)


def test_dead_columns_round_plainly():
    w = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    x = correlated_inputs(100, 32)
    x[:, 5] = 0
    q = quantize_matrix(w, "q8", 32, moments=x.astype(np.float64).T @ x)
    assert np.isfinite(q.dequantize()).all()


@pytest.mark.parametrize("tied", [True, False])
def test_moments_are_each_matrixs_inputs_and_a_tied_embedding_takes_the_heads(tied):
    _, ir = random_model(seed=4, tied=tied)
    m = calibrate.input_moments(ir, positions=20)
    c = ir.config
    assert m["layers.0.attn.wq"].shape == (c.dim, c.dim) and m["layers.1.ffn.w2"].shape == (c.hidden_dim,) * 2
    assert np.allclose(m["layers.0.attn.wq"], m["layers.0.attn.wv"])      # one input, three matrices
    assert ("tok_embeddings" in m) == tied and ("output" in m) == (not tied)   # an untied embedding is only looked up
    plain, tuned = quantize(ir, "q8", 32), quantize(ir, "q8", 32, moments=m)
    same = {n: np.array_equal(plain.tensors[n].codes, tuned.tensors[n].codes) for n in ("tok_embeddings", "layers.0.ffn.w1")}
    assert same == {"tok_embeddings": not tied, "layers.0.ffn.w1": False}
    assert gptq.inverse_factor(np.zeros((3, 3))).tolist() == np.eye(3).tolist()


def test_convert_rounds_q8_by_gptq_and_trains_q4_by_default():
    assert [calibrate.resolve("auto", f) for f in ("q8", "q4")] == ["gptq", "qat"]
    assert [calibrate.resolve(c, "q8") for c in ("none", "gptq")] == ["none", "gptq"]


@pytest.mark.native
@pytest.mark.slow
def test_gptq_model_runs_bit_exact_on_the_native_board(tmp_path):
    """Only the codes change: the engine reproduces the reference on a GPTQ model (q4 and q8, int8 KV)."""
    _, ir = random_model(seed=5)
    qm = quantize(ir, "q4", 32, ["layers.1=q8"], moments=calibrate.input_moments(ir, positions=30))
    with native_link(qm, tmp_path, tmp_path / "builds", kv="int8") as (link, _):
        ref = generate(qm, [1, 7, 3], 20, flags=FLAG_LOGITS, kv="int8")
        toks, logits, done = run(link, [1, 7, 3], 20)
        assert done.reason == "max_tokens"
        assert_matches_reference(toks, logits, ref)


def test_convert_calibrate_gptq_records_it_and_its_command(tmp_path, capsys):
    write_llama2c(random_model(seed=1, vocab_size=64)[1], tmp_path / "m.bin", version=1)
    assert main(["convert", str(tmp_path / "m.bin"), "-o", str(tmp_path / "out"), "--format", "q4",
                 "--calibrate", "gptq"]) == 0
    assert "GPTQ rounding" in capsys.readouterr().out
    md = ModelDir.open(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["convert"]["calibrate"] == "gptq"
    assert "--calibrate gptq" in md.convert_command()
    assert main(["convert", str(tmp_path / "m.bin"), "-o", str(tmp_path / "q8")]) == 0      # q8's default: auto
    assert "GPTQ rounding" in capsys.readouterr().out
    assert json.loads((tmp_path / "q8" / "manifest.json").read_text())["convert"]["calibrate"] == "auto"
    assert "--calibrate" not in ModelDir.open(tmp_path / "q8").convert_command()
