"""The multi-token forward pass: T tokens through each layer together, each weight row read once for
all of them, every token's logits equal to the one-token pass's bit for bit — in the reference and in
the C engine (under ASan/UBSan here; over the protocol on the native and emulated boards below)."""
import struct
import subprocess

import numpy as np
import pytest

from converter.blob import build_blob, parse_header
from converter.formats import StateTiers
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
    # convert's defaults: row scales (one activation scale per input) and integer attention (k12)
    "q8-row-k12kv": (lambda: random_model(seed=5, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=128)[1],
                     "q8", 16, [], "row", "k12"),
    "q4-row-untied": (lambda: random_model(seed=6, tied=False, dim=64, n_heads=4, hidden_dim=96)[1], "q4", 32, [], "row", "f32"),
    # w2's 512 columns: a pass of 4 stages its activations as int16 pairs on the RP2040 (kernels_arch.h)
    "q8-row-wide-ffn": (lambda: random_model(seed=7, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=512)[1],
                        "q8", 16, [], "row", "k12"),
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


def chunk_bytes(qm, kv, pos, n, head=True):
    """(flash, psram, sram) bytes one pass of n tokens at positions pos.. reads, all in flash and the
    KV cache in SRAM: every matrix once; per token every norm (ple.norm once per layer), its embedding
    row, PLE table row and RoPE rows, and its attention's K and V rows; with ``head``, per token the
    final norm, and every head row once for all n tokens."""
    c = qm.config
    h = parse_header(build_blob(qm, state=StateTiers(kv=kv)))
    by = {e.name: e for e in h.entries}
    out = by["tok_embeddings" if c.tied else "output"]
    gathered = ("tok_embeddings", "ple.table", "output")
    mats = sum(e.length for e in h.entries if e.fmt in ("q8", "q4") and e.name not in gathered)
    norms = 2 * c.n_layers * c.dim * 4 + c.n_layers * (c.ple_dim + c.dim) * 4 * bool(c.ple_dim)
    per_token = by["tok_embeddings"].row_stride + (by["ple.table"].row_stride if c.ple_dim else 0) + c.head_dim * 4
    flash = mats + n * (norms + per_token) + ((n * c.dim * 4 + c.n_out * out.row_stride) if head else 0)
    pair = 2 * c.head_dim * 4 if kv == "f32" else 8 + c.head_dim * (3 if kv == "k12" else 2)   # a K and a V row
    return flash, 0, sum(c.n_layers * c.n_heads * (p + 1) * pair for p in range(pos, pos + n))


def pass_bytes(qm, kv, ids_len, T):
    """Bytes of passes of up to T tokens over positions 0..ids_len-1, every token's head computed."""
    per = [chunk_bytes(qm, kv, pos, min(T, ids_len - pos)) for pos in range(0, ids_len, T)]
    return tuple(map(sum, zip(*per)))


@pytest.mark.native
@pytest.mark.parametrize("name", MODELS)
def test_c_engine_multi_token_logits_equal_one_token_logits(name, blob_checker, tmp_path):
    qm, kv = model(name)
    blob = tmp_path / "m.flmb"
    blob.write_bytes(build_blob(qm, state=StateTiers(kv=kv)))
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


# ---------------------------------------------------------------------------------------------
# batched prefill over the protocol: the native board and the emulated RP2040

@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("builds")


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("name", ["q8-gqa", "q4-untied-int8kv", "ple-f16", "q8-row-k12kv", "q4-row-untied"])
def test_batched_prefill_on_the_native_board_equals_the_reference(name, tmp_path, build_root):
    """GENERATE with prefill passes of T tokens: every step's logits (LOGITS flag) and tokens equal
    the reference's — which equal the one-token pass's — and the TOKEN frames name the passes."""
    from converter.reference import FLAG_LOGITS, generate
    from nativeboard import assert_matches_reference, assert_steps_match, native_link, run
    qm, kv = model(name)
    prompt = [int(i) for i in np.random.default_rng(8).integers(0, qm.config.vocab_size, 10)]
    one = generate(qm, prompt, 6, flags=FLAG_LOGITS, kv=kv)
    with native_link(qm, tmp_path, build_root, kv=kv, batch=4) as (link, boot):
        assert boot[-1].batch == 4
        for T in (1, 3, 4):
            ref = generate(qm, prompt, 6, flags=FLAG_LOGITS, kv=kv, batch=T)
            assert [r["logits_crc"] for r in ref] == [r["logits_crc"] for r in one]
            toks, logits, done = run(link, prompt, 6, batch=T)
            assert done.reason == "max_tokens" and done.passes == len({r["chunk"] for r in ref})
            assert_matches_reference(toks, logits, ref)
            assert (T == 1) == all(t.kind == "one" for t in toks)          # (the kinds: assert_steps_match)
            # greedy without LOGITS: the prompt's passes skip the head, its last token prunes it
            ref = generate(qm, prompt, 6, kv=kv, batch=T)
            toks, _, done = run(link, prompt, 6, logits=False, batch=T)
            assert_steps_match(toks, ref)
            assert done.bytes_read == tuple(map(sum, zip(*{t.chunk: t.bytes_read for t in toks}.values())))
        toks, _, _ = run(link, prompt, 2, logits=False)          # batch 0: the board's
        assert [t.chunk_len for t in toks[:8]] == [4] * 8
        err = run(link, prompt, 2, batch=5)[2]
        assert err.name == "bad_message" and "at most 4" in err.text


@pytest.mark.native
@pytest.mark.slow
def test_prefill_bytes_fall_with_the_batch(tmp_path, build_root):
    """A prefill pass reads every matrix once: its TOKEN frames carry exactly the pass's bytes, and
    flash bytes per prompt token fall about T-fold."""
    from nativeboard import native_link, run
    qm, kv = model("q8-gqa")
    prompt = list(range(1, 18))
    per_token = {}
    with native_link(qm, tmp_path, build_root, batch=8) as (link, _):
        for T in (1, 4, 8):
            toks, _, _ = run(link, prompt, 1, logits=False, batch=T)
            pre = {t.chunk: t for t in toks if t.out_id is None}       # passes of prompt tokens only
            assert sorted(pre) == list(range(0, 16, T)) and all(t.chunk_len == T for t in pre.values())
            for t in pre.values():
                assert t.bytes_read == chunk_bytes(qm, kv, t.chunk, T, head=False)
            per_token[T] = sum(t.bytes_read[0] for t in pre.values()) / 16
    assert per_token[1] / per_token[4] > 3.3 and per_token[1] / per_token[8] > 6.0


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("name", ["q8-gqa", "ple-q8-mqa-int8kv", "q8-row-k12kv", "q4-row-untied", "q8-row-wide-ffn"])
def test_batched_passes_on_the_emulated_rp2040(name, tmp_path):
    """The Cortex-M0+ build: prefill passes of T tokens give every step's logits bit for bit (the
    HAL's row-scaled q8 and q4 kernels on blocks of copied rows included), speculative decoding
    (prompt lookup) gives plain greedy decoding's tokens, and the harness's count of the bytes the
    core loaded in each pass equals the engine's (each weight row copied once per pass, whatever T;
    for a model whose rows carry padding no kernel loads, test_rp2040_emu checks the difference)."""
    from converter.reference import FLAG_LOGITS, generate
    from emuboard import emu_link, require_emulator
    from nativeboard import assert_matches_reference, assert_steps_match, run
    from test_rp2040_emu import padding_per_step
    require_emulator()
    qm, kv = model(name)
    exact_bytes = padding_per_step(qm) == 0     # the core reads exactly the bytes the engine counts
    assert exact_bytes or name == "q4-row-untied"
    prompt = [int(i) for i in np.random.default_rng(9).integers(0, qm.config.vocab_size, 9)]
    with emu_link(qm, tmp_path, tmp_path / "b", kv=kv, batch=4) as (link, boot, board):
        assert boot[-1].batch == 4
        for T, flags in ((4, FLAG_LOGITS), (3, 0)):
            board.read_counts()
            ref = generate(qm, prompt, 3, flags=flags, kv=kv, batch=T)
            toks, logits, done = run(link, prompt, 3, logits=bool(flags), batch=T)
            if flags:
                assert_matches_reference(toks, logits, ref)
            assert [t.out_id for t in toks[8:]] == [r["out_id"] for r in ref[8:]]
            counts = {c["step"]: c for c in board.read_counts()}
            firsts = sorted({t.chunk for t in toks})
            assert sorted(counts) == firsts and len(firsts) == done.passes < len(toks)
            for t in toks:
                if t.step == t.chunk and exact_bytes:
                    assert counts[t.step]["bytes"] == list(t.bytes_read), f"pass {t.step}"
        board.read_counts()
        ref = generate(qm, REPEATS, 12, kv=kv, batch=4, speculate="lookup", draft_k=3)
        toks, _, done = run(link, REPEATS, 12, logits=False, speculate="lookup", draft_k=3)
        assert_steps_match(toks, ref)
        assert greedy_ids(ref) == greedy_ids(generate(qm, REPEATS, 12, kv=kv)) and done.verify_passes > 0
        counts = {c["step"]: c for c in board.read_counts()}
        assert sorted(counts) == sorted({t.chunk for t in toks})
        assert all(counts[t.step]["bytes"] == list(t.bytes_read) for t in toks if t.step == t.chunk and exact_bytes)


# ---------------------------------------------------------------------------------------------
# speculative decoding: the tokens of plain greedy decoding, token for token

def with_eos(qm, eos):
    """qm whose generations end at ``eos`` (its stop id)."""
    import dataclasses

    from converter.ir import StopIds, Tokenizer
    V = qm.config.vocab_size
    return dataclasses.replace(qm, tokenizer=Tokenizer([b"t%d" % i for i in range(V)], [0.0] * V, eos_id=eos),
                               stops=StopIds((eos,), "the test's EOS"))


def greedy_ids(steps):
    from converter.reference import NO_TOKEN
    return [r["out_id"] for r in steps if r["out_id"] != NO_TOKEN]


REPEATS = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4]   # prompt lookup finds its n-grams


@pytest.mark.parametrize("name", ["q8-gqa", "q4-untied-int8kv", "ple-f16"])
def test_reference_speculation_is_greedy_exact(name):
    from converter.reference import FLAG_ALL_LOGITS, generate
    qm, kv = model(name)
    plain = generate(qm, REPEATS, 24, kv=kv, flags=FLAG_ALL_LOGITS)    # every step's logits CRC
    for k in (1, 3, 7):
        spec = generate(qm, REPEATS, 24, kv=kv, batch=8, speculate="lookup", draft_k=k)
        assert greedy_ids(spec) == greedy_ids(plain) and len(spec) == len(plain)
        ver = [i for i, r in enumerate(spec) if r["kind"] == "verify"]
        assert ver and [spec[i]["logits_crc"] for i in ver] == [plain[i]["logits_crc"] for i in ver]


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("name", ["q8-gqa", "q4-untied-int8kv", "ple-f16", "q8-row-k12kv"])
def test_prompt_lookup_speculation_on_the_native_board(name, tmp_path, build_root):
    """Verifying passes on the device produce exactly the reference's steps (ids, passes, logits
    CRCs), whose tokens are plain greedy decoding's; LOGITS gives every verified step's logits bit for
    bit; an EOS met inside a verification ends the generation there, as plain decoding would."""
    from converter.reference import FLAG_LOGITS, generate
    from nativeboard import assert_matches_reference, assert_steps_match, native_link, run
    qm, kv = model(name)
    plain = generate(qm, REPEATS, 24, kv=kv)
    eos = greedy_ids(plain)[7]
    with native_link(qm, tmp_path, build_root, kv=kv, batch=5) as (link, boot):
        for k in (1, 4):
            ref = generate(qm, REPEATS, 24, kv=kv, batch=5, speculate="lookup", draft_k=k)
            toks, _, done = run(link, REPEATS, 24, logits=False, speculate="lookup", draft_k=k)
            assert_steps_match(toks, ref)
            assert [t.out_id for t in toks if t.out_id is not None] == greedy_ids(plain)
            ver = {t.chunk: t for t in toks if t.kind == "verify"}
            assert ver and done.verify_passes == len(ver) and done.drafted == sum(t.chunk_len - 1 for t in ver.values())
            assert done.accepted == sum(t.chunk_used - 1 for t in ver.values()) and done.generated == 24
        ref = generate(qm, REPEATS, 24, kv=kv, batch=5, speculate="lookup", draft_k=4, flags=FLAG_LOGITS)
        toks, logits, _ = run(link, REPEATS, 24, speculate="lookup", draft_k=4)
        assert_matches_reference(toks, logits, ref)
        err = run(link, REPEATS, 4, temperature=0.8, speculate="lookup")[2]
        assert err.name == "bad_message" and "greedy" in err.text
        err = run(link, REPEATS, 4, speculate="lookup", draft_k=5)[2]
        assert err.name == "bad_message" and "this placement's is 5" in err.text
    qe = with_eos(qm, eos)
    with native_link(qe, tmp_path, build_root, kv=kv, batch=5) as (link, _):
        ref = generate(qe, REPEATS, 24, kv=kv, batch=5, speculate="lookup", draft_k=4)
        toks, _, done = run(link, REPEATS, 24, logits=False, speculate="lookup", draft_k=4)
        assert_steps_match(toks, ref)
        assert done.reason == "eos" and toks[-1].out_id == eos
        assert [t.out_id for t in toks if t.out_id is not None] == greedy_ids(generate(qe, REPEATS, 24, kv=kv))


@pytest.mark.native
@pytest.mark.slow
def test_speculation_with_a_sliding_window(tmp_path, build_root):
    """Verifying passes stop at the context's end; the window slides between passes; the tokens stay
    plain greedy decoding's."""
    from converter.reference import FLAG_SLIDE, generate
    from nativeboard import assert_steps_match, native_link, run
    _, ir = random_model(seed=12, max_seq_len=20)
    qm = quantize(ir, "q8", 32)
    plain = generate(qm, REPEATS, 40, flags=FLAG_SLIDE)
    ref = generate(qm, REPEATS, 40, flags=FLAG_SLIDE, batch=4, speculate="lookup", draft_k=3)
    assert greedy_ids(ref) == greedy_ids(plain) and max(r["pos"] for r in ref) == 19
    with native_link(qm, tmp_path, build_root, batch=4) as (link, _):
        toks, _, done = run(link, REPEATS, 40, logits=False, slide=True, speculate="lookup", draft_k=3)
    assert_steps_match(toks, ref)
    assert done.generated == 40 and done.verify_passes > 0


@pytest.mark.native
@pytest.mark.slow
def test_cli_run_batch_and_speculate(tmp_path, capsys):
    """`flashlm run --batch T --speculate lookup --draft-k K`: the report's passes (prefill chunks,
    acceptance, tokens per verifying pass, bytes per emitted token) in the summary and the JSON; the
    refusals are one line and exit code 2."""
    import json

    from converter.blob import read_blob, read_header
    from converter.reference import generate
    from converter.torch_import import save_checkpoint
    from host.cli.main import main
    m, _ = random_model(seed=13, max_seq_len=40)
    save_checkpoint(tmp_path / "m.pt", m)
    out = tmp_path / "model"
    assert main(["convert", str(tmp_path / "m.pt"), "-o", str(out), "--batch", "6", "--no-report"]) == 0
    qm = read_blob(out / "model.flmb")
    ids = ",".join(map(str, REPEATS))
    rc = main(["run", "--board", "native", "--model", str(out), "--prompt-ids", ids, "--max-tokens", "20",
               "--batch", "5", "--speculate", "lookup", "--draft-k", "4", "--json", str(tmp_path / "r.json")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    d = json.loads((tmp_path / "r.json").read_text())
    kv = read_header(out / "model.flmb").state_tiers.kv      # convert's default: k12
    ref = generate(qm, REPEATS, 20, batch=5, speculate="lookup", draft_k=4, kv=kv)
    assert d["generated_ids"] == greedy_ids(ref) == greedy_ids(generate(qm, REPEATS, 20, kv=kv))
    pa = d["summary"]["passes"]
    assert pa["prefill"]["passes"] == 3 and pa["prefill"]["tokens"] == len(REPEATS)
    dec = pa["decode"]
    ver = {r["chunk"]: r for r in ref if r["kind"] == "verify"}
    assert dec["verify_passes"] == len(ver) and dec["drafted"] == sum(r["chunk_len"] - 1 for r in ver.values())
    assert dec["accepted"] == sum(r["chunk_used"] - 1 for r in ver.values())
    assert d["done"]["verify_passes"] == dec["verify_passes"] and dec["bytes_per_token"]["flash"] > 0
    assert "speculative decoding (lookup):" in cap.out and "prefill in 3 passes" in cap.out
    for args, why in ((["--temperature", "0.8", "--speculate", "lookup"], "greedy tokens only"),
                      (["--speculate", "lookup", "--draft-k", "6"], "at most board native's 6"),
                      (["--batch", "7"], "at most 6 token(s) per forward pass"),
                      (["--draft-k", "2"], "--draft-k needs --speculate")):
        rc = main(["run", "--board", "native", "--model", str(out), "--prompt-ids", ids, "--max-tokens", "2"] + args)
        err = capsys.readouterr().err
        assert rc == 2 and why in err and err.count("\n") == 1, err


# ---------------------------------------------------------------------------------------------
# the draft model: a small model of the same vocabulary, carried in the image

def with_draft(qm, seed=20, kv="int8"):
    from converter.draft import attach
    _, ird = random_model(seed=seed, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=32, n_layers=1,
                          vocab_size=qm.config.vocab_size, max_seq_len=16)
    return attach(qm, quantize(ird, "q8", 8), kv=kv)


def test_draft_travels_in_the_blob_and_refuses_another_vocabulary():
    from converter.blob import build_blob, parse_header, read_blob
    from converter.draft import attach
    from converter.formats import DRAFT
    from converter.ir import ModelError
    qm, _ = model("q8-gqa")
    qd = with_draft(qm)
    blob = build_blob(qd, state=StateTiers(batch=4))
    h = parse_header(blob)
    assert [e.name for e in h.entries][-2:] == [DRAFT, "golden"]
    back = read_blob(blob)
    assert back.draft.kv == "int8" and back.draft.qm.config.max_seq_len == qm.config.max_seq_len
    d = next(e for e in h.entries if e.name == DRAFT)
    assert parse_header(blob[d.offset:d.offset + d.length]).state_tiers.batch == 4     # the model's batch
    assert h.model_hash != parse_header(build_blob(qm, state=StateTiers(batch=4))).model_hash   # the pair is the model
    _, other = random_model(seed=3, vocab_size=50)
    with pytest.raises(ModelError, match="vocabulary"):
        attach(qm, quantize(other, "q8", 8))


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("name,kv", [("q8-gqa", "int8"), ("ple-f16", "f32")])
def test_draft_model_speculation_on_the_native_board(name, kv, tmp_path, build_root):
    """The draft model's greedy tokens as drafts: the device's steps equal the reference's, whose
    tokens are plain greedy decoding's; HELLO says the board can draft."""
    from converter.reference import FLAG_SLIDE, generate
    from nativeboard import assert_steps_match, native_link, run
    qm, mkv = model(name)
    qd = with_draft(qm, kv=kv)
    prompt = [int(i) for i in np.random.default_rng(10).integers(0, qm.config.vocab_size, 7)]
    plain = generate(qm, prompt, 30, kv=mkv, flags=FLAG_SLIDE)
    with native_link(qd, tmp_path, build_root, kv=mkv, batch=4) as (link, boot):
        assert boot[-1].can_draft
        for k in (1, 3):
            ref = generate(qd, prompt, 30, kv=mkv, batch=4, speculate="draft", draft_k=k, flags=FLAG_SLIDE)
            toks, _, done = run(link, prompt, 30, logits=False, speculate="draft", draft_k=k, slide=True)
            assert_steps_match(toks, ref)
            assert greedy_ids(ref) == greedy_ids(plain) and done.verify_passes > 0
            assert sum(done.draft_bytes) > 0 and done.phase_us[6] >= 0
    with native_link(qm, tmp_path, build_root, kv=mkv, batch=4) as (link, boot):   # no draft in the image
        assert not boot[-1].can_draft
        err = run(link, prompt, 3, speculate="draft")[2]
        assert err.name == "bad_message" and "no draft model" in err.text


@pytest.mark.emulated
@pytest.mark.slow
def test_draft_model_speculation_on_the_emulated_rp2040(tmp_path):
    """On the Cortex-M0+: greedy-exact, and the harness's count of what each pass read (the draft's
    weights in flash and its KV cache in SRAM included) equals the engine's."""
    from converter.reference import generate
    from emuboard import emu_link, require_emulator
    from nativeboard import assert_steps_match, run
    from test_rp2040_emu import padding_per_step
    require_emulator()
    qm, _ = model("q8-gqa")
    qd = with_draft(qm)
    assert padding_per_step(qm) == 0 and padding_per_step(qd.draft.qm) == 0
    prompt = [5, 9, 2, 7, 1]
    with emu_link(qd, tmp_path, tmp_path / "b", batch=4) as (link, boot, board):
        assert boot[-1].can_draft
        board.read_counts()
        ref = generate(qd, prompt, 10, batch=4, speculate="draft", draft_k=3)
        toks, _, done = run(link, prompt, 10, logits=False, speculate="draft", draft_k=3)
        counts = {c["step"]: c for c in board.read_counts()}
    assert_steps_match(toks, ref)
    assert greedy_ids(ref) == greedy_ids(generate(qm, prompt, 10)) and done.verify_passes > 0
    assert all(counts[t.step]["bytes"] == list(t.bytes_read) for t in toks if t.step == t.chunk)
    assert sum(done.draft_bytes) > 0 and done.draft_bytes[2] > 0         # its weights, and its KV cache in SRAM
