"""Both RP2040 cores at work and the weights streamed (``make bench``, section cores; printed, never
asserted): the emulated RP2040 (rp2040js with the harness's core 1, XIP model and SSI direct reads,
125 MHz), default model q8 and q4, decode.

* cycles per decode token (the harness's count, deterministic) of three builds of one firmware: the
  default (hal_matmul's rows on both cores, a product of a matrix in flash streamed into
  SRAM by the SSI's direct read and DMA: stream_rp2040.c), both cores through the XIP cache
  (FLM_RP2040_STREAM=0), and core 0 alone through the XIP cache (also FLM_RP2040_CORES=1: the
  firmware before issue 21); their ratios;
* the token's floor: max(the one-core token's cycles with the XIP model off — its arithmetic alone —
  halved, the flash bytes it loads at the rate the harness moves them in direct reads of
  ``stream_chunk_bytes``: host/emu/ssidirect.mjs), and the default token over it;
* the XIP counters per token: line transfers, their cycles, and the cycles a core waited for the
  bus while it moved the other core's line (one XIP port);
* per phase, the planner's prediction (converter/overlap.py: the products shared by the cores)
  over the emulated µs of the default build;
* prefill in passes of 8, default build: cycles per prompt token over a decode token's.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from converter import costmodel as C
from converter.blob import read_header
from converter.boards import load_board
from converter.overlap import stream_cycles
from converter.passcost import Placement, prefill
from converter.planner import fits
from firmware.baremetal import rebuilt_with
from host.boards.emulated import start_emulated_board
from host.link.messages import PHASES, Generate

from .emulated import predictor
from .model import FORMATS, blob_and_firmware, default_quant, prompt_ids, session
from .passes import PROMPT_STEPS, prefill_figures, prefill_ids

BOARD = "rp2040-emu"
PREFILL_T = 8
NEW = 8


def _median(xs) -> float:
    return float(statistics.median(xs))


def decode(binary: Path, blob: Path, qm, xip_model: bool = True) -> dict:
    """Decode steps of one generation: cycles, XIP counters and emulated µs per phase (medians)."""
    with start_emulated_board(binary, blob, xip_model=xip_model) as board, session(board.port) as s:
        board.read_counts()
        res = s.generate(Generate(prompt_ids(qm), NEW))
        counts = {c["step"]: c for c in board.read_counts()}
    dec = res.generated_steps[1:]
    h = [counts[t.step] for t in dec]
    out = dict(cycles=_median(c["cycles"] for c in h), flash_bytes=_median(c["bytes"][0] for c in h),
               phase_us={p: _median(t.us[i] for t in dec) for i, p in enumerate(PHASES)},
               positions=[t.pos for t in dec], heads=[t.head_rows for t in dec], tokens=res.generated_ids)
    if xip_model:
        out["xip"] = {k: _median(c["xip"][k] for c in h) for k in h[0]["xip"]}
    return out


def prefill_t(qm, work: Path) -> dict | None:
    """Cycles per prompt token of the 16 prompt steps run in passes of PREFILL_T, two cores (None
    where the board's RAM does not hold the batch's scratch)."""
    if not fits(C.ModelSpec.from_quant(qm), BOARD, base="flash", batch=PREFILL_T):
        return None
    blob, fw = blob_and_firmware(qm, BOARD, work, batch=PREFILL_T)
    with start_emulated_board(fw.binary, blob) as board, session(board.port, 300) as s:
        board.read_counts()
        res = s.generate(Generate(prefill_ids(qm), 1, batch=PREFILL_T))
        counts = {c["step"]: c for c in board.read_counts()}
    out = prefill_figures([res], counts)
    place = Placement.of_header(read_header(blob), load_board(BOARD))
    out["predicted_us_per_token"] = sum(p.total_us for p in prefill(place, 0, PROMPT_STEPS, PREFILL_T)) / PROMPT_STEPS
    return out


def format_figures(fmt: str, work: Path) -> dict:
    qm = default_quant(fmt)
    blob, fw = blob_and_firmware(qm, BOARD, work / fmt)
    one_core = rebuilt_with(fw.binary, work / fmt / "one-core", {"FLM_RP2040_CORES": "1", "FLM_RP2040_STREAM": "0"})
    xip_two = rebuilt_with(fw.binary, work / fmt / "two-cores-xip", {"FLM_RP2040_STREAM": "0"})
    two, one, cached = decode(fw.binary, blob, qm), decode(one_core, blob, qm), decode(xip_two, blob, qm)
    arithmetic = decode(one_core, blob, qm, xip_model=False)["cycles"]
    stream = stream_cycles(load_board(BOARD), two["flash_bytes"])
    floor = max(arithmetic / 2, stream)
    predict = predictor(blob, BOARD)
    pred = [predict(pos, "skip" if rows == 0 else int(rows)) for pos, rows in zip(two["positions"], two["heads"])]
    pred_us = {p: _median(x.phase_us.get(p, 0.0) for x in pred) for p in PHASES}   # (draft: not predicted)
    mhz = float(load_board(BOARD)["clock_mhz"])
    pre = prefill_t(qm, work / f"{fmt}-t{PREFILL_T}")
    return dict(
        two_cores_cycles_per_token=two["cycles"], one_core_cycles_per_token=one["cycles"],
        two_cores_xip_cycles_per_token=cached["cycles"],
        same_tokens=int(two["tokens"] == one["tokens"] == cached["tokens"]),
        one_core_xip_off_cycles_per_token=arithmetic, floor_cycles_per_token=floor,
        floor_bound="arithmetic" if arithmetic / 2 >= stream else "flash",
        flash_bytes_per_token=two["flash_bytes"], xip_two_cores=two["xip"], xip_one_core=one["xip"],
        xip_two_cores_cached=cached["xip"],
        two_cores_phase_cycles={p: us * mhz for p, us in two["phase_us"].items()},
        one_core_phase_cycles={p: us * mhz for p, us in one["phase_us"].items()},
        predicted_over_emulated={p: pred_us[p] / us for p, us in two["phase_us"].items() if us and pred_us[p]},
        predicted_over_emulated_token=_median(x.total_us for x in pred) * mhz / two["cycles"],
        prefill_t8=pre)


def section(work: Path) -> dict:
    out = {fmt: format_figures(fmt, work) for fmt in FORMATS}
    ratios = {}
    for fmt, r in out.items():
        ratios[f"two cores streamed / one core through the XIP cache, cycles per decode token, {fmt} (rp2040-emu)"] = (
            r["two_cores_cycles_per_token"] / r["one_core_cycles_per_token"])
        ratios[f"two cores streamed / two cores through the XIP cache, cycles per decode token, {fmt} (rp2040-emu)"] = (
            r["two_cores_cycles_per_token"] / r["two_cores_xip_cycles_per_token"])
        ratios[f"two cores streamed / their floor, cycles per decode token, {fmt} (rp2040-emu)"] = (
            r["two_cores_cycles_per_token"] / r["floor_cycles_per_token"])
        ratios[f"planner predicted / emulated, decode token, two cores, {fmt}"] = r["predicted_over_emulated_token"]
        for p, v in r["predicted_over_emulated"].items():
            ratios[f"planner predicted / emulated, {p}, two cores, {fmt}"] = v
        if r["prefill_t8"]:
            ratios[f"prefill T={PREFILL_T} cycles per prompt token / decode token, two cores, {fmt}"] = (
                r["prefill_t8"]["cycles_per_token"] / r["two_cores_cycles_per_token"])
    return {"rp2040_emu_cores": out, "ratios": ratios}
