"""The engine's speed work on the boards, bit for bit against the reference: prompt steps without
the output layer, the greedy head's tile scan (ids, head rows, CRCs where a whole head was computed),
the int8 KV cache (a placement option: blob header or LAYOUT), the sliding window — on the native
board and the emulated RP2040 (whose harness also counts the bytes the core reads)."""
import struct
import subprocess

import numpy as np
import pytest

from converter.blob import build_blob, parse_header
from converter.formats import StateTiers, layout_id_of
from converter.ir import QTensor
from converter.footprint import region_bytes
from converter.quantize import quantize
from converter.reference import FLAG_ALL_LOGITS, FLAG_LOGITS, FLAG_SLIDE, NO_TOKEN, generate
from host.link.cobs import encode_raw_frame
from host.link.messages import Error, Hello, Layout, MsgType
from modelzoo import random_model, random_ple_model, spread_head, with_head_index
from nativeboard import (assert_matches_reference, assert_steps_match, drain, native_link, recv_until, run,
                         token_bytes_read)

OUTPUT, SAMPLE = 4, 5     # phase indices

CASES = {
    # name: (model factory, default format, group, overrides, scales); all but the last get a head
    # index of tiles of 8 rows
    "q8-tied-spread": (lambda: spread_head(random_model(seed=41)[1], span=6.0), "q8", 32, [], "f32"),
    "q4-untied-head-q4": (lambda: spread_head(random_model(seed=42, dim=64, n_heads=4, n_kv_heads=4, hidden_dim=96,
                                                           tied=False, vocab_size=120)[1], span=6.0), "q4", 16,
                          ["head=q4"], "f32"),
    "ple-out-lt-vocab-f16": (lambda: spread_head(random_ple_model(seed=43, out_vocab=50), span=6.0), "q4", 16,
                             ["head=q4"], "f16"),
    "q8-no-index": (lambda: random_model(seed=44)[1], "q8", 32, [], "f32"),   # greedy steps: the whole head
}


def qmodel(case):
    make, fmt, g, ov, scales = CASES[case]
    qm = quantize(make(), fmt, g, ov, scales=scales)
    return qm if case == "q8-no-index" else with_head_index(qm, 8)


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("speed-builds")


# ---------------------------------------------------------------------------------------------
# prefill without the head, pruned greedy head

@pytest.mark.native
@pytest.mark.parametrize("case", CASES)
def test_default_mode_matches_reference_and_all_logits_ids(case, tmp_path, build_root):
    qm = qmodel(case)
    c = qm.config
    prompt = [1, c.vocab_size - 1, 3, 4, 5]
    with native_link(qm, tmp_path, build_root) as (link, _):
        for temperature, top_p, seed in [(0.0, 0.0, 0), (0.9, 0.8, 77)]:
            ref = generate(qm, prompt, 30, temperature, top_p, seed)
            toks, logits, done = run(link, prompt, 30, temperature, top_p, seed, logits=False)
            assert not logits and done.reason == "max_tokens"
            assert_steps_match(toks, ref)
            full, _, _ = run(link, prompt, 30, temperature, top_p, seed, logits=False, all_logits=True)
            assert_steps_match(full, generate(qm, prompt, 30, temperature, top_p, seed, flags=FLAG_ALL_LOGITS))
            assert [t.out_id for t in full] == [t.out_id for t in toks]          # the same decode output
            for t in toks:
                assert t.bytes_read == token_bytes_read(qm, t), t.step
            pre, dec = toks[:len(prompt) - 1], toks[len(prompt) - 1:]
            assert all(t.head_rows == 0 and t.logits_crc == 0 and t.us[OUTPUT] == 0 and t.us[SAMPLE] == 0
                       and t.out_id is None for t in pre)
            if temperature > 0:     # sampling needs every logit
                assert all(t.head_rows == c.n_out and t.logits_crc != 0 for t in dec)
            else:                   # greedy: no CRC, the argmax inside the output phase
                assert all(0 < t.head_rows <= c.n_out and t.logits_crc == 0 and t.us[SAMPLE] == 0 for t in dec)
                if case == "q8-no-index":
                    assert all(t.head_rows == c.n_out for t in dec)
                else:               # the tile scan skips tiles
                    assert sum(t.head_rows for t in dec) < 0.8 * c.n_out * len(dec)
            assert all(f.head_rows == c.n_out and f.logits_crc != 0 for f in full)


@pytest.mark.native
def test_unknown_generate_flags_are_refused(tmp_path, build_root):
    qm = qmodel("q8-no-index")
    with native_link(qm, tmp_path, build_root) as (link, _):
        payload = struct.pack("<IffQIBBBBI2I", 3, 0.0, 0.0, 0, 0x9, 0, 0, 0, 0, 2, 1, 2)
        link.port.write(encode_raw_frame(MsgType.GENERATE, link.tx_seq, payload))
        link.tx_seq += 1
        err = recv_until(link, lambda m: isinstance(m, Error))[-1]
        assert err.name == "bad_message" and "flags 9 has unknown bits" in err.text
        toks, _, done = run(link, [1, 2], 3, logits=False)
        assert done.generated == 3 and len(toks) == 4


# ---------------------------------------------------------------------------------------------
# the integer KV caches: int8, k12 (12-bit K codes, int8 V codes)

KV_MODELS = {
    "gqa-hd12": dict(seed=45),                                                     # head_dim 12 (x4): no padding
    "mha-hd6": dict(seed=46, dim=24, n_heads=4, n_kv_heads=4, hidden_dim=40, vocab_size=50),   # int8 rows padded to 4
}
KV_GROUP = {"gqa-hd12": 32, "mha-hd6": 24}


def kv_model(name):
    return with_head_index(quantize(spread_head(random_model(**KV_MODELS[name])[1]), "q8", KV_GROUP[name]))


def kv_bytes(qm, pos, kv):
    """The KV bytes attention reads in a step: per head and position a K and a V row's scale and codes."""
    c, hd = qm.config, qm.config.head_dim
    pair = 2 * hd * 4 if kv == "f32" else 8 + hd * (3 if kv == "k12" else 2)
    return c.n_layers * c.n_heads * (pos + 1) * pair


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("kv0", ["int8", "k12"])
@pytest.mark.parametrize("name", KV_MODELS)
def test_integer_kv_cache_bit_exact_and_switchable_by_layout(name, kv0, tmp_path, build_root, blob_checker):
    qm = kv_model(name)
    c = qm.config
    blob = build_blob(qm, state=StateTiers(kv=kv0))
    h = parse_header(blob)
    assert h.state_tiers.kv == kv0 and h.layout_id != parse_header(build_blob(qm)).layout_id
    (tmp_path / "i8.flmb").write_bytes(blob)
    out = subprocess.run([str(blob_checker), str(tmp_path / "i8.flmb")], capture_output=True, text=True).stdout
    # the smallest group of any matrix (q8's output layer takes groups of 8: quantize.HEAD_GROUP_Q8)
    rb = region_bytes(c, min(t.group_size for t in qm.tensors.values() if isinstance(t, QTensor)), kv0)
    assert out.split() == ["ok", str(rb["kv"]), str(rb["logits"]), str(rb["scratch"])]
    prompt = [2, 7, 1]
    with native_link(qm, tmp_path, build_root, blob_bytes=blob) as (link, boot):
        assert [m for m in boot if isinstance(m, Hello)][-1].layout_id == h.layout_id
        for i, kv in enumerate((kv0, "f32", {"int8": "k12", "k12": "int8"}[kv0], kv0)):
            if i:
                tiers = bytes(len(h.entries))
                st = StateTiers(kv=kv).to_u32()
                link.send(Layout(layout_id_of(tiers, st), st, tiers))
                msgs = drain(link)
                assert any(isinstance(m, Hello) and m.layout_id == layout_id_of(tiers, st) for m in msgs)
                assert any(getattr(m, "text", "").endswith(f"KV cache {kv} in SRAM") for m in msgs)
            toks, logits, _ = run(link, prompt, 20)                      # every step's logits, bit for bit
            assert_matches_reference(toks, logits, generate(qm, prompt, 20, flags=FLAG_LOGITS, kv=kv))
            toks, _, _ = run(link, prompt, 20, logits=False)            # default mode: pruned, prefill skipped
            assert_steps_match(toks, generate(qm, prompt, 20, kv=kv))
            for t in toks:
                flash, _, sram = token_bytes_read(qm, t)
                assert t.bytes_read == (flash, 0, kv_bytes(qm, t.pos, kv)), (kv, t.step)
    # what an integer KV cache costs: the logits move, the argmax mostly stays
    a = generate(qm, prompt, 20, flags=FLAG_LOGITS)
    b = generate(qm, prompt, 20, flags=FLAG_LOGITS, kv=kv0)
    assert any(not np.array_equal(x["logits"], y["logits"]) for x, y in zip(a, b))


@pytest.mark.native
def test_layout_refuses_an_unknown_kv_format(tmp_path, build_root):
    qm = kv_model("gqa-hd12")
    h = parse_header(build_blob(qm))
    tiers = bytes(len(h.entries))
    with native_link(qm, tmp_path, build_root) as (link, _):
        st = 15 << 12          # no KV format has code 15
        link.send(Layout(layout_id_of(tiers, st), st, tiers))
        err = [m for m in drain(link) if isinstance(m, Error)]
        assert err and err[0].name == "bad_layout" and "KV format" in err[0].text


# ---------------------------------------------------------------------------------------------
# sliding window

def slide_bytes(qm, kv):
    """The bytes a slide reads: the RoPE row n_drop (cos, sin) and every moved K row (f32 values, or
    an int8 row's scale and codes) and V row (whole, padding included: one block move)."""
    c = qm.config
    S, hd = c.max_seq_len, c.head_dim
    moved = S - 1 - (S - 1) // 2
    row = hd * 4 if kv == "f32" else 4 + ((hd + 3) & ~3)
    k = hd * 4 if kv == "f32" else 4 + hd
    return hd * 4, c.n_layers * moved * c.n_kv_heads * (k + row)


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("kv", ["f32", "int8"])
def test_sliding_window_bit_exact(kv, tmp_path, build_root):
    qm = with_head_index(quantize(spread_head(random_model(seed=47, max_seq_len=11)[1]), "q8", 32))
    S = qm.config.max_seq_len
    prompt = [3, 1, 4, 1, 5]
    with native_link(qm, tmp_path, build_root, blob_bytes=build_blob(qm, state=StateTiers(kv=kv))) as (link, _):
        toks, logits, done = run(link, prompt, 40, slide=True)
        ref = generate(qm, prompt, 40, flags=FLAG_LOGITS | FLAG_SLIDE, kv=kv)
        assert_matches_reference(toks, logits, ref)
        assert done.reason == "max_tokens" and done.generated == 40 and len(toks) == 44
        assert [t.pos for t in toks][:S + 2] == list(range(S)) + [S - (S - 1) // 2, S - (S - 1) // 2 + 1]
        plain, _, _ = run(link, prompt, 40, logits=False, slide=True)
        assert_steps_match(plain, generate(qm, prompt, 40, flags=FLAG_SLIDE, kv=kv))
        rope_b, kv_b = slide_bytes(qm, kv)
        for t, prev in zip(plain[1:], plain):
            flash, _, sram = token_bytes_read(qm, t) if kv == "f32" else (token_bytes_read(qm, t)[0], 0,
                                                                           kv_bytes(qm, t.pos, kv))
            slid = t.pos < prev.pos
            assert t.bytes_read == (flash + (rope_b if slid else 0), 0, sram + (kv_b if slid else 0)), t.step
        stopped, _, done = run(link, prompt, 40, logits=False)        # without the flag: context_full
        assert done.reason == "context_full" and len(stopped) == S
    # a context of 2 cannot keep position 0 and drop half: it ends as before
    tiny = quantize(random_model(seed=48, max_seq_len=2)[1], "q8", 32)
    assert len(generate(tiny, [1], 10, flags=FLAG_SLIDE)) == 2
    with native_link(tiny, tmp_path, build_root) as (link, _):
        toks, _, done = run(link, [1], 10, slide=True, logits=False)
        assert done.reason == "context_full" and len(toks) == 2
        assert_steps_match(toks, generate(tiny, [1], 10, flags=FLAG_SLIDE))


# ---------------------------------------------------------------------------------------------
# the emulated RP2040: the same bits, and the harness counts what the engine counts

@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("kv", ["int8", "k12"])
def test_emulated_rp2040_integer_kv_slide_pruned(kv, tmp_path):
    from emuboard import emu_link
    qm = with_head_index(quantize(spread_head(random_model(seed=49, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=64,
                                                           vocab_size=40, max_seq_len=9)[1], span=6.0), "q8", 8), 4)
    prompt = [1, 5, 2]
    steps = []
    blob = build_blob(qm, state=StateTiers(kv=kv))
    with emu_link(qm, tmp_path, tmp_path, blob_bytes=blob) as (link, boot, board):
        for flags, logits in ((FLAG_SLIDE, False), (FLAG_SLIDE | FLAG_LOGITS, True)):
            board.read_counts()
            toks, lg, done = run(link, prompt, 16, logits=logits, slide=True)
            ref = generate(qm, prompt, 16, flags=flags, kv=kv)
            if logits:
                assert_matches_reference(toks, lg, ref)
            else:
                assert_steps_match(toks, ref)
            counts = {c["step"]: c for c in board.read_counts()}
            assert [list(t.bytes_read) for t in toks] == [counts[t.step]["bytes"] for t in toks]
            steps.append(toks)
    pruned = steps[0][len(prompt) - 1:]
    assert any(t.head_rows < qm.config.n_out for t in pruned) and any(t.pos < p.pos for p, t in zip(pruned, pruned[1:]))
    assert all(t.head_rows == 0 and t.us[OUTPUT] == 0 for t in steps[0][:len(prompt) - 1])
    assert NO_TOKEN not in [t.out_id for t in pruned]


# ---------------------------------------------------------------------------------------------
# the CLI and the report: --kv, --slide, prefill vs decode

@pytest.mark.native
@pytest.mark.slow
def test_cli_convert_kv_run_slide_and_the_prefill_decode_report(tmp_path, capsys):
    import csv
    import json

    from converter.blob import read_blob, read_header
    from converter.torch_import import save_checkpoint
    from host.cli.main import main
    model, _ = random_model(seed=50, max_seq_len=16)
    save_checkpoint(tmp_path / "m.pt", model)
    out = tmp_path / "model"
    assert main(["convert", str(tmp_path / "m.pt"), "-o", str(out), "--kv", "int8", "--no-report"]) == 0
    assert read_header(out / "model.flmb").state_tiers.kv == "int8"
    assert json.loads((out / "manifest.json").read_text())["kv"] == "int8"
    qm = read_blob(out / "model.flmb")
    prompt = [1, 2, 3, 4]
    for kv, batch in ((None, 1), ("f32", None)):      # batch None: the blob's (convert's default, 4)
        args = ["run", "--board", "native", "--model", str(out), "--prompt-ids", ",".join(map(str, prompt)),
                "--max-tokens", "30", "--slide", "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
                "--png", str(tmp_path / "r.png")] + (["--kv", kv] if kv else []) + (["--batch", "1"] if batch else [])
        rc = main(args)
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        ref = generate(qm, prompt, 30, flags=FLAG_SLIDE, kv=kv or "int8", batch=batch or 4)
        rows = list(csv.DictReader((tmp_path / "r.csv").open()))
        assert [(r["kind"], int(r["head_rows"]), int(r["logits_crc"]), int(r["pos"])) for r in rows] == [
            ("prefill" if x["out_id"] == NO_TOKEN else "decode", x["head_rows"], x["logits_crc"], x["pos"]) for x in ref]
        assert len(rows) == 33 > qm.config.max_seq_len
        d = json.loads((tmp_path / "r.json").read_text())
        sm = d["summary"]
        assert d["params"]["slide"] and not d["params"]["all_logits"] and sm["flags"]["slide"]
        assert sm["prefill"]["steps"] == 3 and sm["decode"]["steps"] == 30
        assert [(int(r["pass_first"]), int(r["pass_tokens"])) for r in rows[:4]] == (
            [(0, 1), (1, 1), (2, 1), (3, 1)] if batch else [(0, 4)] * 4)
        if batch:    # one-token passes: the prompt steps whose output is unused spend nothing on the head
            assert sm["prefill"]["head_rows"]["pct_of_out_vocab"] == 0 and sm["prefill"]["phases"]["output"]["sum"] == 0
        else:        # one pass of the four prompt tokens; the report says so
            assert sm["passes"]["prefill"]["passes"] == 1 and "prefill in 1 pass of 4.0 tokens" in cap.out
        assert 0 < sm["decode"]["head_rows"]["pct_of_out_vocab"] <= 100
        assert sm["prefill_tok_per_s"] > 0 and sm["tokens_per_s"] > 0
        assert "prefill: 3 prompt tokens" in cap.out and "head rows (% of out_vocab)" in cap.out
        assert (tmp_path / "r.png").stat().st_size > 1000
    assert "KV cache f32: layout" in cap.out
    # plan --apply keeps the blob's KV format unless --kv names one; --kv f32 / int8: the header records it
    rc = main(["plan", str(out), "--board", "native", "--flash-only", "--apply", "--png", str(tmp_path / "p.png")])
    assert rc == 0 and read_header(out / "model.flmb").state_tiers.kv == "int8"
    rc = main(["plan", str(out), "--board", "native", "--flash-only", "--kv", "f32", "--apply",
               "--png", str(tmp_path / "p.png")])
    assert rc == 0 and read_header(out / "model.flmb").state_tiers.kv == "f32"
    rc = main(["plan", str(out), "--board", "native", "--flash-only", "--kv", "int8", "--apply",
               "--png", str(tmp_path / "p.png")])
    assert rc == 0 and read_header(out / "model.flmb").state_tiers.kv == "int8"
    assert json.loads((out / "manifest.json").read_text())["kv"] == "int8"
    # a random model: its rows are all alike, so convert's calibration left the head index out
    assert json.loads((out / "manifest.json").read_text())["head_index"]["kept"] is False
    assert "output layer: a greedy decode step: the whole head and its argmax" in capsys.readouterr().out
