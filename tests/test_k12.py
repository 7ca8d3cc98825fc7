"""The k12 KV cache (docs/formats.md section 1.2) and the numerics version it came with: K rows of
12-bit codes with a query quantized to 12 bits, int8 V rows; convert's default; refused for heads
longer than 512 (the score sum's int32 bound); the rows' sizes as the engine carves them (the
engine's own against these: tests/test_speed.py's integer KV test; an image of the 8-bit numerics
refused in one line: tests/test_blob.py)."""
import json

import numpy as np
import pytest

from converter.blob import build_blob, parse_header, read_header, retier_blob
from converter.footprint import kv_position_bytes, kv_row_bytes, region_bytes
from converter.formats import KV_DEFAULT, KV_FORMATS, BlobError, StateTiers
from converter.costmodel import ModelSpec
from converter.ir import ModelConfig
from converter.numerics import QMAX_8, QMAX_12, attend_int, quantize_activation
from converter.planner import PlanError, plan
from converter.quantize import quantize
from converter.reference import FLAG_LOGITS, FLAG_SLIDE, Reference, generate
from converter.torch_import import save_checkpoint
from host import defaults
from host.cli.main import main
from modelzoo import random_model
from nativeboard import assert_matches_reference, native_link, run

F = np.float32


def test_host_defaults_name_the_converters_kv_formats():
    assert defaults.KV_FORMATS == KV_FORMATS and defaults.KV_DEFAULT == KV_DEFAULT == "k12"


def test_k12_codes_and_scores_by_hand():
    # a query and two keys of head_dim 4: the codes are round_half_away(x * 2047 / amax)
    q = np.array([1.0, -0.5, 0.25, 0.0], F)
    k = np.array([[2.0, 0.0, 0.0, 1.0], [0.0, 4.0, 0.0, 0.0]], F)
    qc, qs = quantize_activation(q, 4, QMAX_12)
    assert qc[0].tolist() == [2047, -1024, 512, 0] and qs[0] == F(1.0) / F(2047.0)
    kc = np.stack([quantize_activation(r, 4, QMAX_12)[0][0] for r in k])
    assert kc.tolist() == [[2047, 0, 0, 1024], [0, 2047, 0, 0]]
    assert (kc @ qc[0]).tolist() == [2047 * 2047, -1024 * 2047]      # the scores' integer sums
    # int8 for comparison: 8-bit codes of the same rows
    assert quantize_activation(q, 4, QMAX_8)[0][0].tolist() == [127, -64, 32, 0]


def test_k12_attention_of_one_dominant_key_is_its_v_row():
    # key 0 scores 2^15 log2 units above key 1 (p = [2^15, 0]): the output is V row 0, code * scale
    hd = 4
    q = np.array([8.0, 0.0, 0.0, 0.0], F)
    kc = np.array([[[2047, 0, 0, 0]], [[-2047, 0, 0, 0]]], np.int32)        # [T, n_kv, hd]
    ks = np.array([[F(8.0) / F(2047)], [F(8.0) / F(2047)]], F)
    vc = np.array([[[127, -3, 0, 64]], [[1, 1, 1, 1]]], np.int32)
    vs = np.array([[F(0.5)], [F(0.25)]], F)
    out = attend_int(q, kc, ks, vc, vs, 1, 1, hd, F(1.0) / np.sqrt(F(hd)), QMAX_12)
    assert out.tolist() == (vc[0, 0] * F(0.5)).astype(F).tolist()


def test_k12_score_sum_stays_an_int32_at_head_dim_512():
    hd = 512
    q = np.full(hd, 3.0, F)
    kc = np.full((1, 1, hd), QMAX_12, np.int32)
    qc = quantize_activation(q, hd, QMAX_12)[0][0]
    assert int(kc[0, 0] @ qc) == 2047 * 2047 * 512 < 2 ** 31
    out = attend_int(q, kc, np.ones((1, 1), F), np.ones((1, 1, hd), np.int32), np.ones((1, 1), F), 1, 1, hd,
                     F(1.0) / np.sqrt(F(hd)), QMAX_12)
    assert np.all(out == F(1.0))                 # one position: its V row


def test_k12_moves_less_than_int8_from_float_attention():
    _, ir = random_model(seed=11)
    qm = quantize(ir, "q8", 32)
    prompt = [3, 9, 4, 1, 7, 2, 8, 5]
    refs = {kv: Reference(qm, kv) for kv in ("f32", "int8", "k12")}
    err = {"int8": 0.0, "k12": 0.0}
    for pos, tok in enumerate(prompt):
        f = refs["f32"].forward(tok, pos)
        for kv in err:
            err[kv] += float(np.abs(refs[kv].forward(tok, pos) - f).sum())
    assert err["k12"] < err["int8"]
    assert refs["k12"].kc.dtype == np.int32 and np.abs(refs["k12"].kc).max() == QMAX_12
    assert np.abs(refs["k12"].vc).max() == QMAX_8 and np.abs(refs["int8"].kc).max() == QMAX_8


def test_kv_row_bytes():
    cfg = random_model(seed=1)[1].config                     # head_dim 12, 2 kv heads, 2 layers
    assert [kv_row_bytes(cfg, kv, p) for kv in ("f32", "int8", "k12") for p in "kv"] == [48, 48, 16, 16, 28, 16]
    assert kv_position_bytes(cfg, "k12") == 2 * 2 * (28 + 16)
    rows = cfg.n_layers * cfg.max_seq_len * cfg.n_kv_heads
    assert region_bytes(cfg, 32, "k12")["kv"] == rows * 28 + rows * 16


def wide_head_config():
    return ModelConfig(dim=1024, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=32, hidden_dim=64, max_seq_len=4)


def test_k12_is_refused_for_heads_longer_than_512_in_one_line():
    with pytest.raises(ValueError, match="^a k12 KV cache needs a head of at most 512 .flashlm convert --kv int8.$"):
        Reference(quantize(random_model(seed=2, dim=1024, n_heads=1, n_kv_heads=1, hidden_dim=64, n_layers=1,
                                        vocab_size=32, max_seq_len=4)[1], "q8", 32), "k12")
    with pytest.raises(PlanError, match="^a k12 KV cache needs a head of at most 512"):
        plan(ModelSpec.from_config(wide_head_config(), "q8", 32), "native", kv="k12")


def test_blob_writer_refuses_k12_for_a_long_head_and_keeps_int8():
    qm = quantize(random_model(seed=2, dim=1024, n_heads=1, n_kv_heads=1, hidden_dim=64, n_layers=1,
                               vocab_size=32, max_seq_len=4)[1], "q8", 32)
    with pytest.raises(BlobError, match="head of at most 512"):
        build_blob(qm, state=StateTiers(kv="k12"))
    blob = build_blob(qm, state=StateTiers(kv="int8"))
    assert parse_header(blob).state_tiers.kv == "int8"
    with pytest.raises(BlobError, match="head of at most 512"):
        retier_blob(blob, state=StateTiers(kv="k12"))


@pytest.mark.native
def test_native_k12_slides_its_window_bit_exact(tmp_path):
    # the window slides twice: every moved K row dequantized (int16 codes), rotated back, quantized again
    qm = quantize(random_model(seed=12, max_seq_len=9)[1], "q8", 24)
    prompt = [1, 5, 2]
    with native_link(qm, tmp_path, tmp_path / "builds", kv="k12") as (link, _):
        toks, logits, _ = run(link, prompt, 16, slide=True)
    assert_matches_reference(toks, logits, generate(qm, prompt, 16, flags=FLAG_SLIDE | FLAG_LOGITS, kv="k12"))
    assert any(t.pos < p.pos for p, t in zip(toks, toks[1:]))


@pytest.mark.slow
def test_convert_writes_k12_by_default(tmp_path):
    model, _ = random_model(seed=50, max_seq_len=16)
    save_checkpoint(tmp_path / "m.pt", model)
    out = tmp_path / "model"
    assert main(["convert", str(tmp_path / "m.pt"), "-o", str(out), "--no-report"]) == 0
    h = read_header(out / "model.flmb")
    assert h.version == 4 and h.state_tiers.kv == "k12"
    assert json.loads((out / "manifest.json").read_text())["kv"] == "k12"
