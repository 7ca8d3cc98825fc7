"""The kernels' exactness on the emulated RP2040: the build's own soft-float (firmware/hal/rp2040:
softfloat.c, softfloat_m0.s) gives the host's IEEE binary32 results bit for bit (NumPy) over
generated and edge-case operands; the boot self-check passes with the tuned Cortex-M0+ group dots,
and a firmware whose tuned kernel is wrong refuses to generate with ERROR self_check (native and
emulated boards)."""
import subprocess

import numpy as np
import pytest

import bench.kernels as kernels
from converter.quantize import quantize
from emuboard import require_emulator
from host.protocol import Error
from modelzoo import random_model
from nativeboard import rebuilt_board, recv_until, run

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    require_emulator()
    work = tmp_path_factory.mktemp("probe")
    with kernels.Probe(kernels.build_probe(work), work) as p:
        yield p


def test_soft_float_matches_host_ieee_bit_for_bit(probe):
    # 12 entry points x 5 operand kinds x 20000 pairs, and all 37 x 37 edge-case pairs
    assert kernels.check_float(probe, per_mode=20000) == []


def test_float_check_sees_a_wrong_bit(probe, monkeypatch):
    right = kernels.expected

    def off_by_one_ulp(op, a, b):
        r = right(op, a, b)
        return r ^ np.uint32(kernels.OPS[op] == "fmul")
    monkeypatch.setattr(kernels, "expected", off_by_one_ulp)
    bad = kernels.check_float(probe, per_mode=64)
    assert bad and all(line.startswith("fmul(") for line in bad)


def test_activation_codes_round_as_the_reference_for_every_float(tmp_path):
    # kernels.c rounds x*127/amax on the float's bits; converter/reference.py's round_half_away is
    # (int32)(v +- 0.5f): every binary32 v in [-127, 127] (2.2e9 of them) must get the same code
    exe = tmp_path / "quantize_check"
    subprocess.run(["cc", "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
                    f"-I{ROOT}/firmware/engine", str(ROOT / "tests/c/quantize_check.c"),
                    str(ROOT / "firmware/engine/kernels.c"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert out == "0\n", out


def test_tuned_kernels_pass_the_self_check(probe):
    assert probe.self_check() == 0


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
