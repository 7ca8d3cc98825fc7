"""The bench's pure pieces on made-up figures: flattening, ratios against a previous run, the report
tables, callgrind output parsing, the section choice. Nothing here measures or asserts a timing."""
import io

import pytest
from rich.console import Console

from bench import __main__ as bench_main
from bench.callgrind import decode_figures, parse_annotate, parse_totals
from bench.report import compare, flatten, num, print_report, ratio

ANNOTATE = """\
--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
312,823,247 (100.0%)  PROGRAM TOTALS
291,817,936 (93.29%)  fw/src/engine/kernels.c:flm_matvec_row [/tmp/bw/fw/firmware]
274,332,604 (87.70%)  /tmp/bw/fw/src/engine/engine.c:flm_body
274,332,604 (87.70%)  fw/src/engine/engine.c:flm_body [/tmp/bw/fw/firmware]
  2,683,609 ( 0.86%)  fw/src/engine/flm_math.c:flm_expf.part.0 [/tmp/bw/fw/firmware]
        120 ( 0.00%)  ???:clock_gettime@@GLIBC_2.17 [/usr/lib/x86_64-linux-gnu/libc.so.6]
-- Auto-annotated source: fw/src/engine/engine.c
"""


def test_parse_annotate_takes_each_function_once():
    got = parse_annotate(ANNOTATE)
    assert got == {"flm_matvec_row": 291_817_936, "flm_body": 274_332_604, "flm_expf.part.0": 2_683_609,
                   "clock_gettime@@GLIBC_2.17": 120}


def test_parse_totals():
    assert parse_totals("version: 1\nevents: Ir\nsummary: 65174886\ntotals: 65174886\n") == 65_174_886
    with pytest.raises(ValueError):
        parse_totals("events: Ir\n")


def test_decode_figures_divide_the_difference():
    incl = lambda body, head: {"flm_body_many": body, "flm_head": 0, "flm_head_all": 0, "flm_head_argmax": head,
                               "flm_sample": 0, "flm_slide": 0}
    first = dict(total=1000, inclusive=incl(900, 100), self={"a": 600, "b": 400, "same": 5}, head_rows=[10])
    longer = dict(total=5000, inclusive=incl(4500, 500), self={"a": 3000, "b": 1995, "same": 5, "new": 5},
                  head_rows=[10, 7, 8, 9, 6])
    f = decode_figures(first, longer, decode=4, prompt_len=3)
    assert f["ir_per_decode_token"] == 1000 and f["head_rows_per_decode_token"] == 7.5
    assert f["inclusive_per_decode_token"]["flm_body_many"] == 900
    assert f["inclusive_per_decode_token"]["flm_head_argmax"] == 100
    assert f["self_per_decode_token"] == {"a": 600, "b": 398.75, "new": 1.25}    # unchanged functions left out
    assert f["ir_per_prefill_step"] == 300


def test_flatten_keeps_numbers_under_dotted_keys():
    d = {"a": {"b": 1, "c": {"d": 2.5}, "s": "text", "l": [1, 2], "ok": True}, "e": 3}
    assert flatten(d) == {"a.b": 1, "a.c.d": 2.5, "e": 3}


def test_ratio_and_compare():
    assert ratio(3, 2) == 1.5
    assert ratio(3, 0) is None and ratio(3, None) is None and ratio(3, "x") is None and ratio(1, float("nan")) is None
    rows = compare({"x": 4, "y": 1}, {"x": 2})
    assert rows == [("x", 4, 2, 2.0), ("y", 1, None, None)]


def test_num():
    assert num(None) == "-" and num("does not fit") == "does not fit"
    assert num(38_899_433) == "38,899,433" and num(3370.3) == "3,370" and num(96) == "96" and num(0.1234567) == "0.1235"


PHASES = ("embed", "attention", "ffn", "ple", "output", "sampling")
TIERS = ("flash", "psram", "sram")


def fake_results(scale: float) -> dict:
    ph = {p: scale * (i + 1) for i, p in enumerate(PHASES)}
    by = {t: int(scale * 1000) for t in TIERS}
    return {
        "when": "then",
        "native_q8": dict(us_median=ph, tok_per_s=1000 / scale, bytes_per_token=by, bytes_per_token_at_pos=117),
        "rp2040_emu_q8": dict(phase_cycles_median=ph, cycles_per_token=scale * 21, prefill_phase_cycles_median=ph,
                              prefill_cycles_per_step=scale * 20, predicted_over_emulated=dict.fromkeys(PHASES, 0.9),
                              predicted_over_emulated_token=0.9, bytes_per_token=by, bytes_per_token_harness=by,
                              bytes_per_token_predicted=by, bytes_per_token_at_pos=34),
        "callgrind_native_q8": dict(ir_per_decode_token=scale * 7e6, ir_per_prefill_step=scale * 6e6,
                                    inclusive_per_decode_token={"flm_body_many": 6e6, "flm_head_argmax": 1e6},
                                    self_per_decode_token={"flm_matvec_row": 5e6}, prompt_tokens=23, decode_tokens=32),
        "predicted": {"pico": {"default_q8": dict(fits=1, phase_ms=ph, total_ms=21.0, tok_per_s=47.6, bytes_per_token=by),
                               "ple_28m": dict(fits=0, why="flash short by 13.1 MB")}},
        "ratios": {"native q4/q8 tok/s": 0.77 * scale},
    }


def test_report_prints_every_table_with_ratios_to_the_previous_run():
    out = io.StringIO()
    print_report(Console(file=out, width=400), fake_results(2.0), fake_results(1.0))
    text = out.getvalue()
    for want in ("default model per phase", "pred/emu q8", "bytes read per decode token", "emu q8 harness",
                 "callgrind", "flm_matvec_row (self)", "PREDICTED", "does not fit", "ratios measured in this run",
                 "native q4/q8 tok/s", "now vs previous run", "cycles_per_token"):
        assert want in text, want
    cells = lambda name: [c.strip() for c in next(ln for ln in text.splitlines() if name in ln).split("│")][1:5]
    assert cells("cycles_per_token") == ["cycles_per_token", "42", "21", "2.000"]
    assert cells("native q4/q8 tok/s") == ["native q4/q8 tok/s", "1.540", "0.770", "2.000"]
    assert "ratios: now vs previous run" not in text


def test_report_without_a_previous_run_or_sections():
    out = io.StringIO()
    print_report(Console(file=out, width=200), {"when": "now", "ratios": {}}, {})
    assert "previous run: none" in out.getvalue()


def test_unknown_section_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench_main.main(["--only", "nonsense"])
    assert e.value.code == 2
    assert "unknown section nonsense" in capsys.readouterr().err


def test_sections_have_unique_names():
    names = [s.name for s in bench_main.SECTIONS]
    assert len(names) == len(set(names)) and {"native", "emulated", "callgrind", "predicted", "speed"} <= set(names)


def test_run_merges_sections_and_their_ratios():
    seen = []

    def fake(name):
        def run(work):
            seen.append((work.name, work.is_dir(), list(work.iterdir())))
            return {name: {"x": 1}, "ratios": {f"{name} ratio": 0.5}}
        return bench_main.Section(name, run)
    r = bench_main.run([fake("a"), fake("b")], Console(file=io.StringIO()))
    assert seen == [("a", True, []), ("b", True, [])]
    assert r["a"] == {"x": 1} and r["b"] == {"x": 1}
    assert r["ratios"] == {"a ratio": 0.5, "b ratio": 0.5} and set(r["bench_wall_s"]) == {"a", "b"}
    assert r["default_model"]["params"] > 0


def test_passes_figures_print_and_flag_tokens_that_differ(capsys):
    import bench.passes as passes
    pre = {f"T{t}": {"tokens": 16, "passes": 16 // t, "us_per_token": 100.0 / t ** 0.5,
                     "flash_bytes_per_token": 800_000 / t, "cycles_per_token": 2e7} for t in (1, 4, 8)}
    spec = {"none": {"acceptance": None, "accepted": 0, "drafted": 0, "tokens_per_verify_pass": None,
                     "tok_per_s": 6.0, "us_per_token": 160_000.0, "cycles_per_token": 2e7,
                     "bytes_per_token": {"flash": 950_000.0}, "same_tokens_as_plain": 1},
            "lookup": {"acceptance": 0.25, "accepted": 3, "drafted": 12, "tokens_per_verify_pass": 1.75,
                       "tok_per_s": 4.0, "us_per_token": 250_000.0, "cycles_per_token": 3e7,
                       "bytes_per_token": {"flash": 600_000.0}, "same_tokens_as_plain": 0}}
    pre["T4"]["predicted"] = {"us_per_token": 60.0}
    spec["lookup"]["predicted"] = {"us_per_token": 200_000.0}
    predicted = {"esp32s3-n16r8": {"clock": "predicted from the esp32s3-n16r8 profile (240 MHz)",
                                   "prefill": {"ple": {"T1": {"us_per_token": 900.0, "bytes_per_token": {"psram": 5e5}},
                                                       "T8": None}},
                                   "speculation": {"default": {m: {"tok_per_s": tps, "us_per_token": 1e6 / tps,
                                                                   "draft_us_per_token": 0.0,
                                                                   "bytes_per_token": {"psram": 7e5}}
                                                               for m, tps in (("none", 40.0), ("lookup", 50.0))}}}}
    passes.print_passes({"rp2040-emu": {"clock": "emulated timer", "prefill": {"default": pre},
                                        "speculation": {"default": spec}}}, predicted)
    out = capsys.readouterr().out
    assert "T=8: 100,000 B (20.00 M cycles = 35 µs)" in out and "acceptance 25 % (3/12), 1.75 tokens per verifying pass" in out
    assert out.count("TOKENS DIFFER FROM PLAIN DECODING") == 1
    assert "T=4: 200,000 B (20.00 M cycles = 50 µs; predicted 60 µs (1.20x measured))" in out
    assert "per emitted token; predicted 200,000 µs (0.80x measured)" in out
    assert "esp32s3-n16r8, PREDICTED" in out and "T=8: does not fit its RAM" in out and "= 1.25x plain" in out


def test_native15m_table_labels_the_published_figure(capsys):
    from bench import native15m
    cg = lambda ir, rows: dict(ir_per_decode_token=ir, head_rows_per_decode_token=rows)
    native15m.print_table(dict(
        shape="15M shape", checkpoint="v2 file", matrices_kept=43, compiler="cc 12", cpu_avx2=True,
        runq_ir_per_token_issue=native15m.RUNQ_IR_PER_TOKEN, ir_target=native15m.IR_TARGET,
        callgrind={"clones_pruned": cg(20e6, 32000), "clones_all_logits": cg(16.5e6, 32000),
                   "baseline_pruned": cg(28e6, 32000), "baseline_all_logits": cg(24.5e6, 32000)},
        tok_s={"default": dict(tok_per_s_pruned=900.0, tok_per_s_all_logits=1000.0, head_rows_pruned_mean=512.0,
                               head_rows_out_vocab=1024)}))
    text = capsys.readouterr().out
    assert "16.50M" in text and "57.7M" in text and "NOT MEASURED HERE" in text and "<= 40M" in text
    assert "pruned/all 0.900, head rows 512 of 1024" in text
