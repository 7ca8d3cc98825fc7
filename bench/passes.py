"""Forward passes of several tokens (docs/formats.md section 2.4) on the shipped models, on the native
board and the emulated RP2040:

* batched prefill: a 17-token prompt whose first 16 tokens run in passes of T = 1, 4, 8 (the 17th,
  with the head, apart): per prompt token the flash bytes (the engine's counters; on the emulator the
  harness's count of the core's loads beside them) and the time — emulated cycles (the harness's
  count, deterministic) on the RP2040, host-clock µs (the fastest of a few rounds) on the native board;
* speculative decoding, greedy: the same generation plain, with prompt lookup and, for models/default,
  with its shipped draft model (models/default/draft), DRAFT_K drafts a verifying pass: acceptance,
  tokens per verifying pass, µs (and emulated cycles) and bytes per emitted token, emitted tok/s
  against plain decoding (the device's clock), and whether the tokens are plain decoding's (they
  must be: tests/test_multitoken.py asserts it; here it is reported).

The Cortex-M0+ is compute-bound (its soft-float above all): a pass of T tokens there costs about T
one-token passes of arithmetic while reading each weight once, so bytes per token fall ~T-fold and
cycles far less (the harness's XIP model charges the flash line fills the pass saves).

Beside the measurements, the planner's predictions of the same passes (converter/passcost.py,
speculation.py; labelled predicted): on the emulated RP2040 each measured pass predicted at its own
positions on the image's placement, with the predicted/emulated ratios; for the ESP32-S3 (N16R8) and
the Pico, prefill per prompt token at T = 1, 4, 8 and the speculative generations' passes (the same
tokens: greedy-exact on every board, taken from the native runs) on the planner's placement for the
board — predicted µs and bytes per emitted token, and tok/s against plain decoding there."""
from __future__ import annotations

import functools
import statistics
from pathlib import Path

from converter import costmodel as C
from converter.blob import read_header
from converter.boards import load_board
from converter.draft import attach
from converter.load import load_model
from converter.passcost import Placement, prefill
from converter.planner import NoFit, fits, plan
from converter.quantize import quantize
from converter.speculation import predict_run
from converter.tokenizer import encode
from host.commands.roofline import draft_of, record, run_passes
from host.link.messages import Generate
from host.output.export import result_dict
from host.output.stats import forward_passes, pass_summary
from host.boards.emulated import start_emulated_board
from host.boards.native import start_native_board

from .model import PROMPT, ROOT, blob_and_firmware, session

MODELS = {"default": ROOT / "models" / "default", "ple": ROOT / "models" / "ple",
          "ple-dense": ROOT / "models" / "ple-dense"}
DRAFT = ROOT / "models" / "default" / "draft"     # flashlm train --preset draft
PREFILL_T = (1, 4, 8)
SPEC_BATCH = 4          # the speculation images' batch: DRAFT_K drafts + the last token
DRAFT_K = 3
NEW = {"native": 48, "rp2040-emu": 16}
ROUNDS = 2              # native: the fastest round (a busy host only adds time)
EMU_BOARD = "rp2040-emu"
PREDICTED_BOARDS = ("esp32s3-n16r8", "pico")     # predicted only: no board here to measure
PROMPT_STEPS = 16       # prefill_ids: the prompt tokens whose outputs are unused


@functools.cache
def qmodel(name: str, draft: bool = False):
    qm = quantize(load_model(MODELS[name] / "model.pt"), "q8", 32)
    if draft:
        qm = attach(qm, quantize(load_model(DRAFT / "model.pt"), "q8", 32))
    return qm


def prefill_ids(qm) -> list[int]:
    """17 tokens of the model's held-out text: 16 prompt tokens whose output is unused, then the last."""
    text = (MODELS["default"] / "eval.txt").read_text(encoding="utf-8")[:2000]
    return list(encode(qm.tokenizer, text, bos=True))[:17]


def _boards(qm, work: Path, batch: int, boards: tuple[str, ...]):
    """{board: (blob, firmware)} for an image of ``qm`` with this batch."""
    return {b: blob_and_firmware(qm, b, work / f"{b}-t{batch}", batch=batch) for b in boards}


def _run(board: str, blob, fw, jobs, rounds: int):
    """Each (prompt, max_new, kwargs) job on one board, ``rounds`` times: [[RunResult per job] per
    round], and the harness's per-pass counts of the emulator's runs, per job (one round there)."""
    ctx = start_native_board(fw.binary, blob) if board == "native" else start_emulated_board(
        fw.binary, blob, board=board, timeout=120)
    out, counts = [], []
    with ctx as vb, session(vb.port, 300) as s:
        for _ in range(rounds):
            rr = []
            for ids, n, kw in jobs:
                if board != "native":
                    vb.read_counts()
                rr.append(s.generate(Generate(ids, n, **kw)))
                if board != "native":
                    counts.append({c["step"]: c for c in vb.read_counts()})
            out.append(rr)
    return out, counts


def prefill_figures(runs, counts) -> dict:
    """Per prompt token of the 16 prompt steps whose output is unused: µs (fastest round), flash
    bytes, emulated cycles (the harness's) and whether the harness's byte counts equal the engine's."""
    def pure(res):
        return [p for p in forward_passes(res.tokens) if p["prompt_steps"] == p["tokens"]]
    n = sum(p["tokens"] for p in pure(runs[0]))
    out = dict(tokens=n, passes=len(pure(runs[0])),
               us_per_token=min(sum(p["total_us"] for p in pure(r)) for r in runs) / n,
               flash_bytes_per_token=sum(p["bytes"]["flash"] for p in pure(runs[0])) / n)
    if counts:
        firsts = [p["first"] for p in pure(runs[-1])]
        out["cycles_per_token"] = sum(counts[f]["cycles"] for f in firsts) / n
        out["harness_flash_bytes_per_token"] = sum(counts[f]["bytes"][0] for f in firsts) / n
    return out


def spec_figures(runs, counts, plain_ids) -> dict:
    """Decoding after the prompt (pass_summary's decode figures; µs from the fastest round)."""
    dec = [pass_summary(r)["decode"] for r in runs]
    best = min(dec, key=lambda d: d["us_per_token"] or float("inf"))
    out = dict(emitted=best["emitted"], verify_passes=best["verify_passes"], drafted=best["drafted"],
               accepted=best["accepted"], acceptance=best["acceptance"],
               tokens_per_verify_pass=best["tokens_per_verify_pass"], tokens_per_pass=best["tokens_per_pass"],
               us_per_token=best["us_per_token"], tok_per_s=best["tok_per_s"],
               draft_us_per_token=best["draft_us_per_token"], bytes_per_token=best["bytes_per_token"],
               same_tokens_as_plain=int(all(r.generated_ids == plain_ids for r in runs)))
    if counts:
        firsts = [p["first"] for p in forward_passes(runs[-1].tokens) if not p["prompt_steps"]]
        out["cycles_per_token"] = sum(counts[f]["cycles"] for f in firsts) / out["emitted"]
    return out


def predicted_prefill(place: Placement, T: int) -> dict:
    """The prompt steps of prefill_ids in passes of T at positions 0..15, predicted on ``place``."""
    ps = prefill(place, 0, PROMPT_STEPS, T)
    return dict(us_per_token=sum(p.total_us for p in ps) / PROMPT_STEPS,
                bytes_per_token={t: sum(p.bytes_read[t] for p in ps) / PROMPT_STEPS for t in C.TIERS})


def predicted_decoding(place: Placement, res, draft: Placement | None) -> dict:
    """A run's decoding passes (every step a generated token) predicted at their own positions on
    ``place``, drafting included: per emitted token µs, drafting's µs, tok/s and bytes."""
    run = result_dict(res)
    passes = run_passes(run)
    preds = predict_run(place, [record(p, run) for p in passes], draft)
    dec = [(p, m, d) for p, (m, d) in zip(passes, preds) if not p["prompt_steps"]]
    n = sum(p["steps"] for p, _, _ in dec)
    us = sum(m.total_us + (d.total_us if d else 0.0) for _, m, d in dec)
    return dict(emitted=n, us_per_token=us / n, tok_per_s=1e6 * n / us,
                draft_us_per_token=sum(d.total_us for _, _, d in dec if d) / n,
                bytes_per_token={t: sum(m.bytes_read[t] + (d.bytes_read[t] if d else 0) for _, m, d in dec) / n
                                 for t in C.TIERS})


def board_section(board: str, work: Path) -> dict:
    rounds = ROUNDS if board == "native" else 1
    out: dict = {"prefill": {}, "speculation": {}}
    for name in ("default", "ple"):
        qm = qmodel(name)
        spec = C.ModelSpec.from_quant(qm)      # the batches whose scratch the board's RAM holds (all flash)
        ts = [t for t in PREFILL_T if fits(spec, board, base="flash", batch=t)]
        (blob, fw), = _boards(qm, work / name, max(ts), (board,)).values()
        ids = prefill_ids(qm)
        runs, counts = _run(board, blob, fw, [(ids, 1, dict(batch=t)) for t in ts], rounds)
        out["prefill"][name] = {f"T{t}": prefill_figures([r[i] for r in runs], counts[i] if counts else None)
                                for i, t in enumerate(ts)}
        if board == EMU_BOARD:
            place = Placement.of_header(read_header(blob), load_board(board))
            for t in ts:
                out["prefill"][name][f"T{t}"]["predicted"] = predicted_prefill(place, t)
    names = ("default", "ple", "ple-dense") if board == "native" else ("default",)
    for name in names:
        draft = name == "default" and (DRAFT / "model.pt").exists()
        qm = qmodel(name, draft)
        (blob, fw), = _boards(qm, work / f"{name}-spec", SPEC_BATCH, (board,)).values()
        ids = list(encode(qm.tokenizer, PROMPT, bos=True))
        modes = ["none", "lookup"] + (["draft"] if draft else [])
        jobs = [(ids, NEW[board], dict(speculate=m, draft_k=DRAFT_K if m != "none" else 0)) for m in modes]
        runs, counts = _run(board, blob, fw, jobs, rounds)
        plain = runs[0][0].generated_ids
        out["speculation"][name] = {m: spec_figures([r[i] for r in runs], counts[i] if counts else None, plain)
                                    for i, m in enumerate(modes)}
        h = read_header(blob)
        boards = (board,) if board == EMU_BOARD else PREDICTED_BOARDS
        for b in boards:   # the emulated board: the image's placement; others: the planner's for them
            place = (Placement.of_header(h, load_board(b)) if b == board else
                     Placement.of(plan(C.ModelSpec.from_header(h), b, batch=SPEC_BATCH)))
            pred = {m: predicted_decoding(place, runs[0][i], draft_of(h, place) if m == "draft" else None)
                    for i, m in enumerate(modes)}
            if b == board:
                for m in modes:
                    out["speculation"][name][m]["predicted"] = pred[m]
            else:
                out.setdefault("predicted", {}).setdefault(b, {})[name] = pred
    out["clock"] = "host clock" if board == "native" else "emulated timer (rp2040js, 125 MHz)"
    return out


def predicted_boards(generations: dict) -> dict:
    """ESP32-S3 and Pico, predicted: prefill per prompt token at T = 1, 4, 8 on the planner's placement at
    that batch (None where its RAM does not hold it), and the native runs' speculative generations on
    each board (``generations``: board -> model -> mode -> predicted_decoding, from board_section)."""
    out = {}
    for b in PREDICTED_BOARDS:
        prof = load_board(b)
        out[b] = {"clock": f"predicted from the {b} profile ({prof['clock_mhz']} MHz)", "prefill": {},
                  "speculation": generations.get(b, {})}
        for name in ("default", "ple"):
            spec = C.ModelSpec.from_quant(qmodel(name))
            out[b]["prefill"][name] = {}
            for t in PREFILL_T:
                try:
                    place = Placement.of(plan(spec, b, batch=t, suggest=False))
                except NoFit:
                    out[b]["prefill"][name][f"T{t}"] = None
                    continue
                out[b]["prefill"][name][f"T{t}"] = predicted_prefill(place, t)
    return out


def section(work: Path) -> dict:
    res = {"passes": {b: board_section(b, work / b) for b in ("native", EMU_BOARD)}}
    res["passes_predicted"] = predicted_boards(res["passes"]["native"].pop("predicted", {}))
    ratios = {}
    for b, f in res["passes"].items():
        pre = f["prefill"]["default"]
        ratios[f"{b} default q8 prefill flash bytes per token T1/T8"] = (
            pre["T1"]["flash_bytes_per_token"] / pre["T8"]["flash_bytes_per_token"])
        key = "cycles_per_token" if b != "native" else "us_per_token"
        ratios[f"{b} default q8 prefill {key.split('_')[0]} per token T8/T1"] = pre["T8"][key] / pre["T1"][key]
        for name, modes in f["speculation"].items():
            for m in modes:
                if m != "none" and modes[m]["tok_per_s"] and modes["none"]["tok_per_s"]:
                    ratios[f"{b} {name} {m}/plain emitted tok/s"] = modes[m]["tok_per_s"] / modes["none"]["tok_per_s"]
                    ratios[f"{b} {name} {m}/plain flash bytes per emitted token"] = (
                        modes[m]["bytes_per_token"]["flash"] / modes["none"]["bytes_per_token"]["flash"])
    emu = res["passes"][EMU_BOARD]
    for name, ts in emu["prefill"].items():
        for t, v in ts.items():
            ratios[f"{EMU_BOARD} {name} q8 prefill {t} predicted/emulated µs per prompt token"] = (
                v["predicted"]["us_per_token"] / v["us_per_token"])
    for name, modes in emu["speculation"].items():
        for m, v in modes.items():
            ratios[f"{EMU_BOARD} {name} {m} predicted/emulated µs per emitted token"] = (
                v["predicted"]["us_per_token"] / v["us_per_token"])
    for b, f in res["passes_predicted"].items():
        pre = f["prefill"]["default"]
        if pre["T1"] and pre["T8"]:
            ratios[f"{b} default q8 prefill µs per token T1/T8 (predicted)"] = (
                pre["T1"]["us_per_token"] / pre["T8"]["us_per_token"])
        for name, modes in f["speculation"].items():
            for m in modes:
                if m != "none":
                    ratios[f"{b} {name} {m}/plain emitted tok/s (predicted)"] = (
                        modes[m]["tok_per_s"] / modes["none"]["tok_per_s"])
    res["ratios"] = ratios
    return res


def _vs_predicted(v: dict) -> str:
    """" — predicted X µs (predicted/measured R)" where a prediction sits beside a measurement."""
    pr = v.get("predicted")
    if not pr:
        return ""
    return f"; predicted {pr['us_per_token']:,.0f} µs ({pr['us_per_token'] / v['us_per_token']:.2f}x measured)"


def print_passes(p: dict, predicted: dict | None = None) -> None:
    for board, f in p.items():
        print(f"\npasses of several tokens on {board} ({f['clock']}); q8, group 32")
        for name, ts in f["prefill"].items():
            cells = ", ".join(f"T={t[1:]}: {v['flash_bytes_per_token']:,.0f} B"
                              + (f" ({v['cycles_per_token'] / 1e6:,.2f} M cycles = {v['us_per_token']:,.0f} µs"
                                 f"{_vs_predicted(v)})" if "cycles_per_token" in v
                                 else f" ({v['us_per_token']:,.0f} µs)") for t, v in ts.items())
            print(f"  {name} prefill, per prompt token (flash bytes, time): {cells}")
        for name, modes in f["speculation"].items():
            for m, v in modes.items():
                acc = "" if m == "none" else (f"acceptance {100 * v['acceptance']:.0f} % ({v['accepted']}/{v['drafted']}), "
                                               f"{v['tokens_per_verify_pass']:.2f} tokens per verifying pass, "
                                               if v["acceptance"] is not None else "no drafts, ")
                cyc = f", {v['cycles_per_token'] / 1e6:,.2f} M cycles" if "cycles_per_token" in v else ""
                print(f"  {name} {m:6}: {acc}{v['tok_per_s']:,.2f} tok/s, {v['us_per_token']:,.0f} µs{cyc} and "
                      f"{v['bytes_per_token']['flash']:,.0f} flash B per emitted token{_vs_predicted(v)}"
                      + ("" if v["same_tokens_as_plain"] else "  [TOKENS DIFFER FROM PLAIN DECODING]"))
    for board, f in (predicted or {}).items():
        print(f"\npasses of several tokens on {board}, PREDICTED ({f['clock']}; nothing measured); q8, group 32")
        for name, ts in f["prefill"].items():
            cells = ", ".join(f"T={t[1:]}: " + ("does not fit its RAM" if v is None else
                                                 f"{v['us_per_token']:,.0f} µs, "
                                                 + " + ".join(f"{b:,.0f} {tier}" for tier, b in v["bytes_per_token"].items() if b)
                                                 + " B") for t, v in ts.items())
            print(f"  {name} prefill, per prompt token: {cells}")
        for name, modes in f["speculation"].items():
            plain = modes.get("none")
            for m, v in modes.items():
                vs = f" = {v['tok_per_s'] / plain['tok_per_s']:.2f}x plain" if plain and m != "none" else ""
                draft = f" (drafting {v['draft_us_per_token']:,.0f})" if v["draft_us_per_token"] else ""
                print(f"  {name} {m:6}: the native run's passes: {v['tok_per_s']:,.2f} tok/s{vs}, "
                      f"{v['us_per_token']:,.0f} µs{draft} and "
                      + " + ".join(f"{b:,.0f} {tier}" for tier, b in v["bytes_per_token"].items() if b)
                      + " B per emitted token")
