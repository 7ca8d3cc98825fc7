"""A mixture of experts: the PyTorch layer, the reference's router (its deterministic top-k), the
experts' calibrated use, blobs refused in Python and C, the planner's expected experts, the run
report, and the C engine equal to the reference bit for bit on the native board and the emulated
RP2040 (int8 and int4, k = 1 and 2, multi-token passes whose tokens go to different experts,
speculative decoding verifying through the experts)."""
import struct
import subprocess

import numpy as np
import pytest
import torch

from converter import costmodel as C
from converter import expertuse
from converter.blob import build_blob, parse_header, read_blob
from converter.fidelity import Fp32Model
from converter.formats import BlobError, StateTiers
from converter.ir import ModelConfig, ModelError
from converter.numerics import F, route, top_k
from converter.passcost import pass_usage
from converter.quantize import quantize
from converter.reference import FLAG_LOGITS, Reference, generate
from converter.torch_model import MoE
from host.link.codec import decode_payload, encode_payload
from host.link.messages import Token
from host.output.experts import expert_summary, summary_lines
from blobedit import entry, recrc
from modelzoo import random_model

MODELS = {
    # name: (config, default format, group, scales, KV format)
    "q8-k2": (dict(n_experts=4, moe_top_k=2, hidden_dim=48), "q8", 32, "row", "int8"),
    "q4-k1": (dict(n_experts=4, moe_top_k=1, dim=48, n_heads=4, n_kv_heads=1, hidden_dim=40), "q4", 16, "row", "f32"),
    "q8-k2-e6-f32": (dict(n_experts=6, moe_top_k=2, hidden_dim=24, n_layers=3, dim=40, n_heads=4, n_kv_heads=2),
                     "q8", 20, "f32", "int8"),
}
PROMPT = [3, 17, 40, 2, 88, 61, 5, 29, 70]
REPEATS = [5, 9, 2, 7, 5, 9, 2, 7, 5, 9]        # prompt lookup finds drafts in it


def model(name, seed=7, scales=None):
    cfg, fmt, g, default_scales, kv = MODELS[name]
    _, ir = random_model(seed=seed, **cfg)
    return quantize(ir, fmt, g, scales=scales or default_scales), kv


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("moe-builds")


def greedy_ids(steps):
    return [s["out_id"] for s in steps if s["out_id"] != 0xFFFFFFFF]


# ---------------------------------------------------------------------------------------------
# the layer, the router

def test_top_k_is_deterministic_ties_to_the_lowest_index():
    assert top_k(np.array([1, 3, 3, 2], F), 2) == [1, 2]
    assert top_k(np.array([5, 5, 5, 5], F), 3) == [0, 1, 2]
    nan = F("nan")
    assert top_k(np.array([nan, 1, 2], F), 2) == [0, 2]     # a NaN wins only as the first of those left
    assert top_k(np.array([1, nan, 2], F), 2) == [2, 0]


def test_route_weights_are_the_softmax_of_the_chosen_logits():
    rng = np.random.default_rng(0)
    router, x = rng.standard_normal((6, 16)).astype(F), rng.standard_normal(16).astype(F)
    r = (router.astype(np.float64) @ x.astype(np.float64))
    for k in (1, 2, 3):
        chosen, w = route(router, x, k)
        assert chosen == list(np.argsort(-r, kind="stable")[:k])
        want = np.exp(r[chosen] - r[chosen[0]])
        assert np.allclose(w, want / want.sum(), rtol=1e-5) and w.dtype == F
    assert route(router, x, 1)[1][0] == F(1.0)               # one expert: weight exactly 1


def test_torch_moe_layer_computes_the_top_k_mixture_and_its_balance_loss():
    cfg = ModelConfig(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=32, hidden_dim=8, max_seq_len=8,
                      n_experts=4, moe_top_k=2)
    torch.manual_seed(0)
    moe = MoE(cfg)
    x = torch.randn(2, 5, 16)
    y = moe(x)
    for b in range(2):
        for t in range(5):
            logits = moe.router(x[b, t])
            top, idx = torch.topk(logits, 2)
            w = torch.softmax(top, -1)
            want = sum(w[j] * moe.experts[int(idx[j])](x[b, t]) for j in range(2))
            assert torch.allclose(y[b, t], want, atol=1e-6)
    with torch.no_grad():
        moe.router.weight.zero_()          # every expert alike: the balance loss is exactly 1
        moe(x)
    assert abs(float(moe.aux) - 1.0) < 1e-6


def test_config_refuses_experts_it_cannot_run():
    base = dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=32, hidden_dim=8, max_seq_len=8)
    for bad, why in ((dict(n_experts=4, moe_top_k=5), "moe_top_k 5 must be 1..4"),
                     (dict(n_experts=4, moe_top_k=0), "moe_top_k 0"),
                     (dict(n_experts=0, moe_top_k=2), "without experts"),
                     (dict(n_experts=65, moe_top_k=2), "64 experts")):
        with pytest.raises(ModelError, match=why):
            ModelConfig(**base, **bad).validate()


def test_reference_fp32_model_matches_pytorch_and_routers_stay_f32():
    """The quality report's fp32 model (plain float math) against our PyTorch model; the quantized
    model keeps every router in f32 and chooses the fp32 model's experts."""
    torch_model, ir = random_model(seed=3, **MODELS["q8-k2"][0])
    ids = PROMPT[:8]
    with torch.no_grad():
        want = torch_model(torch.tensor([ids]))[0].numpy()
    qm = quantize(ir, "q8", 32)
    fp = Fp32Model(ir, qm.rope_cos, qm.rope_sin)
    got = np.stack([fp.forward(t, p) for p, t in enumerate(ids)])
    assert np.allclose(got, want, atol=2e-4 * np.abs(want).max())
    assert all(qm.recipe[f"layers.{i}.ffn.router"] == "f32" for i in range(ir.config.n_layers))
    with pytest.raises(ModelError, match="stays f32"):
        quantize(ir, "q8", 32, ["layers.0.ffn.router=q8"])


@pytest.mark.parametrize("name", MODELS)
def test_reference_multi_token_pass_equals_one_token_passes(name):
    """Grouped by expert (each chosen expert once for the pass's tokens routed to it), every token's
    logits and choices are the one-token pass's, bit for bit."""
    qm, kv = model(name)
    one, many = Reference(qm, kv), Reference(qm, kv)
    singles, routes = [], []
    for p, t in enumerate(PROMPT):
        singles.append(one.logits(one.body(t, p)))
        routes.append(one.routes[0])
    xs = np.concatenate([many.body_many(PROMPT[:5], 0), many.body_many(PROMPT[5:], 5)])
    assert np.array_equal(np.stack([many.logits(x) for x in xs]).view(np.uint32), np.stack(singles).view(np.uint32))
    assert many.routes == routes[5:]
    assert len({tuple(map(tuple, r)) for r in routes}) > 1          # the tokens went to different experts


# ---------------------------------------------------------------------------------------------
# the experts' use, the blob

def test_expert_use_is_calibrated_and_travels_in_the_blob():
    qm, _ = model("q8-k2")
    use = expertuse.count(qm, PROMPT * 3)
    c = qm.config
    assert use.tokens == 27 and all(sum(row) == c.moe_top_k * 27 for row in use.counts)
    qm.expert_use = use
    blob = build_blob(qm)
    assert parse_header(blob).expert_use.counts == use.counts and read_blob(blob).expert_use.counts == use.counts
    own = expertuse.calibrate(qm, None, tokens=40)
    assert own.tokens == 40 and "own greedy text" in own.source


def _use_at(b, e) -> int:
    """Where moe.use's fields start (version, layers, experts, top_k, tokens, then the counts)."""
    return struct.unpack_from("<I", b, e("moe.use") + 52)[0]


def _set_counts(b, e, values):
    for i, v in enumerate(values):
        struct.pack_into("<I", b, _use_at(b, e) + 20 + 4 * i, v)


def _move_count(b, e):
    """One of layer 0's choices moved from one expert to another: still consistent."""
    off = _use_at(b, e) + 20
    a0, a1 = struct.unpack_from("<II", b, off)
    struct.pack_into("<II", b, off, a0 - 1, a1 + 1) if a0 else struct.pack_into("<II", b, off, a0 + 1, a1 - 1)


@pytest.mark.parametrize("mutate,python,c", [
    (lambda b, e: None, None, "ok"),
    (lambda b, e: struct.pack_into("<II", b, e("layers.1.ffn.router") + 36, 2, 2 * 72),
     "layers.1.ffn.router: f32 \\[2, 144\\], expected f32 \\[4, 72\\]", "wrong shape or format: layers.1.ffn.router"),
    (lambda b, e: b.__setitem__(slice(e("layers.0.ffn.router"), e("layers.0.ffn.router") + 10), b"layers.0.x"),
     "missing tensors", "image lacks a layer tensor: ffn.router"),
    (lambda b, e: b.__setitem__(slice(e("layers.1.ffn.experts.3.w2") + 21, e("layers.1.ffn.experts.3.w2") + 22), b"7"),
     "missing tensors", "image lacks a layer tensor: ffn.experts.3.w2"),
    (lambda b, e: struct.pack_into("<I", b, e("layers.0.ffn.experts.2.w1") + 36, 47),
     "inconsistent quantized layout", "wrong shape or format: layers.0.ffn.experts.2.w1"),
    (lambda b, e: struct.pack_into("<I", b, 48 + 60, 5), "moe_top_k 5 must be 1..4", "bad model config in image: experts"),
    (lambda b, e: struct.pack_into("<I", b, 48 + 56, 0), "without experts", "bad model config in image: experts"),
    (lambda b, e: _set_counts(b, e, [9, 1, 2, 3]), "moe.use: layer 0's counts", "moe.use: counts that do not sum"),
    (_move_count, None, "ok"),
    (lambda b, e: struct.pack_into("<I", b, _use_at(b, e) + 8, 9),
     "counts for 2 layers of 9 experts", "moe.use does not fit the model's experts"),
])
@pytest.mark.native
def test_inconsistent_router_or_experts_refused_in_python_and_c(blob_checker, tmp_path, mutate, python, c):
    qm, _ = model("q8-k2")
    qm.expert_use = expertuse.count(qm, PROMPT)
    b = bytearray(build_blob(qm))
    mutate(b, lambda name: entry(bytes(b), name))
    blob = recrc(b)
    if python is None:
        read_blob(blob)
    else:
        with pytest.raises(BlobError, match=python) as err:
            read_blob(blob)
        assert "\n" not in str(err.value)
    p = tmp_path / "m.flmb"
    p.write_bytes(blob)
    r = subprocess.run([str(blob_checker), str(p)], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr[-2000:]
    assert c in r.stdout and len(r.stdout.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# the planner, the report

def test_planner_counts_the_expected_experts():
    """A step reads the router and each expert's matrices times its share of tokens (k/E without a
    calibration; the calibration's with one), or exactly the experts a TOKEN says it read; a pass of
    T tokens reads an expert once if any token chose it."""
    qm, _ = model("q8-k2")
    c = qm.config
    spec = C.ModelSpec.from_quant(qm)
    by = spec.by_name()
    experts = [n for n in by if ".experts." in n]
    all_experts = sum(by[n].length for n in experts)
    u = C.usage(spec, 3)
    assert sum(u[n].counted for n in experts) == pytest.approx(all_experts * c.moe_top_k / c.n_experts)
    assert u["layers.0.ffn.router"].counted == by["layers.0.ffn.router"].length == 4 * 72 * 4
    exact = C.usage(spec, 3, experts=[0b0101, 0b1000])
    assert sum(exact[n].counted for n in experts) == sum(
        by[f"layers.{li}.ffn.experts.{e}.{w}"].length for li, es in ((0, (0, 2)), (1, (3,))) for e in es
        for w in ("w1", "w2", "w3"))
    qm.expert_use = expertuse.ExpertUse(10, ((10, 10, 0, 0), (4, 4, 6, 6)))
    spec = C.ModelSpec.from_quant(qm)
    u = C.usage(spec, 3)
    w1 = by["layers.0.ffn.experts.0.w1"].length
    assert u["layers.0.ffn.experts.0.w1"].counted == w1 and u["layers.0.ffn.experts.2.w1"].counted == 0
    assert u["layers.1.ffn.experts.2.w1"].counted == pytest.approx(0.6 * w1)
    four = pass_usage(spec, 0, 4, "f32", "greedy", "skip")
    assert four["layers.1.ffn.experts.2.w1"].counted == pytest.approx(w1 * (1 - 0.4 ** 4))
    assert four["layers.1.ffn.router"].counted == 4 * by["layers.1.ffn.router"].length    # f32 rows, read per token


def test_planner_puts_the_most_used_experts_in_sram():
    """Experts are tensors like any other: when SRAM holds only some of them, the knapsack takes the
    most used ones (their predicted µs saved per byte is the largest)."""
    from converter.planner import plan
    cfg = ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=512, hidden_dim=256,
                      max_seq_len=64, tied=True, n_experts=4, moe_top_k=1)
    spec = C.ModelSpec.from_config(cfg, "q8", 32)
    use = expertuse.ExpertUse(100, ((70, 20, 8, 2), (5, 15, 30, 50)))
    p = plan(C.ModelSpec(spec.config, spec.tensors, spec.source, expert_use=use), "pico")
    share = {f"layers.{li}.ffn.experts.{e}.{w}": use.counts[li][e] for li in range(2) for e in range(4)
             for w in ("w1", "w2", "w3")}
    placed = [n for n in share if p.tiers[n] == "sram"]
    assert placed and len(placed) < len(share)
    assert min(share[n] for n in placed) >= max(share[n] for n in share if p.tiers[n] == "flash")
    assert max(share[n] for n in placed) == max(share.values())


def test_token_frames_carry_the_experts_and_the_report_sums_them():
    t = Token(4, 4, 7, 9, (1,) * 7, (100, 0, 5), 3, 0, b"a", 0, 2, 2, "prefill", 4, ((1, 3), (2, 0)), (0b1110, 0b0101))
    back = decode_payload(*encode_payload(t))
    assert back == t
    with pytest.raises(Exception, match="not among its pass's"):
        decode_payload(*encode_payload(Token(4, 4, 7, 9, (1,) * 7, (100, 0, 5), 3, 0, b"a", 0, 2, 2, "prefill", 4,
                                             ((1, 3), (2, 0)), (0b0110, 0b0101))))
    u = Token(5, 5, 9, 3, (1,) * 7, (100, 0, 5), 3, 0, b"b", 1, 2, 2, "prefill", 4, ((3, 2), (0, 2)), (0b1110, 0b0101))
    s = expert_summary([t, u])
    assert s["use"][0] == [0.0, 0.5, 0.5, 1.0] and s["use"][1] == [1.0, 0.0, 1.0, 0.0]
    assert s["passes"] == 1 and s["experts_per_layer_per_pass"] == 2.5 and s["tokens_per_pass"] == 2
    assert "layer 1: e0 100 %, e1 0 %, e2 100 %, e3 0 %" in summary_lines(s)[0]
    assert expert_summary([Token(0, 0, 1, 2, (0,) * 7, (0, 0, 0), 0, 0, b"")]) is None


# ---------------------------------------------------------------------------------------------
# the engine: native board

@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_engine_matches_reference_bit_for_bit(name, tmp_path, build_root):
    """Every step's logits, tokens and experts as the reference's: one-token and batched passes (whose
    tokens are routed to different experts), greedy (the head's tile scan) and sampled."""
    from nativeboard import assert_matches_reference, assert_steps_match, native_link, run
    qm, kv = model(name)
    with native_link(qm, tmp_path, build_root, kv=kv, batch=4) as (link, boot):
        assert boot[-1].image_ok and boot[-1].golden == "exact"
        for T in (1, 4):
            ref = generate(qm, PROMPT, 12, flags=FLAG_LOGITS, kv=kv, batch=T)
            toks, logits, done = run(link, PROMPT, 12, batch=T)
            assert_matches_reference(toks, logits, ref)
            if T > 1:   # a pass whose tokens chose different experts read more than k of them
                assert any(bin(m).count("1") > qm.config.moe_top_k for t in toks for m in t.pass_experts)
        for temperature, seed in ((0.0, 0), (0.9, 5)):
            ref = generate(qm, PROMPT, 10, temperature, 0.0, seed, kv=kv, batch=4)
            toks, _, done = run(link, PROMPT, 10, temperature, 0.0, seed, logits=False, batch=4)
            assert_steps_match(toks, ref)


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("name", ["q8-k2", "q4-k1"])
def test_speculative_decoding_verifies_through_the_experts(name, tmp_path, build_root):
    """Prompt lookup and a draft model: a verifying pass runs the drafts through the experts together;
    the steps are the reference's and the tokens plain greedy decoding's."""
    from converter.draft import attach
    from nativeboard import assert_steps_match, native_link, run
    qm, kv = model(name)
    plain = generate(qm, REPEATS, 16, kv=kv)
    with native_link(qm, tmp_path, build_root, kv=kv, batch=5) as (link, _):
        ref = generate(qm, REPEATS, 16, kv=kv, batch=5, speculate="lookup", draft_k=4)
        toks, _, done = run(link, REPEATS, 16, logits=False, speculate="lookup", draft_k=4)
        assert_steps_match(toks, ref)
        assert greedy_ids(ref) == greedy_ids(plain) and done.verify_passes > 0
    _, ird = random_model(seed=20, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=32, n_layers=1,
                          vocab_size=qm.config.vocab_size, max_seq_len=qm.config.max_seq_len)
    qd = attach(qm, quantize(ird, "q8", 8))
    with native_link(qd, tmp_path, build_root, kv=kv, batch=4) as (link, boot):
        assert boot[-1].can_draft
        ref = generate(qd, REPEATS, 16, kv=kv, batch=4, speculate="draft", draft_k=3)
        toks, _, done = run(link, REPEATS, 16, logits=False, speculate="draft", draft_k=3)
        assert_steps_match(toks, ref)
        assert greedy_ids(ref) == greedy_ids(plain) and done.verify_passes > 0


# ---------------------------------------------------------------------------------------------
# the engine: emulated RP2040

@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("name", ["q8-k2", "q4-k1"])
def test_emulated_rp2040_matches_reference_bit_for_bit(name, tmp_path):
    """The Cortex-M0+ build: every step's logits and experts as the reference's in one-token and
    batched passes and through speculative decoding, with row scales (the HAL's row-scaled kernels) and
    f32 scales; with the latter's rows (no padding a kernel skips) the harness's count of the bytes the
    core loaded in each pass equals the engine's: only the chosen experts' rows, each once a pass."""
    from converter.formats import padding_per_step
    from emuboard import emu_link, require_emulator
    from nativeboard import assert_matches_reference, assert_steps_match, run
    require_emulator()
    for scales in ("row", "f32"):
        qm, kv = model(name, scales=scales)
        exact_bytes = not sum(padding_per_step(parse_header(build_blob(qm)), True, qm.config.n_out).values())
        assert exact_bytes == (scales == "f32")
        c, lengths = qm.config, {e.name: e.length for e in parse_header(build_blob(qm)).entries}
        expert_bytes = lambda masks: sum(lengths[f"{pre}{w}"] for layer, mask in enumerate(masks)
                                         for e, pre in enumerate(c.ffn_prefixes(layer)) if mask >> e & 1
                                         for w in ("w1", "w2", "w3"))
        experts = tuple(f"{pre}{w}" for layer in range(c.n_layers) for pre in c.ffn_prefixes(layer) for w in ("w1", "w2", "w3"))
        with emu_link(qm, tmp_path, tmp_path / "b", kv=kv, batch=4, watch=experts) as (link, boot, board):
            assert boot[-1].golden == "exact"
            for T in (1, 4):
                board.read_counts()
                ref = generate(qm, PROMPT, 4, flags=FLAG_LOGITS, kv=kv, batch=T)
                toks, logits, done = run(link, PROMPT, 4, batch=T)
                assert_matches_reference(toks, logits, ref)
                counts = {c["step"]: c for c in board.read_counts()}
                assert sorted(counts) == sorted({t.chunk for t in toks})
                assert all(counts[t.step]["bytes"] == list(t.bytes_read) for t in toks if t.step == t.chunk
                           and exact_bytes), [(counts[t.step]["bytes"], t.bytes_read) for t in toks if t.step == t.chunk]
                # the core's flash reads inside the experts' rows: the chosen experts' (the pass's), each once a pass
                assert all(counts[t.step]["watched"] == expert_bytes(t.pass_experts) for t in toks
                           if t.step == t.chunk and exact_bytes)
            ref = generate(qm, REPEATS, 8, kv=kv, batch=4, speculate="lookup", draft_k=3)
            toks, _, done = run(link, REPEATS, 8, logits=False, speculate="lookup", draft_k=3)
            assert_steps_match(toks, ref)
            assert greedy_ids(ref) == greedy_ids(generate(qm, REPEATS, 8, kv=kv)) and done.verify_passes > 0


# ---------------------------------------------------------------------------------------------
# Mixtral through the Hugging Face importer

def mixtral(seed=0, **over):
    """A random MixtralForCausalLM (transformers, CPU, eval), weights scaled so routing and logits are
    far from uniform."""
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=300, hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
              rope_theta=500.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    kw.update(over)
    torch.manual_seed(seed)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else p * 5)
    return model


def legacy_layout(folder):
    """The folder's fused experts rewritten as the published checkpoints store them: one tensor per
    expert, block_sparse_moe.experts.{e}.w1/w2/w3 and block_sparse_moe.gate."""
    from safetensors.torch import load_file, save_file
    sd, out = load_file(folder / "model.safetensors"), {}
    for name, t in sd.items():
        pre, _, rest = name.partition(".mlp.")
        if rest == "experts.gate_up_proj":
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{pre}.block_sparse_moe.experts.{e}.w1.weight"] = t[e, :half].contiguous()
                out[f"{pre}.block_sparse_moe.experts.{e}.w3.weight"] = t[e, half:].contiguous()
        elif rest == "experts.down_proj":
            for e in range(t.shape[0]):
                out[f"{pre}.block_sparse_moe.experts.{e}.w2.weight"] = t[e].contiguous()
        elif rest == "gate.weight":
            out[f"{pre}.block_sparse_moe.gate.weight"] = t
        else:
            out[name] = t
    (folder / "model.safetensors").unlink()
    save_file(out, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.slow
def test_mixtral_import_matches_transformers(tmp_path):
    """fp32 (our PyTorch model and the reference's fp32 model) within float tolerance of transformers'
    logits, from the fused layout transformers 5 saves and the published one-tensor-per-expert layout;
    the routers kept f32 and the quantized model's choices mostly the fp32 model's."""
    from converter.fidelity import quality_report
    from converter.load import load_model
    from converter.quantize import rope_tables
    from converter.torch_import import ir_to_module
    model = mixtral()
    model.save_pretrained(tmp_path / "hf")
    ids = PROMPT * 3
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(want).max() > 1.0
    ir = load_model(tmp_path / "hf")
    c = ir.config
    assert (c.n_experts, c.moe_top_k, c.hidden_dim, c.tied) == (4, 2, 40, False)
    with torch.no_grad():
        ours = ir_to_module(ir)(torch.tensor([ids]))[0].numpy()
    fp = Fp32Model(ir, *rope_tables(c))
    fp32 = np.stack([fp.forward(t, p) for p, t in enumerate(ids)])
    for got in (ours, fp32):
        np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=0)
    legacy_layout(tmp_path / "hf")
    again = load_model(tmp_path / "hf")
    assert again.tensors.keys() == ir.tensors.keys()
    assert all(np.array_equal(again.tensors[n], ir.tensors[n]) for n in ir.tensors)
    qm = quantize(ir, "q8", 16)
    assert qm.recipe["layers.1.ffn.router"] == "f32"
    assert quality_report(ir, qm, positions=32, tokens=ids)["router_agreement"] > 0.9


@pytest.mark.parametrize("arch,needs", [("Qwen2MoeForCausalLM", "shared expert"), ("OlmoeForCausalLM", "q_norm"),
                                        ("DeepseekV3ForCausalLM", "latent attention"),
                                        ("GptOssForCausalLM", "attention sinks")])
def test_other_mixtures_of_experts_refused_by_name(arch, needs, tmp_path):
    from converter.load import load_model
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(f'{{"architectures": ["{arch}"], "hidden_size": 64}}')
    with pytest.raises(ModelError, match=f"{arch} is a mixture of experts flashlm does not import: it needs "
                                         f".*{needs}.*MixtralForCausalLM") as e:
        load_model(tmp_path / "hf")
    assert "\n" not in str(e.value)
