"""``python -m tools.esp_qemu.probe``: the engine's kernels on the ESP32-C3's and the ESP32-S3's
instruction sets, in emulated instructions (QEMU under -icount), measured in one run and printed.

The probe firmware (probe.c in place of the app's main.c; the same engine, HAL, soft-float and
compiler flags as the real image) answers:

* the clock's exactness: a loop of n turns of two instructions must take L(0) + 2n for every n;
* the run-time helpers (64-bit multiply and divide, float divide) against the host's arithmetic;
* the kernels' boot self-check;
* instructions per weight of flm_matvec, q8 and q4, groups of 32 and 128, row-scaled (the default
  format) and with f32 scales per group, over a 64 x 512 tensor in SRAM; the integer group dots alone
  (one flm_dot_* call per group); flm_quantize_act per input element;
* instructions per float operation (add, mul, div, int-to-float, float-to-int, compare; the engine's
  own exp, SiLU and square root) beyond the
  same loop doing an integer xor: hardware instructions on the S3's FPU (its divide a call of
  xtensa_rt.c's __divsf3), the soft-float's calls on the C3, the call included.

An instruction is not a cycle: these are counts of executed instructions (no pipeline, cache or
memory timing: QEMU models none), the ISA-level cost of the code. ``measure(isa, work)`` returns
them as a dict."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from converter.ir import ModelConfig
from firmware.build import render_project

from . import board as qemu_board
from .build import ISAS, compile_image, swap_hal

PROBE_SRC = Path(__file__).resolve().parent / "probe.c"
Q8, Q4 = 1, 2
OPS = ("fadd", "fmul", "fdiv", "i2f", "f2i", "fcmp", "flm_expf", "flm_silu", "flm_sqrtf")
NOP = len(OPS)
M64 = (1 << 64) - 1


def build_probe(isa: str, work: Path) -> Path:
    """Render the chip's project for a small model, swap in the QEMU HAL and the probe as main.c."""
    i = ISAS[isa]
    cfg = ModelConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=64, hidden_dim=64,
                      max_seq_len=16, tied=True)
    out = render_project(i.profile, work / f"probe-{isa}", cfg, 32)
    swap_hal(i, out)
    (out / "src" / "main.c").write_text(PROBE_SRC.read_text())
    return compile_image(i, out)


class Probe:
    """The probe running in QEMU, its serial link on a pty."""

    def __init__(self, isa: str, elf: Path, work: Path):
        blob = work / "probe.blob"
        blob.write_bytes(b"\0" * 16)
        self.board = qemu_board.start(isa, elf, blob)
        self.fd = os.open(self.board.port, os.O_RDWR | os.O_NOCTTY)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        self.board.stop()

    def ask(self, cmd: bytes, words: list[int], n_out: int = 1, timeout: float = 120.0) -> np.ndarray:
        os.write(self.fd, cmd + np.array(words, "<u4").tobytes())
        want, got, t0 = 4 * n_out, bytearray(), time.monotonic()
        import select
        while len(got) < want:
            if time.monotonic() - t0 > timeout or not self.board.alive:
                raise RuntimeError(f"probe: no answer to {cmd!r} ({self.board.describe_exit() or 'timeout'})")
            if select.select([self.fd], [], [], 0.5)[0]:
                got += os.read(self.fd, want - len(got))
        return np.frombuffer(bytes(got), "<u4")

    def loop(self, n: int) -> int:
        return int(self.ask(b"L", [n])[0])

    def matvec(self, kind: int, fmt: int, group: int, cols: int, rows: int, scales: int) -> int:
        return int(self.ask(b"M", [kind, fmt, group, cols, rows, scales])[0])

    def op(self, op: int, count: int) -> int:
        return int(self.ask(b"T", [op, count])[0])

    def helper(self, op: int, a: int, b: int) -> int:
        r = self.ask(b"H", [op, a & 0xFFFFFFFF, a >> 32, b & 0xFFFFFFFF, b >> 32], 2)
        return int(r[0]) | int(r[1]) << 32

    def floor(self, rows: int, cols: int) -> tuple[int, bool]:
        r = self.ask(b"K", [rows, cols], 2)
        return int(r[0]), bool(r[1])

    def self_check(self) -> int:
        return int(np.int32(self.ask(b"C", [])[0]))


def helper_expected(op: int, a: int, b: int) -> int:
    def s64(x):
        return x - (1 << 64) if x >> 63 else x
    if op == 0:
        return (a * b) & M64
    if op in (1, 2):
        return (a // b if op == 1 else a % b) if b else None
    if op in (3, 4):
        x, y = s64(a), s64(b)
        if not y:
            return None
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)      # C: toward zero
        return (q if op == 3 else x - q * y) & M64
    x, y = np.uint32(a & 0xFFFFFFFF).view(np.float32), np.uint32(b & 0xFFFFFFFF).view(np.float32)
    with np.errstate(all="ignore"):
        r = np.float32(x / y)
    return 0x7FC00000 if np.isnan(r) else int(r.view(np.uint32))


def check_helpers(p: Probe, n: int = 300) -> list[str]:
    """The run-time helpers over edge and pseudo-random operands; one line per disagreement."""
    rng = np.random.default_rng(20)
    edges = [0, 1, 2, 3, 0xFFFFFFFF, 0x100000000, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, M64, 12345678901234567]
    pairs = [(a, b) for a in edges for b in edges] + [
        (int(rng.integers(0, 1 << 63)) << int(rng.integers(0, 2)) & M64, int(rng.integers(1, 1 << int(rng.integers(1, 64)))))
        for _ in range(n)]
    fpairs = [(int(rng.integers(0, 1 << 32)), int(rng.integers(0, 1 << 32))) for _ in range(n)] + [
        (0x00000001, 0x3F800001), (0x007FFFFF, 0x40000000), (0x3F800000, 0x00000000), (0x7F7FFFFF, 0x00800000),
        (0x00800000, 0x4B000000), (0x3F800000, 0x7F800000)]
    bad = []
    for op in range(5):
        for a, b in pairs:
            want = helper_expected(op, a, b)
            if want is None:
                continue
            got = p.helper(op, a, b)
            if got != want:
                bad.append(f"helper {op}({a:#x}, {b:#x}) = {got:#x}, expected {want:#x}")
    for a, b in fpairs:
        got, want = p.helper(5, a, b) & 0xFFFFFFFF, helper_expected(5, a, b)
        got = 0x7FC00000 if np.isnan(np.uint32(got).view(np.float32)) else got
        if got != want:
            bad.append(f"fdiv({a:#010x}, {b:#010x}) = {got:#010x}, expected {want:#010x}")
    return bad


def measure(isa: str, work: Path, helpers: bool = True) -> dict:
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    elf = build_probe(isa, work)
    out: dict = {"board": ISAS[isa].board, "clock": "emulated instructions (QEMU -icount)"}
    with Probe(isa, elf, work) as p:
        base = p.loop(0)
        out["clock_exact"] = all(p.loop(n) - base == 2 * n for n in (1, 2, 3, 7, 100, 1001, 65537))
        out["self_check"] = p.self_check()
        if helpers:
            out["helper_mismatches"] = check_helpers(p)
        cols, rows = 512, 64
        mv = {}
        for fmt, fname in ((Q8, "q8"), (Q4, "q4")):
            for g in (32, 128):
                n = cols * rows
                mv[f"{fname}_g{g}"] = dict(matvec_row_scaled=p.matvec(0, fmt, g, cols, rows, 2) / n,
                                           matvec=p.matvec(0, fmt, g, cols, rows, 0) / n,
                                           dot_only=p.matvec(1, fmt, g, cols, rows, 0) / n)
        out["instructions_per_weight"] = mv
        # the default model's matrices (dim 128, hidden 352, one KV head of 32): a row's fixed cost
        # (its scaling, the int64 fold's rounding) weighs more on short rows
        shapes = {"wq/wo 128x128": (128, 128), "wk/wv 32x128": (128, 32), "w1/w3 352x128": (128, 352),
                  "w2 128x352": (352, 128)}
        out["default_model_shapes_row_scaled_g32"] = {
            name: {fmt: p.matvec(0, code, 32, c, r, 2) / (c * r) for fmt, code in (("q8", Q8), ("q4", Q4))}
            for name, (c, r) in shapes.items()}
        fl = {}
        for g in (32, 128):
            n, same = p.floor(cols * rows // g, g)
            fl[f"q8_g{g}"] = {"dot_only": n / (cols * rows), "equal_to_flm_dot_q8": same}
        out["floor_kernel_per_weight"] = fl
        out["shape"] = f"{rows} rows x {cols} columns, codes in SRAM"
        out["quantize_act_per_element"] = {f"g{g}": p.matvec(2, Q8, g, cols, 8, 0) / (8 * cols) for g in (32, 128)}
        count = 4096
        base = p.op(NOP, count)
        out["float_op_instructions"] = {name: (p.op(op, count) - base) / count for op, name in enumerate(OPS)}
    return out


def main(argv=None) -> int:
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(prog="python -m tools.esp_qemu.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", default="rv32,xtensa")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for isa in a.isa.split(","):
            res[isa] = r = measure(isa, Path(tmp))
            print(f"{r['board']}: clock exact {r['clock_exact']}; kernels self-check "
                  f"{'ok' if r['self_check'] == 0 else 'FAILED'}; run-time helpers "
                  f"{'ok' if not r.get('helper_mismatches') else r['helper_mismatches'][:3]}")
            print(f"  matvec instructions per weight ({r['shape']}):")
            for k, v in r["instructions_per_weight"].items():
                print(f"    {k:8s} row-scaled {v['matvec_row_scaled']:6.2f}   f32 scales {v['matvec']:6.2f}   "
                      f"group dots alone {v['dot_only']:6.2f}")
            print("  the default model's matrices, row-scaled g32 (q8/q4): " + ", ".join(
                f"{k} {v['q8']:.2f}/{v['q4']:.2f}" for k, v in r["default_model_shapes_row_scaled_g32"].items()))
            print("  floor kernel (probe.c, not the engine's), int8 group dots alone: " + ", ".join(
                f"{k} {v['dot_only']:.2f}{'' if v['equal_to_flm_dot_q8'] else ' WRONG'}" for k, v in r["floor_kernel_per_weight"].items()))
            print("  quantize_act per element: " + ", ".join(f"{k} {v:.2f}" for k, v in r["quantize_act_per_element"].items()))
            print("  float operation, instructions beyond an integer xor: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in r["float_op_instructions"].items()))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    ok = all(r["clock_exact"] and r["self_check"] == 0 and not r.get("helper_mismatches")
             and all(v["equal_to_flm_dot_q8"] for v in r["floor_kernel_per_weight"].values()) for r in res.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
