"""The greedy head's tile index (converter/headprune.py, docs/formats.md section 3): every tile's
bound is at least each of its rows' computed logits, so the scan returns the full scan's first
maximum — in the reference on many random heads and inputs, and in the C engine bit for bit with
the same rows visited; the convert-time calibration keeps an index only where it pays; a blob whose
index is unsound is refused."""
import struct
import subprocess
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converter import headcalib
from converter import headprune as hp
from converter.blob import build_blob, read_blob
from converter.formats import BlobError
from converter.quantize import quantize, quantize_matrix
from converter.numerics import PackedMatrix
from converter.reference import Reference
from modelzoo import random_model, random_ple_model, spread_head, with_head_index

F = np.float32


# ---------------------------------------------------------------------------------------------
# the index

def test_index_structure_and_section_round_trip():
    w = np.random.default_rng(1).standard_normal((40, 37)).astype(F)
    q = quantize_matrix(w, "q4", 8)
    idx = hp.build(q, 33, 4)                         # a head of 33 rows in a 40-row tensor (tied, out_vocab < vocab)
    sizes = np.diff(np.append(idx.starts, 33))
    assert idx.starts[0] == 0 and np.all(sizes >= 1) and np.all(sizes <= 4) and idx.n_tiles == 9
    assert sorted(idx.perm) == list(range(33))
    assert idx.centroids.fmt == "q8" and idx.centroids.group_size == 8 and idx.centroids.shape == (9, 37)
    wd, c = q.exact64(33), idx.centroids.exact64()
    for t, (a, b) in enumerate(zip(idx.starts, idx.ends())):   # each radius covers its rows' distance to the centre
        rows = idx.perm[a:b]
        assert list(rows) == sorted(rows)
        assert idx.radius[t] >= np.sqrt(((wd[rows] - c[t]) ** 2).sum(axis=1)).max()
    inv = idx.inverse(40)
    assert np.array_equal(inv[idx.perm], np.arange(33)) and np.array_equal(inv[33:], np.arange(33, 40))
    back = hp.read_section(hp.section_bytes(idx, 40), 33, 40, idx.centroids)
    for f in ("perm", "starts", "radius"):
        assert np.array_equal(getattr(back, f), getattr(idx, f))
    stored = hp.stored_head(q, idx)
    assert np.array_equal(stored.codes[:33], q.codes[idx.perm]) and np.array_equal(stored.codes[33:], q.codes[33:])
    assert np.array_equal(hp.token_order_head(stored, idx).codes, q.codes)


# ---------------------------------------------------------------------------------------------
# the bound and the scan, against the full scan (reference only: many random heads)

@st.composite
def heads(draw):
    """A quantized head with hostile rows (norms spread over e^6, a component shared by every row,
    duplicated rows: exact ties; rows equal but for sign) and tiles: balanced of a drawn size (1:
    every bound as tight as the rounding margin allows) or a random partition (far from similar)."""
    rows, cols = draw(st.integers(2, 60)), draw(st.integers(1, 70))
    g = draw(st.integers(1, 80))
    fmt = draw(st.sampled_from(["q8", "q4"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    w = rng.standard_normal((rows, cols)) * np.exp(draw(st.floats(0, 6)) * rng.random(rows))[:, None]
    if draw(st.booleans()):
        w += rng.standard_normal(cols) * draw(st.floats(0, 5))
    for _ in range(draw(st.integers(0, 3))):
        a, b = rng.integers(0, rows, 2)
        w[b] = w[a] * draw(st.sampled_from([1.0, -1.0]))
    q = quantize_matrix(w.astype(F), fmt, g, draw(st.booleans()))
    if draw(st.booleans()):
        idx = hp.build(q, rows, draw(st.sampled_from([1, 1, 2, 3, 8, rows])))
    else:
        cut = np.sort(rng.choice(np.arange(1, rows), int(rng.integers(0, rows)), replace=False))
        idx = hp.build(q, rows, 0, np.split(rng.permutation(rows), cut))
    return q, idx, rng


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads(), st.sampled_from(["aligned", "anti", "random", "tiny", "zero"]), st.floats(-30, 30))
def test_every_bound_holds_and_the_scan_is_the_first_maximum(hq, kind, log_scale):
    q, idx, rng = hq
    rows, cols = q.shape
    w = q.dequantize()
    r = int(rng.integers(0, rows))
    x = {"aligned": w[r], "anti": -w.mean(axis=0), "random": rng.standard_normal(cols),
         "tiny": rng.standard_normal(cols) * 1e-30, "zero": np.zeros(cols)}[kind]
    x = (x * np.exp(log_scale)).astype(F)
    xq, xs = PackedMatrix(q).quantize_input(x)
    logits = PackedMatrix(q).matvec_q(xq, xs)
    x2, xm = hp.x_margin(xq, xs)
    if x2 >= hp.FLOOR:      # the proof's claim: no row's computed logit is above its tile's bound
        u = hp.bounds(idx, xq, xs, xm)
        for t, (a, b) in enumerate(zip(idx.starts, idx.ends())):
            assert np.all(u[t] >= logits[idx.perm[a:b]]), (t, u[t], logits[idx.perm[a:b]].max())
    tok, n, tiles = hp.scan(idx, logits, xq, xs)
    assert tok == int(np.argmax(logits))
    assert 1 <= n <= rows and 1 <= tiles <= idx.n_tiles if x2 >= hp.FLOOR else (n, tiles) == (rows, 0)
    assert hp.scan(None, logits, xq, xs) == (int(np.argmax(logits)), rows, 0)


def test_first_max_is_the_engine_loop():
    nan = float("nan")
    for v in ([1, 3, 3, 2], [nan, 5, 6], [2, nan, 7, 7], [-np.inf, -np.inf], [0.0, -0.0]):
        v = np.array(v, F)
        want = 0
        for i in range(1, len(v)):
            if v[i] > v[want]:
                want = i
        assert hp.first_max(v) == want


# ---------------------------------------------------------------------------------------------
# the C engine on the same activations

CASES = {
    # name: (model IR factory, default format, group, overrides, scales)
    "q8-tied": (lambda: random_model(seed=31)[1], "q8", 32, [], "f32"),
    "q4-head-untied": (lambda: random_model(seed=32, dim=64, n_heads=4, n_kv_heads=4, hidden_dim=96, tied=False,
                                            vocab_size=120)[1], "q4", 16, ["head=q4:24"], "f32"),
    "ple-untied-out-lt-vocab-f16": (lambda: random_ple_model(seed=33, tied=False, out_vocab=50), "q4", 16,
                                    ["head=q4"], "f16"),
    "ple-tied-out-lt-vocab": (lambda: random_ple_model(seed=34, out_vocab=41), "q8", 12, [], "f32"),
}


def head_of(ir):
    return "tok_embeddings" if ir.config.tied else "output"


def adversarial_model(case: str, variant: str):
    """The case's model with its head made hostile, and a head index of tiles of 4 rows (none for
    "whole"): spread row norms (tiles skipped), rows duplicated or negated (ties: the first maximum
    must win), a common component shared by every row (negative maxima), a final norm so small that
    X2 falls below the underflow floor, or far from 1 (scaled), or rows and norm so large that the
    logits overflow to infinities and NaN (outside the claim: the engine and the reference must still
    agree on the token and the rows)."""
    make, fmt, g, ov, scales = CASES[case]
    ir = make()
    name, n_out = head_of(ir), ir.config.n_out
    if variant in ("spread", "ties", "scaled", "whole", "overflow"):
        spread_head(ir, seed=len(case), span=6.0)
    w = ir.tensors[name]
    if variant == "ties":
        for a, b, s in ((0, n_out - 1, 1), (3, 9, 1), (5, 6, -1), (7, 8, -1)):
            w[b] = s * w[a]
    if variant == "common":
        w += 4.0 * np.abs(np.random.default_rng(1).standard_normal(w.shape[1])).astype(F)
    if variant == "tiny":
        ir.tensors["norm"] = np.full_like(ir.tensors["norm"], 1e-25)
    if variant == "scaled":      # ||x|| ~ 1e14, head rows ~ 1e-12: the bounds far from the logits' scale
        ir.tensors["norm"] = ir.tensors["norm"] * F(1e12)
        ir.tensors[name] = ir.tensors[name] * F(1e-12)
    if variant == "overflow":
        ir.tensors["norm"] = ir.tensors["norm"] * F(1e10)
        ir.tensors[name] = ir.tensors[name] * F(1e30)
    qm = quantize(ir, fmt, g, ov, scales="f32" if variant in ("scaled", "overflow") else scales)
    return qm if variant == "whole" else with_head_index(qm, 4)


def activations(qm, rng) -> dict[str, np.ndarray]:
    """x vectors (the residual stream before the final norm): aligned with head rows (x = w_r / g, so
    the norm's output is along w_r), against and along the rows' mean, random at several scales,
    zero, and near-aligned."""
    c = qm.config
    w = qm.head().dequantize()[:c.n_out]
    g = qm.tensors["norm"].astype(F)
    g = np.where(g == 0, F(1), g)
    norms = np.linalg.norm(w, axis=1)
    rows = sorted({int(np.argmax(norms)), int(np.argmin(norms)), 0, 3, 5, c.n_out - 1, int(rng.integers(c.n_out))})
    xs = {f"row{r}": w[r] / g for r in rows}
    xs.update(anti=-w.mean(axis=0) / g, mean=w.mean(axis=0) / g, zero=np.zeros(c.dim))
    xs.update({f"random{s:g}": rng.standard_normal(c.dim) * s for s in (1e-6, 1.0, 1e6)})
    xs.update({f"near{r}": (w[r] + 0.3 * rng.standard_normal(c.dim) * np.abs(w[r]).mean()) / g for r in rows[:3]})
    return {k: np.asarray(x, F) for k, x in xs.items()}


def run_heads(exe, blob_path, xs, n_out):
    """tests/c/blob_check.c's "head" mode: the engine's greedy and whole output layer on each x."""
    data = struct.pack("<I", len(xs)) + b"".join(x.tobytes() for x in xs)
    out = subprocess.run([str(exe), str(blob_path), "head"], input=data, capture_output=True, check=True,
                         timeout=60).stdout
    rec = 12 + 4 * n_out
    assert len(out) == rec * len(xs)
    for k in range(len(xs)):
        tok, rows, full = struct.unpack_from("<3I", out, k * rec)
        yield tok, rows, full, np.frombuffer(out, F, n_out, k * rec + 12)


@pytest.mark.native
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # x / 1e-25 squared: inf, as in C
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # inf - inf: NaN, as in C
@pytest.mark.parametrize("variant", ["spread", "ties", "common", "tiny", "scaled", "whole", "overflow"])
@pytest.mark.parametrize("case", CASES)
def test_engine_greedy_head_equals_full_scan_and_reference(blob_checker, tmp_path, case, variant):
    qm = adversarial_model(case, variant)
    c = qm.config
    (tmp_path / "m.flmb").write_bytes(build_blob(qm))
    ref = Reference(qm)
    xs = activations(qm, np.random.default_rng(7))
    skipped = []
    got = run_heads(blob_checker, tmp_path / "m.flmb", list(xs.values()), c.n_out)
    for x, (tok, rows, full, logits) in zip(xs.values(), got):
        want = ref.logits(x)
        assert np.array_equal(logits.view(np.uint32), want.view(np.uint32))      # the whole head, in token order
        assert full == hp.first_max(want) and (tok, rows) == ref.argmax(x)      # the same rows visited
        if np.all(np.isfinite(want)):                                           # the claim: finite logits
            assert tok == full
        skipped.append(rows < c.n_out)
    if variant == "ties":   # the duplicated rows tie; the lower row wins
        w = qm.head().dequantize()
        assert np.array_equal(w[0], w[c.n_out - 1]) and np.array_equal(w[5], -w[6])
    if variant == "common":  # every logit negative against the rows' mean: still the first maximum
        assert ref.logits(xs["anti"]).max() < 0
    if variant in ("tiny", "whole"):    # X2 under the floor, or no index: every row
        assert not any(skipped)
    if variant in ("spread", "ties", "scaled"):
        assert any(skipped), "no tile was ever skipped: the test would prove nothing"
    if variant == "overflow":   # the case is what it says
        assert any(not np.all(np.isfinite(ref.logits(x))) for x in xs.values())


# ---------------------------------------------------------------------------------------------
# the convert-time decision

def test_calibration_keeps_an_index_only_where_it_pays():
    spread = quantize(spread_head(random_model(seed=41)[1], span=6.0), "q8", 32)
    index, rep = headcalib.calibrate(spread)
    assert index is not None and rep["kept"] and rep["worst"] <= 1 - headcalib.MIN_GAIN
    size = rep["tile_size"]
    assert rep["tile_sizes"][size]["rows_pct"] == pytest.approx(100 * index.expected_rows / spread.config.n_out)
    assert index.calib_steps == rep["steps"] == headcalib.STEPS
    alike = quantize(random_model(seed=44)[1], "q8", 32)    # every row alike: tiles save nothing
    none, rep = headcalib.calibrate(alike)
    assert none is None and not rep["kept"] and "would cost" in rep["reason"]
    forced, rep = headcalib.calibrate(alike, force=True)
    assert forced is not None and rep["kept"] and rep["worst"] > 1 - headcalib.MIN_GAIN


# ---------------------------------------------------------------------------------------------
# a blob whose index is unsound is refused

def _entry(blob, name):
    n, table = struct.unpack_from("<II", blob, 36)
    return next(table + 64 * i for i in range(n) if blob[table + 64 * i:table + 64 * i + 32].rstrip(b"\0") == name)


@pytest.mark.native
def test_blob_with_a_bad_head_index_refused_in_python_and_c(blob_checker, tmp_path):
    qm = with_head_index(quantize(random_model(seed=35)[1], "q8", 32), 8)
    blob = bytearray(build_blob(qm))
    back = read_blob(bytes(blob))
    assert np.array_equal(back.head().codes, qm.head().codes) and np.array_equal(back.head_index.perm, qm.head_index.perm)
    e = _entry(blob, b"head.tiles")
    off = struct.unpack_from("<I", blob, e + 52)[0]
    rec, n_out, nt = off + 32, qm.config.n_out, qm.head_index.n_tiles
    perm = rec + 8 * nt
    cases = {   # name: (mutate, Python's refusal, C's refusal)
        "order": (lambda b: struct.pack_into("<I", b, rec + 8, 0), "do not ascend", "tiles must ascend"),
        "nan": (lambda b: struct.pack_into("<f", b, rec + 4, float("nan")), "not in \\+0..\\+inf", "radii"),
        "negative": (lambda b: struct.pack_into("<f", b, rec + 12, -1.0), "not in \\+0..\\+inf", "radii"),
        "smaller": (lambda b: struct.pack_into("<f", b, rec + 4, struct.unpack_from("<f", b, rec + 4)[0] * 0.99),
                    "not the one its rows give", "ok"),
        "map": (lambda b: b.__setitem__(slice(perm, perm + 4), b[perm + 2:perm + 4] + b[perm:perm + 2]),
                "not inverse permutations", "not inverse permutations"),
        "tiles": (lambda b: struct.pack_into("<I", b, off, nt + 1), "does not fit", "does not fit"),
        "half": (lambda b: b.__setitem__(slice(_entry(b, b"head.centroids"), _entry(b, b"head.centroids") + 4), b"xead"),
                 "come together", "half a head index"),
    }
    for name, (mutate, python, c) in cases.items():
        b = bytearray(blob)
        mutate(b)
        struct.pack_into("<I", b, 12, zlib.crc32(memoryview(b)[16:]))
        with pytest.raises(BlobError, match=python):
            read_blob(bytes(b))
        (tmp_path / "m.flmb").write_bytes(bytes(b))
        out = subprocess.run([str(blob_checker), str(tmp_path / "m.flmb")], capture_output=True, text=True).stdout
        assert c in out, (name, out)
