"""Importers: llama2.c v0/v1/v2, state dicts and flashlm checkpoints, tokenizer.bin and BPE JSON."""
import os
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from converter.ir import ModelConfig, ModelError, ModelIR, QTensor
from converter.llama2c import read_llama2c, write_llama2c, write_llama2c_v2
from converter.load import load_model
from converter.quantize import rope_tables
from converter.tokenizer import (decode, encode, from_hf_json, load_tokenizer, parse_tokenizer_bin,
                                 read_tokenizer_bin, tokenizer_bin_bytes, write_tokenizer_bin)
from converter.torch_import import ir_to_module, load_checkpoint, module_to_ir, save_checkpoint, state_dict_to_ir
from converter.torch_model import Transformer


def make_ir(tied=True, n_heads=4, n_kv_heads=2, dim=16, hidden=24, vocab=32, seq=8, layers=2, seed=0):
    cfg = ModelConfig(dim=dim, n_layers=layers, n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=vocab,
                      hidden_dim=hidden, max_seq_len=seq, tied=tied)
    rng = np.random.default_rng(seed)
    return ModelIR(cfg, {n: rng.standard_normal(s).astype(np.float32) for n, s in cfg.tensor_shapes().items()})


def assert_same(a: ModelIR, b: ModelIR):
    assert a.config == b.config
    assert list(a.tensors) == list(b.tensors)
    for name, t in a.tensors.items():
        u = b.tensors[name]
        if isinstance(t, QTensor):
            assert isinstance(u, QTensor) and (t.fmt, t.group_size) == (u.fmt, u.group_size), name
            assert np.array_equal(t.codes, u.codes) and np.array_equal(t.scales, u.scales), name
        else:
            assert isinstance(u, np.ndarray) and u.dtype == np.float32 and np.array_equal(t, u), name


def one_line_error(path, fn=load_model) -> str:
    with pytest.raises(ModelError) as ei:
        fn(path)
    msg = str(ei.value)
    assert "\n" not in msg and os.path.basename(str(path)) in msg, msg
    return msg


# ----------------------------------------------------------------------------- llama2.c round trips

@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_llama2c_round_trip_is_exact(tmp_path, version, tied, heads):
    ir = make_ir(tied, *heads)
    p = tmp_path / f"m{version}.bin"
    write_llama2c(ir, p, version)
    back = load_model(p)
    assert_same(ir, back)
    assert back.meta["version"] == version and back.source == str(p)
    if version == 0:
        cos, sin = rope_tables(ir.config)
        assert np.array_equal(back.rope_cos, cos) and np.array_equal(back.rope_sin, sin)
    else:
        assert back.rope_cos is None
    # and writing what was read gives the same bytes
    p2 = tmp_path / "again.bin"
    write_llama2c(back, p2, version)
    assert p.read_bytes() == p2.read_bytes()


def test_v0_layout_and_rope_tables_from_ir(tmp_path):
    ir = make_ir(tied=False, n_heads=2, n_kv_heads=1, dim=8, hidden=12, vocab=10, seq=4, layers=1)
    c = ir.config
    ir.rope_cos = np.arange(4 * 2, dtype=np.float32).reshape(4, 2)
    ir.rope_sin = -ir.rope_cos
    p = tmp_path / "v0.bin"
    write_llama2c(ir, p, 0)
    raw = p.read_bytes()
    assert struct.unpack_from("<7i", raw) == (8, 12, 1, 2, 1, -10, 4)       # negative vocab: untied
    f = np.frombuffer(raw, "<f4", offset=28)
    assert np.array_equal(f[:80], ir.tensors["tok_embeddings"].ravel())
    assert np.array_equal(f[-80:], ir.tensors["output"].ravel())            # wcls last
    back = read_llama2c(p)
    assert np.array_equal(back.rope_cos, ir.rope_cos) and np.array_equal(back.rope_sin, ir.rope_sin)
    assert len(raw) == 28 + 4 * (c.n_params() + 2 * 4 * 2)


def test_v1_header(tmp_path):
    ir = make_ir(tied=True)
    p = tmp_path / "v1.bin"
    write_llama2c(ir, p, 1)
    raw = p.read_bytes()
    assert raw[:4] == b"24ka" and struct.unpack_from("<I", raw)[0] == 0x616B3432
    assert struct.unpack_from("<i7iB", raw, 4) == (1, 16, 24, 2, 4, 2, 32, 8, 1)
    assert raw[37:256] == bytes(219)
    # norms come first
    f = np.frombuffer(raw, "<f4", offset=256)
    assert np.array_equal(f[:16], ir.tensors["layers.0.attn_norm"])
    assert np.array_equal(f[32:48], ir.tensors["layers.0.ffn_norm"])


def q8_reference(w: np.ndarray, gs: int):
    """llama2.c's quantize_q80 on the flattened tensor."""
    g = w.reshape(-1, gs)
    scale = (np.abs(g).max(axis=1) / np.float32(127)).astype(np.float32)
    codes = np.round(g / scale[:, None]).astype(np.int8)
    return codes.reshape(w.shape), scale.reshape(w.shape[0], -1)


@pytest.mark.parametrize("tied", [True, False])
def test_v2_imports_as_qtensor(tmp_path, tied):
    ir = make_ir(tied)
    p = tmp_path / "q.bin"
    write_llama2c_v2(ir, p, group_size=8)
    back = load_model(p)
    assert back.meta == {"format": "llama2c", "version": 2, "group_size": 8}
    for name, t in ir.tensors.items():
        u = back.tensors[name]
        if t.ndim == 1:
            assert np.array_equal(u, t)
            continue
        assert isinstance(u, QTensor) and u.fmt == "q8" and u.group_size == 8
        codes, scales = q8_reference(t, 8)
        assert np.array_equal(u.codes, codes) and np.array_equal(u.scales, scales), name
    raw = p.read_bytes()
    assert struct.unpack_from("<iB i", raw, 4)[0] == 2 and struct.unpack_from("<i", raw, 37)[0] == 8


def test_v2_codes_and_scales_are_not_requantized(tmp_path):
    """Arbitrary codes/scales (nothing a quantizer would produce) come back bit for bit."""
    ir = make_ir(tied=False)
    rng = np.random.default_rng(3)
    for name, t in list(ir.tensors.items()):
        if t.ndim == 2:
            r, c = t.shape
            ir.tensors[name] = QTensor("q8", rng.integers(-127, 128, (r, c)).astype(np.int8),
                                       rng.uniform(0.001, 5, (r, c // 4)).astype(np.float32), 4)
    p = tmp_path / "q.bin"
    write_llama2c_v2(ir, p, group_size=4)
    back = load_model(p)
    assert_same(ir, back)
    raw = p.read_bytes()
    # layout: header, f32 norms, then tok_embeddings codes immediately followed by its scales
    off = 256 + 4 * 16 * (2 * 2 + 1)
    emb = ir.tensors["tok_embeddings"]
    assert raw[off:off + 32 * 16] == emb.codes.tobytes()
    assert raw[off + 32 * 16:off + 32 * 16 + 4 * 32 * 4] == emb.scales.astype("<f4").tobytes()


def test_v2_group_size_must_divide_columns(tmp_path):
    ir = make_ir()
    p = tmp_path / "q.bin"
    write_llama2c_v2(ir, p, group_size=8)
    raw = bytearray(p.read_bytes())
    struct.pack_into("<i", raw, 37, 3)
    p.write_bytes(bytes(raw))
    assert "group_size 3" in one_line_error(p)
    struct.pack_into("<i", raw, 37, 0)
    p.write_bytes(bytes(raw))
    assert "group_size 0" in one_line_error(p)
    with pytest.raises(ModelError, match="group_size"):
        write_llama2c_v2(ir, tmp_path / "bad.bin", group_size=5)


# ----------------------------------------------------------------------------- refusing bad files

@pytest.fixture
def files(tmp_path):
    ir = make_ir(tied=False)
    out = {}
    for v in (0, 1, 2):
        p = tmp_path / f"model_v{v}.bin"
        write_llama2c(ir, p, v, group_size=8)
        out[v] = p
    return out


@pytest.mark.parametrize("version", [0, 1, 2])
def test_truncated_and_trailing_bytes(files, version):
    p = files[version]
    raw = p.read_bytes()
    p.write_bytes(raw[:-3])
    msg = one_line_error(p)
    assert f"truncated: expected {len(raw)} bytes, found {len(raw) - 3}" in msg
    p.write_bytes(raw + b"\0" * 5)
    assert "5 trailing bytes" in one_line_error(p)
    p.write_bytes(raw[:100])
    one_line_error(p)


def test_wrong_magic_unknown_version_and_bad_flag(files):
    p = files[1]
    raw = bytearray(p.read_bytes())
    bad = bytes(b"XXXX" + raw[4:])
    p.write_bytes(bad)
    assert "not a llama2.c or flashlm checkpoint" in one_line_error(p)
    raw2 = bytearray(raw)
    struct.pack_into("<i", raw2, 4, 3)
    p.write_bytes(bytes(raw2))
    assert "version 3" in one_line_error(p)
    raw3 = bytearray(raw)
    raw3[36] = 7
    p.write_bytes(bytes(raw3))
    assert "shared_classifier" in one_line_error(p)
    raw4 = bytearray(raw)
    struct.pack_into("<i", raw4, 8, -16)          # dim
    p.write_bytes(bytes(raw4))
    assert "dim" in one_line_error(p)


def test_garbage_empty_missing_directory(tmp_path):
    g = tmp_path / "garbage.bin"
    g.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    assert "not a llama2.c or flashlm checkpoint" in one_line_error(g)
    e = tmp_path / "empty.bin"
    e.write_bytes(b"")
    assert "empty" in one_line_error(e)
    one_line_error(tmp_path / "missing.bin")
    d = tmp_path / "adir.bin"
    d.mkdir()
    assert "directory" in one_line_error(d)
    z = tmp_path / "notreally.pt"
    z.write_bytes(b"PK\x03\x04" + bytes(100))
    one_line_error(z)
    t = tmp_path / "tiny.bin"
    t.write_bytes(b"24ka\x01")
    one_line_error(t)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_nan_weights_are_refused(files, version):
    p = files[version]
    raw = bytearray(p.read_bytes())
    struct.pack_into("<f", raw, len(raw) - 4, float("nan"))   # last element: output (or its scale)
    p.write_bytes(bytes(raw))
    msg = one_line_error(p)
    assert "NaN" in msg and "output" in msg


@pytest.fixture(scope="module")
def fuzz_seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    ir = make_ir(tied=False, dim=8, n_heads=2, n_kv_heads=1, hidden=8, vocab=6, seq=4, layers=1)
    seeds = {}
    for v in (0, 1, 2):
        p = d / f"seed{v}.bin"
        write_llama2c(ir, p, v, group_size=4)
        seeds[v] = p.read_bytes()
    return d, seeds


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=st.sampled_from([1, 1, 0, 2]), data=st.data())
def test_fuzzed_files_only_raise_model_error(fuzz_seeds, version, data):
    d, seeds = fuzz_seeds
    raw = bytearray(seeds[version])
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[:data.draw(st.integers(0, len(raw) - 1), label="length")]
    else:
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            i = data.draw(st.integers(0, len(raw) - 1), label="pos")
            raw[i] ^= data.draw(st.integers(1, 255), label="xor")
    p = d / "fuzzed.bin"
    p.write_bytes(bytes(raw))
    try:
        ir = load_model(p)
    except ModelError as e:
        assert "\n" not in str(e) and "fuzzed.bin" in str(e)
    else:
        ir.validate()


# ----------------------------------------------------------------------------- torch

@pytest.mark.parametrize("tied", [True, False])
def test_module_to_ir_matches_module_and_back(tied):
    cfg = ModelConfig(dim=16, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=20, hidden_dim=24,
                      max_seq_len=8, tied=tied)
    torch.manual_seed(0)
    m = Transformer(cfg)
    ir = module_to_ir(m)
    sd = m.state_dict()
    assert set(ir.tensors) == set(cfg.tensor_shapes())
    for name, t in ir.tensors.items():
        assert np.array_equal(t, sd[name + ".weight"].numpy())
    m2 = ir_to_module(ir)
    x = torch.randint(0, 20, (1, 6))
    with torch.no_grad():
        assert torch.equal(m(x), m2(x))


def test_state_dict_rejects_mismatches():
    cfg = ModelConfig(dim=8, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=10, hidden_dim=8, max_seq_len=4)
    sd = Transformer(cfg).state_dict()
    ir = state_dict_to_ir({"_orig_mod." + k: v for k, v in sd.items()}, cfg)   # torch.compile prefix
    assert set(ir.tensors) == set(cfg.tensor_shapes())
    bad = dict(sd)
    del bad["layers.0.ffn.w2.weight"]
    with pytest.raises(ModelError, match="missing layers.0.ffn.w2.weight"):
        state_dict_to_ir(bad, cfg)
    with pytest.raises(ModelError, match="unexpected output.weight.*tied"):
        state_dict_to_ir({**sd, "output.weight": torch.zeros(10, 8)}, cfg)
    with pytest.raises(ModelError, match=r"layers.0.attn.wk.weight: shape \(8, 8\), expected \(4, 8\)"):
        state_dict_to_ir({**sd, "layers.0.attn.wk.weight": torch.zeros(8, 8)}, cfg)
    with pytest.raises(ModelError, match="NaN"):
        state_dict_to_ir({**sd, "norm.weight": torch.full((8,), float("nan"))}, cfg)


@pytest.fixture(scope="module")
def bpe_json():
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers, trainers
    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|bos|>", "<|eos|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    docs = ["The quick brown fox jumps over the lazy dog.", "A small model runs on a small chip.",
            "Once upon a time there was a tiny transformer.", "the the the fox fox dog dog"] * 3
    hf.train_from_iterator(docs, trainer=trainer)
    return hf.to_str()


@pytest.mark.parametrize("tied", [True, False])
def test_checkpoint_round_trip(tmp_path, tied, bpe_json):
    n_vocab = from_hf_json(bpe_json).__len__()
    cfg = ModelConfig(dim=8, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=n_vocab, hidden_dim=8,
                      max_seq_len=4, tied=tied)
    torch.manual_seed(1)
    m = Transformer(cfg)
    p = tmp_path / "model.pt"
    save_checkpoint(p, m, tokenizer_json=bpe_json, train={"steps": 3, "loss": 1.5})
    for ir in (load_checkpoint(p), load_model(p)):
        assert_same(module_to_ir(m), ir)
        assert ir.meta["train"] == {"steps": 3, "loss": 1.5}
        assert ir.tokenizer is not None and ir.tokenizer.kind == "bpe"


def test_checkpoint_refusals(tmp_path):
    cfg = ModelConfig(dim=8, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=10, hidden_dim=8, max_seq_len=4)
    p = tmp_path / "other.pt"
    torch.save({"model": {}}, p)
    assert "not a model checkpoint flashlm reads" in one_line_error(p)
    m = Transformer(cfg)
    save_checkpoint(p, m)
    ck = torch.load(p, weights_only=True)
    ck["version"] = 9
    torch.save(ck, p)
    assert "version 9" in one_line_error(p)
    ck["version"] = 1
    ck["config"]["tied"] = False
    torch.save(ck, p)
    assert "tied" in one_line_error(p)
    ck["config"]["tied"] = True
    del ck["state_dict"]["norm.weight"]
    torch.save(ck, p)
    assert "norm.weight" in one_line_error(p)
    raw = (tmp_path / "other.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    one_line_error(tmp_path / "cut.pt")


# ----------------------------------------------------------------------------- tokenizers

def tiny_vocab() -> list[tuple[str | bytes, float]]:
    v: list[tuple[str | bytes, float]] = [("<unk>", 0.0), ("\n<s>\n", 0.0), ("\n</s>\n", 0.0)]
    v += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    v += [(" ", 0.0), ("a", 0.0), ("b", 0.0), ("c", 0.0),            # 259..262
          ("ab", -1.0), (" a", -2.0), (" ab", -0.5), ("abc", -3.0),  # 263..266
          ("bc", -1.0), ("é", -4.0), (" abc", -9.0)]                   # 267..269
    return v


def tiny_bin(vocab, max_len=None) -> bytes:
    """tokenizer.bin as llama2.c's export writes it: max_token_length is the longest piece."""
    enc = [(s.encode() if isinstance(s, str) else s, score) for s, score in vocab]
    out = [struct.pack("<i", max(len(b) for b, _ in enc) if max_len is None else max_len)]
    for b, score in enc:
        out.append(struct.pack("<fi", score, len(b)) + b)
    return b"".join(out)


def test_tokenizer_bin_round_trip(tmp_path):
    raw = tiny_bin(tiny_vocab())
    p = tmp_path / "tokenizer.bin"
    p.write_bytes(raw)
    tok = read_tokenizer_bin(p)
    assert len(tok) == 270 and tok.kind == "llama2c"
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.pieces[3 + 10] == b"\n" and tok.pieces[3 + 0xFF] == b"\xff"
    assert tok.pieces[263] == b"ab" and tok.scores[264] == -2.0
    assert tok.raw_pieces[13] == b"<0x0A>"
    assert tokenizer_bin_bytes(tok) == raw
    write_tokenizer_bin(tok, tmp_path / "again.bin")
    assert (tmp_path / "again.bin").read_bytes() == raw
    assert load_tokenizer(p).pieces == tok.pieces
    p.write_bytes(tiny_bin(tiny_vocab(), max_len=64))       # a roomier header is fine too
    assert read_tokenizer_bin(p).pieces == tok.pieces


def test_tokenizer_bin_refusals(tmp_path):
    raw = tiny_bin(tiny_vocab())
    p = tmp_path / "tok.bin"
    for cut in (0, 2, 10, len(raw) - 1):
        p.write_bytes(raw[:cut])
        one_line_error(p, load_tokenizer)
    bad = bytearray(raw)
    struct.pack_into("<i", bad, 0, 1)                        # max_token_length too small
    p.write_bytes(bytes(bad))
    assert "max_token_length" in one_line_error(p, load_tokenizer)
    bad = bytearray(raw)
    struct.pack_into("<i", bad, 8, 10 ** 6)                  # token 0 length beyond the file
    p.write_bytes(bytes(bad))
    assert "token 0" in one_line_error(p, load_tokenizer)


def test_llama2c_encode_hand_vocab():
    tok = parse_tokenizer_bin(tiny_bin(tiny_vocab()))
    # " ","a","b","c" -> " ","ab","c" (ab/bc tie: leftmost) -> " ab","c" -> " abc"
    assert encode(tok, "abc") == [1, 269]
    assert encode(tok, "cabc", bos=False) == [259, 262, 266]
    assert encode(tok, "bc a", bos=False) == [259, 267, 264]
    assert encode(tok, "a\n", bos=False) == [264, 3 + 10]  # byte fallback for "\n"
    assert encode(tok, "é") == [1, 259, 268]             # a whole code point in the vocab
    assert encode(tok, "ü", bos=False) == [259, 3 + 0xC3, 3 + 0xBC]
    assert encode(tok, "", bos=True) == [1]
    assert encode(tok, "abc", eos=True)[-1] == 2
    for text in ["abc", "bc a", "a\nb", "ü é  ab", " leading"]:
        assert decode(tok, encode(tok, text)) == text.encode()
    with pytest.raises(ModelError):
        decode(tok, [999])


def naive_merge(tok, text: str) -> list[int]:
    """llama2.c's loop, literally: rescan every pair each round."""
    spell = tok.raw_pieces
    vocab = {}
    for i, s in enumerate(spell):
        vocab.setdefault(s, i)
    ids = [vocab[b" "]]
    for ch in text:
        b = ch.encode()
        ids += [vocab[b]] if b in vocab else [3 + x for x in b]
    while True:
        best, at, bid = -1e10, -1, -1
        for i in range(len(ids) - 1):
            j = vocab.get(spell[ids[i]] + spell[ids[i + 1]])
            if j is not None and tok.scores[j] > best:
                best, at, bid = tok.scores[j], i, j
        if at < 0:
            return ids
        ids[at:at + 2] = [bid]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="abc é\n", max_size=24))
def test_llama2c_encode_matches_naive_merge(text):
    tok = parse_tokenizer_bin(tiny_bin(tiny_vocab()))
    if text:
        assert encode(tok, text, bos=False) == naive_merge(tok, text)
    assert decode(tok, encode(tok, text)) == text.encode()


def test_bpe_from_hf_json(bpe_json):
    from tokenizers import Tokenizer as HF
    tok = from_hf_json(bpe_json)
    hf = HF.from_str(bpe_json)
    assert tok.kind == "bpe" and len(tok) == hf.get_vocab_size()
    assert tok.bos_id == hf.token_to_id("<|bos|>") and tok.eos_id == hf.token_to_id("<|eos|>")
    assert tok.pieces[tok.bos_id] == b"<|bos|>"
    assert tok.pieces[hf.token_to_id("Ġ")] == b" " and tok.pieces[hf.token_to_id("Ċ")] == b"\n"
    for text in ["The quick brown fox", "the lazy dog.\n", "naïve café 日本語 🙂", ""]:
        ids = encode(tok, text)
        assert ids[0] == tok.bos_id
        assert decode(tok, ids) == text.encode()
        assert ids[1:] == hf.encode(text, add_special_tokens=False).ids
    # merge results score by rank: earlier merges score higher
    merged = [i for i in range(len(tok)) if len(tok.pieces[i]) > 1 and i not in (tok.bos_id, tok.eos_id)]
    assert merged and all(tok.scores[i] <= 0 for i in merged)
    with pytest.raises(ModelError):
        from_hf_json("{not json")
    with pytest.raises(ModelError):
        from_hf_json('{"model": {"type": "WordPiece", "vocab": {}}}')


def test_load_model_attaches_tokenizer(tmp_path, bpe_json):
    raw_vocab = tiny_vocab()
    tb = tmp_path / "tokenizer.bin"
    tb.write_bytes(tiny_bin(raw_vocab))
    ir = make_ir(vocab=len(raw_vocab))
    p = tmp_path / "m.bin"
    write_llama2c(ir, p, 1)
    got = load_model(p, tokenizer_path=tb)
    assert got.tokenizer is not None and got.tokenizer.bos_id == 1
    tj = tmp_path / "tokenizer.json"
    tj.write_text(bpe_json)
    with pytest.raises(ModelError) as ei:
        load_model(p, tokenizer_path=tj)
    msg = str(ei.value)
    assert "tokenizer.json" in msg and "vocab_size 270" in msg and "\n" not in msg
    n = len(from_hf_json(bpe_json))
    write_llama2c(make_ir(vocab=n), p, 0)
    assert load_model(p, tokenizer_path=tj).tokenizer.kind == "bpe"
