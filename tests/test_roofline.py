"""Predicted forward passes of several tokens, speculative decoding and the roofline (converter/passcost.py,
speculation.py, roofline.py; `flashlm plan --roofline`): the structure of the predictions — a pass reads
each weight once and computes every token, so bytes per token fall about T-fold while arithmetic does
not; speculation pays on a bandwidth-bound board and not on a compute-bound one — and the prediction
beside the emulated RP2040's deterministic cycles (a loose band: the sizes are bench.passes')."""
import copy
import json
from pathlib import Path

import pytest

from converter import computecost as K
from converter import costmodel as C
from converter import passcost as P
from converter import roofline as R
from converter import speculation as S
from converter import timing
from converter.blob import build_blob, parse_header
from converter.formats import StateTiers
from converter.planner import plan
from converter.quantize import quantize
from modelzoo import random_model, with_head_index

ROOT = Path(__file__).resolve().parent.parent

def qmodel(seed=1, **kw):
    return quantize(random_model(seed=seed, **kw)[1], "q8", 32)


def synthetic_board(name, cycles_per_mac, flash_MBps, sram_budget=1 << 20):
    """A board with one knob each for arithmetic and for the bytes it streams from flash."""
    return {"name": name, "chip": "test", "clock_mhz": 100, "fpu": True,
            "tiers": {"flash": {"capacity": 1 << 24, "budget": 1 << 24, "seq_read_MBps": flash_MBps,
                                "row_latency_us": 0.0, "line_bytes": 32},
                      "sram": {"capacity": sram_budget, "budget": sram_budget, "seq_read_MBps": 1000.0,
                               "row_latency_us": 0.0, "line_bytes": 4}},
            "compute": {"cycles_per_mac": cycles_per_mac, "cycles_per_flop": cycles_per_mac}}


BANDWIDTH_BOUND = synthetic_board("bandwidth-bound", 0.05, 2.0)
COMPUTE_BOUND = synthetic_board("compute-bound", 50.0, 10000.0)


def board(name):
    from converter.boards import load_board
    return load_board(name)


def flash_placement(qm, prof, batch=8, kv="f32"):
    """Every tensor in flash, the state in SRAM (planned: the planner's batch and RAM checks)."""
    return P.Placement.of(plan(C.ModelSpec.from_quant(qm), prof, base="flash", batch=batch, kv=kv))


def test_a_one_token_pass_is_the_cost_models_step():
    qm = with_head_index(qmodel(), 4)     # a greedy step's head: the rows its tile scan visits (here 11)
    for prof in ("pico", "esp32s3-n16r8", BANDWIDTH_BOUND):
        pl = P.Placement.of(plan(C.ModelSpec.from_quant(qm), prof, batch=4))
        for pos, head in ((0, "skip"), (7, None), (7, "full"), (3, 11)):
            want = timing.predict(pl.spec, pl.prof, pl.tiers, pl.regions, pos, pl.kv, head=head)
            got = P.predict_pass(pl, pos, 1, head)
            assert got.bytes_read == want.bytes_read
            assert got.total_us == pytest.approx(want.total_us, rel=1e-9)
            assert got.phase_us == pytest.approx(want.phase_us, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("kv", ["f32", "int8"])
def test_a_pass_reads_each_weight_once_and_every_token_its_own(kv):
    """The bytes a pass of T tokens is predicted to read are what the engine counts for it
    (test_multitoken.chunk_bytes, checked there against the C engine's counters): every matrix once,
    per token its embedding row, norms, RoPE rows and KV rows — so flash bytes per token fall ~T-fold."""
    from test_multitoken import chunk_bytes
    qm = qmodel(seed=3, max_seq_len=40)
    h = parse_header(build_blob(qm, state=StateTiers(kv=kv)))
    pl = P.Placement.of_header(h, board("pico"))
    per_token = []
    for T in (1, 2, 4, 8):
        got = P.predict_pass(pl, 5, T, P.HEAD_SKIP)
        flash, psram, sram = chunk_bytes(qm, kv, 5, T, head=False)
        assert (got.bytes_read["flash"], got.bytes_read["psram"], got.bytes_read["sram"]) == (flash, psram, sram)
        per_token.append(got.bytes_read["flash"] / T)
        verify = P.predict_pass(pl, 5, T, P.HEAD_ALL)
        assert verify.bytes_read["flash"] == chunk_bytes(qm, kv, 5, T, head=True)[0]
    assert per_token[3] < per_token[0] / 5          # weights dominate: ~T-fold fewer bytes a token
    assert all(a > b for a, b in zip(per_token, per_token[1:]))


def test_a_pass_computes_every_token_and_copies_each_row():
    """Arithmetic is each token's own (the one-token step's at its position); reading is once per pass
    plus the row copies the multi-token kernel writes to SRAM (kernels.c flm_matmul_rows)."""
    qm = qmodel(seed=4)
    pl = flash_placement(qm, COMPUTE_BOUND)
    one = [P.predict_pass(pl, 10 + t, 1, P.HEAD_SKIP) for t in range(4)]
    four = P.predict_pass(pl, 10, 4, P.HEAD_SKIP)
    for ph in C.PHASES:
        assert four.compute_us[ph] == pytest.approx(sum(o.compute_us[ph] for o in one), rel=1e-12)
        assert four.macs[ph] == pytest.approx(sum(o.macs[ph] for o in one), rel=1e-12)
    mats = sum(t.length for t in pl.spec.tensors if t.fmt in ("q8", "q4") and t.name != "tok_embeddings")
    copies = sum(four.traffic[ph].get("sram", 0) for ph in C.PHASES) - sum(
        o.traffic[ph].get("sram", 0) for o in one for ph in C.PHASES)
    assert copies == mats
    assert four.tier_us()["flash"] < 1.1 * one[0].tier_us()["flash"]


def test_speculation_pays_on_a_bandwidth_bound_board_and_not_on_a_compute_bound_one():
    qm = qmodel(seed=5)
    acc = S.Acceptance((0.8,))
    quotes = {}
    for prof in (BANDWIDTH_BOUND, COMPUTE_BOUND):
        pl = flash_placement(qm, prof)
        quotes[prof["name"]] = q = S.predict_speculation(pl, acc, 3, 20)
        assert q.tokens_per_verify == pytest.approx(1 + 0.8 + 0.64 + 0.512)
        assert q.bytes_per_token()["flash"] < q.plain.bytes_read["flash"] / 2    # bytes fall on both
    bw, cb = quotes["bandwidth-bound"], quotes["compute-bound"]
    assert bw.pass_cost_ratio < 1.5 and bw.speedup > 2.0               # k+1 tokens cost little more than one
    assert 3.5 < cb.pass_cost_ratio < 4.5 and cb.speedup < 1.0           # ... or about k+1 times one
    # the roofline says why: the one-token pass is memory-bound on the first, compute-bound on the second
    for q, bound in ((bw, "memory"), (cb, "compute")):
        whole = {p.phase: p for p in R.pass_points(q.plain, "1")}["pass"]
        assert whole.bound == bound
        ffn1 = {p.phase: p for p in R.pass_points(q.plain, "1")}["ffn"]
        ffn4 = {p.phase: p for p in R.pass_points(q.verify, "4")}["ffn"]
        flash_intensity = [p.ops / p.bytes["flash"] for p in (ffn1, ffn4)]   # the weights read once for 4 tokens
        assert 3.0 < flash_intensity[1] / flash_intensity[0] <= 4.0
        assert bound != "memory" or ffn1.tier == ffn4.tier == "flash"


def test_roofs_come_from_the_profile_and_the_cost_model():
    for name in ("pico", "esp32s3-n16r8", "rp2040-emu"):
        prof = board(name)
        cpm, cpf = R.cycles_per_op(prof)
        comp = prof.get("compute", {})
        want = K.CHIP_COMPUTE.get(prof.get("chip"), (4.0, 2.0 if prof.get("fpu", True) else 50.0))
        assert (cpm, cpf) == pytest.approx((comp.get("cycles_per_mac", want[0]), comp.get("cycles_per_flop", want[1])))
        roofs = R.roofs(prof)
        assert roofs.mac_per_s == pytest.approx(prof["clock_mhz"] * 1e6 / cpm)
        assert set(roofs.bandwidth) == set(timing.tier_models(prof))


def test_acceptance_arithmetic_and_its_calibration():
    a = S.Acceptance((0.5, 0.4))
    assert a.tokens_per_verify(3) == pytest.approx(1 + 0.5 + 0.2 + 0.08)       # the last rate repeats
    assert a.all_accepted(3) == pytest.approx(0.5 * 0.4 * 0.4)
    assert S.parse_acceptance("0.8,0.6").rates == (0.8, 0.6)
    for bad in ("1.5", "x", "", "0.5,,0.2"):
        with pytest.raises(Exception, match="--acceptance"):
            S.parse_acceptance(bad)
    # hand-made verifications of 3 drafts (accepted 0, 1, 3, 2) and one pass without drafts; the
    # estimate of tokens per verification equals their mean (the rates telescope)
    steps = []
    for first, used in ((4, 1), (5, 2), (7, 4), (11, 3)):
        steps += [dict(chunk=first, chunk_len=4, chunk_used=used, kind="verify", pos=first, out_id=1)] * used
    steps += [dict(chunk=14, chunk_len=1, chunk_used=1, kind="one", pos=14, out_id=1),
              dict(chunk=15, chunk_len=1, chunk_used=1, kind="one", pos=15, out_id=1)]    # the last pass: not counted
    a = S.acceptance_from_steps([(5, steps)], 3, "hand-made")
    assert a.reached == (4, 3, 2) and a.accepted == (3, 2, 1)
    assert a.tokens_per_verify(3) == pytest.approx((1 + 2 + 4 + 3) / 4)
    assert a.proposed == pytest.approx(4 / 5)


def test_calibration_by_the_reference_with_a_draft_model():
    from test_multitoken import with_draft
    qm = with_draft(qmodel(seed=6, max_seq_len=48))
    prompts = [[3, 5, 7, 3, 5, 7, 3, 5], [9, 2, 9, 2, 9, 2, 4, 8]]
    for mode in S.MODES:
        a = S.calibrate(qm, mode, 3, prompts, 12, "two prompts")
        assert len(a.rates) == 3 and all(0.0 <= r <= 1.0 for r in a.rates)
        assert list(a.reached) == sorted(a.reached, reverse=True) and a.reached[0] > 0
        assert 0.0 < a.proposed <= 1.0


def test_the_draft_models_cost_is_its_steps():
    """Proposing k drafts: the draft catches up (one token, or two after a verification that
    accepted all) and scans its head, then k-1 one-token steps, each with its head scan."""
    from test_multitoken import with_draft
    qm = with_draft(qmodel(seed=7, max_seq_len=16))
    main = flash_placement(qm, board("pico"), batch=4)
    dpl = P.draft_placement(C.ModelSpec.from_quant(qm.draft.qm), main, qm.draft.kv)
    assert set(dpl.tiers.values()) == {"flash"} and set(dpl.regions.values()) == {main.regions["scratch"]}
    got = S.draft_cost(dpl, 6, 3, catch_up=1)
    want = sum(P.predict_pass(dpl, p, 1, None).total_us for p in (6, 7, 8))
    assert got.total_us == pytest.approx(want, rel=1e-12)
    two = S.draft_cost(dpl, 6, 3, catch_up=2)
    assert two.bytes_read["flash"] > got.bytes_read["flash"] and two.total_us > got.total_us
    q = S.predict_speculation(main, S.Acceptance((0.5,)), 3, 6, dpl)
    assert q.draft is not None and 0 < q.draft_us_per_token < q.us_per_token


def test_the_best_batch_is_the_smallest_near_the_lowest_within_ram():
    qm = qmodel(seed=8, max_seq_len=64)
    spec = C.ModelSpec.from_quant(qm)
    need1 = plan(spec, synthetic_board("roomy", 1.0, 4.0), base="flash").need["sram"]
    small = synthetic_board("small-sram", 1.0, 4.0, sram_budget=need1 + 6000)   # room for a few tokens a pass
    quotes = P.batch_quotes(spec, small, plan_kw=dict(base="flash"))
    ok = [q for q in quotes if q.fits]
    top = max(q.batch for q in ok)
    assert 1 < top < max(q.batch for q in quotes)
    assert all(q.fits == (q.batch <= top) for q in quotes)          # more tokens a pass, more scratch
    assert all("does not fit" in q.why for q in quotes if not q.fits)
    assert all(a.us_per_token > b.us_per_token for a, b in zip(ok, ok[1:]))    # flash-bound: more T, less time
    best = P.best_batch(quotes)
    low = min(q.us_per_token for q in ok)
    assert best.us_per_token <= low * (1 + P.BEST_T_TOLERANCE)
    assert all(q.us_per_token > low * (1 + P.BEST_T_TOLERANCE) for q in ok if q.batch < best.batch)


@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_four_token_rows_cost_their_factor_of_a_mac(fmt):
    """rp2040-emu's four-token rows ([compute] q8_quad_mac_factor, q4_quad_mac_factor): a token of a pass of
    8 costs the row-scaled products' MACs at its format's factor, linearly; a pass of 3 (no quad) and a
    factor of 1 cost what one token costs. (The other format's factor is 1 here: q4's head is q8.)"""
    qm = quantize(random_model(seed=3, dim=64, n_heads=4, hidden_dim=128)[1], fmt, 32)
    spec = C.ModelSpec.from_quant(qm)
    assert all(t.rowscale for t in spec.tensors if t.fmt == fmt and t.name != "tok_embeddings")
    key = f"{fmt}_quad_mac_factor"
    f = board("rp2040-emu")["compute"][key]
    assert f < 1.0

    def rows(x, n):
        prof = copy.deepcopy(board("rp2040-emu"))
        prof["compute"].update({"q8_quad_mac_factor": 1.0, "q4_quad_mac_factor": 1.0, key: x})
        return sum(K.compute_parts(spec, 5, prof, pass_n=n)[1].values())

    assert rows(f, 3) == rows(f, 1) == rows(1.0, 8)
    saved = rows(f, 1) - rows(f, 8)
    assert saved > 0 and saved == pytest.approx((rows(0.5, 1) - rows(0.5, 8)) * (1 - f) / 0.5, rel=1e-9)


def test_q4_in_groups_of_16_costs_its_second_sub_block():
    """rp2040-emu's [compute] q4_g16_cycles: a row-scaled q4 product in groups of 16 costs that much more per
    32 columns of each row (the lanes' sub-blocks of 16, softfloat_m0.s flm_rs_rows_q4h_m0); groups of 32
    and q8 nothing (q4's head is in groups of 16 whatever the group)."""
    x = board("rp2040-emu")["compute"]["q4_g16_cycles"]
    assert x > 0

    def rows(qm, cycles):
        prof = copy.deepcopy(board("rp2040-emu"))
        prof["compute"]["q4_g16_cycles"] = cycles
        return sum(K.compute_parts(C.ModelSpec.from_quant(qm), 5, prof)[1].values())

    ir = random_model(seed=3, dim=64, n_heads=4, hidden_dim=128)[1]       # a tied head: the embedding's rows
    for qm in (quantize(ir, "q4", 16), quantize(ir, "q4", 32), quantize(ir, "q8", 16)):
        g16 = [t for t in C.ModelSpec.from_quant(qm).tensors if t.fmt == "q4" and t.group == 16 and t.rowscale]
        extra = sum(t.rows * t.cols / 32 * x for t in g16)
        assert rows(qm, x) - rows(qm, 0.0) == pytest.approx(extra, rel=1e-9)
        assert bool(extra) == (qm.tensors["layers.0.ffn.w1"].fmt == "q4" or qm.tensors["tok_embeddings"].fmt == "q4")


# ---------------------------------------------------------------------------------------------
# the emulated RP2040: predicted vs measured prefill (deterministic cycles; a loose band)

@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_predicted_prefill_tracks_the_emulated_rp2040(tmp_path):
    """The shipped model's prompt in passes of 1 and of 4 tokens on the emulated Cortex-M0+ (XIP model
    on): every pass's bytes are the predicted ones exactly; passes of 4 cost less per token, measured
    and predicted; the prediction is within a loose band of the emulated timer (bench.passes prints
    the ratios)."""
    from converter.boards import load_board
    from converter.load import load_model
    from emuboard import emu_link, require_emulator
    from host.output.stats import forward_passes
    from nativeboard import run
    require_emulator()
    qm = quantize(load_model(str(ROOT / "models" / "default" / "model.pt")), "q8", 32)
    prompt = [0, 401, 9, 57, 300, 12, 88, 7, 5]          # 8 prompt tokens whose outputs are unused, then the last
    with emu_link(qm, tmp_path, tmp_path / "b", batch=4) as (link, boot, board):
        h = parse_header((tmp_path / "model.flmb").read_bytes())
        pl = P.Placement.of_header(h, load_board("rp2040-emu"))
        per_token = {}
        for T in (1, 4):
            toks, _, done = run(link, prompt, 1, logits=False, batch=T)
            passes = [p for p in forward_passes(toks) if p["prompt_steps"] == p["tokens"]]
            assert sum(p["tokens"] for p in passes) == 8
            pred = [P.predict_pass(pl, p["first"], p["tokens"], P.HEAD_SKIP) for p in passes]
            for p, q in zip(passes, pred):
                assert p["bytes"] == q.bytes_read
            per_token[T] = (sum(p["total_us"] for p in passes) / 8, sum(q.total_us for q in pred) / 8)
    (m1, p1), (m4, p4) = per_token[1], per_token[4]
    assert m4 < m1 and p4 < p1
    for m, p in per_token.values():
        assert 0.7 < p / m < 1.4, per_token


# ---------------------------------------------------------------------------------------------
# flashlm plan --roofline

def test_cli_plan_roofline_writes_the_png_and_prints_predictions(tmp_path, capsys, monkeypatch):
    from converter.torch_import import save_checkpoint
    from host.cli.main import main
    m, _ = random_model(seed=9, max_seq_len=48)
    save_checkpoint(tmp_path / "m.pt", m)
    png = tmp_path / "r.png"
    rc = main(["plan", str(tmp_path / "m.pt"), "--board", "pico", "--roofline", "--acceptance", "0.7",
               "--png", str(png), "--json", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for text in ("batched prefill on pico", "best batch", "speculative decoding with lookup", "roofline",
                 "a prediction", "Speculation"):
        assert text in out, text
    d = json.loads((tmp_path / "p.json").read_text())["roofline"]
    assert d["label"].startswith("predicted") and d["best_batch"] >= 1
    assert {p["pass"] for p in d["points"]} >= {"1 token"} and not any(p["measured"] for p in d["points"])
    assert d["speculation"]["lookup"]["acceptance"]["source"] == "supplied"
    monkeypatch.chdir(tmp_path)       # no --png: roofline-BOARD.png here
    assert main(["plan", "shape:ple-28m", "--board", "esp32s3-n16r8", "--roofline"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "roofline-esp32s3-n16r8.png").is_file() and "give --acceptance" in out


def test_cli_plan_roofline_errors_are_one_line(tmp_path, capsys):
    from converter.torch_import import save_checkpoint
    from host.cli.main import main
    m, _ = random_model(seed=10, max_seq_len=32)
    save_checkpoint(tmp_path / "m.pt", m)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "flashlm-run", "hello": {"board": "native"}, "tokens": [{}]}))
    (tmp_path / "bad.json").write_text("{")
    model = str(tmp_path / "m.pt")
    for args, why in ((["--measured", str(other)], "--measured belongs to --roofline"),
                      (["--roofline", "--measured", str(tmp_path / "none.json")], "no such file"),
                      (["--roofline", "--measured", str(tmp_path / "bad.json")], "not a flashlm run report"),
                      (["--roofline", "--measured", str(other)], "ran on board 'native', not 'pico'"),
                      (["--roofline", "--acceptance", "2"], "give a rate in 0..1"),
                      (["--roofline", "--speculate", "draft"], "no draft model"),
                      (["--roofline", "--png", str(tmp_path / "no" / "r.png")], "does not exist")):
        rc = main(["plan", model, "--board", "pico"] + args)
        err = capsys.readouterr().err
        assert rc == 2 and why in err and err.count("\n") == 1, (args, err)


@pytest.mark.native
@pytest.mark.slow
def test_cli_plan_roofline_beside_a_measured_run(tmp_path, capsys):
    """A run on the native board (batched prefill, prompt lookup): its passes predicted at their own
    positions and drawn beside the measurement; the bytes of every kind of pass equal the prediction."""
    from converter.torch_import import save_checkpoint
    from host.cli.main import main
    from test_multitoken import REPEATS
    m, _ = random_model(seed=13, max_seq_len=40)
    save_checkpoint(tmp_path / "m.pt", m)
    out = tmp_path / "model"
    assert main(["convert", str(tmp_path / "m.pt"), "-o", str(out), "--batch", "4", "--no-report"]) == 0
    ids = ",".join(map(str, REPEATS))
    assert main(["run", "--board", "native", "--model", str(out), "--prompt-ids", ids, "--max-tokens", "12",
                 "--speculate", "lookup", "--json", str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    rc = main(["plan", str(out), "--board", "native", "--roofline", "--batch", "4", "--acceptance", "0.5",
               "--measured", str(tmp_path / "r.json"), "--png", str(tmp_path / "r.png"),
               "--json", str(tmp_path / "p.json")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "measured on native" in cap.out and (tmp_path / "r.png").is_file()
    d = json.loads((tmp_path / "p.json").read_text())["roofline"]
    kinds = {c["pass"] for c in d["measured"]}
    assert any(k.startswith("prefill ×4") for k in kinds) and any(k.startswith("verify") for k in kinds)
    assert all(c["bytes_equal"] for c in d["measured"])
    assert any(p["measured"] for p in d["points"]) and any(not p["measured"] for p in d["points"])
