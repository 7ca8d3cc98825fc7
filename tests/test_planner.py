"""Layout planner, board profiles, LAYOUT switching and staging on the native board."""
import dataclasses
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from converter import costmodel as C
from converter import timing
from converter.blob import build_blob, parse_header, read_header, retier_blob
from converter.boards import board_names, load_board
from converter.costmodel import ModelSpec, match_pattern
from converter.footprint import region_bytes, state_bytes, tier_needs
from converter.formats import StateTiers
from converter.ir import ModelConfig, ModelError
from converter.planner import NoFit, PlanError, plan, plan_layout
from converter.quantize import quantize
from converter.reference import FLAG_LOGITS, generate
from host.commands.compare import Measure, compare
from host.commands.plan import plan_model
from host.commands.plan_options import PlanQuery
from host.errors import UserError
from host.link.messages import Error, Hello, Layout
from modelzoo import random_model, with_head_index
from nativeboard import drain, expected_bytes_read, native_link, run

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
LLAMA15M = ModelConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, hidden_dim=768,
                       max_seq_len=256, tied=True)
REQUIRED = ("chip", "cores", "clock_mhz", "fpu", "hal", "build", "timer", "tiers")


# ---------------------------------------------------------------------------------------------
# board profiles

@pytest.mark.parametrize("name", board_names())
def test_board_profiles_have_the_documented_keys(name):
    prof = load_board(name)
    for k in REQUIRED:
        assert k in prof, f"{name}: missing {k}"
    assert "flash" in prof["tiers"] and set(prof["tiers"]) <= {"flash", "psram", "sram"}
    tm = timing.tier_models(prof)
    for tier, t in prof["tiers"].items():
        for k in ("capacity", "budget", "line_bytes"):
            assert k in t, f"{name}: tiers.{tier} lacks {k}"
        # a tier's speed: its bandwidth and row latency, or the cycles one line fill takes (XIP flash)
        assert ("line_cycles" in t) != ("seq_read_MBps" in t and "row_latency_us" in t), f"{name}: tiers.{tier}"
        assert 0 < t["budget"] <= t["capacity"] and tm[tier].seq_read_MBps > 0 and tm[tier].row_latency_us >= 0
    if prof["build"] == "platformio":
        assert {"platform", "board", "framework"} <= set(prof["platformio"])
        assert prof["flash"]["method"] and 0 < prof["usb"]["vid"] < 65536 and 0 < prof["usb"]["pid"] < 65536


def test_every_profile_number_names_a_source():
    """Each numeric line in a hardware profile carries a comment (its source or [EST])."""
    for name in board_names():
        if name in ("native", "rp2040-emu"):
            continue
        text = (ROOT / "boards" / f"{name}.toml").read_text()
        for line in text.splitlines():
            s = line.strip()
            if s.startswith(("#", "[", "{", "alt")) or "=" not in s:   # alt entries carry a note
                continue
            key, _, val = s.partition("=")
            v = val.split("#")[0].strip()
            if v[:1].isdigit():
                assert "#" in val, f"{name}: {s!r} has no source comment"


# ---------------------------------------------------------------------------------------------
# the planner's invariants

configs = st.builds(
    lambda d_h, heads, kvdiv, layers, vocab, hidden, ctx, tied, ple, out4: ModelConfig(
        dim=d_h * heads, n_layers=layers, n_heads=heads, n_kv_heads=heads // kvdiv, vocab_size=vocab,
        hidden_dim=hidden, max_seq_len=ctx, tied=tied, ple_dim=ple, out_vocab=vocab * out4 // 4),
    st.sampled_from([4, 8, 16]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.integers(1, 4),
    st.integers(8, 600), st.integers(8, 200), st.integers(2, 96), st.booleans(), st.sampled_from([0, 0, 5, 24]),
    st.sampled_from([0, 1, 3, 4])).filter(
        lambda c: c.n_kv_heads > 0 and c.n_heads % c.n_kv_heads == 0)


@st.composite
def boards(draw):
    def tier(lo, hi, line_fill=False):
        t = dict(capacity=1 << 30, budget=draw(st.integers(lo, hi)), line_bytes=draw(st.sampled_from([4, 8, 32, 64])))
        if line_fill:       # an XIP flash given by the cycles of one line fill
            return dict(t, line_cycles=draw(st.integers(8, 400)))
        return dict(t, seq_read_MBps=draw(st.floats(1, 1000)), row_latency_us=draw(st.floats(0, 3)))
    tiers = {"flash": tier(1 << 12, 1 << 22, draw(st.booleans())), "sram": tier(1 << 10, 1 << 19)}
    if draw(st.booleans()):
        tiers["psram"] = tier(1 << 12, 1 << 22)
    return dict(name="synthetic", clock_mhz=draw(st.integers(50, 500)), fpu=draw(st.booleans()),
                tiers=tiers, compute=dict(cycles_per_mac=draw(st.floats(0.5, 10)),
                                          cycles_per_flop=draw(st.floats(0.5, 80))))


PATTERNS = ["layers.*.ffn", "layers.0.attn", "head", "tok_embeddings", "norm", "rope.*", "layers.*.attn.wq",
            "kv", "logits", "scratch", "layers.1.ffn.w2", "*norm", "layers.*.ple", "ple.proj", "ple.*"]


@st.composite
def overrides(draw):
    n = draw(st.integers(0, 3))
    return [f"{draw(st.sampled_from(PATTERNS))}={draw(st.sampled_from(['flash', 'psram', 'sram']))}"
            for _ in range(n)]


def _expected_override(spec, ovs, name):
    tier = None
    for o in ovs:
        pat, _, t = o.partition("=")
        targets = (["tok_embeddings" if spec.config.tied else "output"] if pat == "head"
                   else [n for n in [x.name for x in spec.tensors] + list(C.REGIONS) if match_pattern(pat, n)])
        if name in targets:
            tier = t
    return tier


def _recount(spec, pl):
    staged = {"psram": [], "sram": []}
    for t in spec.tensors:
        if pl.tiers[t.name] in staged:
            staged[pl.tiers[t.name]].append(t.length)
    need = dict.fromkeys(("psram", "sram"), 0)
    sizes = C.state_sizes(spec, pl.kv)
    for tier, lengths in staged.items():
        need[tier] += sum((n + 63) & ~63 for n in lengths)
    for r, tier in pl.regions.items():
        need[tier] += sizes[r]
    assert need == tier_needs(spec.config, spec.min_group, staged, pl.regions, pl.kv)
    return need


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, boards(), overrides(), st.sampled_from(["q8", "q4"]), st.sampled_from([8, 16, 32]),
       st.sampled_from(["f32", "int8"]))
def test_placement_within_budgets_exactly_once_overrides_respected(cfg, prof, ovs, fmt, g, kv):
    spec = ModelSpec.from_config(cfg, fmt, g)
    try:
        pl = plan(spec, prof, overrides=ovs, kv=kv, suggest=False)
    except NoFit as e:
        assert e.shortfall and all(n > b for n, b in e.shortfall.values())
        return
    except PlanError as e:
        assert "--place" in str(e)
        assert cfg.ple_dim or "ple.table" not in str(e)
        return
    names = [t.name for t in spec.tensors]
    assert sorted(pl.tiers) == sorted(names) and len(names) == len(set(names))   # every tensor, once
    assert set(pl.tiers.values()) <= set(prof["tiers"]) and pl.tiers["tokenizer"] == "flash"
    assert pl.tiers.get("ple.table", "flash") == "flash"
    assert sorted(pl.regions) == sorted(C.REGIONS) and set(pl.regions.values()) <= set(prof["tiers"]) - {"flash"}
    need = _recount(spec, pl)
    for tier in ("psram", "sram"):
        if tier in prof["tiers"]:
            assert need[tier] == pl.need[tier] <= prof["tiers"][tier]["budget"]
        else:
            assert need[tier] == 0
    assert spec.blob_bytes == pl.need["flash"] <= prof["tiers"]["flash"]["budget"]
    for name in names + list(C.REGIONS):
        want = _expected_override(spec, ovs, name)
        if want is not None:
            assert (pl.tiers.get(name) or pl.regions.get(name)) == want, (name, ovs)
    # the optimiser never predicts worse than leaving every free tensor in flash
    flash = plan(spec, prof, overrides=ovs, kv=kv, base="flash", suggest=False)
    assert pl.prediction.total_us <= flash.prediction.total_us * (1 + 1e-9) + 1e-9


@settings(max_examples=80, deadline=None)
@given(configs, boards(), st.data())
def test_predictions_monotone_in_bytes_moved(cfg, prof, data):
    spec = ModelSpec.from_config(cfg)
    tiers = {t.name: (data.draw(st.sampled_from(sorted(prof["tiers"]))) if t.kind != "tokenizer" else "flash")
             for t in spec.tensors}
    ram = sorted(set(prof["tiers"]) - {"flash"})
    regions = {r: data.draw(st.sampled_from(ram)) for r in C.REGIONS}
    pos = data.draw(st.integers(0, cfg.max_seq_len - 2))
    a = timing.predict(spec, prof, tiers, regions, pos)
    b = timing.predict(spec, prof, tiers, regions, pos + 1)            # one more KV row per head
    assert sum(b.bytes_read.values()) > sum(a.bytes_read.values())
    assert b.total_us >= a.total_us and sum(b.memory_us.values()) >= sum(a.memory_us.values())
    # a tensor that grows (more bytes read through the same tier) never predicts less memory time
    victims = [t for t in spec.tensors if t.kind in ("attention", "ffn", "head", "embedding", "norm")]
    v = data.draw(st.sampled_from(victims))
    grow = data.draw(st.integers(1, 10000))
    grown = ModelSpec(spec.config, tuple(dataclasses.replace(t, length=t.length + (grow if t is v else 0),
                                                             row_stride=t.row_stride + (grow if t is v and t.kind == "embedding" else 0))
                                         for t in spec.tensors))
    c = timing.predict(grown, prof, tiers, regions, pos)
    assert sum(c.memory_us.values()) >= sum(a.memory_us.values()) and c.total_us >= a.total_us
    # and per tier: more bytes or more gathered rows never cost less
    tm = timing.tier_models(prof)
    for t in tm.values():
        n, r = data.draw(st.integers(0, 1 << 20)), data.draw(st.integers(0, 1000))
        assert t.us(n + 1, r) >= t.us(n, r) and t.us(n, r + 1) >= t.us(n, r)


@pytest.mark.native
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs.filter(lambda c: c.vocab_size <= 300), st.sampled_from([7, 16, 32]), st.data())
def test_region_sizes_mirror_engine_state(blob_checker, tmp_path, cfg, g, data):
    """converter/footprint.py's region sizes are the engine's own (flm_state_region_bytes on the blob),
    at every batch."""
    from modelzoo import random_ple_model
    ir = random_ple_model(seed=0, **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    qm = quantize(ir, data.draw(st.sampled_from(["q8", "q4"])), g, [f"layers.0.ffn.w2=q8:{g + 3}"])
    batch = data.draw(st.sampled_from([1, 2, 3, 8]))       # activations and logits grow with it
    (tmp_path / "m.flmb").write_bytes(build_blob(qm, state=StateTiers(batch=batch)))
    out = subprocess.run([str(blob_checker), str(tmp_path / "m.flmb")], capture_output=True, text=True, check=True)
    min_group = min(t.group_size for t in qm.tensors.values() if hasattr(t, "codes"))
    rb = region_bytes(cfg, min_group, batch=batch)
    assert out.stdout.split() == ["ok", str(rb["kv"]), str(rb["logits"]), str(rb["scratch"])]
    assert sum(rb.values()) == state_bytes(cfg, min_group, batch=batch)


@pytest.mark.parametrize("tied", [True, False])
def test_bytes_read_formula_matches_engine_test(tied):
    """Planner figures for the default layout against tests/nativeboard.py's formula, with and
    without a head index (greedy steps: the tile scan at the calibration's expected rows, or the
    whole head)."""
    _, ir = random_model(seed=5, tied=tied)
    for qm in (quantize(ir, "q8", 32), with_head_index(quantize(ir, "q8", 32), 8)):
        if qm.head_index is not None:
            qm.head_index.expected_rows = 41.4      # as the calibration would have measured
        spec = ModelSpec.from_header(parse_header(build_blob(qm)))
        n_out = qm.config.n_out
        cases = [("full", None, False), ("skip", 0, False), (n_out, n_out, True)]
        cases += [(17, 17, True), (None, 41, True)] if qm.head_index else [(None, n_out, True)]
        for pos in (0, 3, 47):
            for head, rows, greedy in cases:
                p = timing.predict(spec, load_board("native"), {}, dict.fromkeys(C.REGIONS, "sram"), pos, head=head)
                flash, psram, sram = expected_bytes_read(qm, pos, rows, greedy)
                assert p.bytes_read == {"flash": flash, "psram": psram, "sram": sram}, (pos, head)
        with pytest.raises(ModelError, match="head must be full, skip or the rows of a greedy step"):
            timing.predict(spec, load_board("native"), {}, dict.fromkeys(C.REGIONS, "sram"), 0, head=n_out + 1)
        if qm.head_index is None:
            with pytest.raises(ModelError, match="no head index"):
                timing.predict(spec, load_board("native"), {}, dict.fromkeys(C.REGIONS, "sram"), 0, head=17)


# ---------------------------------------------------------------------------------------------
# does not fit

def test_15m_llama2c_shape_fits_esp32s3_n16r8_and_not_pico():
    q4 = ModelSpec.from_config(LLAMA15M, "q4", 32)      # convert --format q4: the embedding q4 in groups of 16
    pl = plan(q4, "esp32s3-n16r8")
    assert pl.need["flash"] <= pl.budget["flash"] and pl.regions["kv"] == "psram"
    assert pl.prediction.tok_s > 0 and pl.prediction.bytes_read["psram"] > 0
    # q8 everywhere cannot fit 16 MB of flash at all: the error says so and offers int4
    q8 = ModelSpec.from_config(LLAMA15M, "q8", 32)
    with pytest.raises(NoFit) as e:
        plan(q8, "esp32s3-n16r8")
    assert "flash short by" in str(e.value) and "int4" in str(e.value)
    assert set(e.value.shortfall) == {"flash"}
    for spec in (q8, q4):
        with pytest.raises(NoFit) as e:
            plan(spec, "pico")
        msg = str(e.value)
        assert msg.startswith("the model does not fit on pico: flash short by") and "sram short by" in msg
        assert set(e.value.shortfall) == {"flash", "sram"}
        assert any("KV cache" in d and d.startswith("sram") for d in e.value.details)
        assert "psram: none on this board" in e.value.details
        assert any("no quantization or context change" in s for s in e.value.suggestions)
    assert any("esp32s3-n16r8" in s for s in e.value.suggestions)   # q4: fits as is there


def test_batch_trades_ram_for_tokens_per_pass():
    """The batch (tokens per forward pass) grows scratch and the logits buffers; a batch that does not
    fit is refused with the largest one that does, and --apply's state_tiers carries it."""
    spec = ModelSpec.from_config(ModelConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=1, vocab_size=1024,
                                             hidden_dim=352, max_seq_len=128, tied=True), "q8", 32)
    sizes = {b: C.state_sizes(spec, "f32", b) for b in (1, 4, 8)}
    assert sizes[1]["kv"] == sizes[4]["kv"] == sizes[8]["kv"]
    assert sizes[1]["scratch"] < sizes[4]["scratch"] < sizes[8]["scratch"]
    assert sizes[8]["logits"] - sizes[1]["logits"] == 7 * 1024 * 4
    pl = plan(spec, "pico", batch=8)
    assert pl.batch == 8 and pl.state_tiers.batch == 8 and plan(spec, "pico").state_tiers.to_u32() & 0xFF0000 == 0
    with pytest.raises(NoFit) as e:
        plan(spec, "pico", batch=40)
    fit = next(s for s in e.value.suggestions if s.startswith("a batch of"))
    n = int(fit.split()[3])
    assert 8 <= n < 40 and plan(spec, "pico", batch=n).batch == n
    with pytest.raises(NoFit):
        plan(spec, "pico", batch=n + 1, suggest=False)


def test_ple_seed_shape_fits_esp32s3_n16r8_with_the_table_in_flash():
    """The 28.9M PLE shape (int4, groups of 128, fp16 scales, tied head over 25353 rows) on the
    N16R8: the 12.4 MB table stays in flash and a token gathers one table row and one embedding row."""
    from converter.shapes import SHAPES, shape_spec
    spec = shape_spec("ple-28m")
    c = spec.config
    assert c.n_params() == 28_869_920 and c.param_split() == {"table": 25_165_824, "core": 3_704_096}
    by = spec.by_name()
    tab, emb = by["ple.table"], by["tok_embeddings"]
    assert (tab.fmt, tab.group, tab.scale16, emb.fmt, emb.scale16) == ("q4", 128, True, "q4", True)
    assert tab.row_stride == 12 + 6 * 64 and emb.row_stride == 4 + 48      # fp16 scales padded to 4, codes
    gathered = tab.row_stride + emb.row_stride
    assert gathered == 448 and 400 <= gathered <= 500
    pl = plan(spec, "esp32s3-n16r8", head="full")      # the published measurement scanned the whole head
    assert pl.tiers["ple.table"] == "flash" and pl.need["flash"] == spec.blob_bytes <= pl.budget["flash"]
    u = pl.uses
    assert u["ple.table"].read == {"embed": 396} and u["ple.table"].rows == {"embed": 1}
    assert u["tok_embeddings"].read["embed"] == 52 and u["tok_embeddings"].rows == {"embed": 1}
    assert u["tok_embeddings"].read["output"] == 25353 * 52                 # the tied head's rows
    # the embedding sits where the head reads it fastest (PSRAM): flash serves the table row alone
    assert pl.tiers["tok_embeddings"] == "psram" and pl.prediction.bytes_read["flash"] == 396
    # with the embedding pinned to flash, flash gives both gathered rows plus the head's stream
    fl = plan(spec, "esp32s3-n16r8", overrides=["embedding=flash"], head="full")
    assert fl.prediction.bytes_read["flash"] == 448 + 25353 * 52
    # a shape has no head index (it needs weights to calibrate): a greedy step computes the whole head
    up = plan(spec, "esp32s3-n16r8")
    assert spec.head_scan is None and "head.tiles" not in up.uses
    assert up.uses["tok_embeddings"].read["output"] == 25353 * 52 and up.uses["tok_embeddings"].rows == {"embed": 1}
    assert up.prediction.phase_us["output"] > pl.prediction.phase_us["output"]      # + its argmax
    assert "the whole head and its argmax" in up.to_dict()["prediction"]["output_layer"]
    # a prediction for every phase, PLE included, within 3x of the published measurement
    pub = SHAPES["ple-28m"]["published"]
    ph = pl.prediction.phase_us
    assert set(ph) == set(C.PHASES) and all(v > 0 for v in ph.values())
    for k, ms in pub["phase_ms"].items():
        assert ms / 3 < ph[k] / 1000 < ms * 3, k
    # f32 scales do not fit the 15.66 MB blob partition; fp16 (or row) scales are what makes it fit
    with pytest.raises(NoFit, match="flash short by"):
        plan(ModelSpec.from_config(c, "q4", 128, ["head=q4:128"], scales="f32"), "esp32s3-n16r8", suggest=False)
    plan(ModelSpec.from_config(c, "q4", 128, ["head=q4:128"], scales="row"), "esp32s3-n16r8", suggest=False)
    for place in ("ple.table=psram", "ple.*=sram"):
        with pytest.raises(PlanError, match="ple.table stays in flash") as e:
            plan(spec, "esp32s3-n16r8", overrides=[place])
        assert "\n" not in str(e.value)


def test_cli_plans_the_seed_shape(tmp_path):
    out = subprocess.run([sys.executable, "-m", "host.cli", "plan", "shape:ple-28m", "--board", "esp32s3-n16r8",
                          "--png", str(tmp_path / "m.png"), "--json", str(tmp_path / "p.json")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "ple.table" in out.stdout and "PLE" in out.stdout and "prediction" in out.stdout
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["tiers"]["ple.table"] == "flash" and set(d["prediction"]["phase_us"]) == set(C.PHASES)
    bad = subprocess.run([sys.executable, "-m", "host.cli", "plan", "shape:nope", "--board", "esp32s3-n16r8"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "shape 'nope'" in bad.stderr and "ple-28m" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_plan_and_compare_are_typed_functions_that_agree_with_the_cli(tmp_path):
    """The scripting API: plan_model and compare take typed options and return what the command
    line writes as --json."""
    quiet = Console(file=io.StringIO())
    query = PlanQuery(ctx=64, kv="f32", batch=2, pos=10)
    planned = plan_model(quiet, "shape:ple-28m", "esp32s3-n16r8", query=query, place=("norm=sram",))
    r = _flashlm("plan", "shape:ple-28m", "--board", "esp32s3-n16r8", "--ctx", "64", "--kv", "f32", "--batch", "2",
                 "--pos", "10", "--place", "norm=sram", "--json", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    assert json.loads(json.dumps(planned)) == json.loads((tmp_path / "p.json").read_text())
    assert planned["tiers"]["norm"] == "sram" and (planned["context"], planned["kv"], planned["position"]) == (64, "f32", 10)
    both = compare(quiet, "shape:ple-28m", ("esp32s3-n16r8",), ("flash", "auto"), query=query)
    assert set(both["predicted"]) == {"esp32s3-n16r8/flash", "esp32s3-n16r8/auto"} and both["runs"] == {}
    with pytest.raises(UserError, match="single --board"):
        compare(quiet, "shape:ple-28m", ("esp32s3-n16r8", "pico"), measure=Measure())


def test_bench_ple_seed_labels_prediction_and_measurement(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.ple_seed", "--json", str(tmp_path / "t.json")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "PREDICTION" in out.stdout and "PUBLISHED MEASUREMENT" in out.stdout and "pred/pub" in out.stdout
    t = json.loads((tmp_path / "t.json").read_text())
    assert [r["phase"] for r in t["rows"]] == list(C.PHASES) and t["published_total_ms"] == 102.9
    assert t["published_best_ms"] == 13.3 and "token, best" in out.stdout
    assert t["tiers"]["ple.table"] == "flash" and t["bytes_per_token"]["flash"] == 396


def test_shorter_context_and_int8_kv_are_suggested():
    cfg = ModelConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=1, vocab_size=1024, hidden_dim=352,
                      max_seq_len=512, tied=True)
    with pytest.raises(NoFit) as e:
        plan(ModelSpec.from_config(cfg), "pico")
    sug = " | ".join(e.value.suggestions)
    assert "a context of" in sug and "the int8 KV cache fits (flashlm convert --kv int8)" in sug
    with pytest.raises(NoFit) as e:                  # convert's default k12: int8 is the smaller format
        plan(ModelSpec.from_config(cfg), "pico", kv="k12")
    assert "the int8 KV cache fits (flashlm convert --kv int8)" in e.value.suggestions
    ctx = int(sug.split("a context of ")[1].split()[0])
    plan(ModelSpec.from_config(cfg).with_context(ctx), "pico")
    with pytest.raises(NoFit):
        plan(ModelSpec.from_config(cfg).with_context(ctx + 1), "pico")


def test_overrides_rejected_with_a_reason():
    spec = ModelSpec.from_config(ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256,
                                             hidden_dim=96, max_seq_len=64))
    for place, why in (("head=psram", "no psram tier"), ("kv=flash", "cannot live in flash"),
                       ("tokenizer=sram", "read from flash only"), ("nothing.here=sram", "matches no tensor"),
                       ("layers.*.ffn=rom", "expected PATTERN=")):
        with pytest.raises(PlanError, match=why):
            plan(spec, "pico", overrides=[place])
    big = ModelSpec.from_config(ModelConfig(dim=256, n_layers=4, n_heads=4, n_kv_heads=4, vocab_size=512,
                                            hidden_dim=768, max_seq_len=64))
    with pytest.raises(NoFit) as e:
        plan(big, "pico", overrides=["layers.*.ffn=sram"])
    assert "sram short by" in str(e.value) and any("--place 'layers.*.ffn=sram'" in d for d in e.value.details)
    pl = plan(spec, "esp32s3-n16r8", overrides=["head=psram", "layers.*.ffn=flash", "kv=psram"])
    assert pl.tiers["tok_embeddings"] == "psram" and pl.regions["kv"] == "psram"
    assert all(pl.tiers[n] == "flash" for n in pl.tiers if ".ffn." in n)


# ---------------------------------------------------------------------------------------------
# the firmware: staging at boot, LAYOUT, counters equal to the plan's figures

LAYOUTS = ["auto", "flash", "flash,layers.*.ffn=psram,kv=psram,head=sram",
           "auto,layers.*.attn=psram,logits=psram,scratch=psram,rope.*=psram"]


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("planner-builds")


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("case", ["q8-tied-gqa", "q4-untied-mqa"])
def test_layout_switch_moves_counters_keeps_logits(case, tmp_path, build_root):
    if case == "q8-tied-gqa":
        _, ir = random_model(seed=11)
        qm = quantize(ir, "q8", 32)
    else:
        _, ir = random_model(seed=12, dim=48, n_heads=4, n_kv_heads=1, hidden_dim=70, tied=False, vocab_size=61)
        qm = quantize(ir, "q4", 16, ["layers.0.ffn=q8:24"])
    spec = ModelSpec.from_quant(qm)
    plans = [plan_layout(spec, "native", lay) for lay in LAYOUTS]
    assert len({p.layout_id for p in plans}) == len(plans)
    first = plans[2]          # the blob boots with a mixed placement: staged at boot
    blob = build_blob(qm, first.tiers, first.state_tiers)
    assert parse_header(blob).layout_id == first.layout_id
    prompt, n = [1, 7, 3], 5
    ref = generate(qm, prompt, n, flags=FLAG_LOGITS)
    with native_link(qm, tmp_path, build_root, blob_bytes=blob) as (link, boot):
        hello = [m for m in boot if isinstance(m, Hello)][-1]
        assert hello.layout_id == first.layout_id
        seen = []
        for i, pl in enumerate([first] + plans):
            if i:
                link.send(Layout(pl.layout_id, pl.state_tiers.to_u32(), pl.tier_codes))
                msgs = drain(link)
                assert any(isinstance(m, Hello) and m.layout_id == pl.layout_id for m in msgs), msgs
            toks, logits, done = run(link, prompt, n)
            assert done.generated == n and len(toks) == len(ref)
            for t, lg, r in zip(toks, logits, ref):
                assert tuple(t.bytes_read) == tuple(pl.predict_at(t.pos, head="full").bytes_read[k]
                                                    for k in ("flash", "psram", "sram")), (LAYOUTS, i, t.pos)
                assert np.array_equal(bits(lg.values), bits(r["logits"]))
            seen.append(tuple(toks[-1].bytes_read))
        assert len(set(seen)) >= 4            # the counters moved between tiers


@pytest.mark.native
def test_layout_refused_keeps_the_previous_one(tmp_path, build_root):
    _, ir = random_model(seed=13)
    qm = quantize(ir, "q8", 32)
    spec = ModelSpec.from_quant(qm)
    pl = plan_layout(spec, "native", "flash,layers.*.ffn=psram")
    with native_link(qm, tmp_path, build_root) as (link, _):
        before, _, _ = run(link, [2, 3], 2, logits=False)
        link.send(Layout(pl.layout_id ^ 1, pl.state_tiers.to_u32(), pl.tier_codes))
        err = [m for m in drain(link) if isinstance(m, Error)]
        assert err and err[0].code == 8 and "does not match" in err[0].text
        link.send(Layout(pl.layout_id, pl.state_tiers.to_u32(), pl.tier_codes[:-1]))
        err = [m for m in drain(link) if isinstance(m, Error)]
        assert err and err[0].code == 8 and "table entries" in err[0].text
        link.send(Layout(pl.layout_id, 0x3, pl.tier_codes))
        assert [m.code for m in drain(link) if isinstance(m, Error)] == [8]
        after, _, _ = run(link, [2, 3], 2, logits=False)
        assert [t.bytes_read for t in after] == [t.bytes_read for t in before]


def test_retier_keeps_model_hash_and_data():
    _, ir = random_model(seed=14)
    qm = quantize(ir, "q8", 32)
    blob = build_blob(qm)
    pl = plan_layout(ModelSpec.from_quant(qm), "native", "flash,layers.*=psram,kv=psram")
    new = retier_blob(blob, pl.tiers, pl.state_tiers)
    a, b = parse_header(blob), parse_header(new)
    assert a.model_hash == b.model_hash and b.layout_id == pl.layout_id and b.state_tiers == pl.state_tiers
    assert new == build_blob(qm, pl.tiers, pl.state_tiers) and retier_blob(new) == blob


# ---------------------------------------------------------------------------------------------
# the CLI

def _flashlm(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "host.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=300)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from converter.torch_import import save_checkpoint
    d = tmp_path_factory.mktemp("plan-model")
    model, _ = random_model(seed=21)
    save_checkpoint(d / "m.pt", model)
    r = _flashlm("convert", d / "m.pt", "-o", d / "out", "--no-report")
    assert r.returncode == 0, r.stderr
    return d / "out"


@pytest.mark.slow
def test_cli_plan_table_png_and_errors(model_dir, tmp_path):
    r = _flashlm("plan", model_dir, "--board", "pico", "--png", tmp_path / "map.png", "--json", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    assert "predicted" in r.stdout and "tok/s" in r.stdout and "read/token" in r.stdout
    assert (tmp_path / "map.png").stat().st_size > 1000
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["board"] == "pico" and doc["prediction"]["label"].startswith("predicted")
    r = _flashlm("plan", model_dir, "--board", "pico", "--place", "kv=psram")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no psram tier" in r.stderr
    r = _flashlm("plan", model_dir, "--board", "pico", "--ctx", "48", "--place", "layers.*=sram",
                 "--place", "tok_embeddings=sram")
    assert r.returncode in (0, 2)
    if r.returncode == 2:
        assert r.stderr.startswith("flashlm: error: the model does not fit on pico") and "changes that" in r.stdout


@pytest.mark.slow
def test_cli_apply_then_compare_run(model_dir, tmp_path):
    import shutil
    d = tmp_path / "m"
    shutil.copytree(model_dir, d)
    h0 = read_header(d / "model.flmb")
    r = _flashlm("plan", d, "--board", "native", "--flash-only", "--place", "layers.*.ffn=psram",
                 "--place", "kv=psram", "--apply", "--json", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    h1 = read_header(d / "model.flmb")
    man = json.loads((d / "manifest.json").read_text())
    assert h1.model_hash == h0.model_hash and h1.layout_id == man["layout_id"] == json.loads(
        (tmp_path / "p.json").read_text())["layout_id"] != h0.layout_id
    assert {e.tier for e in h1.entries if ".ffn." in e.name} == {"psram"}
    r = _flashlm("compare", d, "--board", "native", "--layout", "flash", "--layout", "auto",
                 "--layout", "flash,head=psram,kv=psram", "--run", "--prompt-ids", "1,2", "--max-tokens", "3",
                 "--json", tmp_path / "c.json", "--png", tmp_path / "c.png")
    assert r.returncode == 0, r.stderr + r.stdout
    doc = json.loads((tmp_path / "c.json").read_text())
    runs = doc["runs"]
    assert len(runs) == 3 and all(v["bytes_match"] == v["steps"] == 4 for v in runs.values())
    assert len({tuple(v["crcs"]) for v in runs.values()}) == 1
    assert "bit-identical logits" in r.stdout and (tmp_path / "c.png").stat().st_size > 1000


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_layout_on_the_emulated_rp2040(tmp_path, build_root):
    """Staging at boot and LAYOUT on the Cortex-M0+ build: counters equal the plan's, logits equal."""
    from emuboard import emu_link
    _, ir = random_model(seed=15, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=48, vocab_size=40, max_seq_len=16)
    qm = quantize(ir, "q8", 16)
    spec = ModelSpec.from_quant(qm)
    staged = plan_layout(spec, "rp2040-emu", "flash,layers.0=sram,head=sram")
    flash = plan_layout(spec, "rp2040-emu", "flash")
    blob = build_blob(qm, staged.tiers, staged.state_tiers)
    with emu_link(qm, tmp_path, build_root, blob_bytes=blob) as (link, boot, _):
        assert [m for m in boot if isinstance(m, Hello)][-1].layout_id == staged.layout_id
        got = []
        for i, pl in enumerate((staged, flash)):
            if i:
                link.send(Layout(pl.layout_id, pl.state_tiers.to_u32(), pl.tier_codes))
                assert any(isinstance(m, Hello) and m.layout_id == pl.layout_id for m in drain(link, 2.0))
            toks, logits, done = run(link, [1, 2], 2)
            assert done.generated == 2
            for t in toks:
                assert tuple(t.bytes_read) == tuple(pl.predict_at(t.pos, head="full").bytes_read[k] for k in ("flash", "psram", "sram"))
            got.append([bits(lg.values).tobytes() for lg in logits])
        assert got[0] == got[1]
        assert toks[-1].bytes_read[2] < staged.predict_at(toks[-1].pos, head="full").bytes_read["sram"]


def test_board_aliases_resolve_to_the_profile():
    from converter.boards import load_board
    from converter.ir import ModelError
    assert load_board("esp32-s3-devkitc-1-n16r8")["name"] == "esp32s3-n16r8"
    assert load_board("esp32-c3-devkitm-1")["name"] == "esp32c3-devkitm-1"
    with pytest.raises(ModelError, match="unknown board 'esp32-s9'"):
        load_board("esp32-s9")
