"""``make bench`` / ``python -m bench``: figures measured in one run, printed, never asserted.

* native board, default model at q8 and q4: µs per phase (median over decode steps, from the
  firmware's own clock — the host's monotonic clock on the native board), tok/s, bytes per token
  per tier;
* emulated RP2040 (rp2040js), default model at q8 and q4: cycles and emulated µs per decode
  token (median, from the emulated TIMER / the harness's cycle count), emulator wall time per
  token (host clock), bytes per token the harness counted, firmware image sizes;
* emulated RP2040, default model: time the device tokenizer takes to encode text prompts (from the
  LOG a GENERATE_TEXT answers with, emulated timer µs; cycles at 125 MHz): a short prompt, a
  verse of the eval text, and the worst case, a 2032-byte run of spaces (one word merged down);
* convert time of a ~15M-parameter random llama2.c v1 checkpoint (dim 288, 6 layers, 6 heads,
  vocab 32000, context 256): load + quantize + blob.

Results go to bench/results.json; the previous file's figures are shown beside as ratios.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from converter.blob import write_blob
from converter.ir import ModelConfig, ModelIR
from converter.load import load_model
from converter.llama2c import write_llama2c
from converter.quantize import quantize
from converter.tokenizer import encode
from firmware.build import build_firmware
from host.protocol import PHASES, TIERS, Link
from host.session import Session, open_port
from host.virtual import start_native_board

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results.json"
PROMPT = "ROMEO:\nWhat light through yonder window breaks?"


def native_run(qm, work: Path, new_tokens: int = 96) -> dict:
    blob = work / "model.flmb"
    write_blob(qm, blob)
    fw = build_firmware("native", work / "fw", blob)
    ids = encode(qm.tokenizer, PROMPT) if qm.tokenizer is not None and qm.tokenizer.hf_json else [1, 2, 3]
    with start_native_board(fw.binary, blob) as board:
        ser = open_port(board.port)
        try:
            s = Session(Link(ser), frame_timeout=30)
            s.handshake()
            res = s.generate(ids, new_tokens)
        finally:
            ser.close()
    dec = [t for t in res.tokens if t.out_id is not None][1:]      # decode steps only
    per_phase = {p: statistics.median(t.us[i] for t in dec) for i, p in enumerate(PHASES)}
    total_us = sum(sum(t.us) for t in dec)
    return dict(clock=res.clock, board=res.board, decode_steps=len(dec),
                us_median=per_phase, tok_per_s=len(dec) / (total_us / 1e6) if total_us else float("inf"),
                bytes_per_token={tier: dec[-1].bytes_read[i] for i, tier in enumerate(TIERS)},
                bytes_per_token_at_pos=dec[-1].pos)


def emu_run(qm, work: Path, new_tokens: int = 12) -> dict:
    """The default model on the emulated RP2040: per decode token cycles, emulated µs, wall ms."""
    import re

    from host.virtual import start_emulated_board
    blob = work / "model.flmb"
    write_blob(qm, blob)
    fw = build_firmware("rp2040-emu", work / "fw-emu", blob)
    m = re.search(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s", fw.size_text, re.M)
    ids = encode(qm.tokenizer, PROMPT) if qm.tokenizer is not None and qm.tokenizer.hf_json else [1, 2, 3]
    with start_emulated_board(fw.binary, blob) as board:
        ser = open_port(board.port)
        try:
            s = Session(Link(ser), frame_timeout=60)
            s.handshake(timeout=30)
            board.read_counts()
            res = s.generate(ids, new_tokens)
            counts = {c["step"]: c for c in board.read_counts()}
        finally:
            ser.close()
    dec = [t for t in res.tokens if t.out_id is not None][1:]
    h = [counts[t.step] for t in dec if t.step in counts]
    return dict(clock=res.clock, decode_steps=len(dec),
                cycles_per_token=statistics.median(c["cycles"] for c in h),
                emulated_us_per_token=statistics.median(c["us"] for c in h),
                device_us_per_token=statistics.median(sum(t.us) for t in dec),
                emulated_tok_per_s=1e6 / statistics.median(sum(t.us) for t in dec),
                wall_ms_per_token=statistics.median(c["wall_ms"] for c in h),
                emulated_mcycles_per_wall_s=statistics.median(c["cycles"] / c["wall_ms"] / 1e3 for c in h),
                harness_agrees=int(all(counts[t.step]["bytes"] == list(t.bytes_read) for t in res.tokens)),
                bytes_per_token={tier: dec[-1].bytes_read[i] for i, tier in enumerate(TIERS)},
                image_text_bytes=int(m.group(1)) if m else 0, image_bss_bytes=int(m.group(3)) if m else 0,
                blob_bytes=blob.stat().st_size)


ENCODE_TEXTS = {"short": PROMPT, "eval_verse": None, "spaces_2032": " " * 2032}


def emu_encode(qm, work: Path) -> dict:
    """Encode times of the device tokenizer on the emulated RP2040 (each GENERATE_TEXT is stopped
    after its first step)."""
    import re

    from host.protocol import Done, GenerateText, Log, Stop
    from host.virtual import start_emulated_board
    blob = work / "model.flmb"
    write_blob(qm, blob)
    fw = build_firmware("rp2040-emu", work / "fw-emu", blob)
    lines = (ROOT / "models" / "default" / "eval.txt").read_text(encoding="utf-8").split("\n")
    texts = {**ENCODE_TEXTS, "eval_verse": "\n".join(lines[100:106])}
    out = {}
    with start_emulated_board(fw.binary, blob) as board:
        ser = open_port(board.port)
        try:
            link = Link(ser)
            Session(link, frame_timeout=60).handshake(timeout=30)
            for name, text in texts.items():
                link.send(GenerateText(text, 1))
                got = None
                while True:
                    fr = link.recv(120)
                    if fr is None:
                        raise RuntimeError(f"no answer to GENERATE_TEXT {name}")
                    if isinstance(fr.msg, Log) and (m := re.match(r"text prompt: (\d+) bytes, (\d+) tokens, "
                                                                    r"encoded in (\d+) us", fr.msg.text)):
                        got = dict(bytes=int(m[1]), tokens=int(m[2]), us=int(m[3]), cycles=int(m[3]) * 125)
                        link.send(Stop())
                    if isinstance(fr.msg, Done):
                        break
                out[name] = got
        finally:
            ser.close()
    return out


def default_model() -> ModelIR:
    path = ROOT / "models" / "default" / "model.pt"
    return load_model(path)


def convert_15m(work: Path) -> dict:
    cfg = ModelConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, hidden_dim=768,
                      max_seq_len=256, tied=True)
    rng = np.random.default_rng(0)
    tensors = {n: (np.ones(s, np.float32) if len(s) == 1 else rng.standard_normal(s, np.float32) * 0.02)
               for n, s in cfg.tensor_shapes().items()}
    path = work / "stories15M_random.bin"
    write_llama2c(ModelIR(cfg, tensors), path, version=1)
    out = {"params": cfg.n_params()}
    for fmt in ("q8", "q4"):
        t0 = time.perf_counter()
        ir = load_model(path)
        t1 = time.perf_counter()
        qm = quantize(ir, fmt, 32)
        t2 = time.perf_counter()
        info = write_blob(qm, work / f"m15_{fmt}.flmb")
        t3 = time.perf_counter()
        out[fmt] = dict(load_s=t1 - t0, quantize_s=t2 - t1, blob_s=t3 - t2, total_s=t3 - t0, blob_bytes=info.size)
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def main() -> None:
    results: dict = {"when": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ir = default_model()
        c = ir.config
        results["default_model"] = dict(params=c.n_params(), dim=c.dim, layers=c.n_layers,
                                         vocab=c.vocab_size, context=c.max_seq_len)
        for fmt in ("q8", "q4"):
            (work / fmt).mkdir()
            results[f"native_{fmt}"] = native_run(quantize(ir, fmt, 32), work / fmt)
        for fmt in ("q8", "q4"):
            (work / f"emu-{fmt}").mkdir()
            results[f"rp2040_emu_{fmt}"] = emu_run(quantize(ir, fmt, 32), work / f"emu-{fmt}")
        (work / "emu-encode").mkdir()
        results["rp2040_emu_encode"] = emu_encode(quantize(ir, "q8", 32), work / "emu-encode")
        results["convert_15M_llama2c_v1"] = convert_15m(work)
    prev = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    now, before = flatten(results), flatten(prev)
    print(f"flashlm bench — {results['when']}; native figures from the firmware's clock "
          f"({results['native_q8']['clock']}, board {results['native_q8']['board']})")
    print(f"{'figure':58s} {'now':>14s} {'previous':>14s} {'ratio':>8s}")
    for k, v in now.items():
        p = before.get(k)
        ratio = f"{v / p:8.3f}" if isinstance(p, (int, float)) and p else "       -"
        ps = f"{p:14.4g}" if isinstance(p, (int, float)) else f"{'-':>14s}"
        print(f"{k:58s} {v:14.4g} {ps} {ratio}")
    q8, q4 = results["native_q8"], results["native_q4"]
    print(f"ratios in this run: q4/q8 tok/s {q4['tok_per_s'] / q8['tok_per_s']:.3f}, "
          f"q4/q8 flash bytes per token {q4['bytes_per_token']['flash'] / q8['bytes_per_token']['flash']:.3f}")
    e8, e4 = results["rp2040_emu_q8"], results["rp2040_emu_q4"]
    print(f"emulated RP2040 (rp2040js, {e8['clock']}; no XIP-cache model: flash time is a lower bound): "
          f"q8 {e8['cycles_per_token']:,.0f} cycles = {e8['emulated_us_per_token']:,.0f} µs per token, "
          f"q4 {e4['cycles_per_token']:,.0f} cycles = {e4['emulated_us_per_token']:,.0f} µs; q4/q8 cycles "
          f"{e4['cycles_per_token'] / e8['cycles_per_token']:.3f}; emulator wall time per token q8 "
          f"{e8['wall_ms_per_token']:,.0f} ms, q4 {e4['wall_ms_per_token']:,.0f} ms (host clock)")
    enc = results["rp2040_emu_encode"]
    print("device tokenizer on the emulated RP2040 (emulated timer; cycles at 125 MHz): " + ", ".join(
        f"{k} {v['bytes']} B -> {v['tokens']} tokens in {v['us']:,} µs ({v['cycles']:,} cycles)" for k, v in enc.items()))
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"saved {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
