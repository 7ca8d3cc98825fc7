"""The emulated RP2040 (rp2040js at 125 MHz, the harness's XIP model on): the default model at q8
and q4, decode and prefill apart, and decode again with the XIP model off.

* cycles per step: the harness's count of emulated cycles between the firmware's step marks
  (deterministic: the same image, blob and prompt give the same count on every run), XIP stalls
  included;
* the XIP cache per decode token: hits, misses (line transfers; instruction fetches apart), the
  cycles they stalled the core, the flash bytes per second the misses delivered while the core
  waited, and over the whole token;
* cycles per phase: the firmware's own per-phase µs (its TIMER, which advances with the emulated
  cycles) × 125 MHz — deterministic too, within 1 µs per timed interval;
* bytes per token per tier three ways: the engine's counters (TOKEN frames), the harness's count
  of the core's loads, and the planner's prediction for that step (rp2040-emu profile, the blob's
  placement);
* the planner's predicted µs per phase beside the emulated ones (rp2040-emu's flash tier: one
  line fill of ``line_cycles`` per 8 bytes, the harness's XIP model's cost);
* with the XIP model off (rp2040js as is: a flash read costs what an SRAM read costs): cycles per
  decode token and per phase; and so for the default q8 model in the format before row scales too
  (f32 scales per group, f32 KV cache and float attention: the format of the 19.6M cycles per token
  measured before the Cortex-M0+ kernels were tuned),
  beside convert's default (row scales, k12 KV cache, integer attention), and the default's
  weights with the f32 KV cache (the attention phase then differs by the attention alone);
* in those three XIP-off q8 runs, the harness's call profile: the cycles per decode token inside
  the engine's calls of the parts of a layer (PROFILE), so the attention itself (``attention``:
  scores, softmax, the values' weighted sum) is measured apart from the projections, the norm, the
  RoPE and the KV stores that share its phase (the profile changes no emulated cycle);
* the time the device tokenizer takes to encode text prompts (GENERATE_TEXT's LOG line);
* the golden check's time at boot and on SELFTEST (its LOG line, the firmware's clock).
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from converter import costmodel as C
from converter import timing
from converter.blob import read_header
from converter.boards import load_board, stream_stride
from converter.formats import KV_DEFAULT, padding_per_step, row_padding
from host.link.messages import PHASES, TIERS, Done, Generate, Log, Stop
from host.boards.emulated import start_emulated_board

from .model import FORMATS, MODEL, PROMPT, blob_and_firmware, default_quant, prompt_ids, session

BOARD = "rp2040-emu"
# the engine's functions the call profile times (firmware/engine/engine.c, PROFILED): the attention
# itself, the RoPE, the KV stores, the RMSNorms, the activations' quantization, the matrix products
PROFILE = ("attention", "rope", "kv_put", "rmsnorm", "quantize_all", "product")
MHZ = float(load_board(BOARD)["clock_mhz"])
STREAM = stream_stride(load_board(BOARD))


def predictor(blob: Path, board: str):
    """pos, head -> the planner's Prediction for a step of ``blob`` as placed in its header."""
    h = read_header(blob)
    spec = C.ModelSpec.from_header(h, str(blob))
    prof = load_board(board)
    regions, kv = h.state_tiers.regions("sram"), h.state_tiers.kv
    return lambda pos, head: timing.predict(spec, prof, h.tiers, regions, pos, kv, "greedy", head=head)


def _head(t) -> str | int:
    """The output layer a step computed, as the planner names it (greedy: its rows, or skipped)."""
    return "skip" if t.head_rows == 0 else int(t.head_rows)


def _median(xs) -> float:
    return float(statistics.median(xs))


def golden_ms(logs: list[str]) -> dict[int, int]:
    """Steps checked -> ms, from the golden check's LOG lines (``... steps 0-1 of 4 ...; 254 ms``)."""
    out = {}
    for t in logs:
        m = re.search(r"golden check.*: steps 0-(\d+) of \d+ .*; (\d+) ms", t)
        if m:
            out[int(m.group(1)) + 1] = int(m.group(2))
    return out


def xip_per_token(h: list[dict], flash_bytes: int, device_us: float) -> dict:
    """The harness's XIP counts over decode steps ``h`` (medians), and the flash bytes a second
    the line transfers delivered while the core waited for them, and over the whole token."""
    x = {k: _median(c["xip"][k] for c in h) for k in ("hits", "misses", "fetch_misses", "stall_cycles")}
    data_stall_us = (x["misses"] - x["fetch_misses"]) * h[-1]["xip"]["miss_cycles"] / MHZ
    return dict(x, miss_cycles=h[-1]["xip"]["miss_cycles"],
                stall_share=x["stall_cycles"] / _median(c["cycles"] for c in h),
                flash_MBps_while_stalled=flash_bytes / data_stall_us, flash_MBps_per_token=flash_bytes / device_us)


def unpadded(t, padding: dict[str, int]) -> list[int]:
    """Token ``t``'s bytes per tier less ``padding`` (per tier): what the core loaded."""
    return [b - padding.get(tier, 0) for tier, b in zip(TIERS, t.bytes_read)]


def call_profile(h: list[dict]) -> dict:
    """Per function of the call profile: cycles per decode token and calls (medians over ``h``)."""
    return {name: dict(cycles=_median(c["calls"][name][0] for c in h), calls=_median(c["calls"][name][1] for c in h))
            for name in PROFILE}


def watched_rows(header, names) -> tuple[tuple[tuple[int, int], ...], int]:
    """The blob byte ranges of the tensors ``names`` (all in flash) and the bytes a core loads reading
    every row of them once (their rows less the padding no kernel loads)."""
    es = [e for e in header.entries if e.name in names]
    return (tuple((e.offset, e.offset + e.length) for e in es),
            sum(e.rows * (e.row_stride - row_padding(e)) for e in es))


def emu_run(qm, work: Path, new_tokens: int = 12, xip_model: bool = True, kv: str = KV_DEFAULT,
            profile: bool = False, watch: tuple[str, ...] = ()) -> dict:
    """One generation of the prompt and ``new_tokens`` on the emulated RP2040 (deterministic: one run)
    with the KV cache ``kv``; with the XIP model, after a SELFTEST (every golden step); ``profile``:
    with the call profile of the functions PROFILE; ``watch``: names of tensors (in flash) whose bytes
    the harness counts apart in each decode token (``watched``)."""
    blob, fw = blob_and_firmware(qm, BOARD, work, kv=kv)
    m = re.search(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s", fw.size_text, re.M)
    ranges, every_row = watched_rows(read_header(blob), watch)
    with start_emulated_board(fw.binary, blob, xip_model=xip_model, profile=PROFILE if profile else (),
                              watch=ranges) as board, session(board.port) as s:
        checked = s.selftest(timeout=600) if xip_model else None
        golden = golden_ms(s.logs)
        board.read_counts()
        res = s.generate(Generate(prompt_ids(qm), new_tokens))
        counts = {c["step"]: c for c in board.read_counts()}
    dec, pre = res.generated_steps[1:], res.prompt_steps
    h = [counts[t.step] for t in dec]
    profiled = {"call_profile": call_profile(h)} if profile else {}
    if watch:
        profiled.update(watched_bytes_per_token=_median(c["watched"] for c in h), watched_bytes_every_row=every_row)
    hp = [counts[t.step] for t in pre]
    emu_us = {p: _median(t.us[i] for t in dec) for i, p in enumerate(PHASES)}
    device_us = _median(sum(t.us) for t in dec)
    if not xip_model:
        return dict(cycles_per_token=_median(c["cycles"] for c in h), device_us_per_token=device_us,
                    phase_cycles_median={p: us * MHZ for p, us in emu_us.items()},
                    emulated_mcycles_per_wall_s=_median(c["cycles"] / c["wall_ms"] / 1e3 for c in h),
                    decode_pos=[t.pos for t in dec], **profiled)
    predict = predictor(blob, BOARD)
    header = read_header(blob)
    pred = [predict(t.pos, _head(t)) for t in dec]
    last = dec[-1]
    pred_us = {p: _median(x.phase_us.get(p, 0.0) for x in pred) for p in PHASES}   # (draft: not predicted)
    return dict(
        clock=res.clock, decode_steps=len(dec),
        cycles_per_token=_median(c["cycles"] for c in h),
        emulated_us_per_token=_median(c["us"] for c in h),
        device_us_per_token=device_us,
        emulated_tok_per_s=1e6 / device_us,
        wall_ms_per_token=_median(c["wall_ms"] for c in h),
        emulated_mcycles_per_wall_s=_median(c["cycles"] / c["wall_ms"] / 1e3 for c in h),
        # the emulator's own work: the cycles of the instructions it ran (XIP stalls cost it nothing)
        instruction_mcycles_per_wall_s=_median((c["cycles"] - c["xip"]["stall_cycles"]) / c["wall_ms"] / 1e3
                                               for c in h),
        # the harness's loads = the engine's bytes less the rows' padding, which no kernel loads
        harness_agrees=int(all(counts[t.step]["bytes"] == unpadded(t, padding_per_step(header, qm.config.tied, t.head_rows,
                                                                                               stream_stride=STREAM))
                               for t in res.tokens)),
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
        xip=xip_per_token(h, last.bytes_read[0], device_us),
        # the planner's flash lines (a line per 8 bytes) beside the data line transfers the harness saw
        xip_data_misses_over_predicted_lines=(_median(c["xip"]["misses"] - c["xip"]["fetch_misses"] for c in h)
                                              / (pred[-1].bytes_read["flash"] / 8)),
        predicted_us_median=pred_us,
        predicted_over_emulated={p: pred_us[p] / emu_us[p] for p in PHASES if emu_us[p]},
        predicted_over_emulated_token=_median(x.total_us for x in pred) / device_us,
        image_text_bytes=int(m.group(1)) if m else 0, image_bss_bytes=int(m.group(3)) if m else 0,
        blob_bytes=blob.stat().st_size,
        # the golden check (emulated ms): its boot steps (when the boot LOG reached the host) and all
        golden_boot_ms=next((ms for n, ms in golden.items() if n < checked.golden_checked), None),
        golden_selftest_ms=golden.get(checked.golden_checked), golden_steps=checked.golden_checked,
        golden_bit_exact=int(checked.golden == "exact"), **profiled)


def section(work: Path) -> dict:
    out = {f"rp2040_emu_{fmt}": emu_run(default_quant(fmt), work / f"emu-{fmt}") for fmt in FORMATS}
    out.update({f"rp2040_emu_{fmt}_xip_off": emu_run(default_quant(fmt), work / f"emu-{fmt}", xip_model=False,
                                                     profile=fmt == "q8") for fmt in FORMATS})
    # the format before row scales: f32 scales per group, f32 KV cache (float attention), XIP model off
    out["rp2040_emu_q8_f32_scales_f32_kv_xip_off"] = base = emu_run(default_quant("q8", "f32"), work / "emu-q8-f32",
                                                                     xip_model=False, kv="f32", profile=True)
    # the same row-scaled weights with the f32 KV cache: the attention phase's difference is the
    # attention itself (its projections are the same matvecs)
    out["rp2040_emu_q8_f32_kv_xip_off"] = fkv = emu_run(default_quant("q8"), work / "emu-q8-f32kv", xip_model=False,
                                                        kv="f32", profile=True)
    # the same weights with the int8 KV cache (the default before numerics 4, and boards short of SRAM)
    out["rp2040_emu_q8_int8_kv"] = i8 = emu_run(default_quant("q8"), work / "emu-q8-int8kv", kv="int8")
    e8, e4, off = out["rp2040_emu_q8"], out["rp2040_emu_q4"], out["rp2040_emu_q8_xip_off"]
    out["ratios"] = {
        "emulated q8 cycles per decode token / the Cortex-M0+ kernels' target (10M), XIP model off":
            off["cycles_per_token"] / 10e6,
        f"emulated q8 cycles per decode token, {KV_DEFAULT} KV (default) / int8 KV, XIP model on":
            e8["cycles_per_token"] / i8["cycles_per_token"],
        f"emulated q8 flash bytes per decode token, {KV_DEFAULT} KV (default) / int8 KV":
            e8["bytes_per_token"]["flash"] / i8["bytes_per_token"]["flash"],
        f"emulated q8 cycles per decode token, row scales + {KV_DEFAULT} KV / f32 scales + f32 KV, XIP model off":
            off["cycles_per_token"] / base["cycles_per_token"],
        "emulated q8 attention phase cycles, default / f32 scales + f32 KV, XIP model off":
            off["phase_cycles_median"]["attention"] / base["phase_cycles_median"]["attention"],
        f"emulated q8 attention phase cycles, {KV_DEFAULT} KV (integer) / f32 KV (float), row scales, XIP model off":
            off["phase_cycles_median"]["attention"] / fkv["phase_cycles_median"]["attention"],
        # the attention itself (call profile: the attention function's calls, the same positions)
        "emulated q8 attention itself (call profile), default / f32 scales + f32 KV, XIP model off":
            off["call_profile"]["attention"]["cycles"] / base["call_profile"]["attention"]["cycles"],
        f"emulated q8 attention itself (call profile), {KV_DEFAULT} KV / f32 KV, row scales, XIP model off":
            off["call_profile"]["attention"]["cycles"] / fkv["call_profile"]["attention"]["cycles"],
        "emulated q8 attention itself / attention phase, default, XIP model off":
            off["call_profile"]["attention"]["cycles"] / off["phase_cycles_median"]["attention"],
        **{f"emulated {fmt} cycles per decode token, XIP model on/off": out[f"rp2040_emu_{fmt}"]["cycles_per_token"]
           / out[f"rp2040_emu_{fmt}_xip_off"]["cycles_per_token"] for fmt in FORMATS},
        **{f"emulator speed, instruction Mcycles per wall s (host clock), XIP model on/off, {fmt}":
           out[f"rp2040_emu_{fmt}"]["instruction_mcycles_per_wall_s"]
           / out[f"rp2040_emu_{fmt}_xip_off"]["emulated_mcycles_per_wall_s"] for fmt in FORMATS},
        **{f"emulated {fmt} XIP data misses / planner's flash lines per decode token":
           out[f"rp2040_emu_{fmt}"]["xip_data_misses_over_predicted_lines"] for fmt in FORMATS},
        "emulated q4/q8 cycles per decode token": e4["cycles_per_token"] / e8["cycles_per_token"],
        "emulated q4/q8 FFN cycles": e4["phase_cycles_median"]["ffn"] / e8["phase_cycles_median"]["ffn"],
        **{f"emulated {fmt} prefill/decode cycles per step": out[f"rp2040_emu_{fmt}"]["prefill_cycles_per_step"]
           / out[f"rp2040_emu_{fmt}"]["cycles_per_token"] for fmt in FORMATS},
        **{f"predicted/emulated µs per decode token, {fmt}": out[f"rp2040_emu_{fmt}"]["predicted_over_emulated_token"]
           for fmt in FORMATS},
        **{f"emulated golden SELFTEST / decode token, {fmt}": out[f"rp2040_emu_{fmt}"]["golden_selftest_ms"] * 1e3
           / out[f"rp2040_emu_{fmt}"]["device_us_per_token"] for fmt in FORMATS},
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
            link.send(Generate(text, 1))
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
