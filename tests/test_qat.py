"""Quantization-aware training (converter/qat.py, ``flashlm convert --calibrate qat``): the fake quantizer
is the blob's, training lowers the distance to fp32, the result is an ordinary blob the engine runs
bit-exact, and a seed gives the same weights twice."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from converter import qat
from converter.blob import read_blob
from converter.fidelity import sample_text, teacher_forced
from converter.fidelity_recipes import bits_per_weight
from host.model_dir import ModelDir
from converter.ir import ModelError
from converter.numerics import quantize_activation
from converter.quantize import quantize, quantize_matrix
from converter.reference import FLAG_LOGITS, generate
from converter.llama2c import write_llama2c
from host.cli.main import main
from modelzoo import random_model
from nativeboard import assert_matches_reference, native_link, run


def test_a_grid_passes_gradients_to_the_weights_straight_through():
    w = torch.randn(4, 32, requires_grad=True)
    qat.LearnedGrid(w, "q4", 16)(w).sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


def test_activation_fake_quant_is_the_devices_whole_vector_quantization():
    x = np.random.default_rng(1).standard_normal((6, 72)).astype(np.float32)
    got = qat.act_fake_quant(torch.from_numpy(x), 127).numpy()
    for row, g in zip(x, got):
        codes, scale = quantize_activation(row, 72, 127)
        assert np.allclose(g, codes.reshape(-1)[:72] * scale[0], rtol=1e-6, atol=1e-7)
    assert not qat.act_fake_quant(torch.zeros(3, 8), 127).any()


def test_a_learned_grid_is_the_quantizer_with_that_grid_given_bit_for_bit():
    rng = np.random.default_rng(2)
    for shape, g, fmt in (((20, 70), 16, "q4"), ((33, 172), 32, "q4"), ((8, 64), 8, "q8"), ((5, 9), 4, "q4")):
        w = (rng.standard_normal(shape) * rng.uniform(1e-4, 3, (shape[0], 1))).astype(np.float32)
        w[0, :g] = 0                      # an all-zero group: multiplier 0, codes 0
        w[1] = 0                          # an all-zero row: row scale 0
        grid = qat.LearnedGrid(torch.from_numpy(w), fmt, g)
        assert np.array_equal(grid(torch.from_numpy(w)).detach().numpy(),
                              quantize_matrix(w, fmt, g, rowscale=True).dequantize()), (shape, g, fmt)
        with torch.no_grad():
            grid.log_k.add_(torch.from_numpy(rng.normal(0, 0.3, grid.log_k.shape)).float())
        mult = grid.multipliers().numpy().astype(np.uint8)
        assert (mult != grid.k0.numpy()).any() and mult[0, 0] == 0 and mult.max() <= 255
        got = quantize_matrix(w, fmt, g, rowscale=True, grid=(grid.row.float().numpy()[:, 0], mult))
        assert np.array_equal(got.mult, mult)
        assert np.array_equal(grid(torch.from_numpy(w)).detach().numpy(), got.dequantize()), (shape, g, fmt)


def test_a_learned_multiplier_gets_the_lsq_gradient():
    w = torch.tensor([[0.5, -1.0, 0.25, 2.0]])
    grid = qat.LearnedGrid(w, "q4", 4)
    with torch.no_grad():
        grid.log_k.fill_(-0.5)                              # below ceil: 2.0 clips
    grid(w).sum().backward()
    eff = float(grid.multipliers()[0, 0] * grid.row[0, 0])
    x = [float(v) / eff for v in w[0]]       # in range: d/d eff of round(x) eff is round(x) - x; clipped: +-7
    expect = sum(round(v) - v if abs(round(v)) <= 7 else 7.0 * np.sign(v) for v in x)
    k = float(grid.k0[0, 0] * np.exp(-0.5))                 # d k / d log_k = k, d eff / d k = row
    assert grid.log_k.grad[0, 0].item() == pytest.approx(expect * k * float(grid.row[0, 0]), rel=1e-5)


def test_quantize_refuses_a_grid_that_does_not_fit_in_one_line():
    w = np.ones((4, 32), np.float32)
    with pytest.raises(ModelError, match="a grid of 4 row scales and \\(4, 2\\) multipliers for a matrix of 4 rows of 1 groups"):
        quantize_matrix(w, "q4", 32, rowscale=True, grid=(np.ones(4), np.ones((4, 2), np.uint8)))
    with pytest.raises(ModelError, match="powers of two"):
        quantize_matrix(w, "q4", 32, rowscale=True, grid=(np.full(4, 0.3), np.ones((4, 1), np.uint8)))


def trained(ir, steps=60, positions=192, seed=qat.SEED, quant=(), **kw):
    """The QAT model of ``ir`` at q4 g32 (``quant``: the recipe's overrides) and its grids."""
    return qat.train(ir, quantize(ir, "q4", 32, quant), steps=steps, positions=positions, seed=seed, **kw)


def test_qat_lowers_kl_to_fp32_below_nearest_rounding():
    _, ir = random_model(seed=3, vocab_size=64)
    probe = sample_text(ir, 150, seed=0)
    plain = teacher_forced(quantize(ir, "q4", 32), "k12", probe)
    tir, grids = trained(ir)
    tuned = teacher_forced(quantize(tir, "q4", 32, grids=grids), "k12", probe)
    assert tuned["kl_mean"] < 0.8 * plain["kl_mean"], (plain, tuned)


def test_qat_is_deterministic_for_a_seed_and_changes_with_it():
    _, ir = random_model(seed=4, vocab_size=64)
    (a, ga), (b, gb), (c, _) = trained(ir, steps=5), trained(ir, steps=5), trained(ir, steps=5, seed=9)
    assert all(np.array_equal(a.tensors[n], b.tensors[n]) for n in ir.tensors)
    assert ga.keys() == gb.keys() and all(np.array_equal(ga[n][1], gb[n][1]) for n in ga)
    assert not np.array_equal(a.tensors["layers.0.ffn.w1"], c.tensors["layers.0.ffn.w1"])
    assert a.tokenizer is ir.tokenizer and a.config == ir.config


def test_qat_refuses_what_it_cannot_train_in_one_line():
    _, ir = random_model(seed=5, vocab_size=64)
    with pytest.raises(ModelError, match="trains against row scales; tok_embeddings has f32 scales"):
        qat.train(ir, quantize(ir, "q4", 32, scales="f32"), steps=1, positions=10)
    with pytest.raises(ModelError, match="grid"):
        quantize(ir, "q4", 32, scales="f32", grids={"layers.0.ffn.w1": (np.ones(1), np.ones((1, 1)))})
    with pytest.raises(ModelError, match="at least 1"):
        qat.train(ir, quantize(ir, "q4", 32), steps=0)


@pytest.mark.native
@pytest.mark.slow
def test_qat_model_runs_bit_exact_on_the_native_board(tmp_path):
    """QAT changes only the weights quantize() is given: the engine reproduces the reference."""
    _, ir = random_model(seed=6)
    tir, grids = trained(ir, steps=20, quant=["tok_embeddings=q4"])
    qm = quantize(tir, "q4", 32, ["tok_embeddings=q4"], grids=grids)
    with native_link(qm, tmp_path, tmp_path / "builds", kv="k12") as (link, _):
        ref = generate(qm, [1, 7, 3], 20, flags=FLAG_LOGITS, kv="k12")
        toks, logits, done = run(link, [1, 7, 3], 20)
        assert done.reason == "max_tokens"
        assert_matches_reference(toks, logits, ref)


def test_convert_calibrate_qat_records_it_writes_the_same_blob_twice_and_refuses_float_scales(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(qat, "STEPS", 3)
    monkeypatch.setattr(qat, "POSITIONS", 60)
    write_llama2c(random_model(seed=1, vocab_size=64)[1], tmp_path / "m.bin", version=1)
    args = ["convert", str(tmp_path / "m.bin"), "-o", str(tmp_path / "out"), "--format", "q4", "--calibrate", "qat"]
    assert main(args + ["--no-report"]) == 0
    out = capsys.readouterr().out
    assert "quantization-aware training" in out and "trained 3 steps on 60 positions" in out
    assert "fp32 sampled 60 of 60 positions of its own text" in out
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["convert"]["calibrate"] == "qat"
    args2 = [a if a != str(tmp_path / "out") else str(tmp_path / "again") for a in args]
    assert main(args2 + ["--no-report"]) == 0                # the same blob twice
    assert (tmp_path / "out" / "model.flmb").read_bytes() == (tmp_path / "again" / "model.flmb").read_bytes()
    plain = [a if a != "qat" else "none" for a in args2]
    assert main(plain + ["-o", str(tmp_path / "plain"), "--no-report"]) == 0
    assert (tmp_path / "out" / "model.flmb").read_bytes() != (tmp_path / "plain" / "model.flmb").read_bytes()
    assert main(args + ["--scales", "f32"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["flashlm: error: --calibrate qat trains against row scales, not --scales f32"], err


def test_convert_format_q4_trains_by_default_within_5_bits_and_none_skips_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(qat, "STEPS", 2)
    monkeypatch.setattr(qat, "POSITIONS", 40)
    _, ir = random_model(seed=2, vocab_size=64, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=128)   # no ragged group
    write_llama2c(ir, tmp_path / "m.bin", version=1)
    base = ["convert", str(tmp_path / "m.bin"), "--format", "q4", "--no-report"]
    assert main(base + ["-o", str(tmp_path / "auto")]) == 0
    assert "trained 2 steps on 40 positions" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert manifest["convert"]["calibrate"] == "auto" and manifest["convert"]["group_size"] == 16
    assert manifest["recipe"]["tok_embeddings"] == "q4:16" and manifest["recipe"]["layers.0.ffn.w1"] == "q4:16"
    assert "--group-size" not in ModelDir.open(tmp_path / "auto").convert_command()
    assert bits_per_weight(read_blob(tmp_path / "auto" / "model.flmb")) <= 5
    assert main(base + ["-o", str(tmp_path / "none"), "--calibrate", "none"]) == 0
    assert "quantization-aware training" not in capsys.readouterr().out
