"""The C engine on the native board reproduces the NumPy reference bit for bit."""
import subprocess

import numpy as np
import pytest

from converter.quantize import quantize
from converter.numerics import EXP2_Q23, fexp, gelu, silu
from converter.reference import FLAG_LOGITS, generate
from firmware.build_meta import ENGINE_DIR
from modelzoo import random_model, spread_head, with_head_index
from nativeboard import assert_matches_reference, expected_bytes_read, native_link, run, token_bytes_read

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent

CASES = {
    # name: (model config, default format, group size, overrides, head index tile size (0: none))
    "q8-tied-gqa-ragged": (dict(), "q8", 32, [], 0),
    "q4-untied-mha": (dict(dim=64, n_heads=4, n_kv_heads=4, hidden_dim=96, tied=False, vocab_size=120),
                      "q4", 16, ["tok_embeddings=q4:16", "output=q4:32"], 8),
    "mixed-mqa-odd-groups": (dict(dim=48, n_heads=4, n_kv_heads=1, hidden_dim=70, n_layers=3, vocab_size=61),
                             "q8", 20, ["layers.*.ffn=q4:7", "layers.1.attn.wq=q4:48"], 0),
    "q4-tied-head": (dict(dim=40, n_heads=2, n_kv_heads=1, hidden_dim=64, vocab_size=50),
                     "q4", 32, ["tok_embeddings=q4:24"], 5),
}


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("builds")


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_engine_matches_reference_bit_for_bit(case, tmp_path, build_root):
    cfg, fmt, g, ov, tile = CASES[case]
    _, ir = random_model(seed=len(case), **cfg)
    qm = quantize(ir, fmt, g, ov)
    if tile:     # the head's rows stored in tile order: the embedding and the whole head go through its maps
        with_head_index(qm, tile)
    prompt = [1, 7, 3]
    runs = [(0.0, 0.0, 0), (0.9, 0.0, 11), (0.8, 0.9, 12345)]
    with native_link(qm, tmp_path, build_root) as (link, _):
        for temperature, top_p, seed in runs:
            ref = generate(qm, prompt, 34, temperature, top_p, seed, flags=FLAG_LOGITS)
            toks, logits, done = run(link, prompt, 34, temperature, top_p, seed)
            assert done.reason == "max_tokens" and done.generated == 34 and len(toks) == len(ref) == 36
            assert_matches_reference(toks, logits, ref)


@pytest.mark.native
@pytest.mark.slow
def test_context_full_and_eos_stop(tmp_path, build_root):
    _, ir = random_model(seed=3, max_seq_len=12)
    qm = quantize(ir, "q8", 32)
    with native_link(qm, tmp_path, build_root) as (link, _):
        toks, _, done = run(link, [2, 4], 50, logits=False)
        assert done.reason == "context_full" and done.steps == 12 and done.generated == 11
        ref = generate(qm, [2, 4], 50)
        assert [t.out_id for t in toks[1:]] == [r["out_id"] for r in ref[1:]]


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("index", [False, True])
def test_bytes_read_per_tier(tmp_path, build_root, tied, index):
    """Every step reads each matrix once, one embedding row, norms, RoPE rows; KV grows with pos;
    the head: skipped on prompt steps; on greedy steps the tile scan's centre rows, records, rows
    and map entries with a head index, else the whole head; all rows with ALL_LOGITS."""
    _, ir = random_model(seed=5, tied=tied)
    qm = with_head_index(quantize(spread_head(ir, span=6.0), "q8", 32), 8) if index else quantize(ir, "q8", 32)
    with native_link(qm, tmp_path, build_root) as (link, _):
        toks, _, _ = run(link, [1, 2, 3], 5, logits=False)
        full, _, _ = run(link, [1, 2, 3], 5, logits=False, all_logits=True)
    assert [t.head_rows for t in toks[:2]] == [0, 0] and all(t.head_rows > 0 for t in toks[2:])
    assert [t.head_rows for t in toks[2:]] == [r["head_rows"] for r in generate(qm, [1, 2, 3], 5)[2:]]
    assert any(t.head_rows < qm.config.n_out for t in toks[2:]) == index     # tiles skipped only with an index
    for t in toks:
        assert t.bytes_read == token_bytes_read(qm, t)
    for t in full:
        assert t.head_rows == qm.config.n_out and t.bytes_read == expected_bytes_read(qm, t.pos)


def test_exp_table_is_the_references():
    src = (ENGINE_DIR / "flm_math.c").read_text()
    body = src[src.index("flm_exp2_q23[257] = {") + 21:]
    table = [int(v.strip().rstrip("u")) for v in body[:body.index("}")].split(",")]
    assert table == EXP2_Q23.tolist()


@pytest.mark.native
def test_c_math_matches_numpy(tmp_path):
    exe = tmp_path / "math_check"
    subprocess.run(["cc", "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
                    f"-I{ENGINE_DIR}", str(ROOT / "tests/c/math_check.c"),
                    str(ENGINE_DIR / "flm_math.c"), "-o", str(exe)], check=True)
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(200000).astype(np.float32) * 30,
        rng.uniform(-100, 100, 100000).astype(np.float32),
        np.array([0.0, -0.0, -86.0, -86.00001, 88.0, 88.00001, 1e-30, -1e-30, 0.5, -0.5,
                  np.float32(0.34657359), 1e-40, 3e38], np.float32),
        rng.integers(1, 0x7f800000, 100000, dtype=np.uint32).view(np.float32)])
    out = subprocess.run([str(exe)], input=x.tobytes(), capture_output=True, check=True).stdout
    got = np.frombuffer(out, np.float32).reshape(-1, 4)
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(got[:, 0]), bits(fexp(x)))
        assert np.array_equal(bits(got[:, 1]), bits(np.sqrt(np.abs(x))))
        assert np.array_equal(bits(got[:, 2]), bits(silu(x)))
        assert np.array_equal(bits(got[:, 3]), bits(gelu(x)))
    exact = np.exp(x[:300000].astype(np.float64))
    ok = (x[:300000] > -80) & (x[:300000] < 80)
    # the table exp: x * log2(e) * 2^16 rounded to a float (a quarter of 2^-16 at |x| ~ 80) and to an
    # integer (a half), 2^(j/256) interpolated (1e-6): below 2^(0.76/65536) - 1 + 1e-6 ~ 9e-6
    assert np.max(np.abs(got[:300000, 0][ok] - exact[ok]) / exact[ok]) < 9e-6
    # GELU is torch's tanh approximation (the training side's F.gelu(approximate="tanh"))
    x64 = x[:300000].astype(np.float64)
    want = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    ok = np.abs(x64) < 30
    assert np.max(np.abs(got[:300000, 3][ok] - want[ok]) / np.maximum(np.abs(x64[ok]), 1e-3)) < 2e-6
