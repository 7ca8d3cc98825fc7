"""The emulated RP2040 (rp2040js at 125 MHz): the default model at q8 and q4, decode and prefill apart.

* cycles per step: the harness's count of emulated cycles between the firmware's step marks
  (deterministic: the same image, blob and prompt give the same count on every run);
* cycles per phase: the firmware's own per-phase µs (its TIMER, which advances with the emulated
  cycles) × 125 MHz — deterministic too, within 1 µs per timed interval;
* bytes per token per tier three ways: the engine's counters (TOKEN frames), the harness's count
  of the core's loads, and the planner's prediction for that step (rp2040-emu profile, the blob's
  placement);
* the planner's predicted µs per phase beside the emulated ones (rp2040-emu charges flash reads
  nothing, as rp2040js does: there flash time is a lower bound of a real Pico's);
* the time the device tokenizer takes to encode text prompts (GENERATE_TEXT's LOG line).
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from converter import costmodel as C
from converter.blob import kv_format, read_header, unpack_state_tiers
from converter.boards import load_board
from host.protocol import PHASES, TIERS, Done, GenerateText, Log, Stop
from host.virtual import start_emulated_board

from .model import FORMATS, MODEL, PROMPT, blob_and_firmware, default_quant, prompt_ids, session

BOARD = "rp2040-emu"
MHZ = float(load_board(BOARD)["clock_mhz"])


def predictor(blob: Path, board: str):
    """pos, head -> the planner's Prediction for a step of ``blob`` as placed in its header."""
    h = read_header(blob)
    spec = C.ModelSpec.from_header(h, str(blob))
    prof = load_board(board)
    regions = {r: ("sram" if t == "default" else t) for r, t in unpack_state_tiers(h.state_tiers).items()}
    kv = kv_format(h.state_tiers)
    return lambda pos, head: C.predict(spec, prof, h.tiers, regions, pos, kv, "greedy", head=head)


def _head(t) -> str | int:
    """The output layer a step computed, as the planner names it (greedy: pruned rows, or skipped)."""
    return "skip" if t.head_rows == 0 else int(t.head_rows)


def _median(xs) -> float:
    return float(statistics.median(xs))


def emu_run(qm, work: Path, new_tokens: int = 12) -> dict:
    """One generation of the prompt and ``new_tokens`` on the emulated RP2040 (deterministic: one run)."""
    blob, fw = blob_and_firmware(qm, BOARD, work)
    m = re.search(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s", fw.size_text, re.M)
    with start_emulated_board(fw.binary, blob) as board, session(board.port) as s:
        board.read_counts()
        res = s.generate(prompt_ids(qm), new_tokens)
        counts = {c["step"]: c for c in board.read_counts()}
    dec, pre = res.generated_steps[1:], res.prompt_steps
    h = [counts[t.step] for t in dec]
    hp = [counts[t.step] for t in pre]
    predict = predictor(blob, BOARD)
    pred = [predict(t.pos, _head(t)) for t in dec]
    last = dec[-1]
    emu_us = {p: _median(t.us[i] for t in dec) for i, p in enumerate(PHASES)}
    device_us = _median(sum(t.us) for t in dec)
    pred_us = {p: _median(x.phase_us.get(p, 0.0) for x in pred) for p in PHASES}   # (draft: not predicted)
    return dict(
        clock=res.clock, decode_steps=len(dec),
        cycles_per_token=_median(c["cycles"] for c in h),
        emulated_us_per_token=_median(c["us"] for c in h),
        device_us_per_token=device_us,
        emulated_tok_per_s=1e6 / device_us,
        wall_ms_per_token=_median(c["wall_ms"] for c in h),
        emulated_mcycles_per_wall_s=_median(c["cycles"] / c["wall_ms"] / 1e3 for c in h),
        harness_agrees=int(all(counts[t.step]["bytes"] == list(t.bytes_read) for t in res.tokens)),
        # per phase: firmware µs x clk_sys (median over decode steps); and how much of the harness's
        # cycles the timed phases cover
        phase_cycles_median={p: us * MHZ for p, us in emu_us.items()},
        phase_cover=sum(sum(t.us) for t in dec) * MHZ / sum(c["cycles"] for c in h),
        prefill_steps=len(pre),
        prefill_cycles_per_step=_median(c["cycles"] for c in hp),
        prefill_cycles_total=sum(c["cycles"] for c in hp),
        prefill_phase_cycles_median={p: _median(t.us[i] for t in pre) * MHZ for i, p in enumerate(PHASES)},
        bytes_per_token={tier: last.bytes_read[i] for i, tier in enumerate(TIERS)},
        bytes_per_token_harness=dict(zip(TIERS, counts[last.step]["bytes"])),
        bytes_per_token_predicted={tier: pred[-1].bytes_read[tier] for tier in TIERS},
        bytes_per_token_at_pos=last.pos, head_rows_at_pos=last.head_rows,
        predicted_us_median=pred_us,
        predicted_over_emulated={p: pred_us[p] / emu_us[p] for p in PHASES if emu_us[p]},
        predicted_over_emulated_token=_median(x.total_us for x in pred) / device_us,
        image_text_bytes=int(m.group(1)) if m else 0, image_bss_bytes=int(m.group(3)) if m else 0,
        blob_bytes=blob.stat().st_size)


def section(work: Path) -> dict:
    out = {f"rp2040_emu_{fmt}": emu_run(default_quant(fmt), work / f"emu-{fmt}") for fmt in FORMATS}
    e8, e4 = out["rp2040_emu_q8"], out["rp2040_emu_q4"]
    out["ratios"] = {
        "emulated q4/q8 cycles per decode token": e4["cycles_per_token"] / e8["cycles_per_token"],
        "emulated q4/q8 FFN cycles": e4["phase_cycles_median"]["ffn"] / e8["phase_cycles_median"]["ffn"],
        **{f"emulated {fmt} prefill/decode cycles per step": out[f"rp2040_emu_{fmt}"]["prefill_cycles_per_step"]
           / out[f"rp2040_emu_{fmt}"]["cycles_per_token"] for fmt in FORMATS},
        **{f"predicted/emulated µs per decode token, {fmt}": out[f"rp2040_emu_{fmt}"]["predicted_over_emulated_token"]
           for fmt in FORMATS},
    }
    return out


ENCODE_TEXTS = {"short": PROMPT, "eval_verse": None, "spaces_2032": " " * 2032}


def encode_section(work: Path) -> dict:
    """Encode times of the device tokenizer (each GENERATE_TEXT is stopped after its first step)."""
    blob, fw = blob_and_firmware(default_quant("q8"), BOARD, work / "emu-encode")
    lines = (MODEL / "eval.txt").read_text(encoding="utf-8").split("\n")
    texts = {**ENCODE_TEXTS, "eval_verse": "\n".join(lines[100:106])}
    out = {}
    with start_emulated_board(fw.binary, blob) as board, session(board.port) as s:
        link = s.link
        for name, text in texts.items():
            link.send(GenerateText(text, 1))
            got = None
            while True:
                fr = link.recv(120)
                if fr is None:
                    raise RuntimeError(f"no answer to GENERATE_TEXT {name}")
                if isinstance(fr.msg, Log) and (m := re.match(r"text prompt: (\d+) bytes, (\d+) tokens, "
                                                                r"encoded in (\d+) us", fr.msg.text)):
                    got = dict(bytes=int(m[1]), tokens=int(m[2]), us=int(m[3]), cycles=int(m[3]) * MHZ)
                    link.send(Stop())
                if isinstance(fr.msg, Done):
                    break
            out[name] = got
    return {"rp2040_emu_encode": out}
