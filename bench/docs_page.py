"""Write docs/bench.md from bench/results.json.

The page holds the last full ``make bench`` run's figures as Markdown tables, each section naming
its board, its clock and how memory was timed, predictions labelled as predictions.
``python -m bench`` rewrites the page after a full run (when it saves results.json);
``python -m bench.docs_page`` rewrites it from the results.json there is. Prose elsewhere links to
the page instead of copying figures, so no figure goes stale by hand; tests/test_docs.py checks
the committed page is what this module writes.
"""
from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from converter.costmodel import PHASES, TIERS

from .report import (RESULTS, Figures, bytes_table, callgrind_table, head_index_table, num, phase_table,
                     predicted_table, rat)

PAGE = RESULTS.parent.parent / "docs" / "bench.md"

# The kinds of run the figures come from, described once at the top of the page; every section
# names the kinds its tables come from.
RUNS = Figures("the runs: board, clock and how memory is timed", ["run", "board", "clock", "memory"], [
    ["native", "the engine compiled for this computer, the blob memory-mapped as its flash",
     "the host's monotonic clock, read by the firmware (noisy: other processes share the CPU)",
     "host RAM: bytes counted by the engine, not timed as flash"],
    ["callgrind", "the native engine under valgrind's callgrind (x86-64)",
     "instructions executed (deterministic, whatever the load)", "not timed"],
    ["emulated, XIP on", "rp2040-emu: the RP2040 firmware in rp2040js at 125 MHz",
     "the emulated timer: rp2040js's cycle counts (deterministic)",
     "the harness's XIP model: 16 KB two-way cache, a QSPI line transfer per miss ([emulator.md](emulator.md))"],
    ["emulated, XIP off", "rp2040-emu", "the emulated timer", "a flash read costs what an SRAM read costs (rp2040js as is)"],
    ["probe", "rp2040-emu, a probe image of the kernels", "SysTick (rp2040js's cycle counts)", "codes and activations in SRAM"],
    ["qemu", "esp32c3-isa-qemu, esp32s3-isa-qemu: the ESP32-C3's (rv32imc) and ESP32-S3's (Xtensa LX7) instruction "
     "sets on QEMU's generic machines, not the chips",
     "emulated instructions: QEMU's exact count of executed instructions (not cycles)", "not timed: QEMU models no "
     "cache, flash or PSRAM"],
    ["PREDICTED", "esp32s3-n16r8, pico, rp2040-emu profiles (boards/*.toml): nothing runs",
     "the planner's cost model at the profile's clock", "each tier's bandwidth and row latency from the profile"]])


def markdown(f: Figures) -> str:
    """``f`` as a Markdown table under its title in bold, the caption below it."""
    cell = lambda x: num(x).replace("|", "\\|").replace("\n", "<br>")
    words = lambda x: isinstance(x, str) and any(c.isalpha() for c in x)
    text = [i == 0 or all(words(r[i]) for r in f.rows) for i in range(len(f.columns))]
    lines = [f"**{f.title}**", "",
             "| " + " | ".join(c.replace("\n", "<br>") for c in f.columns) + " |",
             "|" + "|".join(":---" if left else "---:" for left in text) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in f.rows]
    return "\n".join(lines + (["", f.caption] if f.caption else []))


def per_run(title: str, runs: dict[str, dict], keys: list[tuple], caption: str | None = None) -> Figures:
    """One column per run, one row per ``(label, key)``: a dotted path into the run's dict, or a function of it."""
    get = lambda run, key: key(run) if callable(key) else functools.reduce(dict.__getitem__, key.split("."), run)
    return Figures(title, ["figure"] + list(runs), [[label] + [get(x, key) for x in runs.values()] for label, key in keys],
                   caption)


def headline(r: dict) -> Figures | None:
    rows = []
    n8, n4 = r.get("native_q8"), r.get("native_q4")
    if n8 and n4:
        rows.append(["native", "host clock", "host RAM, not timed", n8["tok_per_s"], n4["tok_per_s"]])
    e8, e4 = r.get("rp2040_emu_q8"), r.get("rp2040_emu_q4")
    if e8 and e4:
        rows.append(["rp2040-emu", "emulated timer, 125 MHz", "XIP model on", e8["emulated_tok_per_s"],
                     e4["emulated_tok_per_s"]])
    o8, o4 = r.get("rp2040_emu_q8_xip_off"), r.get("rp2040_emu_q4_xip_off")
    if o8 and o4:
        rows.append(["rp2040-emu", "emulated timer, 125 MHz", "XIP model off", 1e6 / o8["device_us_per_token"],
                     1e6 / o4["device_us_per_token"]])
    for board, models in r.get("predicted", {}).items():
        rows.append([f"{board} (PREDICTED)", "board profile", "profile's tiers, planner's placement"]
                    + [models[m]["tok_per_s"] if models[m]["fits"] else "does not fit" for m in ("default_q8", "default_q4")])
    return Figures("decode tokens per second, default model (greedy, convert's k12 KV cache, row scales)",
                   ["board", "clock", "memory", "q8 tok/s", "q4 tok/s"], rows) if rows else None


def emulated_table(r: dict) -> Figures | None:
    runs = {fmt: r[f"rp2040_emu_{fmt}"] for fmt in ("q8", "q4") if f"rp2040_emu_{fmt}" in r}
    if not runs:
        return None
    return per_run("emulated RP2040, default model: one run per format", runs, [
        ("cycles per decode token (harness)", "cycles_per_token"),
        ("emulated µs per decode token", "emulated_us_per_token"),
        ("emulated tok/s", "emulated_tok_per_s"),
        ("cycles per prefill step (harness)", "prefill_cycles_per_step"),
        ("XIP cache hits per decode token", "xip.hits"),
        ("XIP cache misses per decode token", "xip.misses"),
        ("of them, instruction fetches", "xip.fetch_misses"),
        ("cycles one miss stalls", "xip.miss_cycles"),
        ("stall cycles per decode token", "xip.stall_cycles"),
        ("stall share of the token", "xip.stall_share"),
        ("flash MB/s while stalled", "xip.flash_MBps_while_stalled"),
        ("flash MB/s over the token", "xip.flash_MBps_per_token"),
        ("XIP data misses / planner's predicted line fills", "xip_data_misses_over_predicted_lines"),
        ("predicted / emulated µs per decode token", "predicted_over_emulated_token"),
        ("golden check at boot, ms", "golden_boot_ms"),
        ("golden check on SELFTEST, ms", "golden_selftest_ms"),
        ("golden check bit-exact", lambda e: "yes" if e["golden_bit_exact"] else "no"),
        ("image .text bytes", "image_text_bytes"),
        ("image .bss bytes", "image_bss_bytes"),
        ("blob bytes", "blob_bytes"),
        ("emulator wall ms per token (host clock)", "wall_ms_per_token"),
        ("emulated Mcycles per wall second (host clock)", "emulated_mcycles_per_wall_s")])


XIP_OFF_RUNS = {"rp2040_emu_q8_xip_off": "q8 (row scales, k12 KV)", "rp2040_emu_q4_xip_off": "q4 (row scales, k12 KV)",
                "rp2040_emu_q8_f32_kv_xip_off": "q8, f32 KV cache",
                "rp2040_emu_q8_f32_scales_f32_kv_xip_off": "q8, f32 group scales + f32 KV"}


def xip_off_table(r: dict) -> Figures | None:
    runs = {label: r[k] for k, label in XIP_OFF_RUNS.items() if k in r}
    if not runs:
        return None
    phases = [ph for ph in PHASES if any(e["phase_cycles_median"][ph] for e in runs.values())]
    return per_run("emulated RP2040 with the XIP model off, the default model's weights in four formats", runs,
                   [("cycles per decode token", "cycles_per_token"), ("device µs per decode token", "device_us_per_token")]
                   + [(f"{ph} cycles (median)", f"phase_cycles_median.{ph}") for ph in phases]
                   + [("emulated Mcycles per wall second (host clock)", "emulated_mcycles_per_wall_s")])


def call_profile_table(r: dict) -> Figures | None:
    runs = {label: r[k]["call_profile"] for k, label in XIP_OFF_RUNS.items() if "call_profile" in r.get(k, {})}
    if not runs:
        return None
    names = list(next(iter(runs.values())))
    return Figures("call profile: emulated cycles per decode token inside each part of a layer (calls in brackets), "
                   "XIP model off", ["function"] + list(runs),
                   [[n] + [f"{num(p[n]['cycles'])} ({num(p[n]['calls'])})" for p in runs.values()] for n in names],
                   "attention is the attention itself (scores, softmax, the values' weighted sum); product the matrix "
                   "products with their activations' quantization")


def encode_table(r: dict) -> Figures | None:
    e = r.get("rp2040_emu_encode")
    if not e:
        return None
    return Figures("device tokenizer: time to encode a text prompt on the board (GENERATE_TEXT)",
                   ["prompt", "bytes", "tokens", "µs", "cycles"],
                   [[name, v["bytes"], v["tokens"], v["us"], v["cycles"]] for name, v in e.items()])


def xip_table(r: dict) -> Figures | None:
    x = r.get("rp2040_emu_xip_head_placement")
    if not x:
        return None
    rows = [[name, v["measured_output_us"], v["predicted_output_us"], v["measured_token_us"], v["predicted_token_us"],
             v["flash_bytes_per_token"], v["sram_bytes_per_token"]] for name, v in x["layouts"].items()]
    return Figures("a default-shaped model with a 256-token vocabulary, head read from flash vs staged in SRAM "
                   "(a LAYOUT frame, no reflash)",
                   ["layout", "output µs", "output µs PREDICTED", "token µs", "token µs PREDICTED", "flash B/token",
                    "SRAM B/token"], rows,
                   f"head in SRAM saves {num(x['head_in_sram_saves_us_measured'])} µs a token emulated, "
                   f"{num(x['head_in_sram_saves_us_predicted'])} predicted; one XIP miss {num(x['miss_ns'])} ns; "
                   f"flash {num(x['flash_MBps_while_stalled'])} MB/s while stalled; same tokens both ways: "
                   f"{'yes' if x['same_tokens'] else 'no'}")


def cores_table(r: dict) -> Figures | None:
    c = r.get("rp2040_emu_cores")
    if not c:
        return None
    rows = []
    for fmt, v in c.items():
        pre = v.get("prefill_t8") or {}
        rows.append([fmt, v["one_core_cycles_per_token"], v["two_cores_xip_cycles_per_token"],
                     v["two_cores_cycles_per_token"], rat(v["two_cores_cycles_per_token"] / v["one_core_cycles_per_token"]),
                     v["floor_cycles_per_token"], v["floor_bound"],
                     rat(v["two_cores_cycles_per_token"] / v["floor_cycles_per_token"]),
                     v["xip_two_cores_cached"]["bus_wait_cycles"], rat(v["predicted_over_emulated_token"]),
                     rat(pre["cycles_per_token"] / v["two_cores_cycles_per_token"]) if pre else "-"])
    return Figures("default model, decode: core 0 alone through the XIP cache (FLM_RP2040_CORES=1, FLM_RP2040_STREAM=0), "
                   "both cores through it (FLM_RP2040_STREAM=0), and both cores with the weights streamed (the default)",
                   ["format", "one core cycles/token", "two cores, XIP cache", "two cores, streamed", "streamed / one core",
                    "floor", "floor bound by", "streamed / floor", "bus wait cycles (XIP cache)", "PREDICTED / emulated",
                    "prefill T=8 / decode"], rows,
                   "floor: max(the one-core token's cycles with the XIP model off, halved; the flash bytes at the "
                   "SSI direct reads' rate, 1 KB reads); same tokens in the three builds: "
                   + ", ".join(f"{fmt} {'yes' if v['same_tokens'] else 'no'}" for fmt, v in c.items()))


def kernels_tables(r: dict) -> list[Figures]:
    k = r.get("kernels")
    if not k:
        return []
    cpw = Figures(f"cycles per weight of a matvec ({k['cycles_per_weight_shape']})",
                  ["format, group", "row scales (default)", "f32 group scales", "integer dots only"],
                  [[name, v["matvec_row_scaled"], v["matvec"], v["dot_only"]] for name, v in k["cycles_per_weight"].items()],
                  "activation quantization: " + ", ".join(f"{g} {num(v)} cycles per element"
                                                          for g, v in k["quantize_act_cycles_per_element"].items())
                  + f"; boot self-check: {'ok' if k['self_check'] == 0 else 'FAILED'}")
    ops = Figures("soft-float: cycles per call beyond an empty call", ["operation", "cycles"],
                  [[op, v] for op, v in k["float_op_cycles"].items()])
    return [cpw, ops]


def esp_tables(r: dict) -> list[Figures]:
    """The QEMU boards: instructions per decode token and phase; per weight beside the Cortex-M0+'s
    cycles (the kernels section, same run) and the floor kernels; per float operation; the fit."""
    e = r.get("esp_qemu")
    if not e:
        return []
    boards = list(e)
    runs = [(b, fmt, e[b]["decode"][fmt]) for b in boards for fmt in e[b]["decode"]]
    dec = Figures("instructions per decode token of the default model (convert's defaults: row scales, k12 KV "
                  "cache, head index), medians over the decode steps of one greedy generation",
                  ["phase"] + [f"{b}\n{fmt}" for b, fmt, _ in runs],
                  [[ph] + [x["phase_instructions"][ph] for *_, x in runs] for ph in PHASES if ph != "sampling"]
                  + [["token"] + [x["instructions_per_token"] for *_, x in runs],
                     ["golden check"] + [x["bit_exact"] for *_, x in runs]])
    m0 = (r.get("kernels") or {}).get("cycles_per_weight", {})
    kinds = (("matvec_row_scaled", "matvec, row scales (default)"), ("matvec", "matvec, f32 group scales"),
             ("dot_only", "integer group dots alone"))
    rows = [[f"{label}, {k}"] + [e[b]["probe"]["instructions_per_weight"][k][key] for b in boards]
            + [m0.get(k, {}).get(key)] for key, label in kinds for k in e[boards[0]]["probe"]["instructions_per_weight"]]
    rows += [[f"derived floor, row-scaled {fmt} (docs/kernels.md)"] + [e[b]["probe"]["floor_per_weight"][fmt] for b in boards]
             + [None] for fmt in ("q8", "q4")]
    rows += [[f"floor kernel (esp_probe.c), {k}"] + [e[b]["probe"]["floor_kernel_per_weight"][k]["dot_only"]
                                                     for b in boards] + [None]
             for k in e[boards[0]]["probe"]["floor_kernel_per_weight"]]
    pw = Figures(f"per weight: instructions on the QEMU boards beside the Cortex-M0+'s cycles (rp2040-emu probe, "
                 f"the kernels section) ({e[boards[0]]['probe']['shape']})",
                 ["kernel, format"] + [f"{b}\ninstructions" for b in boards] + ["rp2040-emu\ncycles"], rows,
                 "an instruction is not a cycle: the M0+'s column counts cycles (rp2040js), the others executed "
                 "instructions; the derived floors are a row-scaled group dot's fewest instructions a weight per "
                 "instruction set, the floor kernels esp_probe.c's C loops written toward the int8 one (docs/kernels.md)")
    ops = Figures("instructions per float operation beyond an integer xor (soft-float calls on the C3, the FPU on "
                  "the S3; fdiv on the S3: the soft-float's __divsf3)", ["operation"] + boards,
                  [[op] + [e[b]["probe"]["float_op_instructions"][op] for b in boards]
                   for op in e[boards[0]]["probe"]["float_op_instructions"]]
                  + [[f"quantize_act per element, {g}"] + [e[b]["probe"]["quantize_act_per_element"][g] for b in boards]
                     for g in e[boards[0]]["probe"]["quantize_act_per_element"]])
    fit = Figures("the planner's calibration from these counts (instructions per MAC: least squares over the "
                  "phases of both formats, the float operations at the probe's add/multiply)", ["figure"] + boards,
                  [[k] + [e[b]["fit"][k] for b in boards] for k in e[boards[0]]["fit"]])
    return [dec, pw, ops, fit]


def native15m_tables(r: dict) -> list[Figures]:
    m = r.get("native15m")
    if not m:
        return []
    c = m["callgrind"]
    builds = (("clones", "flashlm build (the loader's pick of the row kernels)"), ("baseline", "x86-64 baseline alone"))
    ir = Figures(f"callgrind instructions per decode token: {m['shape']} ({m['checkpoint']}, {m['matrices_kept']} "
                 f"matrices imported as they are; {m['compiler']})", ["build", "greedy head", "--all-logits", "head rows"],
                 [[label, c[f"{b}_pruned"]["ir_per_decode_token"], c[f"{b}_all_logits"]["ir_per_decode_token"],
                   c[f"{b}_pruned"]["head_rows_per_decode_token"]] for b, label in builds]
                 + [["llama2.c runq.c -O3 (measured once, not in this run)", "-", m["runq_ir_per_token_issue"], "-"],
                    ["the native engine's target", "-", m["ir_target"], "-"]])
    tok = Figures("native tok/s (host clock), greedy head vs --all-logits", ["model", "greedy head", "--all-logits",
                                                                            "greedy / all", "head rows (of out_vocab)"],
                  [[name, v["tok_per_s_pruned"], v["tok_per_s_all_logits"],
                    rat(v["tok_per_s_pruned"] / v["tok_per_s_all_logits"]),
                    f"{num(v['head_rows_pruned_mean'])} of {num(v['head_rows_out_vocab'])}"] for name, v in m["tok_s"].items()])
    return [ir, tok]


def speed_table(r: dict) -> Figures | None:
    s = r.get("speed")
    if not s:
        return None
    return per_run("the default model q8: whole vs greedy head, prefill with and without the head, int8 vs f32 KV "
                   "cache (per step the fastest round, then the median over steps)",
                   {f"{f['board']} ({f['clock']})": f for f in s.values()}, [
                       ("output µs per decode token, whole head", "output_us_full"),
                       ("output µs per decode token, greedy tile scan", "output_us_pruned"),
                       ("token µs, whole head", "token_us_full"),
                       ("token µs, greedy tile scan", "token_us_pruned"),
                       ("head rows visited, % of out_vocab (mean)", "head_rows_pct"),
                       ("head rows visited, % (fewest)", "head_rows_min_pct"),
                       ("prefill µs with the head", "prefill_with_head.total_us"),
                       ("prefill µs without the head", "prefill_without_head.total_us"),
                       ("attention µs, f32 KV cache", "attention_us_f32"),
                       ("attention µs, int8 KV cache", "attention_us_int8"),
                       ("KV bytes read per decode token, f32", "kv_read_per_token_f32"),
                       ("KV bytes read per decode token, int8", "kv_read_per_token_int8"),
                       ("KV bytes stored per position, f32", "kv_stored_per_position_f32"),
                       ("KV bytes stored per position, int8", "kv_stored_per_position_int8"),
                       ("int8 KV: greedy tokens", lambda f: "same" if f["int8_first_divergence"] is None
                        else f"differ from step {f['int8_first_divergence']}")])


def head_decision_table(r: dict) -> Figures | None:
    h = r.get("head_index")
    if not h:
        return None
    return Figures("convert's head-index decision (calibration by the reference's greedy steps)",
                   ["model", "out_vocab", "kept", "tile size", "worst cost / whole head", "why"],
                   [[name, m["n_out"], "yes" if m["kept"] else "no", m["decision"]["tile_size"],
                     rat(m["decision"]["worst"]), m["decision"]["reason"]] for name, m in h.items()])


def ple_seed_table(r: dict) -> Figures | None:
    t = r.get("ple_seed")
    if not t:
        return None
    rows = [[x["phase"], x["predicted_ms"], x["published_ms"], rat(x["ratio"])] for x in t["rows"]]
    rows.append(["token", t["predicted_total_ms"], t["published_total_ms"], rat(t["ratio_total"])])
    if "published_best_ms" in t:          # a run from before the best build's figure was recorded has none
        rows.append(["token, the best published build (no phase breakdown)", t["predicted_total_ms"],
                     t["published_best_ms"], rat(t["ratio_best"])])
    return Figures(f"{t['shape']} on {t['board']}: PREDICTED ms per token at position {t['position']} beside the "
                   f"published measurement on that chip", ["phase", "PREDICTED ms", "published ms", "predicted / published"],
                   rows, f"placement: tok_embeddings in {t['tiers']['tok_embeddings']}, ple.table in "
                   f"{t['tiers']['ple.table']}; predicted bytes per token: "
                   + ", ".join(f"{k} {num(v)}" for k, v in t["bytes_per_token"].items())
                   + f"; blob {num(t['blob_bytes'])} of a {num(t['flash_budget'])}-byte flash budget")


def ple_vs_dense_table(r: dict) -> Figures | None:
    p = r.get("ple_vs_dense")
    if not p:
        return None
    return per_run(f"the PLE model beside its equal-core dense twin: fp32 eval over all of eval.txt; PREDICTED on "
                   f"{p['board']} ({p['recipe']})", p["models"], [
                       ("parameters", "params"), ("in the PLE table", "table"), ("core", "core"),
                       ("eval loss, nats/token", "eval_loss"), ("perplexity", "eval_ppl"),
                       ("bits per character", "eval_bits_per_char"), ("blob bytes", "blob_bytes"),
                       ("tok/s PREDICTED", "tok_s_predicted")]
                   + [(f"{t} B/token PREDICTED", f"bytes_per_token_predicted.{t}") for t in TIERS],
                   f"core ple/dense {p['core_ratio']:.4f}; PLE lowers the eval loss by {p['loss_gain_nats']:.4f} nats")


def moe_tables(r: dict) -> list[Figures]:
    m = r.get("moe")
    if not m:
        return []
    evals = per_run("fp32 eval over all of eval.txt (PyTorch on the host)", m["eval_fp32"], [
        ("parameters", "params"), ("train steps", "train_steps"), ("eval loss, nats/token", "eval_loss"),
        ("perplexity", "eval_ppl"), ("bits per character", "eval_bits_per_char")])
    emu = per_run(f"per decode token on {m['board']}, XIP model {m['xip_model']} ({m['recipe']})", m["emulated"], [
        ("cycles", "cycles_per_token"), ("flash bytes", "flash_bytes_per_token"),
        ("FFN flash bytes (harness)", "ffn_flash_bytes_per_token"),
        ("FFN bytes, every row once", "ffn_flash_bytes_every_row"), ("FFN share read", "ffn_share_read")],
        f"moe: {m['n_experts']} experts, top {m['top_k']}: k/E {m['k_over_e']:.3f}, the bound 1.1 x k/E "
        f"{m['bound']:.3f}; experts' use calibrated on {m['expert_use']['source']}")
    pred = [Figures(f"PREDICTED decode token on {b} (planner, q8 g32, placed by the planner)",
                    ["model", "ms/token", "tok/s"] + [f"{t} B/token" for t in TIERS],
                    [[name, p["total_ms"], p["tok_per_s"]] + [p["bytes_per_token"].get(t, 0) for t in TIERS]
                     for name, p in models.items() if p["fits"]]) for b, models in m["predicted"].items()]
    return [evals, emu, *pred]


def fidelity_tables(r: dict) -> list[Figures]:
    return [Figures(f"{name}: teacher-forced over {f['positions']:,} positions of fp32's sampled text, greedy over "
                    f"{f['prompts']} prompts x {f['tokens']} tokens",
                    ["recipe", "bits/weight", "top-1", "KL (nats)", "ΔCE (nats/token)", "greedy = fp32, median tokens"],
                    [[f"{row['label']} ({row['recipe']})", row["bits_per_weight"], row["top1_agreement"],
                      row["kl_mean"], row["delta_ce"], row["greedy"]["median"]] for row in f["rows"]])
            for name, f in r.get("fidelity", {}).items()]


def passes_tables(r: dict) -> list[Figures]:
    out = []
    for board, f in r.get("passes", {}).items():
        emu = board != "native"
        rows = []
        for name, ts in f["prefill"].items():
            for t, v in ts.items():
                row = [f"{name} {t}", v["flash_bytes_per_token"], v["us_per_token"]]
                if emu:
                    row += [v["cycles_per_token"], v["predicted"]["us_per_token"],
                            rat(v["predicted"]["us_per_token"] / v["us_per_token"])]
                rows.append(row)
        out.append(Figures(f"{board}, {f['clock']}: batched prefill per prompt token, passes of T tokens",
                           ["model, T", "flash B", "µs"] + (["cycles", "µs PREDICTED", "predicted / emulated"] if emu else []),
                           rows))
        rows = []
        for name, modes in f["speculation"].items():
            for m, v in modes.items():
                row = [f"{name} {m}", "-" if v["acceptance"] is None else f"{100 * v['acceptance']:.0f} % "
                       f"({v['accepted']}/{v['drafted']})", v["tokens_per_verify_pass"] or "-", v["tok_per_s"],
                       v["us_per_token"], v["bytes_per_token"]["flash"], "yes" if v["same_tokens_as_plain"] else "NO"]
                if emu:
                    row += [v["predicted"]["us_per_token"], rat(v["predicted"]["us_per_token"] / v["us_per_token"])]
                rows.append(row)
        out.append(Figures(f"{board}, {f['clock']}: speculative decoding against plain greedy decoding (none)",
                           ["model, proposer", "acceptance", "tokens per verifying pass", "tok/s", "µs per emitted token",
                            "flash B per emitted token", "plain decoding's tokens"]
                           + (["µs PREDICTED", "predicted / emulated"] if emu else []), rows))
    for board, f in r.get("passes_predicted", {}).items():
        out.append(Figures(f"{board}, PREDICTED, {f['clock']} (nothing measured): batched prefill per prompt token",
                           ["model, T", "µs PREDICTED"] + [f"{t} B" for t in TIERS],
                           [[f"{name} {t}"] + (["does not fit its RAM"] + ["-"] * len(TIERS) if v is None else
                                               [v["us_per_token"]] + [v["bytes_per_token"][x] for x in TIERS])
                            for name, ts in f["prefill"].items() for t, v in ts.items()]))
        out.append(Figures(f"{board}, PREDICTED: the native run's speculative generations on this board's placement",
                           ["model, proposer", "tok/s", "µs per emitted token", "of it drafting"]
                           + [f"{t} B per emitted token" for t in TIERS],
                           [[f"{name} {m}", v["tok_per_s"], v["us_per_token"], v["draft_us_per_token"]]
                            + [v["bytes_per_token"][x] for x in TIERS]
                            for name, modes in f["speculation"].items() for m, v in modes.items()]))
    return out


def convert_table(r: dict) -> Figures | None:
    c = r.get("convert_15M_llama2c_v1")
    if not c:
        return None
    keys = ("load_s", "quantize_s", "head_index_s", "blob_s", "total_s", "blob_bytes")
    return Figures(f"convert a random 15M-parameter llama2.c v1 checkpoint ({num(c['params'])} parameters; host "
                   f"clock, seconds)", ["format"] + list(keys), [[fmt] + [c[fmt][k] for k in keys] for fmt in ("q8", "q4")])


def ratios_list(r: dict) -> Figures | None:
    rows = [[k, rat(v)] for k, v in r.get("ratios", {}).items()]
    return Figures("ratios measured in this run (PREDICTED ones come from the planner)",
                   ["ratio", "value"], rows) if rows else None


def wall_table(r: dict) -> Figures | None:
    w = r.get("bench_wall_s")
    return Figures("wall time per section (host clock, s)", ["section", "s"], [[k, v] for k, v in w.items()]) if w else None


def render(r: dict) -> str:
    """The page for the results dict ``r`` (a full run's bench/results.json)."""
    m = r["default_model"]
    sections = [
        ("Summary", None, [headline(r)]),
        ("Runs", None, [RUNS]),
        ("Default model per phase", "Runs: native, emulated (XIP on), PREDICTED (rp2040-emu profile).",
         [phase_table(r), bytes_table(r)]),
        ("Emulated RP2040", "Run: emulated, XIP on.", [emulated_table(r)]),
        ("Emulated RP2040, XIP model off", "Run: emulated, XIP off.", [xip_off_table(r), call_profile_table(r)]),
        ("Device tokenizer", "Run: emulated, XIP on.", [encode_table(r)]),
        ("XIP model: head placement", "Runs: emulated, XIP on; PREDICTED (rp2040-emu profile).", [xip_table(r)]),
        ("Both RP2040 cores", "Runs: emulated, XIP on (and off for the floor); PREDICTED (rp2040-emu profile).",
         [cores_table(r)]),
        ("Kernels on the Cortex-M0+", "Run: probe.", kernels_tables(r)),
        ("The ESP32 instruction sets in QEMU", "Runs: qemu (instructions), probe (the M0+'s cycles).", esp_tables(r)),
        ("Native engine instructions", "Run: callgrind.", [callgrind_table(r)]),
        ("The 15M llama2.c shape", "Runs: callgrind (instructions), native (tok/s).", native15m_tables(r)),
        ("Speed work: head, prefill, KV cache", "Runs: native, emulated (XIP on).", [speed_table(r)]),
        ("Greedy head index", "Runs: native (µs), callgrind (instructions), emulated (XIP on, cycles).",
         [head_index_table(r), head_decision_table(r)]),
        ("Predicted boards", "Run: PREDICTED (esp32s3-n16r8 and pico profiles).", [predicted_table(r), ple_seed_table(r)]),
        ("PLE vs dense", "Eval: fp32 in PyTorch on the host; bytes and tok/s: PREDICTED (pico profile).",
         [ple_vs_dense_table(r)]),
        ("Mixture of experts", "models/moe beside models/default (same bytes per token) and models/moe-dense (same "
         "parameters). Runs: fp32 eval on the host, emulated (XIP on), PREDICTED (esp32s3-n16r8, pico).", moe_tables(r)),
        ("Forward passes of several tokens", "Runs: native, emulated (XIP on), PREDICTED (esp32s3-n16r8, pico, and "
         "rp2040-emu beside the emulated figures).", passes_tables(r)),
        ("Fidelity", "Each recipe against fp32: the NumPy reference with the device's numerics (bit-exact with every "
         "board; its KV format and integer attention included) on the host.", fidelity_tables(r)),
        ("Convert", "Host clock.", [convert_table(r)]),
        ("Ratios", "Each ratio names its runs; its figures are in the sections above.", [ratios_list(r)]),
        ("Bench run", None, [wall_table(r)]),
    ]
    out = ["# Benchmark figures", "",
           "<!-- Written by `python -m bench.docs_page` from bench/results.json; `make bench` rewrites both. "
           "Do not edit by hand. -->", "",
           f"The last full `make bench` run: {r['when']}, {r['host']['cpus']} CPUs, load {r['host']['load_1min']:.2f}. "
           f"Default model: `models/default`, {num(m['params'])} parameters (dim {m['dim']}, {m['layers']} layers, "
           f"vocab {m['vocab']}, context {m['context']}). Each section names the runs its figures come from (board, "
           "clock and how memory is timed: [Runs](#runs)); PREDICTED figures come from the planner and the board "
           "profiles, nothing ran on those boards. "
           "What each section measures and how to run it: [testing.md](testing.md#benchmarks).", ""]
    out += [f"- [{title}](#{anchor(title)})" for title, _, _ in sections]
    for title, intro, tables in sections:
        tables = [t for t in tables if t is not None]
        out += ["", f"## {title}", ""]
        if tables:
            out += ([intro, ""] if intro else []) + ["\n\n".join(markdown(t) for t in tables)]
        else:       # the section came after this run: the page says so rather than dropping its heading
            out += ["Not in this run (its results predate the section): the next full `make bench` measures it."]
    return "\n".join(out) + "\n"


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, spaces to hyphens, punctuation but hyphens dropped."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def write(results: Path = RESULTS, page: Path = PAGE) -> Path:
    page.write_text(render(json.loads(results.read_text())))
    return page


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.docs_page", description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="a full run's results (default: bench/results.json)")
    ap.add_argument("-o", "--output", type=Path, default=PAGE, help="the page to write (default: docs/bench.md)")
    a = ap.parse_args(argv)
    print(f"wrote {write(a.results, a.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
