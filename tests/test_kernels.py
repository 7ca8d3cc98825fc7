"""The kernels' exactness. On the emulated RP2040: the build's own soft-float (firmware/hal/rp2040:
softfloat.c, softfloat_m0.s) gives the host's IEEE binary32 results bit for bit (NumPy) over
generated and edge-case operands; the boot self-check passes with the tuned Cortex-M0+ group dots.
On the host: the vectorised rows (kernels.c, built by gcc and clang, with and without the AVX2
clones, and as the 32-bit scalar build) equal converter/numerics.py on tensors of every shape
class (group sizes with and without a vectorised row, short last groups, odd q4 groups, fp16
scales, the full code range). A firmware whose tuned kernel is wrong refuses to generate with
ERROR self_check (native and emulated boards)."""
import shutil
import subprocess

import numpy as np
import pytest

import bench.kernels as kernels
from converter.formats import encode_qtensor, row_stride
from converter.ir import QTensor
from converter.quantize import quantize
from converter.numerics import QMAX_8, QMAX_12, PackedMatrix
from emuboard import require_emulator
from firmware.build_meta import ENGINE_DIR
from host.link.messages import Error
from modelzoo import random_model
from nativeboard import rebuilt_board, recv_until, run

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    require_emulator()
    work = tmp_path_factory.mktemp("probe")
    with kernels.Probe(kernels.build_probe(work), work) as p:
        yield p


@pytest.mark.native
@pytest.mark.emulated
@pytest.mark.slow
def test_soft_float_matches_host_ieee_bit_for_bit(probe):
    # 12 entry points x 5 operand kinds x 20000 pairs, and all 37 x 37 edge-case pairs
    assert kernels.check_float(probe, per_mode=20000) == []


@pytest.mark.emulated
def test_float_check_sees_a_wrong_bit(probe, monkeypatch):
    right = kernels.expected

    def off_by_one_ulp(op, a, b):
        r = right(op, a, b)
        return r ^ np.uint32(kernels.OPS[op] == "fmul")
    monkeypatch.setattr(kernels, "expected", off_by_one_ulp)
    bad = kernels.check_float(probe, per_mode=64)
    assert bad and all(line.startswith("fmul(") for line in bad)




@pytest.mark.emulated
def test_a_slow_reader_gets_the_uart_bytes_in_order(probe):
    """The harness writes UART output one write at a time: a host reading a 64 KB reply slowly through
    a 4 KB pipe gets every byte in order (with several fs.write calls in flight, libuv's threads
    wrote them interleaved: 1,900 of 16,384 words wrong here, and a CI run's float check failed)."""
    import fcntl
    import os
    import time
    fd = probe.proc.stdout.fileno()
    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 4096)
    op, n = kernels.OPS.index("fsub"), 16384
    probe.proc.stdin.write(b"R" + np.array([op, 0, 0, n], "<u4").tobytes())
    probe.proc.stdin.flush()
    got = bytearray()
    while len(got) < 4 * n:
        time.sleep(0.002)
        got += os.read(fd, min(1000, 4 * n - len(got)))
    a, b = kernels.operands(0, 0, n)
    assert np.array_equal(np.frombuffer(bytes(got), "<u4"), kernels.expected(op, a, b))
# the rounding of the cores without vectors (on the float's bits: i386 with SSE but not SSE2, kernels.c
# has no FLM_VECTOR there) and of the cores with them (the float form, vectorised)
@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("flags", [["-m32", "-msse", "-mfpmath=sse"], []], ids=["bits", "vector"])
def test_activation_codes_round_as_the_reference_for_every_float(flags, tmp_path):
    # converter/numerics.py's round_half_away is (int32)(v +- 0.5f): every binary32 v in [-127, 127]
    # and in [-2047, 2047] (2.2e9 and 2.3e9 of them) must get the same code from flm_quantize_act
    exe = tmp_path / "quantize_check"
    r = subprocess.run(["cc", "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", *flags,
                        f"-I{ENGINE_DIR}", str(ROOT / "tests/c/quantize_check.c"),
                        str(ENGINE_DIR / "kernels.c"), "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0 and "-m32" in flags and ("gnu/stubs-32" in r.stderr or "cannot find" in r.stderr):
        pytest.skip("no 32-bit C library (apt-get install libc6-dev-i386)")
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert out == "0\n", out


# host builds of kernels.c: (compiler, flags); FLM_NO_CLONES is the x86-64 baseline alone; i386 with
# SSE but not SSE2 builds the portable C of the cores without SIMD (no vectorised rows), its floats in
# SSE registers (x87's wider intermediates would not round as binary32); with tests/c/rs_scalar_host
# the RV32 and Xtensa kernels' row-scaled rows (firmware/hal/kernels_rs_scalar.h) over portable dots
# (five flags: matvec_cases' seed 5 holds a row-scaled q8 case at its largest sums, k * isum past 2^32)
RS_SCALAR_HOST = [f"-I{ROOT / 'tests/c/rs_scalar_host'}", f"-I{ROOT / 'firmware/hal'}"]
HOST_BUILDS = [("cc", []), ("cc", ["-DFLM_NO_CLONES"]), ("clang", []), ("clang", ["-DFLM_NO_CLONES"]),
               ("cc", ["-m32", "-msse", "-mfpmath=sse"]), ("cc", ["-m32", "-msse", "-mfpmath=sse", *RS_SCALAR_HOST])]


def matvec_cases(seed: int, n: int):
    """Random tensors over the shape classes the row kernels tell apart, with their inputs."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        fmt = ("q8", "q4")[k % 2]
        g = int(rng.choice([1, 2, 3, 7, 8, 16, 23, 24, 31, 32, 33, 64, 96, 128, 129]))
        cols = int(rng.integers(1, 3 * g + 4)) if k % 3 else g * int(rng.integers(1, 12))   # a third whole
        rows, s16, rs = int(rng.integers(1, 6)), bool(k % 5 == 4), bool(k % 5 == 2)
        lo, hi = (-128, 127) if fmt == "q8" else (-8, 7)           # every code the format can hold
        codes = rng.integers(lo, hi + 1, (rows, cols)).astype(np.int8)
        ng = -(-cols // g)
        scales = (rng.standard_normal((rows, ng)) * 10.0 ** rng.integers(-6, 3, (rows, ng))).astype(np.float32)
        if s16:
            scales = scales.astype(np.float16).astype(np.float32)
        mult = None
        if rs:   # row-scaled: one float scale per row, multipliers 0..255 (255 and 0 among them)
            scales = scales[:, :1]
            mult = rng.integers(0, 256, (rows, ng)).astype(np.uint8)
            mult[rng.random((rows, ng)) < 0.2] = rng.choice([0, 255])
        qmax = QMAX_12 if fmt == "q8" else QMAX_8                 # the codes the engine passes a product
        xq = rng.integers(-qmax, qmax + 1, cols).astype(np.int16)
        xq[rng.random(cols) < 0.2] = rng.choice([-qmax, qmax])
        if k % 11 == 10:   # the largest sums: every product at its bound (row-scaled: k * isum beyond int32)
            codes[:], xq[:] = lo, -qmax
            if mult is not None:
                mult[:] = 255
        xs = (np.abs(rng.standard_normal(ng)) * 10.0 ** rng.integers(-4, 2, ng)).astype(np.float32)
        xs[rng.random(ng) < 0.1] = 0.0
        yield QTensor(fmt, codes, scales, g, s16, mult), xq, xs


@pytest.mark.native
@pytest.mark.parametrize("cc,flags", HOST_BUILDS, ids=lambda v: v if isinstance(v, str) else " ".join(v) or "-")
def test_host_rows_equal_the_reference(cc, flags, tmp_path):
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    exe = tmp_path / "matvec_check"
    r = subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", *flags,
                        f"-I{ENGINE_DIR}", str(ROOT / "tests/c/matvec_check.c"),
                        str(ENGINE_DIR / "kernels.c"), "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0 and "-m32" in flags and ("gnu/stubs-32" in r.stderr or "cannot find" in r.stderr):
        pytest.skip("no 32-bit C library (apt-get install libc6-dev-i386)")
    assert r.returncode == 0, r.stderr
    cases = list(matvec_cases(seed=len(flags), n=400))
    feed, want = [], []
    for q, xq, xs in cases:
        rows, cols = q.shape
        code = {"q8": 1, "q4": 2}[q.fmt]
        kind = 2 if q.rowscale else int(q.scale16)
        stride = row_stride(q.fmt, cols, q.group_size, q.scale16, q.rowscale)
        feed += [np.array([code, rows, cols, q.group_size, kind, stride], "<u4").tobytes(), encode_qtensor(q),
                 xq.astype("<i2").tobytes(), xs.astype("<f4").tobytes()]
        xg = np.zeros(q.n_groups * q.group_size, np.int32)
        xg[:cols] = xq
        ref = PackedMatrix(q).matvec_q(xg.reshape(q.n_groups, q.group_size), xs)
        want.append(np.concatenate([ref, ref]))
    out = subprocess.run([str(exe)], input=b"".join(feed), capture_output=True, check=True).stdout
    got = np.frombuffer(out[:-4], "<f4")
    assert np.frombuffer(out[-4:], "<i4")[0] == 0, "flm_kernels_self_check failed"
    at = 0
    for (q, _, _), w in zip(cases, want):
        g_ = got[at:at + w.size]
        at += w.size
        assert g_.view(np.uint32).tolist() == w.view(np.uint32).tolist(), \
            f"{q.fmt} g{q.group_size} {q.shape} fp16={q.scale16} row={q.rowscale}: rows (all, one by one) {g_} != " \
            f"reference {w}"
    assert at == got.size


@pytest.mark.emulated
def test_tuned_kernels_pass_the_self_check(probe):
    assert probe.self_check() == 0


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("board", ["native", "rp2040-emu"])
def test_wrong_tuned_kernel_is_refused_at_boot(board, tmp_path):
    if board == "rp2040-emu":
        require_emulator()
    _, ir = random_model(seed=3)
    with rebuilt_board(quantize(ir, "q8", 32), tmp_path, board, define="FLM_FAULT_TUNED_KERNEL 1") as (link, hello, _):
        err = recv_until(link, lambda m: isinstance(m, Error))[-1]
        assert not hello.image_ok and err.name == "self_check" and "self-check failed" in err.text
        toks, _, done = run(link, [1, 2, 3], 2)
    assert toks == [] and isinstance(done, Error) and done.name == "self_check"
