"""``python -m bench.headindex``: the greedy head's tile index (converter/headprune.py) on every
shipped model and on the 15M llama2.c shape, measured in one run and printed, never asserted.

Per model: what ``flashlm convert`` decides (the calibration's rows visited per tile size, the cost
ratios, index kept or left out and why), then the same greedy generation on two blobs of the same
weights — with the head index (convert's own, or for a model it left out, the best tiling forced
with ``--head-index on``, to show what the decision avoided) and without one (every greedy step
computes the whole head and its argmax) — and for each:

* head rows the greedy steps visit (% of out_vocab);
* native board (host clock): output + sampling µs per generated token, the fastest of ``ROUNDS``
  interleaved rounds per step, then the median over steps;
* native engine under callgrind: instructions of ``flm_head_argmax`` per generated token
  (deterministic, load-independent: the difference of a 1-token and a (1 + ``CG_TOKENS``)-token run);
* emulated RP2040 (rp2040js cycle counts, shipped models only: the 15M shape does not fit a Pico):
  output + sampling cycles per generated token (firmware µs x 125 MHz), one run; the PLE models with
  an int8 KV cache, without which their KV cache does not fit the Pico's SRAM (the head does not
  read it).

The 15M shape is the random-weight ``bench.model.random_15m_ir`` written by our llama2.c v2 (Q8_0)
writer and read back (``llama15m_v2``), as bench/native15m.py measures it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from converter import headcalib
from converter.load import load_model
from converter.quantize import quantize
from converter.tokenizer import encode
from firmware.build_meta import BuildError
from host.boards.emulated import start_emulated_board
from host.link.messages import Generate
from host.boards.native import start_native_board

from .callgrind import callgrind_missing, profile
from .model import PROMPT, ROOT, blob_and_firmware, llama15m_v2, session
from .speed import fastest

OUT, SAMPLE = 4, 5
MHZ = 125.0
ROUNDS, NATIVE_TOKENS, EMU_TOKENS, CG_TOKENS = 7, 48, 4, 16
SHIPPED = {   # name: (model folder, --quant overrides, KV cache format on the emulated RP2040)
    "default": ("models/default", [], "f32"), "default_head_q4": ("models/default", ["head=q4"], "f32"),
    "ple": ("models/ple", [], "int8"), "ple_dense": ("models/ple-dense", [], "int8")}


NAMES = (*SHIPPED, "llama2c_15m_random")


def model(name: str, work: Path):
    """(the quantized model without an index, prompt ids, the KV cache format on the emulated RP2040
    or None: it runs only natively)."""
    if name in SHIPPED:
        path, ov, kv = SHIPPED[name]
        qm = quantize(load_model(ROOT / path / "model.pt"), "q8", 32, ov)
        return qm, list(encode(qm.tokenizer, PROMPT, bos=True)), kv
    return quantize(load_model(llama15m_v2(work)), "q8", 32), [1, 320, 1055, 8432, 2041], None


def greedy_us(runs) -> float:
    return statistics.median(fastest(runs, lambda t: t.us[OUT] + t.us[SAMPLE]))


def measure_model(name: str, qm, ids: list[int], emu_kv: str | None, work: Path, echo) -> dict:
    t0 = time.monotonic()
    inp = headcalib.greedy_inputs(qm)
    index, rep = headcalib.calibrate(qm, inp)
    forced = index if index is not None else headcalib.calibrate(qm, inp, force=True)[0]
    rep["seconds"] = time.monotonic() - t0
    out = {"decision": rep, "n_out": qm.config.n_out}
    blobs = {}
    for kind, idx in (("index", forced), ("whole", None)):
        qm.head_index = idx
        blobs[kind] = blob_and_firmware(qm, "native", work / name / kind)
    qm.head_index = None
    runs: dict = {k: [] for k in blobs}
    with start_native_board(blobs["index"][1].binary, blobs["index"][0]) as a, \
            start_native_board(blobs["whole"][1].binary, blobs["whole"][0]) as b, \
            session(a.port, 120) as sa, session(b.port, 120) as sb:
        for _ in range(ROUNDS):
            runs["index"].append(sa.generate(Generate(ids, NATIVE_TOKENS)))
            runs["whole"].append(sb.generate(Generate(ids, NATIVE_TOKENS)))
    toks = {k: [t.out_id for t in r[0].generated_steps] for k, r in runs.items()}
    assert toks["index"] == toks["whole"], f"{name}: the index changed the greedy tokens"
    n_out = qm.config.n_out
    for k, r in runs.items():
        steps = r[0].generated_steps
        out[k] = dict(head_rows_pct=100 * statistics.mean(t.head_rows for t in steps) / n_out,
                      native_output_us=greedy_us(r), flash_bytes=statistics.median(t.bytes_read[0] for t in steps))
    if not callgrind_missing():
        for k, (blob, fw) in blobs.items():
            d = work / name / k
            one = profile(fw.binary, blob, ids, 1, d / "cg1.out")["inclusive"]["flm_head_argmax"]
            more = profile(fw.binary, blob, ids, 1 + CG_TOKENS, d / "cg2.out")["inclusive"]["flm_head_argmax"]
            out[k]["callgrind_head_instructions"] = (more - one) / CG_TOKENS
    if emu_kv is not None:
        try:
            for kind, idx in (("index", forced), ("whole", None)):
                qm.head_index = idx
                blob, fw = blob_and_firmware(qm, "rp2040-emu", work / name / f"emu-{kind}", kv=emu_kv)
                with start_emulated_board(fw.binary, blob, timeout=60) as board, session(board.port, 120, 60) as s:
                    res = s.generate(Generate(ids, EMU_TOKENS))
                out[kind]["emulated_output_cycles"] = MHZ * statistics.median(
                    t.us[OUT] + t.us[SAMPLE] for t in res.generated_steps)
                out[kind]["emulated_head_rows_pct"] = 100 * statistics.mean(
                    t.head_rows for t in res.generated_steps) / qm.config.n_out
        except BuildError as e:      # said, not hidden: the figures are left out
            out["emulated_skipped"] = str(e)
            for kind in ("index", "whole"):
                out[kind].pop("emulated_output_cycles", None)
                out[kind].pop("emulated_head_rows_pct", None)
        qm.head_index = None
    out["kept"] = index is not None
    out["wall_s"] = time.monotonic() - t0
    if echo:
        print_model(name, out)
    return out


def ratios(res: dict) -> dict:
    """Output phase with the head index / without, per model and measure; for a model convert left
    the index out its shipped ratio is 1 (the same blob) and the forced one is shown as such."""
    out = {}
    for name, r in res.items():
        label = f"{name}: {'head index' if r['kept'] else 'forced head index (convert left it out)'}/whole head"
        for key, what in (("native_output_us", "native output µs"), ("callgrind_head_instructions",
                          "callgrind head instructions"), ("emulated_output_cycles", "emulated output cycles")):
            if key in r["index"]:
                out[f"{label} {what}"] = r["index"][key] / r["whole"][key]
    return out


def section(work: Path) -> dict:
    res = {name: measure_model(name, *model(name, work), work, echo=False) for name in NAMES}
    return {"head_index": res, "ratios": ratios(res)}


def print_model(name: str, r: dict) -> None:
    d = r["decision"]
    print(f"\n{name} (out_vocab {r['n_out']}): convert {'keeps' if r['kept'] else 'leaves out'} the head index: "
          f"{d['reason']} ({d['steps']} calibration steps, {d['seconds']:.0f} s)")
    for size, t in d["tile_sizes"].items():
        print(f"  calibration, tiles of {size:>2} ({t['n_tiles']} tiles): {t['rows_pct']:5.1f} % of rows; cost vs the "
              f"whole head " + ", ".join(f"{k} {v:.3f}" for k, v in t["cost_ratio"].items()))
    label = "index" if r["kept"] else "forced index"
    i, w = r["index"], r["whole"]
    print(f"  head rows visited: {label} {i['head_rows_pct']:.1f} %, whole head {w['head_rows_pct']:.1f} %; flash bytes "
          f"per token {i['flash_bytes']:,.0f} vs {w['flash_bytes']:,.0f}")
    print(f"  native board (host clock), output + sampling µs per generated token: {label} {i['native_output_us']:,.0f}, "
          f"whole head {w['native_output_us']:,.0f} (x{i['native_output_us'] / w['native_output_us']:.3f})")
    if "callgrind_head_instructions" in i:
        print(f"  callgrind (native engine), flm_head_argmax instructions per token: {label} "
              f"{i['callgrind_head_instructions']:,.0f}, whole head {w['callgrind_head_instructions']:,.0f} "
              f"(x{i['callgrind_head_instructions'] / w['callgrind_head_instructions']:.3f})")
    if "emulated_skipped" in r:
        print(f"  emulated RP2040: not run: {r['emulated_skipped']}")
    if "emulated_output_cycles" in i:
        print(f"  emulated RP2040 (rp2040js cycles), output + sampling per generated token: {label} "
              f"{i['emulated_output_cycles']:,.0f} ({i['emulated_head_rows_pct']:.1f} % of rows), whole head "
              f"{w['emulated_output_cycles']:,.0f} (x{i['emulated_output_cycles'] / w['emulated_output_cycles']:.3f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.headindex", description=__doc__.splitlines()[0])
    ap.add_argument("--only", metavar="NAME[,NAME]", help=f"models: {', '.join(NAMES)}")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        names = a.only.split(",") if a.only else NAMES
        res = {n: measure_model(n, *model(n, Path(tmp)), Path(tmp), echo=True) for n in names}
    print("\nratios (with / without the head index, one run):")
    for k, v in ratios(res).items():
        print(f"  {k}: {v:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
