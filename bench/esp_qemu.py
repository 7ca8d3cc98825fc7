"""``make bench``'s esp_qemu section and ``python -m bench.esp_qemu``: the engine on the ESP32 family's
instruction sets in QEMU (boards esp32c3-isa-qemu, esp32s3-isa-qemu, esp32p4-isa-qemu), in emulated instructions:
counts of executed instructions (QEMU -icount), exact and deterministic, but not cycles (QEMU models
no pipeline, cache or memory timing) and compiled by this machine's compilers (GCC for rv32, clang-22
for Xtensa; the real S3's ESP-IDF compiles with GCC).

* per decode token of the default model, q8 and q4 (convert's defaults: row scales, k12 KV cache,
  the head index): instructions per phase and in total, medians over the decode steps of one greedy
  generation, beside the planner's prediction for the board's own profile;
* a probe image (bench/esp_probe.c in place of main.c: the same engine, HAL, Makefile and flags as
  the board's firmware): instructions per weight of the matvec, q8 and q4, groups of 32 and 128,
  row-scaled (the default) and with f32 scales per group, the integer group dots alone, the floor
  kernels of docs/kernels.md (their dots checked equal to the engine's), the activations'
  quantization per element, and instructions per float operation beyond an integer xor;
* the probe's own checks, which a figure is worthless without (tests/test_esp_qemu.py asserts them):
  the clock is an exact instruction count (a loop of n turns of two instructions takes L(0) + 2n),
  the compiler run-time helpers equal the host's arithmetic, the boot self-check passes;
* the compute calibration these counts give the planner: instructions per float operation the probe's
  add and multiply, per multiply-accumulate fitted (least squares) to the per-phase instructions of
  both formats (the QEMU boards' [compute]; the ESP32 profiles' refit in docs/planner.md says how
  they carry over).
"""
from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from converter import computecost as K
from converter import costmodel as C
from converter.blob import read_header
from converter.boards import load_board
from converter.ir import ModelConfig
from firmware.baremetal import missing_tools, render_makefile
from firmware.build import render_project
from firmware.build_meta import BuildError
from host.boards.qemu import qemu_missing, start_qemu_board
from host.link.messages import PHASES, Generate

from .model import FORMATS, blob_and_firmware, default_quant, prompt_ids, session

BOARDS = ("esp32c3-isa-qemu", "esp32s3-isa-qemu", "esp32p4-isa-qemu")
# The floor of a row-scaled group dot per instruction set (a profile's kernels), instructions a weight,
# as docs/kernels.md derives it with int16 activation codes (flm_act): a weight's loads, sign
# extensions and multiply-accumulate (int4: per code byte, the two weights' share), plus the pointer
# steps and loop branch of a turn of 16 weights
FLOOR = {"rv32": {"q8": 4 + 3 / 16, "q4": 4.5 + 3 / 16},          # LB LH MUL ADD; LBU ANDI SRLI, 2x (LH MUL ADD)
         "xtensa": {"q8": 4 + 2 / 16, "q4": 3.5 + 2 / 16}}        # L8UI SEXT L16SI MULA; L8UI 2 EXTUI 2x (L16SI MULA)
PROBE_SRC = Path(__file__).resolve().parent / "esp_probe.c"
Q8, Q4 = 1, 2          # blob.h FLM_Q8 / FLM_Q4
OPS = ("fadd", "fmul", "fdiv", "i2f", "f2i", "fcmp", "flm_expf", "flm_silu", "flm_sqrtf")
NOP = len(OPS)
M64 = (1 << 64) - 1
FIT_PHASES = ("embed", "attention", "ffn", "output")


def unavailable(board: str) -> str | None:
    """Why ``board`` cannot be built and run here (one line), or None."""
    prof = load_board(board)
    return missing_tools(prof) or qemu_missing(prof)


def build_probe(board: str, work: Path) -> Path:
    """The board's project for a small model, its main.c the probe; returns firmware.elf."""
    cfg = ModelConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=64, hidden_dim=64,
                      max_seq_len=16, tied=True)
    out = render_project(board, Path(work) / f"probe-{board}", cfg, 32)
    render_makefile(load_board(board), out)
    (out / "src" / "main.c").write_text(PROBE_SRC.read_text())
    r = subprocess.run(["make", "-s", "-C", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"probe build failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return out / "firmware.elf"


class Probe:
    """The probe running in QEMU, its serial link on a pty."""

    def __init__(self, board: str, elf: Path, work: Path):
        blob = Path(work) / "probe.blob"
        blob.write_bytes(b"\0" * 16)
        self.board = start_qemu_board(elf, blob, board)
        self.fd = os.open(self.board.port, os.O_RDWR | os.O_NOCTTY)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        self.board.stop()

    def ask(self, cmd: bytes, words: list[int], n_out: int = 1, timeout: float = 300.0) -> np.ndarray:
        os.write(self.fd, cmd + np.array(words, "<u4").tobytes())
        want, got, t0 = 4 * n_out, bytearray(), time.monotonic()
        while len(got) < want:
            if time.monotonic() - t0 > timeout or not self.board.alive:
                raise RuntimeError(f"probe: no answer to {cmd!r} ({self.board.describe_exit() or 'timeout'})")
            if select.select([self.fd], [], [], 0.5)[0]:
                got += os.read(self.fd, want - len(got))
        return np.frombuffer(bytes(got), "<u4")

    def loop(self, n: int) -> int:
        return int(self.ask(b"L", [n])[0])

    def matvec(self, kind: int, fmt: int, group: int, cols: int, rows: int, scales: int) -> int:
        """kind 0: flm_matvec, 1: its group dots alone, 2: the quantization; scales 0 f32, 2 row."""
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


def clock_exact(p: Probe) -> bool:
    """A loop of n turns of two instructions takes L(0) + 2n instructions, for every n tried."""
    base = p.loop(0)
    return all(p.loop(n) - base == 2 * n for n in (1, 2, 3, 7, 100, 1001, 65537))


def helper_expected(op: int, a: int, b: int) -> int | None:
    """What esp_probe.c's helper must answer (None: C leaves it undefined)."""
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
    """The run-time helpers (64-bit multiply and divide; float divide) over edge and pseudo-random
    operands against the host's arithmetic; one line per disagreement."""
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
            if want is not None and p.helper(op, a, b) != want:
                bad.append(f"helper {op}({a:#x}, {b:#x}) = {p.helper(op, a, b):#x}, expected {want:#x}")
    for a, b in fpairs:
        got, want = p.helper(5, a, b) & 0xFFFFFFFF, helper_expected(5, a, b)
        got = 0x7FC00000 if np.isnan(np.uint32(got).view(np.float32)) else got
        if got != want:
            bad.append(f"fdiv({a:#010x}, {b:#010x}) = {got:#010x}, expected {want:#010x}")
    return bad


def measure_probe(board: str, work: Path) -> dict:
    """The probe's figures on ``board`` (instructions), and its checks."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    elf = build_probe(board, work)
    out: dict = {"board": board, "clock": "emulated instructions (QEMU -icount)"}
    with Probe(board, elf, work) as p:
        out["clock_exact"] = int(clock_exact(p))
        out["self_check"] = p.self_check()
        out["helper_mismatches"] = len(check_helpers(p))
        cols, rows = 512, 64
        mv = {}
        for fmt, fname in ((Q8, "q8"), (Q4, "q4")):
            for g in (32, 128):
                n = cols * rows
                mv[f"{fname}_g{g}"] = dict(matvec_row_scaled=p.matvec(0, fmt, g, cols, rows, 2) / n,
                                           matvec=p.matvec(0, fmt, g, cols, rows, 0) / n,
                                           dot_only=p.matvec(1, fmt, g, cols, rows, 0) / n)
        out["instructions_per_weight"] = mv
        out["floor_per_weight"] = FLOOR[load_board(board)["kernels"]]
        out["shape"] = f"{rows} rows x {cols} columns, codes in SRAM"
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
            fl[f"q8_g{g}"] = {"dot_only": n / (cols * rows), "equal_to_flm_dot_q8": int(same)}
        out["floor_kernel_per_weight"] = fl
        out["quantize_act_per_element"] = {f"g{g}": p.matvec(2, Q8, g, cols, 8, 0) / (8 * cols) for g in (32, 128)}
        count = 4096
        base = p.op(NOP, count)
        out["float_op_instructions"] = {name: (p.op(op, count) - base) / count for op, name in enumerate(OPS)}
    return out


def _median(xs) -> float:
    return float(statistics.median(xs))


def decode(board: str, fmt: str, work: Path, new_tokens: int = 12) -> dict:
    """The default model (``fmt``, convert's defaults) on ``board``: instructions per decode token and
    per phase (medians over the decode steps of one greedy generation; deterministic), and the
    multiply-accumulates and float operations the cost model counts for the same steps."""
    qm = default_quant(fmt)
    blob, fw = blob_and_firmware(qm, board, work / f"{board}-{fmt}")
    with start_qemu_board(fw.binary, blob, board, timeout=60) as b, session(b.port, 300, 300) as s:
        golden = s.hello.bit_exact
        res = s.generate(Generate(prompt_ids(qm), new_tokens))
    dec = res.generated_steps[1:]
    h = read_header(blob)
    spec = C.ModelSpec.from_header(h, str(blob))
    prof = load_board(board)
    counts = [_counts(spec, prof, t.pos, h.state_tiers.kv, int(t.head_rows)) for t in dec]
    return dict(bit_exact=golden, steps=len(dec), decode_pos=[t.pos for t in dec],
                instructions_per_token=_median(sum(t.us) for t in dec),
                phase_instructions={p: _median(t.us[i] for t in dec) for i, p in enumerate(PHASES)},
                macs={p: _median(c[0][p] for c in counts) for p in FIT_PHASES},
                flops={p: _median(c[1][p] for c in counts) for p in FIT_PHASES})


def _counts(spec, prof: dict, pos: int, kv: str, head: int) -> tuple[dict, dict]:
    """(MACs, float operations) per phase of one step as the cost model counts them: its compute
    with one instruction a MAC and none a float operation, and the other way round."""
    q4 = float(prof.get("compute", {}).get("q4_mac_factor", K.Q4_MAC_FACTOR))
    mac = dict(prof, compute={"cycles_per_mac": 1.0, "cycles_per_flop": 0.0, "q4_mac_factor": q4})
    flop = dict(prof, compute={"cycles_per_mac": 0.0, "cycles_per_flop": 1.0, "q4_mac_factor": q4})
    return (K.compute_cycles(spec, pos, mac, kv, head=head), K.compute_cycles(spec, pos, flop, kv, head=head))


def fit(runs: dict, per_flop: float) -> dict:
    """The calibration a QEMU board's [compute] takes: instructions per float operation the probe's
    (its add and multiply, ``per_flop``), and per MAC the least-squares fit of what remains of
    every (format, phase) of ``runs`` (fmt -> decode()). Not both fitted: the cost model counts a
    division, exp or SiLU as a few adds, so on the S3 (FPU adds of 3 instructions, a soft division of
    hundreds) a free fit trades the two against each other to a negative cost per float operation."""
    rows = [(r["macs"][p], r["flops"][p], r["phase_instructions"][p]) for r in runs.values() for p in FIT_PHASES]
    m, f, actual = (np.array(c, dtype=float) for c in zip(*rows))
    rest = actual - per_flop * f
    cpm = float(m @ rest / (m @ m))
    err = np.abs(cpm * m + per_flop * f - actual) / np.maximum(actual, 1)
    return dict(instructions_per_mac=cpm, instructions_per_flop=per_flop, max_phase_error=float(err.max()))


def section(work: Path) -> dict:
    """make bench's esp_qemu section: both boards' decode tokens, probes and calibration fits."""
    out: dict = {}
    ratios: dict = {}
    for board in BOARDS:
        why = unavailable(board)
        if why:
            print(f"bench esp_qemu: {board} left out: {why}", file=sys.stderr)
            continue
        runs = {fmt: decode(board, fmt, Path(work)) for fmt in FORMATS}
        probe = measure_probe(board, Path(work))
        ops = probe["float_op_instructions"]
        out[board] = dict(decode=runs, probe=probe, fit=fit(runs, (ops["fadd"] + ops["fmul"]) / 2))
        mv, fl = probe["instructions_per_weight"], probe["floor_per_weight"]
        for fmt in ("q8", "q4"):
            for g in (32, 128):
                ratios[f"{board} {fmt} g{g} row-scaled matvec / the derived floor, instructions per weight"] = (
                    mv[f"{fmt}_g{g}"]["matvec_row_scaled"] / fl[fmt])
        ratios[f"{board} q4/q8 instructions per decode token"] = (
            runs["q4"]["instructions_per_token"] / runs["q8"]["instructions_per_token"])
    return {"esp_qemu": out, "ratios": ratios}


def main() -> int:
    import json
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        r = section(Path(tmp))
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
