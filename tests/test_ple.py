"""Per-Layer Embeddings (PLE) below training: the config and recipe, the NumPy reference against
plain float math, blob v2 with fp16 scales, the C engine on the native board bit for bit (random
models and the shipped models/ple), the bytes a token reads, and layouts that try to move the PLE
table out of flash."""
import dataclasses
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from converter import costmodel as C
from converter import timing
from converter.blob import build_blob, parse_header, read_blob, retier_blob
from converter.boards import load_board
from converter.fidelity import Fp32Model
from converter.formats import BlobError, layout_id_of
from converter.ir import ModelConfig, ModelError
from converter.numerics import QMAX_12, quantize_activation
from converter.quantize import quantize, quantize_matrix
from converter.reference import FLAG_LOGITS, Reference, generate
from converter.tokenizer import encode
from host.link.messages import Error, Hello, Layout
from blobedit import entry, recrc
from modelzoo import random_ple_model
from nativeboard import assert_matches_reference, drain, expected_bytes_read, native_link, recv_until, run


SHIPPED_PLE = Path(__file__).resolve().parent.parent / "models" / "ple" / "model.pt"

CASES = {
    # name: (model config, default format, group size, overrides, scales) — dims and PLE widths
    # that are not multiples of the group size; heads tied and untied; out_vocab < vocab
    "q8-tied-out50": (dict(out_vocab=50), "q8", 16, [], "f32"),
    "q4-untied-f16": (dict(dim=40, n_heads=4, n_kv_heads=1, hidden_dim=52, ple_dim=20, n_layers=3, tied=False,
                           out_vocab=61), "q4", 16, ["ple.proj=q8:12"], "f16"),
    "q4-tied-f16-head-q4": (dict(dim=36, n_heads=2, n_kv_heads=2, hidden_dim=44, ple_dim=12, vocab_size=40,
                                 out_vocab=33), "q4", 24, ["head=q4"], "f16"),
}


def qmodel(case: str, seed: int = 0):
    cfg, fmt, g, ov, scales = CASES[case]
    return quantize(random_ple_model(seed=seed + len(case), **cfg), fmt, g, ov, scales=scales)


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ple-builds")


# ---------------------------------------------------------------------------------------------
# config, recipe

def test_config_shapes_order_and_param_split():
    c = ModelConfig(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=10, hidden_dim=12, max_seq_len=4,
                    tied=False, ple_dim=3, out_vocab=7)
    names = list(c.tensor_shapes())
    assert names[:4] == ["tok_embeddings", "ple.table", "ple.proj", "ple.norm"]
    assert names[4:16] == [f"layers.0.{n}" for n in ("attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo",
                                                     "ffn_norm", "ffn.w1", "ffn.w2", "ffn.w3",
                                                     "ple.gate", "ple.proj", "ple.norm")]
    s = c.tensor_shapes()
    assert s["ple.table"] == (10, 6) and s["ple.proj"] == (6, 8) and s["ple.norm"] == (3,)
    assert s["layers.1.ple.gate"] == (3, 8) and s["layers.1.ple.proj"] == (8, 3) and s["output"] == (7, 8)
    assert c.n_out == 7 and dataclasses.replace(c, out_vocab=0).n_out == 10
    assert c.param_split() == {"table": 60, "core": c.n_params() - 60}
    dense = dataclasses.replace(c, ple_dim=0)
    assert not any("ple" in n for n in dense.tensor_shapes()) and dense.param_split()["table"] == 0


@pytest.mark.parametrize("bad,msg", [(dict(out_vocab=11), "out_vocab 11 exceeds vocab_size 10"),
                                     (dict(ple_dim=-1), "ple_dim must be a non-negative integer"),
                                     (dict(ple_dim=70000), "implausibly large")])
def test_config_errors_are_one_line(bad, msg):
    c = ModelConfig(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=10, hidden_dim=12, max_seq_len=4, **bad)
    with pytest.raises(ModelError, match=msg) as e:
        c.validate()
    assert "\n" not in str(e.value)


def test_recipe_table_int4_head_alias_and_fp16_scales():
    ir = random_ple_model(seed=1, tied=False, out_vocab=40)
    qm = quantize(ir, "q8", 16)
    assert qm.recipe["ple.table"] == "q4:16" and qm.recipe["ple.proj"] == "q8:16"
    assert qm.recipe["layers.1.ple.gate"] == "q8:16" and qm.recipe["ple.norm"] == "f32"
    assert qm.recipe["layers.0.ple.norm"] == "f32" and qm.recipe["output"] == "q8:8"     # q8's head: group 8
    qm = quantize(ir, "q8", 16, ["head=q4:8", "ple.table=q8"])             # overrides still win
    assert qm.recipe["output"] == "q4:8" and qm.recipe["tok_embeddings"] == "q8:16"
    assert qm.recipe["ple.table"] == "q8:16"
    tied = quantize(random_ple_model(seed=1), "q8", 16, ["head=q4"])
    assert tied.recipe["tok_embeddings"] == "q4:8"          # an override without a group keeps the default one
    qm = quantize(ir, "q4", 16, scales="f16")
    assert qm.recipe["ple.table"] == "q4:16:f16" and qm.tensors["ple.table"].scale16
    with pytest.raises(ModelError, match="scales must be row, f32 or f16"):
        quantize(ir, "q4", 16, scales="f8")


def test_fp16_scales_are_rounded_before_the_codes():
    w = np.random.default_rng(3).standard_normal((5, 37)).astype(np.float32) * 3
    q = quantize_matrix(w, "q4", 8, scale16=True)
    assert np.array_equal(q.scales, q.scales.astype(np.float16).astype(np.float32))
    g = np.arange(37) // 8
    safe = np.where(q.scales > 0, q.scales, 1)[:, g]
    assert np.array_equal(q.codes, np.clip(np.rint(w / safe), -7, 7).astype(np.int8))
    with pytest.raises(ModelError, match="overflow fp16 scales") as e:
        quantize_matrix(np.full((1, 4), 1e6, np.float32), "q4", 4, scale16=True)
    assert "\n" not in str(e.value)


def test_llama2c_files_cannot_hold_ple(tmp_path):
    from converter.llama2c import write_llama2c
    for ir in (random_ple_model(seed=1), random_ple_model(seed=1, ple_dim=0, out_vocab=30)):
        with pytest.raises(ModelError, match="cannot hold Per-Layer Embeddings or an out_vocab"):
            write_llama2c(ir, tmp_path / "m.bin", 1)


# ---------------------------------------------------------------------------------------------
# the reference

@pytest.mark.parametrize("tied", [True, False])
def test_reference_tracks_fp32_model(tied):
    """The quantized forward (int8 activations, our exp, left folds) against plain float math on the
    same dequantized weights: within float tolerance, the same argmax almost always."""
    ir = random_ple_model(seed=4, tied=tied, out_vocab=55)
    qm = quantize(ir, "q8", 16)
    deq = dataclasses.replace(ir, tensors={n: (t.dequantize() if hasattr(t, "codes") else t)
                                           for n, t in qm.tensors.items()})
    ref, fp = Reference(qm), Fp32Model(deq, qm.rope_cos, qm.rope_sin)
    agree, errs, toks = 0, [], np.random.default_rng(0).integers(0, ir.config.vocab_size, 30)
    for pos, t in enumerate(toks):
        a, b = ref.forward(int(t), pos), fp.forward(int(t), pos)
        assert a.shape == b.shape == (55,)
        errs.append(np.abs(a - b).max() / np.abs(b).max())
        agree += int(np.argmax(a) == np.argmax(b))
    # int8 activations through 2 random layers cost a few percent (the dense path alone: ~3% mean;
    # one activation scale per input, as row-scaled matrices take, up to 16% at the worst step)
    assert max(errs) < 0.2 and np.mean(errs) < 0.05 and agree >= 27


def test_per_layer_inputs_follow_the_spec_in_float64():
    """u_l = (rmsnorm(ple.proj x / sqrt(d))[l] + T[t][l] sqrt(P)) / sqrt(2), against float64 math on
    the same weights and on the input ple.proj's product takes (the embedding row's 12-bit activation
    codes times their scales, as into any q8 product), so only float rounding remains."""
    ir = random_ple_model(seed=4, out_vocab=55)
    qm = quantize(ir, "q8", 16, scales="f32")
    c, P, ref = qm.config, qm.config.ple_dim, Reference(qm)
    w, tab = qm.tensors["ple.proj"].dequantize().astype(np.float64), qm.tensors["ple.table"].dequantize()
    emb, g = qm.tensors["tok_embeddings"].dequantize(), qm.tensors["ple.norm"].astype(np.float64)
    for t in range(c.vocab_size):
        codes, scales = quantize_activation(emb[t], qm.tensors["ple.proj"].group_size, QMAX_12)
        x = (codes * scales[:, None].astype(np.float64)).reshape(-1)[:c.dim]
        z = (w @ x / np.sqrt(c.dim)).reshape(c.n_layers, P)
        zn = z / np.sqrt(np.mean(z * z, axis=1, keepdims=True) + c.norm_eps) * g
        want = (zn + tab[t].reshape(c.n_layers, P).astype(np.float64) * np.sqrt(P)) / np.sqrt(2)
        got = ref.ple_inputs(t, emb[t])
        assert got.shape == (c.n_layers, P) and np.abs(got - want).max() < 1e-5 * np.abs(want).max(), t


def test_ple_path_matters():
    """Zeroing the table changes the logits (the PLE path is wired in, in both models)."""
    ir = random_ple_model(seed=5)
    qm = quantize(ir, "q8", 16)
    a = Reference(qm).forward(3, 0)
    ir.tensors["ple.table"] = np.zeros_like(ir.tensors["ple.table"])
    assert not np.allclose(a, Reference(quantize(ir, "q8", 16)).forward(3, 0), atol=1e-3)


# ---------------------------------------------------------------------------------------------
# blob v2

def test_blob_round_trip_with_ple_and_fp16_scales():
    for case in CASES:
        qm = qmodel(case)
        blob = build_blob(qm)
        back = read_blob(blob)
        assert dataclasses.replace(back.config, norm_eps=qm.config.norm_eps) == qm.config
        for name, t in qm.tensors.items():
            b = back.tensors[name]
            if hasattr(t, "codes"):
                assert (b.fmt, b.group_size, b.scale16) == (t.fmt, t.group_size, t.scale16), name
                assert np.array_equal(b.codes, t.codes) and np.array_equal(b.scales, t.scales), name
            else:
                assert np.array_equal(b, t)
        h = parse_header(blob)
        assert struct.unpack_from("<4I", blob, 96) == (qm.config.ple_dim, qm.config.n_out, 0, 0)
        for e in h.entries:
            assert e.offset % 64 == 0
            if e.scale16:     # the row's fp16 scales padded to 4, then each group's codes padded to 4
                ng = -(-e.cols // e.group_size)
                assert e.row_stride % 4 == 0 and e.row_stride >= ((2 * ng + 3) & ~3)


def test_blob_config_stores_the_effective_out_vocab():
    qm = quantize(random_ple_model(seed=2), "q8", 16)
    blob = build_blob(qm)
    assert struct.unpack_from("<I", blob, 100)[0] == qm.config.vocab_size      # never 0
    assert read_blob(blob).config.out_vocab == 0                               # read back as "same"


def test_blob_refuses_the_table_off_flash():
    qm = qmodel("q8-tied-out50")
    for f in (lambda: build_blob(qm, tiers={"ple.table": "sram"}),
              lambda: retier_blob(build_blob(qm), tiers={"ple.table": "psram"})):
        with pytest.raises(BlobError, match="ple.table cannot be placed in") as e:
            f()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("mutate,python,c", [
    (lambda b, e: None, None, "ok"),
    (lambda b, e: b.__setitem__(slice(e("layers.1.ple.gate"), e("layers.1.ple.gate") + 8), b"ple.xxxx"),
     "missing tensors", "image lacks a layer tensor: ple.gate"),
    (lambda b, e: struct.pack_into("<I", b, e("ple.norm") + 32, 0x100), "unknown format", "bad format: ple.norm"),
    (lambda b, e: struct.pack_into("<I", b, e("ple.proj") + 60, 4), "inconsistent quantized layout",
     "inconsistent quantized layout: ple.proj"),
    (lambda b, e: struct.pack_into("<I", b, 100, 0), "out_vocab 0", "bad model config"),
    (lambda b, e: struct.pack_into("<I", b, e("ple.table") + 40, 7), "inconsistent quantized layout",
     "wrong shape or format: ple.table"),
])
@pytest.mark.native
def test_ple_blob_checks_in_python_and_c(blob_checker, tmp_path, mutate, python, c):
    b = bytearray(build_blob(qmodel("q4-untied-f16")))
    mutate(b, lambda name: entry(bytes(b), name))
    blob = recrc(b)
    if python is None:
        read_blob(blob)
    else:
        with pytest.raises(BlobError, match=python):
            read_blob(blob)
    p = tmp_path / "m.flmb"
    p.write_bytes(blob)
    r = subprocess.run([str(blob_checker), str(p)], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr[-2000:]
    assert c in r.stdout


# ---------------------------------------------------------------------------------------------
# the engine on the native board

@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_engine_matches_reference_bit_for_bit(case, tmp_path, build_root):
    qm = qmodel(case)
    c = qm.config
    prompt = [1, c.vocab_size - 1, 3]                 # an input token the head never predicts
    with native_link(qm, tmp_path, build_root) as (link, boot):
        hello = boot[-1]
        assert (hello.vocab_size, hello.out_vocab) == (c.vocab_size, c.n_out)
        for temperature, top_p, seed in [(0.0, 0.0, 0), (0.9, 0.0, 11), (0.8, 0.9, 12345)]:
            ref = generate(qm, prompt, 34, temperature, top_p, seed, flags=FLAG_LOGITS)
            toks, logits, done = run(link, prompt, 34, temperature, top_p, seed)
            assert done.reason == "max_tokens" and done.generated == 34 and len(toks) == len(ref) == 36
            assert_matches_reference(toks, logits, ref)
            assert all(len(lg.values) == c.n_out for lg in logits)
            assert all(t.head_rows == c.n_out and (t.out_id is None or t.out_id < c.n_out) for t in toks)
            for t in toks:
                assert t.bytes_read == expected_bytes_read(qm, t.pos), t.step
        # the planner predicts the same bytes, step by step
        spec = C.ModelSpec.from_header(parse_header(build_blob(qm)))
        for t in toks:
            p = timing.predict(spec, load_board("native"), {}, dict.fromkeys(C.REGIONS, "sram"), t.pos, head="full")
            assert tuple(p.bytes_read[k] for k in C.TIERS) == t.bytes_read
    assert done.phase_us[3] == sum(t.us[3] for t in toks)     # the ple phase is timed


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.skipif(not SHIPPED_PLE.exists(), reason="models/ple not trained")
def test_shipped_ple_model_on_the_native_board(tmp_path, build_root):
    """The shipped PLE model as 'flashlm convert' makes it (q8 g32, the table int4): a text prompt,
    greedy and sampled, bit for bit against the reference."""
    from converter.load import load_model
    qm = quantize(load_model(str(SHIPPED_PLE)), "q8", 32)
    assert qm.recipe["ple.table"] == "q4:32"
    prompt = encode(qm.tokenizer, "KING.\n")                # <|bos|> first
    assert prompt[0] == qm.tokenizer.bos_id and len(prompt) >= 3
    with native_link(qm, tmp_path, build_root) as (link, boot):
        assert (boot[-1].vocab_size, boot[-1].out_vocab) == (qm.config.vocab_size, qm.config.n_out)
        for temperature, top_p, seed in [(0.0, 0.0, 0), (0.8, 0.9, 7)]:
            ref = generate(qm, prompt, 6, temperature, top_p, seed, flags=FLAG_LOGITS)
            toks, logits, done = run(link, prompt, 6, temperature, top_p, seed)
            assert done.generated == 6 and len(toks) == len(ref) == len(prompt) + 5
            assert_matches_reference(toks, logits, ref)
            assert all(t.bytes_read == expected_bytes_read(qm, t.pos) for t in toks)


def _stage_all_but(qm, keep: tuple[str, ...]) -> dict[str, str]:
    return {n: "sram" for n in list(qm.config.tensor_shapes()) + ["rope.cos", "rope.sin"] if n not in keep}


@pytest.mark.native
def test_flash_bytes_per_token_are_the_two_gathered_rows(tmp_path, build_root):
    """Everything but the embedding and the PLE table staged into SRAM (untied head): each step
    reads exactly one embedding row and one table row from flash."""
    qm = qmodel("q4-untied-f16")
    h = parse_header(build_blob(qm))
    by = {e.name: e for e in h.entries}
    row_bytes = by["tok_embeddings"].row_stride + by["ple.table"].row_stride
    tiers = _stage_all_but(qm, ("tok_embeddings", "ple.table"))
    blob = build_blob(qm, tiers=tiers)
    spec = C.ModelSpec.from_header(parse_header(blob))
    with native_link(qm, tmp_path, build_root, blob_bytes=blob) as (link, boot):
        assert boot[-1].layout_id == parse_header(blob).layout_id
        ref = generate(qm, [2, 5], 33, flags=FLAG_LOGITS)
        toks, logits, done = run(link, [2, 5], 33)
        assert_matches_reference(toks, logits, ref)
        # a LAYOUT that moves the table out of flash is refused; the placement stays
        codes = [{"flash": 0, "psram": 1, "sram": 2}[tiers.get(e.name, "flash")] for e in h.entries]
        i = [e.name for e in h.entries].index("ple.table")
        bad = bytes(codes[:i] + [2] + codes[i + 1:])
        link.send(Layout(layout_id_of(bad), 0, bad))
        err = recv_until(link, lambda m: isinstance(m, Error))[-1]
        assert err.name == "bad_layout" and "ple.table" in err.text and "flash only" in err.text
        drain(link)
        again, _, _ = run(link, [2, 5], 3)
    for t in toks + again:
        assert t.bytes_read[0] == row_bytes, t.step
        p = timing.predict(spec, load_board("native"), parse_header(blob).tiers, dict.fromkeys(C.REGIONS, "sram"),
                           t.pos, head="full")
        assert tuple(p.bytes_read[k] for k in C.TIERS) == t.bytes_read
    assert 40 < row_bytes < 200


@pytest.mark.native
def test_a_header_that_places_the_table_in_ram_is_read_from_flash(tmp_path, build_root):
    """Staging skips ple.table whatever the image header says (the writer never produces this): the
    engine counts its row as a flash read."""
    qm = qmodel("q8-tied-out50")
    b = bytearray(build_blob(qm))
    e = entry(bytes(b), "ple.table")
    struct.pack_into("<I", b, e + 48, 2)
    h = parse_header(bytes(b), check_crc=False)
    codes = [{"flash": 0, "psram": 1, "sram": 2}[x.tier] for x in h.entries]
    struct.pack_into("<I", b, 32, layout_id_of(codes))
    with native_link(qm, tmp_path, build_root, blob_bytes=recrc(b)) as (link, boot):
        toks, logits, _ = run(link, [4], 3)
    assert isinstance(boot[-1], Hello) and boot[-1].image_ok and boot[-1].layout_id == layout_id_of(codes)
    assert_matches_reference(toks, logits, generate(qm, [4], 3, flags=FLAG_LOGITS))
    assert all(t.bytes_read == expected_bytes_read(qm, t.pos) for t in toks)
