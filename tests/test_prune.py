"""The exactly pruned greedy head: the same token as the full scan's first maximum, on adversarial
activations, in the reference and in the C engine (bit for bit, the same rows visited)."""
import struct
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converter import headprune
from converter.blob import BlobError, build_blob, read_blob
from converter.ir import QTensor
from converter.quantize import quantize, quantize_matrix
from converter.reference import PackedMatrix, Reference, quantize_activation
from modelzoo import random_model, random_ple_model, spread_head

F = np.float32


# ---------------------------------------------------------------------------------------------
# the records

def test_records_sorted_by_bound_then_row_and_bounds_round_up():
    w = np.random.default_rng(1).standard_normal((40, 37)).astype(F)
    w[7] = w[3]                                              # a tie in bound: row order decides
    q = quantize_matrix(w, "q4", 8)
    rec = headprune.records(q, 33)
    assert len(rec) == 33 and sorted(rec["row"]) == list(range(33))
    b, r = rec["bound"].astype(np.float64), rec["row"]
    assert np.all((b[:-1] > b[1:]) | ((b[:-1] == b[1:]) & (r[:-1] < r[1:])))
    g = np.arange(37) // 8   # ||code * scale||, the products exact in float64 (the engine's true weights)
    exact = np.sqrt(np.sum((q.codes[:33].astype(np.float64) * q.scales[:33][:, g]) ** 2, axis=1))
    got = np.empty(33)
    got[r] = b      # rounded up to binary32, once: within float64's own rounding (covered by MARGIN)
    assert np.all(got >= exact * (1 - 1e-12)) and np.all(np.nextafter(got.astype(F), F(0)) < exact * (1 + 1e-12))
    assert list(r).index(3) + 1 == list(r).index(7)


# ---------------------------------------------------------------------------------------------
# the scan, against the full scan's first maximum (reference only: many random heads)

@st.composite
def heads(draw):
    rows, cols = draw(st.integers(2, 60)), draw(st.integers(1, 70))
    g = draw(st.integers(1, 80))
    fmt = draw(st.sampled_from(["q8", "q4"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    w = rng.standard_normal((rows, cols)) * np.exp(draw(st.floats(0, 6)) * rng.random(rows))[:, None]
    if draw(st.booleans()):                                  # rows sharing a common component
        w += rng.standard_normal(cols) * draw(st.floats(0, 5))
    for _ in range(draw(st.integers(0, 3))):                 # duplicated rows: tied logits
        a, b = rng.integers(0, rows, 2)
        w[b] = w[a]
    return quantize_matrix(w.astype(F), fmt, g, draw(st.booleans())), rng


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads(), st.sampled_from(["aligned", "anti", "random", "tiny", "zero"]), st.floats(-30, 30))
def test_pruned_scan_is_the_first_maximum(hq, kind, log_scale):
    q, rng = hq
    rows, cols = q.shape
    head = PackedMatrix(q)
    w = q.dequantize()
    r = int(rng.integers(0, rows))
    x = {"aligned": w[r], "anti": -w.mean(axis=0), "random": rng.standard_normal(cols),
         "tiny": rng.standard_normal(cols) * 1e-30, "zero": np.zeros(cols)}[kind]
    x = (x * np.exp(log_scale)).astype(F)
    xq, xs = quantize_activation(x, q.group_size)
    logits = head.matvec_q(xq, xs)
    tok, n = headprune.scan(logits, headprune.records(q, rows), xq, xs)
    assert tok == int(np.argmax(logits)) and 1 <= n <= rows
    top = logits.max()
    seen = set(headprune.records(q, rows)["row"][:n])
    assert all(logits[i] < top for i in range(rows) if i not in seen)     # every skipped row is below


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
    """The case's model with its head made hostile: spread row norms (pruning stops early), rows
    duplicated (ties: the first maximum must win), a common component shared by every row (negative
    maxima), a final norm so small that X2 falls below the underflow floor, or far from 1 (scaled)."""
    make, fmt, g, ov, scales = CASES[case]
    ir = make()
    name, n_out = head_of(ir), ir.config.n_out
    w = ir.tensors[name]
    if variant in ("spread", "ties"):
        spread_head(ir, seed=len(case))
        w = ir.tensors[name]
    if variant == "ties":
        for a, b in ((0, n_out - 1), (3, 9), (5, 6)):
            w[b] = w[a]
    if variant == "common":
        w += 4.0 * np.abs(np.random.default_rng(1).standard_normal(w.shape[1])).astype(F)
    if variant == "tiny":
        ir.tensors["norm"] = np.full_like(ir.tensors["norm"], 1e-25)
    if variant == "scaled":      # ||x|| ~ 1e14, head rows ~ 1e-12: Xm far from the logits' scale
        spread_head(ir, seed=len(case))
        ir.tensors["norm"] = ir.tensors["norm"] * F(1e12)
        ir.tensors[name] = ir.tensors[name] * F(1e-12)
    return quantize(ir, fmt, g, ov, scales="f32" if variant == "scaled" else scales)


def activations(qm, rng) -> dict[str, np.ndarray]:
    """x vectors (the residual stream before the final norm): aligned with head rows (x = w_r / g, so
    the norm's output is along w_r), against and along the rows' mean, random at several scales,
    zero, and near-aligned."""
    c = qm.config
    w = qm.head().dequantize()[:c.n_out]
    g = qm.tensors["norm"].astype(F)
    g = np.where(g == 0, F(1), g)
    b = headprune.row_bounds(qm.head(), c.n_out)
    rows = sorted({int(np.argmax(b)), int(np.argmin(b)), 0, 3, 5, c.n_out - 1, int(rng.integers(c.n_out))})
    xs = {f"row{r}": w[r] / g for r in rows}
    xs.update(anti=-w.mean(axis=0) / g, mean=w.mean(axis=0) / g, zero=np.zeros(c.dim))
    xs.update({f"random{s:g}": rng.standard_normal(c.dim) * s for s in (1e-6, 1.0, 1e6)})
    xs.update({f"near{r}": (w[r] + 0.3 * rng.standard_normal(c.dim) * np.abs(w[r]).mean()) / g for r in rows[:3]})
    return {k: np.asarray(x, F) for k, x in xs.items()}


def run_heads(exe, blob_path, xs, n_out):
    """tests/c/blob_check.c's "head" mode: the engine's pruned and full output layer on each x."""
    data = struct.pack("<I", len(xs)) + b"".join(x.tobytes() for x in xs)
    out = subprocess.run([str(exe), str(blob_path), "head"], input=data, capture_output=True, check=True,
                         timeout=60).stdout
    rec = 12 + 4 * n_out
    assert len(out) == rec * len(xs)
    for k in range(len(xs)):
        tok, rows, full = struct.unpack_from("<3I", out, k * rec)
        yield tok, rows, full, np.frombuffer(out, F, n_out, k * rec + 12)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # x / 1e-25 squared: inf, as in C
@pytest.mark.parametrize("variant", ["spread", "ties", "common", "tiny", "scaled"])
@pytest.mark.parametrize("case", CASES)
def test_engine_pruned_head_equals_full_scan_and_reference(blob_checker, tmp_path, case, variant):
    qm = adversarial_model(case, variant)
    c = qm.config
    (tmp_path / "m.flmb").write_bytes(build_blob(qm))
    ref = Reference(qm)
    xs = activations(qm, np.random.default_rng(7))
    stopped = []
    got = run_heads(blob_checker, tmp_path / "m.flmb", list(xs.values()), c.n_out)
    for x, (tok, rows, full, logits) in zip(xs.values(), got):
        want = ref.logits(x)
        assert np.array_equal(logits.view(np.uint32), want.view(np.uint32))      # the full scan, bit for bit
        assert tok == full == int(np.argmax(want))                              # the same first maximum
        assert (tok, rows) == ref.argmax(x)                                     # the same rows visited
        stopped.append(rows < c.n_out)
    if variant == "ties":   # the duplicated rows tie; the lower row wins
        w = qm.head().dequantize()
        assert np.array_equal(w[0], w[c.n_out - 1]) and np.array_equal(w[3], w[9])
    if variant == "common":  # every logit negative against the rows' mean: nothing may be pruned
        x = xs["anti"]
        assert ref.logits(x).max() < 0 and ref.argmax(x)[1] == c.n_out
    if variant == "tiny":    # X2 under the floor: the scan never stops early
        assert not any(stopped)
    if variant in ("spread", "ties", "scaled"):
        assert any(stopped), "pruning never stopped early: the test would prove nothing"


# ---------------------------------------------------------------------------------------------
# a blob whose records do not match its head is refused

def test_blob_with_wrong_prune_records_refused_in_python_and_c(blob_checker, tmp_path):
    import zlib
    qm = quantize(random_model(seed=35)[1], "q8", 32)
    blob = bytearray(build_blob(qm))
    n, table = struct.unpack_from("<II", blob, 36)
    e = next(table + 64 * i for i in range(n) if blob[table + 64 * i:table + 64 * i + 10] == b"head.prune")
    off = struct.unpack_from("<I", blob, e + 52)[0]
    cases = {"swap": (lambda b: b.__setitem__(slice(off, off + 16), b[off + 8:off + 16] + b[off:off + 8]),
                      "does not match", "ok"),
             "row": (lambda b: struct.pack_into("<I", b, off + 8, qm.config.n_out), "does not match",
                     "record names no head row"),
             "nan": (lambda b: struct.pack_into("<f", b, off + 12, float("nan")), "does not match", "bad bound"),
             "short": (lambda b: struct.pack_into("<I", b, e + 40, 8 * qm.config.n_out - 8), None, "wrong shape")}
    for name, (mutate, python, c) in cases.items():
        b = bytearray(blob)
        mutate(b)
        struct.pack_into("<I", b, 12, zlib.crc32(memoryview(b)[16:]))
        if python:
            with pytest.raises(BlobError, match=python):
                read_blob(bytes(b))
        (tmp_path / "m.flmb").write_bytes(bytes(b))
        out = subprocess.run([str(blob_checker), str(tmp_path / "m.flmb")], capture_output=True, text=True).stdout
        assert c in out, (name, out)
