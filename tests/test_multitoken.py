"""The multi-token forward pass: T tokens through each layer together, each weight row read once for
all of them, every token's logits equal to the one-token pass's bit for bit — in the reference and in
the C engine (under ASan/UBSan here; over the protocol on the native and emulated boards below)."""
import struct
import subprocess

import numpy as np
import pytest

from converter.blob import build_blob, parse_header
from converter.quantize import quantize
from converter.reference import Reference
from modelzoo import random_model, random_ple_model

MODELS = {
    # name: (ir factory, format, group, overrides, scales, KV format)
    "q8-gqa": (lambda: random_model(seed=1)[1], "q8", 32, [], "f32", "f32"),
    "q4-untied-int8kv": (lambda: random_model(seed=2, tied=False, n_kv_heads=6, dim=48, hidden_dim=70)[1],
                         "q4", 16, ["output=q4:32"], "f32", "int8"),
    "ple-f16": (lambda: random_ple_model(seed=3, out_vocab=61, vocab_size=70), "q4", 16, ["ple.proj=q8:12"],
                "f16", "f32"),
    "ple-q8-mqa-int8kv": (lambda: random_ple_model(seed=4, n_kv_heads=1, ple_dim=8), "q8", 24, [], "f32", "int8"),
}


def model(name):
    make, fmt, g, ov, scales, kv = MODELS[name]
    return quantize(make(), fmt, g, ov, scales=scales), kv


def one_token_logits(qm, kv, ids):
    ref = Reference(qm, kv)
    return np.stack([ref.logits(ref.body(t, p)) for p, t in enumerate(ids)])


@pytest.mark.parametrize("name", MODELS)
def test_reference_multi_token_pass_equals_one_token_pass(name):
    qm, kv = model(name)
    ids = [int(i) for i in np.random.default_rng(5).integers(0, qm.config.vocab_size, 11)]
    want = one_token_logits(qm, kv, ids)
    for T in (2, 4, 11):
        ref = Reference(qm, kv)
        got = []
        for pos in range(0, len(ids), T):
            got += [ref.logits(x) for x in ref.body_many(ids[pos:pos + T], pos)]
        assert np.array_equal(np.stack(got).view(np.uint32), want.view(np.uint32)), f"T={T}"


def pass_bytes(qm, kv, ids_len, T):
    """Bytes the C engine reads over passes of up to T tokens at positions 0..ids_len-1 with every
    token's whole head (all in flash, the KV cache in SRAM): per pass each matrix and the head once
    (norms once per call), per token its embedding row, PLE table row and RoPE rows."""
    c = qm.config
    h = parse_header(build_blob(qm, kv=kv))
    by = {e.name: e for e in h.entries}
    head = by["tok_embeddings" if c.tied else "output"]
    gathered = ("tok_embeddings", "ple.table", "output")
    mats = sum(e.length for e in h.entries if e.fmt in ("q8", "q4") and e.name not in gathered)
    norms = 2 * c.n_layers * c.dim * 4 + c.n_layers * (c.ple_dim + c.dim) * 4 * bool(c.ple_dim) + c.dim * 4
    n_pass = -(-ids_len // T)
    per_token = by["tok_embeddings"].row_stride + (by["ple.table"].row_stride if c.ple_dim else 0) + c.head_dim * 4
    flash = n_pass * (mats + norms + c.n_out * head.row_stride) + ids_len * per_token
    row = c.head_dim * 4 if kv == "f32" else 4 + c.head_dim
    sram = sum(c.n_layers * c.n_heads * 2 * (p + 1) * row for p in range(ids_len))
    return flash, 0, sram


@pytest.mark.parametrize("name", MODELS)
def test_c_engine_multi_token_logits_equal_one_token_logits(name, blob_checker, tmp_path):
    qm, kv = model(name)
    blob = tmp_path / "m.flmb"
    blob.write_bytes(build_blob(qm, kv=kv))
    ids = [int(i) for i in np.random.default_rng(6).integers(0, qm.config.vocab_size, 13)]
    want = one_token_logits(qm, kv, ids)
    n_out = qm.config.n_out
    for T in (1, 3, 4, 8):
        out = subprocess.run([str(blob_checker), str(blob), "chunks", str(T)],
                             input=struct.pack(f"<I{len(ids)}I", len(ids), *ids), capture_output=True, check=True,
                             timeout=60).stdout
        got = np.frombuffer(out, np.float32, len(ids) * n_out).reshape(len(ids), n_out)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"T={T}"
        assert struct.unpack_from("<3I", out, len(ids) * n_out * 4) == pass_bytes(qm, kv, len(ids), T), f"T={T}"
