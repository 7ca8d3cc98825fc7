"""Blob writer/reader round trip, and refusal of bad images by Python and by the firmware."""
import struct
import subprocess
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from converter.blob import build_blob, parse_header, read_blob
from converter.formats import BlobError, decode_qtensor, encode_qtensor
from converter.quantize import quantize, quantize_matrix
from host.link.messages import Error, Hello
from modelzoo import random_model
from nativeboard import drain, native_link, recv_until, run



@pytest.fixture(scope="module")
def small_qm():
    _, ir = random_model(seed=1, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=40, vocab_size=30,
                         max_seq_len=16, n_layers=1)
    return quantize(ir, "q4", 24, ["tok_embeddings=q8:20"])


def with_crc(b: bytes) -> bytes:
    b = bytearray(b)
    struct.pack_into("<I", b, 12, zlib.crc32(memoryview(b)[16:]))
    return bytes(b)


@pytest.mark.parametrize("fmt", ["q8", "q4"])
@pytest.mark.parametrize("shape,g", [((5, 37), 8), ((3, 64), 32), ((4, 9), 9), ((2, 7), 100)])
def test_qtensor_block_encoding_round_trips(fmt, shape, g):
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    q = quantize_matrix(w, fmt, g)
    assert np.abs(q.codes).max() <= (127 if fmt == "q8" else 7)
    back = decode_qtensor(encode_qtensor(q), fmt, *shape, g)
    assert np.array_equal(back.codes, q.codes) and np.array_equal(back.scales, q.scales)


@pytest.mark.parametrize("fmt", ["q8", "q4"])
@pytest.mark.parametrize("shape,g", [((5, 37), 8), ((3, 64), 32), ((4, 9), 9), ((2, 7), 100)])
def test_row_scaled_encoding_round_trips(fmt, shape, g):
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    q = quantize_matrix(w, fmt, g, rowscale=True)
    raw = encode_qtensor(q)
    ng = -(-shape[1] // g)
    code = (lambda n: n) if fmt == "q8" else (lambda n: (n + 1) // 2)
    stride = 4 + (ng + 3) // 4 * 4 + sum((code(min(g, shape[1] - s)) + 3) // 4 * 4 for s in range(0, shape[1], g))
    assert len(raw) == shape[0] * stride
    row = np.frombuffer(raw, np.uint8)[:stride]        # f32 row scale, u8 multipliers padded to 4, codes
    assert row[:4].view("<f4")[0] == q.scales[0, 0] and np.array_equal(row[4:4 + ng], q.mult[0])
    if fmt == "q4":                                     # offset by 8, element 2j in the low nibble
        c0 = int(row[4 + (ng + 3) // 4 * 4])
        assert (c0 & 15) - 8 == q.codes[0, 0] and (c0 >> 4) - 8 == q.codes[0, 1]
    back = decode_qtensor(raw, fmt, *shape, g, rowscale=True)
    assert np.array_equal(back.codes, q.codes) and np.array_equal(back.scales, q.scales)
    assert np.array_equal(back.mult, q.mult)


def test_blob_round_trip_is_exact(small_qm):
    back = read_blob(build_blob(small_qm))
    for name, t in small_qm.tensors.items():
        b = back.tensors[name]
        if hasattr(t, "codes"):
            assert (b.fmt, b.group_size, b.rowscale) == (t.fmt, t.group_size, t.rowscale)
            assert np.array_equal(b.codes, t.codes) and np.array_equal(b.scales, t.scales)
            assert t.mult is None or np.array_equal(b.mult, t.mult)
        else:
            assert np.array_equal(b, t)
    assert np.array_equal(back.rope_cos, small_qm.rope_cos)
    h = parse_header(build_blob(small_qm))
    assert all(e.offset % 64 == 0 for e in h.entries)


def test_model_hash_ignores_placement_but_not_weights(small_qm):
    a = parse_header(build_blob(small_qm))
    b = parse_header(build_blob(small_qm, tiers={"layers.0.ffn.w1": "sram"}))
    assert a.model_hash == b.model_hash and a.layout_id != b.layout_id
    small_qm.tensors["norm"] = small_qm.tensors["norm"] + np.float32(1)
    try:
        assert parse_header(build_blob(small_qm)).model_hash != a.model_hash
    finally:
        small_qm.tensors["norm"] = small_qm.tensors["norm"] - np.float32(1)


@pytest.mark.parametrize("mutate,message", [
    (lambda b: b[:50], "too short"),
    (lambda b: b[:-10], "truncated"),
    (lambda b: b"XXXX" + b[4:], "not a flashlm blob"),
    (lambda b: b[:4] + struct.pack("<I", 9) + b[8:], "made for numerics 9, this flashlm is 4: re-run flashlm convert"),
    # an image of the 8-bit activations' numerics (issue 22): refused in one line, not misread
    (lambda b: b[:4] + struct.pack("<I", 3) + b[8:], "^blob: made for numerics 3, this flashlm is 4: re-run flashlm convert$"),
    (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "CRC mismatch"),
])
def test_python_refuses_bad_blobs(small_qm, mutate, message):
    with pytest.raises(BlobError, match=message) as e:
        read_blob(mutate(build_blob(small_qm)))
    assert "\n" not in str(e.value)


@pytest.mark.native
@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_blobs_give_blob_errors_in_python_and_c(small_qm, blob_checker, tmp_path, data):
    """Structure fuzz: mutations re-CRC'd so they reach the table and section checks."""
    blob = bytearray(build_blob(small_qm))
    n = data.draw(st.integers(1, 6))
    for _ in range(n):
        i = data.draw(st.integers(16, min(len(blob) - 1, 112 + 64 * 40)))
        blob[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[:data.draw(st.integers(0, len(blob)))]
        struct.pack_into("<I", blob, 8, len(blob)) if len(blob) >= 12 else None
    mutated = with_crc(bytes(blob)) if len(blob) >= 16 else bytes(blob)
    try:
        read_blob(mutated)
    except BlobError as e:
        assert "\n" not in str(e)
    p = tmp_path / "m.flmb"
    p.write_bytes(mutated)
    r = subprocess.run([str(blob_checker), str(p)], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr[-2000:]      # ASan/UBSan abort on any memory error
    assert r.stdout.strip()


@pytest.mark.parametrize("mutate,cause", [
    (lambda b: b[:-5] + bytes([b[-5] ^ 0x40]) + b[-4:], "CRC mismatch"),
    (lambda b: b[:-64], "size mismatch"),
    (lambda b: b"ELF!" + b[4:], "bad magic"),
    (lambda b: with_crc(b[:4] + struct.pack("<I", 5) + b[8:]), "made for numerics 5, this firmware is 4: re-run flashlm convert"),
    (lambda b: with_crc(b[:4] + struct.pack("<I", 3) + b[8:]), "made for numerics 3, this firmware is 4: re-run flashlm convert"),
])
@pytest.mark.native
def test_firmware_refuses_bad_image_at_boot(small_qm, tmp_path_factory, tmp_path, mutate, cause):
    bad = mutate(build_blob(small_qm))
    with native_link(small_qm, tmp_path, tmp_path_factory.mktemp("b"), blob_bytes=bad) as (link, boot):
        hello = next(m for m in boot if isinstance(m, Hello))
        assert not hello.image_ok
        err = recv_until(link, lambda m: isinstance(m, Error))[-1]
        assert err.name == "bad_image" and cause in err.text
        drain(link)
        _, _, done = run(link, [1], 3)
        assert isinstance(done, Error) and done.name == "no_model"


@pytest.mark.native
def test_firmware_refuses_bad_requests(small_qm, tmp_path_factory, tmp_path):
    c = small_qm.config
    with native_link(small_qm, tmp_path, tmp_path_factory.mktemp("b")) as (link, boot):
        assert next(m for m in boot if isinstance(m, Hello)).image_ok
        _, _, err = run(link, [1] * (c.max_seq_len + 1), 3)
        assert err.name == "prompt_too_long" and f"{c.max_seq_len + 1} tokens" in err.text
        _, _, err = run(link, [1, c.vocab_size], 3)
        assert err.name == "bad_token"
        toks, _, done = run(link, [1], 2)        # still serving afterwards
        assert done.generated == 2 and len(toks) == 2
