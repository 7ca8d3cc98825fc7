"""``make bench`` / ``python -m bench``: figures measured in one run, printed, never asserted.

Sections (``--only NAME[,NAME]``; ``--quick`` leaves out those that run an emulated board):

* native — the native board, default model at q8 and q4: µs per phase, tok/s, bytes per token
  per tier (bench/native.py; the firmware's clock, which is the host's monotonic clock there);
* emulated — the emulated RP2040 (rp2040js, the harness's XIP model on), default model at q8 and
  q4: cycles per decode token and per prefill step (the harness's count), cycles per phase
  (firmware µs × 125 MHz), XIP cache hits, misses and stall cycles per token, bytes per token
  counted three ways, the planner's prediction beside it; decode again with the XIP model off
  (bench/emulated.py);
* encode — the device tokenizer's time to encode text prompts on the emulated RP2040;
* xip — the emulated RP2040's XIP model: the head in flash vs in SRAM measured against the
  planner's prediction, and the model beside published XIP figures (bench/xip.py);
* cores — the emulated RP2040: cycles per decode token of the default model q8 and q4 with the
  weights streamed on both cores (the default build), on both cores through the XIP cache, and on
  core 0 alone through it; their floor (max(the arithmetic halved, the flash bytes at the SSI direct
  reads' rate)), the XIP bus's waits, the planner's two-core prediction per phase, and prefill in
  passes of 8 against a decode token (bench/cores.py);
* kernels — cycles per weight of the q8/q4 matvec (g32, g128) and per soft-float call on the
  emulated Cortex-M0+ (bench/kernels.py: SysTick in a probe image);
* esp_qemu — the ESP32-C3's, ESP32-S3's and ESP32-P4's instruction sets in QEMU (esp32c3-isa-qemu,
  esp32s3-isa-qemu, esp32p4-isa-qemu): emulated instructions per decode token and per phase of the
  default model q8 and q4, per weight of the matvec (q8/q4, g32/g128) beside each instruction set's
  derived floor (their ratios) and the floor kernels, per float operation,
  and the planner's calibration fitted to them (bench/esp_qemu.py: a probe image and the boards'
  firmware; the tables set them beside the kernels section's Cortex-M0+ cycles);
* callgrind — instructions per decode token and per prefill step of the native engine under
  valgrind's callgrind, per function (bench/callgrind.py; deterministic);
* native15m — the native engine beside llama2.c's runq.c: callgrind instructions per decode
  token on the 15M llama2.c shape (our v2 Q8_0 file, imported as it is), pruned head and
  --all-logits, with and without the AVX2 clones, beside runq.c's 57.7M (measured once when the
  native kernels were compared with it; llama2.c is not built here); native tok/s of every
  shipped model, pruned vs --all-logits (bench/native15m.py);
* predicted — the planner's predicted ms per phase on the ESP32-S3 N16R8 and Pico profiles for the
  default model and the ple-28m shape, and ple-28m beside its published measurement
  (bench/predict.py, bench/ple_seed.py);
* speed — bench.speed's short mode: whole vs greedy head, prefill with and without the head, int8
  vs f32 KV cache, on the native board and the emulated RP2040 (bench/speed.py);
* head_index — bench.headindex: convert's head-index decision on every shipped model and the 15M
  llama2.c shape, head rows visited, and the output phase with the index and without it (native µs,
  callgrind instructions, emulated RP2040 cycles) (bench/headindex.py);
* ple_vs_dense — the shipped PLE model beside its equal-core dense twin: fp32 eval loss over
  all of eval.txt and the Pico plan's predicted bytes per token (bench/ple_vs_dense.py);
* moe — the shipped mixture of experts beside the dense default (same bytes per token) and
  models/moe-dense (same parameters): fp32 eval loss of the three; on the emulated RP2040 (XIP model
  on) cycles per decode token and the flash bytes a token loads from the FFN's matrices against
  reading every expert (k/E); the planner's predictions for the ESP32-S3 and the Pico (bench/moe.py);
* passes — forward passes of several tokens on the shipped models, native and emulated RP2040:
  prefill cycles (µs) and flash bytes per prompt token at T = 1, 4, 8, and speculative decoding
  (prompt lookup, the default model's draft model): acceptance, tokens per verifying pass, emitted
  tok/s and bytes per emitted token against plain greedy decoding; beside them the planner's
  predictions of the same passes (predicted/emulated ratios on the RP2040) and, predicted only,
  for the ESP32-S3 and the Pico (bench/passes.py);
* fidelity — every quantization recipe against fp32 with the device's numerics on stories260K (when
  ../shared holds it) and convert's defaults and GPTQ on the default model: teacher-forced top-1 agreement, mean KL and ΔCE over 2,000
  positions of fp32's sampled text, greedy agreement over 16 prompts x 200 tokens (bench/fidelity.py);
* convert — load + quantize + blob time of a ~15M-parameter random llama2.c checkpoint.

A section is ``Section(name, run, emulated)``: ``run(work_dir)`` (an empty directory of its own)
returns a dict of top-level result entries; its optional ``ratios`` entry (label -> value) joins
the table of ratios measured in this run (bench/kernels.py ``section`` is a short example). A full run (no ``--only``/``--quick``) writes
bench/results.json after printing every figure beside the previous file's with their ratio, and
docs/bench.md from it (bench/docs_page.py); a partial run only prints (``--json FILE`` writes it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console

from . import (callgrind, convert, cores, docs_page, emulated, esp_qemu, fidelity, headindex, kernels, moe, native,
               native15m, passes, ple_seed, ple_vs_dense, predict, speed, xip)
from .model import ROOT, default_ir
from .report import RESULTS, print_report


@dataclass(frozen=True)
class Section:
    name: str
    run: Callable[[Path], dict]
    emulated: bool = False       # runs an emulated board (minutes): left out by --quick


SECTIONS = [
    Section("native", native.section),
    Section("emulated", emulated.section, emulated=True),
    Section("encode", emulated.encode_section, emulated=True),
    Section("xip", xip.section, emulated=True),
    Section("cores", cores.section, emulated=True),
    Section("kernels", kernels.section, emulated=True),
    Section("esp_qemu", esp_qemu.section, emulated=True),
    Section("callgrind", callgrind.section),
    Section("native15m", native15m.section),
    Section("predicted", predict.section),
    Section("speed", speed.section, emulated=True),
    Section("head_index", headindex.section, emulated=True),
    Section("ple_vs_dense", ple_vs_dense.section),
    Section("moe", moe.section, emulated=True),
    Section("passes", passes.section, emulated=True),
    Section("fidelity", fidelity.section),
    Section("convert", convert.section),
]


def run(sections: list[Section], console: Console) -> dict:
    c = default_ir().config
    results: dict = {"when": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "host": {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]},
                     "default_model": dict(params=c.n_params(), dim=c.dim, layers=c.n_layers,
                                           vocab=c.vocab_size, context=c.max_seq_len)}
    ratios, wall = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in sections:
            t0 = time.monotonic()
            console.print(f"[bold]bench: {s.name}[/] ...")
            (Path(tmp) / s.name).mkdir()
            out = s.run(Path(tmp) / s.name)
            ratios.update(out.pop("ratios", {}))
            results.update(out)
            wall[s.name] = time.monotonic() - t0
    return {**results, "bench_wall_s": wall, "ratios": ratios}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--only", metavar="NAME[,NAME]", help="run these sections: " + ", ".join(s.name for s in SECTIONS))
    ap.add_argument("--quick", action="store_true", help="leave out the sections that run an emulated board")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    a = ap.parse_args(argv)
    chosen = SECTIONS
    if a.only:
        names = [n.strip() for n in a.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {s.name for s in SECTIONS}]
        if unknown:
            ap.error(f"unknown section {', '.join(unknown)} (sections: {', '.join(s.name for s in SECTIONS)})")
        chosen = [s for s in SECTIONS if s.name in names]
    if a.quick:
        chosen = [s for s in chosen if not s.emulated]
    console = Console(width=None if sys.stdout.isatty() else 160)
    results = run(chosen, console)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    console.print(f"\n[bold]flashlm bench — {results['when']}[/] on {results['host']['cpus']} CPUs, load "
                  f"{results['host']['load_1min']:.2f}; every figure names its board and clock; predictions are "
                  f"labelled as such")
    if "ple_seed" in results:
        ple_seed.print_table(results["ple_seed"])
    if "native15m" in results:
        native15m.print_table(results["native15m"])
    for board, f in results.get("speed", {}).items():
        speed.print_board(board, f)
    if "moe" in results:
        moe.print_table(results["moe"])
    if "fidelity" in results:
        fidelity.print_table(results["fidelity"])
    if "passes" in results:
        passes.print_passes(results["passes"], results.get("passes_predicted"))
    print_report(console, results, previous)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    if chosen == SECTIONS:
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        console.print(f"saved {RESULTS.relative_to(ROOT)} and {docs_page.write().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
