"""The emulated RP2040's XIP model against the planner and against published figures (``make bench``,
section xip; printed, never asserted).

* head placement: a model shaped like the default one but with a 256-token vocabulary (its tied
  head, 36 KB, fits the SRAM beside the KV cache) on the emulated RP2040 with the XIP model on,
  the head read in place from flash and staged in SRAM (``flashlm compare --run``'s path: a
  LAYOUT frame, no reflash): the output phase's µs per decode token each way, and what the head in
  SRAM saves measured over what the planner predicts;
* published figures: one emulated XIP miss (the harness's line transfer at the divider the HAL
  writes, the Pico SDK's) beside the ~400 ns an uncached load takes on a Pico (Oberon RTK, "Flash
  Memory": code run straight from flash, oberon-rtk.org/description/flash-memory), and the rate
  the line transfers delivered flash bytes while the core waited beside the ~16 MB/s a large fp32
  model streamed from XIP at on an RP2350 (a published figure for another chip: the QMI at clk_sys / 3
  of 150 MHz, which the pico2 profile estimates with the same line arithmetic).
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from converter import costmodel as C
from converter import timing
from converter.blob import read_header
from converter.boards import load_board
from converter.planner import plan_layout
from converter.quantize import quantize
from host.commands.compare import measure_layouts
from host.link.messages import Generate
from host.boards.emulated import start_emulated_board

from .model import GROUP, blob_and_firmware, default_ir, random_ir, session

BOARD = "rp2040-emu"
LAYOUTS = ("flash", "flash,head=sram")
PUBLISHED_UNCACHED_LOAD_NS = 400.0      # Oberon RTK on a Pico (RP2040, 125 MHz, SDK boot2)
PUBLISHED_RP2350_XIP_MBPS = 16.0        # published: a large fp32 model streamed from XIP on an RP2350


def head_placement(work: Path, new_tokens: int = 8) -> dict:
    cfg = replace(default_ir().config, vocab_size=256)
    qm = quantize(random_ir(cfg, seed=1), "q8", GROUP)
    blob, fw = blob_and_firmware(qm, BOARD, work)
    spec = C.ModelSpec.from_header(read_header(blob))
    plans = {lay: plan_layout(spec, BOARD, lay, suggest=False) for lay in LAYOUTS}
    with start_emulated_board(fw.binary, blob) as board, session(board.port) as s:
        board.read_counts()
        runs = measure_layouts(s, plans, Generate([1, 5, 9, 13], new_tokens))
        counts = board.read_counts()
    flash_run = runs[LAYOUTS[0]]
    dec = flash_run["result"].generated_steps
    first = min(c["gen"] for c in counts)                          # the first layout's generation
    steps = {t.step for t in dec}
    h = [c for c in counts if c["gen"] == first and c["step"] in steps]
    miss_cycles = h[-1]["xip"]["miss_cycles"]
    data_misses = statistics.median(c["xip"]["misses"] - c["xip"]["fetch_misses"] for c in h)
    clock = float(load_board(BOARD)["clock_mhz"])
    out = {lay: dict(measured_output_us=r["measured"]["output"], predicted_output_us=r["predicted"]["output"],
                     measured_token_us=sum(r["measured"].values()), predicted_token_us=sum(r["predicted"].values()),
                     flash_bytes_per_token=r["measured_bytes"]["flash"],
                     sram_bytes_per_token=r["measured_bytes"]["sram"])
           for lay, r in runs.items()}
    a, b = out[LAYOUTS[0]], out[LAYOUTS[1]]
    return dict(
        layouts=out,
        same_tokens=int(runs[LAYOUTS[0]]["crcs"] == runs[LAYOUTS[1]]["crcs"]),
        head_in_sram_saves_us_measured=a["measured_output_us"] - b["measured_output_us"],
        head_in_sram_saves_us_predicted=a["predicted_output_us"] - b["predicted_output_us"],
        miss_ns=miss_cycles / clock * 1e3,
        flash_MBps_while_stalled=statistics.median(c["bytes"][0] for c in h) / (data_misses * miss_cycles / clock))


def section(work: Path) -> dict:
    hp = head_placement(work / "head")
    pico2 = timing.tier_models(load_board("pico2"))["flash"].seq_read_MBps
    return {
        "rp2040_emu_xip_head_placement": hp,
        "ratios": {
            "head in SRAM: output µs saved, measured/predicted (rp2040-emu, XIP model)":
                hp["head_in_sram_saves_us_measured"] / hp["head_in_sram_saves_us_predicted"],
            "head in flash: decode token µs, predicted/measured (rp2040-emu, XIP model)":
                hp["layouts"][LAYOUTS[0]]["predicted_token_us"] / hp["layouts"][LAYOUTS[0]]["measured_token_us"],
            "head in SRAM: decode token µs, predicted/measured (rp2040-emu, XIP model)":
                hp["layouts"][LAYOUTS[1]]["predicted_token_us"] / hp["layouts"][LAYOUTS[1]]["measured_token_us"],
            "emulated XIP miss / published uncached load on a Pico (~400 ns)":
                hp["miss_ns"] / PUBLISHED_UNCACHED_LOAD_NS,
            "emulated XIP flash MB/s while stalled / published RP2350 fp32 streaming (~16 MB/s)":
                hp["flash_MBps_while_stalled"] / PUBLISHED_RP2350_XIP_MBPS,
            "pico2 profile's flash MB/s / published RP2350 fp32 streaming (~16 MB/s)":
                pico2 / PUBLISHED_RP2350_XIP_MBPS,
        },
    }
