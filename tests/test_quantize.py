"""Group-wise quantization and the per-tensor recipe."""
import numpy as np
import pytest

from converter.ir import ModelError, QTensor
from converter.quantize import parse_overrides, quantize, quantize_matrix
from modelzoo import random_model


@pytest.mark.parametrize("fmt,qmax", [("q8", 127), ("q4", 7)])
def test_matrix_quantization_is_symmetric_groupwise_with_ragged_last_group(fmt, qmax):
    w = np.random.default_rng(0).standard_normal((6, 45)).astype(np.float32)
    w[2, 32:] = 0.0                                     # an all-zero (ragged) group
    q = quantize_matrix(w, fmt, 16)
    assert q.codes.shape == (6, 45) and q.scales.shape == (6, 3)
    assert q.scales[2, 2] == 0 and not q.codes[2, 32:].any()
    for g, (a, b) in enumerate([(0, 16), (16, 32), (32, 45)]):
        amax = np.abs(w[:, a:b]).max(axis=1)
        np.testing.assert_array_equal(q.scales[:, g], (amax / np.float32(qmax)).astype(np.float32))
        assert (np.abs(q.codes[:, a:b]).max(axis=1)[amax > 0] == qmax).all()
    err = np.abs(q.dequantize() - w)
    g_of = np.arange(45) // 16
    assert (err <= q.scales[:, g_of] / 2 + 1e-7).all()


@pytest.mark.parametrize("fmt,qmax", [("q8", 127), ("q4", 7)])
def test_row_scaled_quantization_power_of_two_row_scale_integer_multipliers(fmt, qmax):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((7, 45)).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, (7, 1))
    w[2, 32:] = 0.0                                     # an all-zero (ragged) group: multiplier 0
    w[3] = 0.0                                          # an all-zero row: row scale 0
    w[4, :16] *= np.float32(1e-4)                       # a group far below the row's largest
    q = quantize_matrix(w, fmt, 16, rowscale=True)
    assert q.rowscale and q.scales.shape == (7, 1) and q.mult.shape == (7, 3) and q.mult.dtype == np.uint8
    S, k = q.scales[:, 0].astype(np.float64), q.mult.astype(np.float64)
    assert S[3] == 0 and not q.mult[3].any() and not q.codes[3].any() and q.mult[2, 2] == 0
    live = S > 0
    assert np.all(np.frexp(S[live])[0] == 0.5)        # powers of two
    amax = np.abs(w.astype(np.float64)).reshape(7, -1)
    ideal = np.stack([np.abs(w[:, a:b]).max(axis=1) for a, b in ((0, 16), (16, 32), (32, 45))], 1) / np.float32(qmax)
    # the largest multiplier is in (127, 255]: S is the smallest power of two that keeps it <= 255
    assert ((k.max(axis=1)[live] > 127) & (k.max(axis=1)[live] <= 255)).all()
    eff = k * S[:, None]
    assert (eff >= ideal.astype(np.float32)).all() and (eff - ideal < S[:, None] + 1e-30).all()
    assert np.abs(q.codes).max() <= qmax and amax.shape
    g_of = np.arange(45) // 16
    err = np.abs(q.exact64() - w)
    assert (err <= eff[:, g_of] / 2 + 1e-12).all()
    # the engine's dequantization: float(code * k) * S, one rounding
    assert np.array_equal(q.dequantize(), (q.codes.astype(np.int32) * q.mult[:, g_of]).astype(np.float32)
                          * q.scales[:, :1])


def test_row_scaled_group_size_limit():
    _, ir = random_model(seed=0)
    with pytest.raises(ModelError, match="1..512 for row scales"):
        quantize(ir, "q8", 1024)
    assert quantize(ir, "q8", 1024, scales="f32").recipe["layers.0.attn.wq"] == "q8:1024:f32"


def test_default_recipe_and_overrides():
    _, ir = random_model(seed=0, tied=False)
    qm = quantize(ir, "q4", 32)          # q4's embedding and head: q4 at group 16 at most
    assert qm.recipe["tok_embeddings"] == "q4:16" and qm.recipe["output"] == "q4:16"
    assert quantize(ir, "q4", 8).recipe["output"] == "q4:8"
    assert qm.recipe["layers.0.ffn.w1"] == "q4:32" and qm.recipe["norm"] == "f32"
    # q8's output layer (an untied head here) at group 8, the embedding at the default group; an override
    # without a group keeps the tensor's default one
    assert quantize(ir, "q8", 32).recipe["output"] == "q8:8" and quantize(ir, "q8", 4).recipe["output"] == "q8:4"
    qm = quantize(ir, "q8", 32, ["layers.*.ffn=q4:16", "layers.1.ffn.w2=q8", "output=q4"])
    assert qm.recipe["layers.0.ffn.w3"] == "q4:16" and qm.recipe["layers.1.ffn.w2"] == "q8:32"
    assert qm.recipe["layers.1.ffn.w1"] == "q4:16" and qm.recipe["output"] == "q4:8" and qm.recipe["tok_embeddings"] == "q8:32"
    assert qm.recipe["layers.0.attn.wq"] == "q8:32"
    assert isinstance(qm.tensors["layers.0.attn_norm"], np.ndarray)


@pytest.mark.parametrize("bad", ["ffn", "x=q3", "layers.*=q4:0", "layers.*=q4:abc", "nomatch.*=q4"])
def test_bad_overrides_are_clear_errors(bad):
    _, ir = random_model(seed=0)
    with pytest.raises(ModelError) as e:
        quantize(ir, "q8", 32, [bad])
    assert "\n" not in str(e.value)


def test_prequantized_tensors_pass_through_unchanged():
    _, ir = random_model(seed=0)
    pre = quantize_matrix(ir.tensors["layers.0.attn.wq"], "q8", 24)
    ir.tensors["layers.0.attn.wq"] = pre
    qm = quantize(ir, "q8", 32)
    assert qm.tensors["layers.0.attn.wq"] is pre and qm.recipe["layers.0.attn.wq"] == "q8:24:f32"
    assert isinstance(qm.tensors["layers.0.attn.wk"], QTensor)


def test_parse_overrides():
    o = parse_overrides(["a.*=q4:64", "b=q8"])
    assert (o[0].pattern, o[0].fmt, o[0].group_size) == ("a.*", "q4", 64) and o[1].group_size is None
    assert o[0].matches("a.x.y") and not o[1].matches("bb")
