"""The NumPy reference: fp32 path vs PyTorch, quantized path vs fp32, sampling determinism."""
import numpy as np
import pytest
import torch

from converter.fidelity import Fp32Model, quality_report
from converter.numerics import QMAX_8, QMAX_12, PackedMatrix, fold, quantize_activation
from converter.quantize import quantize, rope_tables
from converter.reference import Reference
from converter.sampling import Rng, sample
from modelzoo import random_model


@pytest.mark.parametrize("cfg", [dict(), dict(tied=False, n_kv_heads=6), dict(n_kv_heads=1, n_layers=3)])
def test_fp32_numpy_matches_pytorch(cfg):
    model, ir = random_model(seed=2, **cfg)
    cos, sin = rope_tables(ir.config)
    toks = np.random.default_rng(0).integers(0, ir.config.vocab_size, 24)
    with torch.no_grad():
        want = model(torch.tensor(toks)[None])[0].numpy()
    fp = Fp32Model(ir, cos, sin)
    got = np.stack([fp.forward(int(t), p) for p, t in enumerate(toks)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_rope_tables_match_pytorch_model():
    model, ir = random_model(seed=0)
    cos, sin = rope_tables(ir.config)
    assert np.array_equal(cos, model.rope_cos.numpy()) and np.array_equal(sin, model.rope_sin.numpy())


def test_quantized_reference_tracks_fp32():
    _, ir = random_model(seed=4)
    for fmt, top1 in (("q8", 0.95), ("q4", 0.6)):
        r = quality_report(ir, quantize(ir, fmt, 32), positions=40)
        assert r["top1_agreement"] >= top1, (fmt, r["top1_agreement"])
        assert r["positions"] == 40 and all(t["rel_rmse"] < (0.01 if fmt == "q8" else 0.2) for t in r["tensors"]
                                            if t["format"] == fmt)


def test_fold_is_a_left_fold():
    a = np.array([1e8, 1.0, -1e8, 1.0], np.float32)
    assert fold(a) == np.float32(np.float32(np.float32(a[0] + a[1]) + a[2]) + a[3])
    assert fold(np.array([-0.0], np.float32)).tobytes() == np.float32(-0.0).tobytes()


def test_activation_quantization_rounds_half_away_and_handles_zero_groups():
    x = np.array([127.0, 63.5, -63.5, 0.4, 0.0, 0.0, 0.0, 0.0, 1.0], np.float32)
    codes, scales = quantize_activation(x, 4, QMAX_8)
    assert codes[0].tolist() == [127, 64, -64, 0]
    assert codes[1].tolist() == [0, 0, 0, 0] and scales[1] == 0
    assert codes[2].tolist() == [127, 0, 0, 0]           # ragged last group, zero padded
    assert scales.dtype == np.float32


def test_q8_products_take_12_bit_activation_codes_and_q4_8_bit():
    # docs/formats.md 1.1: scale = amax / 2047, code = round_half_away(x * (2047 / amax)), clamped
    x = np.array([2047.0, 1023.5, -1023.5, 0.4, -2047.0, 1.0, 0.5, -0.5], np.float32)
    codes, scales = quantize_activation(x, 8, QMAX_12)
    assert codes[0].tolist() == [2047, 1024, -1024, 0, -2047, 1, 1, -1] and scales[0] == np.float32(1.0)
    y = np.array([3.0, -1.5, 0.001, 2.9999], np.float32)     # amax 3: inv = 2047/3 in binary32
    inv = np.float32(2047.0) / np.float32(3.0)
    want = [int(np.trunc(v * inv + np.float32(0.5) * np.sign(v))) for v in y]
    assert quantize_activation(y, 4, QMAX_12)[0][0].tolist() == want == [2047, -1024, 1, 2047]
    assert quantize_activation(y, 4, QMAX_12)[1][0] == np.float32(3.0) / np.float32(2047.0)
    rng = np.random.default_rng(3)
    _, ir = random_model(seed=3)
    for fmt, qmax in (("q8", QMAX_12), ("q4", QMAX_8)):
        m = PackedMatrix(quantize(ir, fmt, 16).tensors["layers.0.attn.wq"])
        assert m.act_qmax == qmax
        xq, _ = m.quantize_input(rng.standard_normal(m.cols).astype(np.float32) * 9)
        assert np.abs(xq).max() == qmax


def test_sampler_is_deterministic_and_greedy_takes_first_max():
    logits = np.array([0.5, 2.0, 2.0, -1.0], np.float32)
    assert sample(logits, 0.0, 0.0, Rng(0)) == 1
    rng = np.random.default_rng(0).standard_normal(500).astype(np.float32)
    a = [sample(rng, 1.0, 0.9, r) for r in [Rng(7)] for _ in range(20)]
    b = [sample(rng, 1.0, 0.9, r) for r in [Rng(7)] for _ in range(20)]
    assert a == b and len(set(a)) > 3
    assert Rng(0).next_u32() == Rng(0).next_u32() != Rng(1).next_u32()


def test_reference_forward_is_repeatable():
    _, ir = random_model(seed=6)
    qm = quantize(ir, "q4", 16)
    a, b = Reference(qm), Reference(qm)
    for pos, tok in enumerate([3, 1, 4, 1, 5]):
        assert np.array_equal(a.forward(tok, pos), b.forward(tok, pos))
