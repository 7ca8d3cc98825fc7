"""The ESP32-C3's and ESP32-S3's instruction sets in QEMU (tools/esp_qemu, issue 20 phase A): the
probe's clock is an exact instruction count and the run-time helpers are the host's arithmetic;
both boards are bit-exact with the NumPy reference at boot and on a generation (int8 and int4,
the int8 and the f32 KV cache, batched prefill, PLE); the negative controls say "no" at the step
where their logits first leave the reference's. Skipped where QEMU or a compiler is missing."""
import shutil
from pathlib import Path

import numpy as np
import pytest
import serial

from converter.blob import read_golden, write_blob
from converter.quantize import quantize
from converter.reference import FLAG_ALL_LOGITS, NO_TOKEN, generate
from host.protocol import Hello, Link, Ping
from modelzoo import random_model, random_ple_model
from nativeboard import assert_steps_match, recv_until, run

TOOLS = {"rv32": ("qemu-system-riscv32", "riscv64-unknown-elf-gcc"),
         "xtensa": ("qemu-system-xtensa", "clang-22", "llvm-mc-22", "xtensa-lx106-elf-ld")}


def need(isa: str) -> None:
    missing = [t for t in TOOLS[isa] if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (tools/esp_qemu, NOTES-phaseA.md)")


def booted(isa, qm, tmp: Path, kv="f32", batch=1, defines=(), fused=False):
    """(link, boot HELLO, board, port, blob) for qm on the QEMU board of ``isa``."""
    from tools.esp_qemu import board
    from tools.esp_qemu.build import build
    blob = tmp / "model.flmb"
    write_blob(qm, blob, kv=kv, batch=batch)
    elf = build(isa, blob, tmp / f"fw-{isa}", defines, fused=fused)
    b = board.start(isa, elf, blob)
    port = serial.Serial(b.port, 115200, timeout=0.05)
    link = Link(port)
    link.send(Ping())
    return link, recv_until(link, lambda m: isinstance(m, Hello), timeout=120)[-1], b, port, blob


@pytest.mark.parametrize("isa", ["rv32", "xtensa"])
def test_probe_clock_is_an_exact_instruction_count_and_helpers_are_exact(isa, tmp_path):
    need(isa)
    from tools.esp_qemu import probe
    elf = probe.build_probe(isa, tmp_path)
    with probe.Probe(isa, elf, tmp_path) as p:
        base = p.loop(0)
        assert [p.loop(n) - base for n in (1, 2, 3, 10, 1000, 65537)] == [2, 4, 6, 20, 2000, 131074]
        assert p.self_check() == 0
        assert probe.check_helpers(p, n=100) == []
        n, same = p.floor(16, 32)
        assert same and n > 0


CASES = {
    "q8 tied, f32 KV": (lambda: quantize(random_model(seed=3)[1], "q8", 32), "f32", 1),
    "q4 untied PLE, int8 KV, batch 4": (lambda: quantize(random_ple_model(seed=5, tied=False, out_vocab=50), "q4", 16),
                                        "int8", 4),
}


@pytest.mark.parametrize("isa", ["rv32", "xtensa"])
@pytest.mark.parametrize("case", CASES)
def test_qemu_board_is_bit_exact_with_the_reference(isa, case, tmp_path):
    need(isa)
    make, kv, batch = CASES[case]
    qm = make()
    link, hello, b, port, _ = booted(isa, qm, tmp_path, kv=kv, batch=batch)
    try:
        assert hello.board == {"rv32": "esp32c3-isa-qemu", "xtensa": "esp32s3-isa-qemu"}[isa]
        assert hello.clock_name == "emulated instructions"
        assert hello.golden == "exact" and hello.bit_exact.startswith("yes")
        prompt = [5, 9, 2, 7, 3, 11]
        toks, _, done = run(link, prompt, 6, logits=False, all_logits=True, batch=1)
        assert_steps_match(toks, generate(qm, prompt, 6, flags=FLAG_ALL_LOGITS, kv=kv))
        toks, _, _ = run(link, prompt, 6, logits=False, batch=batch)
        assert_steps_match(toks, generate(qm, prompt, 6, kv=kv, batch=batch))
        assert all(sum(t.us) > 0 for t in toks)          # the clock counts
    finally:
        port.close()
        b.stop()


def first_differing_step(link, qm, prompt, kv) -> int | None:
    from converter import golden
    n = golden.STEPS - len(prompt) + 1
    toks, _, _ = run(link, prompt, n, logits=False, all_logits=True, batch=1)
    for t, r in zip(toks, generate(qm, prompt, n, flags=FLAG_ALL_LOGITS, kv=kv)):
        if t.logits_crc != r["logits_crc"] or (NO_TOKEN if t.out_id is None else t.out_id) != r["out_id"]:
            return t.step
    return None


def test_rv32_with_a_flush_to_zero_soft_float_is_not_bit_exact(tmp_path):
    """As the RP2040's: subnormal embedding rows make the residual stream subnormal at once."""
    need("rv32")
    _, ir = random_model(seed=7)
    ir.tensors["tok_embeddings"] = (ir.tensors["tok_embeddings"] * np.float32(2.0 ** -140)).astype(np.float32)
    qm = quantize(ir, "q8", 32)
    link, h0, b, port, blob = booted("rv32", qm, tmp_path, defines=("FLM_FAULT_FTZ=1",))
    try:
        first = first_differing_step(link, qm, list(read_golden(blob.read_bytes()).prompt), "f32")
    finally:
        port.close()
        b.stop()
    assert first is not None and h0.golden == "differs" and h0.golden_first_diff == first


def test_xtensa_with_fused_multiply_adds_is_not_bit_exact(tmp_path):
    """Every multiply-add the C allows fused into MADD.S (what GCC does for the S3 without
    -ffp-contract=off), with float attention (the f32 KV cache) where the fused roundings survive."""
    need("xtensa")
    qm = quantize(random_model(seed=3)[1], "q8", 32)
    link, h0, b, port, blob = booted("xtensa", qm, tmp_path, kv="f32", fused=True)
    try:
        first = first_differing_step(link, qm, list(read_golden(blob.read_bytes()).prompt), "f32")
    finally:
        port.close()
        b.stop()
    assert first is not None
    assert h0.golden == ("differs" if first < 2 else "exact")
