"""``python -m bench.kernels``: the engine's kernels and float arithmetic on the emulated RP2040
(rp2040js), measured in one run and printed, never asserted.

A probe firmware (bench/rp2040_probe.c in place of the app's main.c; the same engine, HAL,
soft-float and compiler flags as the real firmware) times, with the Cortex-M0+'s SysTick counting
processor clock cycles (rp2040js's per-instruction cycle counts):

* the matvec (flm_matvec) in cycles per weight, q8 and q4, groups of 32 and 128 (q4 16 too), row-scaled (the
  default format: integer group dots, an integer fold, one float scaling per row) and with f32
  scales per group (group dots, a float term each, a float fold); the integer group dots alone over
  the same bytes (one call of flm_dot_q8 / flm_dot_q4 per group, so a call's cost per group
  included; the matvec inlines them); the activation quantization (flm_quantize_act) per input
  element;
* each soft-float entry point (__aeabi_fadd ...) in cycles per call, the cost of a call to an
  empty function subtracted.

The probe also answers the exactness checks of tests/test_kernels.py (``check_float``): every
float entry point against the host's IEEE binary32 arithmetic (NumPy) on generated and edge-case
operands. ``measure(work)`` returns the figures as a dict.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROBE_SRC = Path(__file__).resolve().parent / "rp2040_probe.c"
OPS = ("fadd", "fsub", "fmul", "fdiv", "fcmpeq", "fcmplt", "fcmple", "fcmpgt", "fcmpge", "i2f", "ui2f", "f2iz",
       "group_term", "rs_scale", "quant_code")
NOP = len(OPS)
MODES = 5          # operand kinds of the probe's op_pair (rp2040_probe.c)
Q8, Q4 = 1, 2      # blob.h FLM_Q8 / FLM_Q4
M32 = np.uint64(0xFFFFFFFF)

# Edge operands: zeros, subnormals, the normal boundary, 1 and its neighbours, integers around
# 2^23, 2^24 and 2^31, the largest finite, infinities, quiet and signalling NaN, ties of 1 + 2^-24.
EDGES = np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00800000,
                  0x00800001, 0x80800000, 0x3F800000, 0xBF800000, 0x3F800001, 0x3F7FFFFF, 0x3FFFFFFF,
                  0x40000000, 0x3F000000, 0x3FC00000, 0x40400000, 0x33800000, 0x34000000, 0x4B000000,
                  0x4B000001, 0x4B7FFFFF, 0x4B800000, 0x4EFFFFFF, 0x4F000000, 0xCF000000, 0xCF000001,
                  0x0C800000, 0x72800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                  0xFFC00001, 0x7F800001], dtype=np.uint32)


def build_probe(work: Path, float_lib: str = "flashlm") -> Path:
    """Render an rp2040-emu project, swap its main.c for the probe, build; returns firmware.bin.
    ``float_lib="libgcc"``: without flashlm's soft-float (and the kernels' assembly that goes with
    it), so the float operations are GCC's own soft-fp, the code the ESP32-C3's ROM holds too."""
    from converter.boards import load_board
    from converter.ir import ModelConfig
    from firmware.build import render_project
    from firmware.build_meta import BuildError
    from firmware.baremetal import render_makefile
    cfg = ModelConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=64, hidden_dim=64,
                      max_seq_len=16, tied=True)
    out = render_project("rp2040-emu", work / f"probe-{float_lib}", cfg, 32)
    if float_lib == "libgcc":
        hal = out / "src" / "hal"
        for f in ("softfloat.c", "softfloat_aeabi.c", "softfloat_m0.s"):
            (hal / f).unlink()
        (hal / "softfloat_m0.h").write_text("/* none: libgcc's soft-float, the portable kernels */\n")
    render_makefile(load_board("rp2040-emu"), out)
    (out / "src" / "main.c").write_text(PROBE_SRC.read_text())
    r = subprocess.run(["make", "-s", "-C", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"probe build failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return out / "firmware.bin"


class Probe:
    """The probe running in the harness, UART0 on pipes."""

    def __init__(self, image: Path, work: Path):
        from converter.boards import load_board
        from host.boards.emulated import EMU_DIR, EMU_HARNESS
        blob = work / "probe.blob"
        blob.write_bytes(b"\0" * 16)
        off = int(load_board("rp2040-emu")["flash"]["blob_offset"])
        self.proc = subprocess.Popen(["node", str(EMU_HARNESS), "--firmware", str(image), "--blob", str(blob),
                                      "--blob-offset", str(off)], cwd=str(EMU_DIR),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def ask(self, cmd: bytes, words: list[int], n_out: int, payload: bytes = b"") -> np.ndarray:
        self.proc.stdin.write(cmd + np.array(words, "<u4").tobytes() + payload)
        self.proc.stdin.flush()
        want, got = 4 * n_out, bytearray()
        while len(got) < want:
            chunk = os.read(self.proc.stdout.fileno(), want - len(got))
            if not chunk:
                raise RuntimeError(f"probe ended: {self.proc.stderr.read().decode(errors='replace').strip()}")
            got += chunk
        return np.frombuffer(bytes(got), "<u4")

    def hashed(self, op: int, mode: int, start: int, count: int) -> int:
        return int(self.ask(b"F", [op, mode, start, count], 1)[0])

    def results(self, op: int, mode: int, start: int, count: int) -> np.ndarray:
        return self.ask(b"R", [op, mode, start, count], count)

    def given(self, op: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        pairs = np.stack([a, b], axis=1).astype("<u4").tobytes()
        return self.ask(b"X", [op, len(a)], len(a), pairs)

    def op_cycles(self, op: int, count: int = 4096) -> int:
        return int(self.ask(b"T", [op, count], 1)[0])

    def matvec_cycles(self, kind: int, fmt: int, group: int, cols: int, rows: int, scales: int = 0) -> int:
        """scales 0: f32 per group, 1: fp16 per group, 2: row-scaled (rp2040_probe.c 'M')."""
        return int(self.ask(b"M", [kind, fmt, group, cols, rows, scales], 1)[0])

    def self_check(self) -> int:
        return int(np.int32(self.ask(b"C", [], 1)[0]))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def operands(mode: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The probe's op_pair for indices start .. start+count-1 (rp2040_probe.c)."""
    i = np.arange(start, start + count, dtype=np.uint32)
    x, y = _fmix(np.uint32(2) * i), _fmix(np.uint32(2) * i + np.uint32(1))
    if mode in (1, 4):
        y = (y & np.uint32(0x83FFFFFF)) | (x & np.uint32(0x7C000000))
    if mode == 2:
        x, y = x & np.uint32(0x81FFFFFF), y & np.uint32(0x81FFFFFF)
    if mode == 3:
        e = (np.where(i & 1, 381, 127) - ((x >> 23) & 255).astype(np.int64) + ((y >> 24) & 15).astype(np.int64) - 8)
        y = (y & np.uint32(0x807FFFFF)) | (np.clip(e, 1, 254).astype(np.uint32) << np.uint32(23))
    if mode == 4:
        x, y = x & np.uint32(0xFFFC0000), y & np.uint32(0xFFFC0000)
    return x, y


def expected(op: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the probe's run_op must answer, from the host's IEEE binary32 arithmetic."""
    fa, fb = a.view(np.float32), b.view(np.float32)
    name = OPS[op]
    with np.errstate(all="ignore"):
        if name in ("fadd", "fsub", "fmul", "fdiv", "i2f", "ui2f", "group_term", "rs_scale"):
            if name in ("group_term", "rs_scale"):   # (float)isum * (sc * xs), isum from both operands' bits
                isum = (a ^ b).view(np.int32) >> ((b >> np.uint32(3)) & np.uint32(7)).astype(np.int32)
                # rs_scale: sc a power of two (a's sign and exponent) when b is odd
                sc = np.where(b & 1, a & np.uint32(0xFF800000), a).view(np.float32) if name == "rs_scale" else fa
                r = isum.astype(np.float32) * (sc * fb)
            elif name == "i2f":
                r = (a.view(np.int32) >> (b & np.uint32(31)).astype(np.int32)).astype(np.float32)
            elif name == "ui2f":
                r = (a >> (b & np.uint32(31))).astype(np.float32)
            else:
                r = {"fadd": np.add, "fsub": np.subtract, "fmul": np.multiply, "fdiv": np.divide}[name](fa, fb)
            u = r.view(np.uint32)
            return np.where(np.isnan(r), np.uint32(0x7FC00000), u).astype(np.uint32)
        if name == "quant_code":   # an activation code of x = a times inv = b (reference quantize_activation)
            from converter.numerics import round_half_away
            v = (fa * fb).astype(np.float32)
            q = round_half_away(np.clip(np.where(np.isnan(v), np.float32(0), v), -127, 127).astype(np.float32))
            return q.astype(np.int64).astype(np.uint32)
        if name == "f2iz":   # truncation, saturating, NaN -> 0 (softfloat.c)
            t = np.clip(np.trunc(fa.astype(np.float64)), -2.0**31, 2.0**31 - 1)
            return np.where(np.isnan(fa), 0, t).astype(np.int64).astype(np.uint32)
        cmp = {"fcmpeq": np.equal, "fcmplt": np.less, "fcmple": np.less_equal, "fcmpgt": np.greater,
               "fcmpge": np.greater_equal}[name]
        return cmp(fa, fb).astype(np.uint32)


def _weighted(r: np.ndarray) -> int:
    w = np.arange(len(r), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return int((r.astype(np.uint64) * w).sum() & M32)


def check_float(probe: Probe, per_mode: int, chunk: int = 16384) -> list[str]:
    """Every entry point over MODES x per_mode generated operand pairs and all pairs of EDGES;
    returns one line per disagreement (the first few operands of each failing chunk)."""
    bad = []
    ea, eb = np.repeat(EDGES, len(EDGES)), np.tile(EDGES, len(EDGES))
    for op, name in enumerate(OPS):
        got, want = probe.given(op, ea, eb), expected(op, ea, eb)
        for k in np.flatnonzero(got != want)[:4]:
            bad.append(f"{name}({ea[k]:#010x}, {eb[k]:#010x}) = {got[k]:#010x}, expected {want[k]:#010x}")
        for mode in range(MODES):
            for start in range(0, per_mode, chunk):
                n = min(chunk, per_mode - start)
                a, b = operands(mode, start, n)
                want = expected(op, a, b)
                if probe.hashed(op, mode, start, n) == _weighted(want):
                    continue
                got = probe.results(op, mode, start, n)
                for k in np.flatnonzero(got != want)[:4]:
                    bad.append(f"{name}({a[k]:#010x}, {b[k]:#010x}) = {got[k]:#010x}, expected {want[k]:#010x}"
                               f" (mode {mode})")
    return bad


def measure(work: Path) -> dict:
    """Cycle figures of the kernels and soft-float on the emulated RP2040 (SysTick, processor clock)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    image = build_probe(work)
    out: dict = {"board": "rp2040-emu", "clock": "SysTick (rp2040js cycle counts, processor clock)"}
    with Probe(image, work) as p:
        out["self_check"] = p.self_check()
        cols, rows = 512, 64
        mv = {}
        for fmt, fname in ((Q8, "q8"), (Q4, "q4")):
            for g in (16, 32, 128) if fmt == Q4 else (32, 128):   # q4's default groups are 16
                n = cols * rows
                mv[f"{fname}_g{g}"] = dict(matvec_row_scaled=p.matvec_cycles(0, fmt, g, cols, rows, 2) / n,
                                           matvec=p.matvec_cycles(0, fmt, g, cols, rows) / n,
                                           dot_only=p.matvec_cycles(1, fmt, g, cols, rows) / n)
        out["cycles_per_weight"] = mv
        out["cycles_per_weight_shape"] = (f"{rows} rows x {cols} columns, codes in SRAM; matvec: f32 scales per "
                                          "group, matvec_row_scaled: row scales (the default)")
        out["quantize_act_cycles_per_element"] = {f"g{g}": p.matvec_cycles(2, Q8, g, cols, 8) / (8 * cols)
                                                  for g in (32, 128)}
        count = 4096
        base = p.op_cycles(NOP, count)
        out["float_op_cycles"] = {name: (p.op_cycles(op, count) - base) / count for op, name in enumerate(OPS)}
    return out


def section(work: Path) -> dict:
    """make bench's kernels section: measure() and the ratios it shows within one run."""
    k = measure(work)
    mv = k["cycles_per_weight"]
    rs = {g: mv[f"q8_g{g}"]["matvec_row_scaled"] for g in (32, 128)}
    return {"kernels": k, "ratios": {
        # the targets set when the Cortex-M0+ kernels were tuned: an int8 matvec at <= 6 cycles per
        # weight at g32, <= 4 at g128
        "kernels q8 row-scaled cycles per weight / the target, g32 (6)": rs[32] / 6.0,
        "kernels q8 row-scaled cycles per weight / the target, g128 (4)": rs[128] / 4.0,
        **{f"kernels q8 row-scaled / f32-scaled cycles per weight, g{g}": rs[g] / mv[f"q8_g{g}"]["matvec"]
           for g in (32, 128)},
        "kernels q4/q8 row-scaled cycles per weight, g32": mv["q4_g32"]["matvec_row_scaled"] / rs[32],
        "kernels q4 row-scaled cycles per weight, g16/g32": (mv["q4_g16"]["matvec_row_scaled"]
                                                              / mv["q4_g32"]["matvec_row_scaled"]),
        "kernels q4/q8 cycles per weight, g32": mv["q4_g32"]["matvec"] / mv["q8_g32"]["matvec"],
        "kernels g128/g32 cycles per weight, q8": mv["q8_g128"]["matvec"] / mv["q8_g32"]["matvec"],
        "kernels int dot share of the q8 g32 matvec": mv["q8_g32"]["dot_only"] / mv["q8_g32"]["matvec"]}}


def main() -> None:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(Path(tmp))
    print(f"flashlm kernels — {res['board']}, cycles from {res['clock']}")
    print(f"boot self-check: {'ok' if res['self_check'] == 0 else 'FAILED'}")
    print(f"matvec cycles per weight ({res['cycles_per_weight_shape']}):")
    for k, v in res["cycles_per_weight"].items():
        print(f"  {k:8s} matvec row-scaled {v['matvec_row_scaled']:6.2f}   f32 scales {v['matvec']:6.2f}   "
              f"group dots alone {v['dot_only']:6.2f}")
    for k, v in res["quantize_act_cycles_per_element"].items():
        print(f"  quantize_act {k}: {v:6.2f} cycles per element")
    print("soft-float cycles per call (beyond an empty call):")
    print("  " + ", ".join(f"{k} {v:.1f}" for k, v in res["float_op_cycles"].items()))
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        Path(sys.argv[2]).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
