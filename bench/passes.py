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

The Cortex-M0+ is compute-bound in rp2040js (which charges flash reads nothing): a pass of T tokens
there costs about T one-token passes of arithmetic while reading each weight once, so bytes per token
fall and cycles do not. The planner's predictions of these passes for other boards (a roofline) are
not part of this section."""
from __future__ import annotations

import functools
import statistics
from pathlib import Path

from converter.draft import attach
from converter.load import load_model
from converter.quantize import quantize
from converter.tokenizer import encode
from host.report import forward_passes, pass_summary
from host.virtual import start_emulated_board, start_native_board

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
                rr.append(s.generate(ids, n, **kw))
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


def board_section(board: str, work: Path) -> dict:
    rounds = ROUNDS if board == "native" else 1
    out: dict = {"prefill": {}, "speculation": {}}
    for name in ("default", "ple"):
        qm = qmodel(name)
        (blob, fw), = _boards(qm, work / name, max(PREFILL_T), (board,)).values()
        ids = prefill_ids(qm)
        runs, counts = _run(board, blob, fw, [(ids, 1, dict(batch=t)) for t in PREFILL_T], rounds)
        out["prefill"][name] = {f"T{t}": prefill_figures([r[i] for r in runs], counts[i] if counts else None)
                                for i, t in enumerate(PREFILL_T)}
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
    out["clock"] = "host clock" if board == "native" else "emulated timer (rp2040js, 125 MHz)"
    return out


def section(work: Path) -> dict:
    res = {"passes": {b: board_section(b, work / b) for b in ("native", EMU_BOARD)}}
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
    res["ratios"] = ratios
    return res


def print_passes(p: dict) -> None:
    for board, f in p.items():
        print(f"\npasses of several tokens on {board} ({f['clock']}); q8, group 32")
        for name, ts in f["prefill"].items():
            cells = ", ".join(f"T={t[1:]}: {v['flash_bytes_per_token']:,.0f} B"
                              + (f" ({v['cycles_per_token'] / 1e6:,.2f} M cycles)" if "cycles_per_token" in v
                                 else f" ({v['us_per_token']:,.0f} µs)") for t, v in ts.items())
            print(f"  {name} prefill, per prompt token (flash bytes, time): {cells}")
        for name, modes in f["speculation"].items():
            for m, v in modes.items():
                acc = "" if m == "none" else (f"acceptance {100 * v['acceptance']:.0f} % ({v['accepted']}/{v['drafted']}), "
                                               f"{v['tokens_per_verify_pass']:.2f} tokens per verifying pass, "
                                               if v["acceptance"] is not None else "no drafts, ")
                cyc = f", {v['cycles_per_token'] / 1e6:,.2f} M cycles" if "cycles_per_token" in v else ""
                print(f"  {name} {m:6}: {acc}{v['tok_per_s']:,.2f} tok/s, {v['us_per_token']:,.0f} µs{cyc} and "
                      f"{v['bytes_per_token']['flash']:,.0f} flash B per emitted token"
                      + ("" if v["same_tokens_as_plain"] else "  [TOKENS DIFFER FROM PLAIN DECODING]"))
