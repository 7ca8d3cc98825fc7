"""The ESP32-C3's, ESP32-S3's and ESP32-P4's instruction sets in QEMU (boards esp32c3-isa-qemu,
esp32s3-isa-qemu, esp32p4-isa-qemu):
each board boots bit-exact with the NumPy reference (its golden check "yes") and generates as the
reference does, token for token and every step's logits CRC: int8 and int4, row-scaled and f32
scales, PLE, the int8 and the f32 KV cache, batched prefill (the multi-token pass) and speculative
decoding (prompt lookup and a draft model). Its clock is an exact instruction count and its compiler
run-time helpers are the host's arithmetic (the probe, bench/esp_qemu.py). The negative controls —
a soft-float that flushes subnormals to zero on RISC-V, every multiply-add fused into MADD.S on
Xtensa, GCC's FMADD.S on the P4's rv32imafc — say "no" at the step where their logits first leave
the reference's. One image per board serves every model here (the bare-metal arenas are the board's
whole budgets); a board whose QEMU or compiler is missing is skipped, naming what to install."""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import serial

from converter import golden
from converter.blob import read_golden, write_blob
from converter.boards import load_board
from converter.formats import StateTiers
from converter.quantize import quantize
from converter.reference import FLAG_ALL_LOGITS, NO_TOKEN, generate
from firmware.build import build_firmware
from host.boards.qemu import start_qemu_board
from host.link.messages import Done, Hello, Log, Ping, SelfTest
from host.link.port import Link
from modelzoo import random_model, random_ple_model
from nativeboard import assert_steps_match, rebuilt_board, recv_until, run

pytestmark = [pytest.mark.native, pytest.mark.cross, pytest.mark.emulated, pytest.mark.slow]

BOARDS = ("esp32c3-isa-qemu", "esp32s3-isa-qemu", "esp32p4-isa-qemu")
PROMPT = [5, 9, 2, 7, 3, 11]
REPEATS = [3, 8, 13, 21, 3, 8, 13, 21, 34, 3, 8, 13]     # prompt lookup finds its drafts here


def need(board: str) -> None:
    from bench.esp_qemu import unavailable
    why = unavailable(board)
    if why:
        pytest.skip(why)


def with_draft(qm, kv="int8"):
    from converter.draft import attach
    _, ird = random_model(seed=20, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=32, n_layers=1,
                          vocab_size=qm.config.vocab_size, max_seq_len=16)
    return attach(qm, quantize(ird, "q8", 8), kv=kv)


# name: (QuantModel factory, KV cache, batch); every model 2 layers and a context of 48, so one image
# per board runs them all
CASES = {
    "q8 row scales, int8 KV, draft model": (lambda: with_draft(quantize(
        random_model(seed=5, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=128)[1], "q8", 16, scales="row")), "int8", 4),
    "q4 row scales, untied, f32 KV": (lambda: quantize(
        random_model(seed=8, tied=False, dim=64, n_heads=4, hidden_dim=96)[1], "q4", 32, scales="row"), "f32", 4),
    "q4 fp16 group scales (ple-28m's recipe), int8 KV": (lambda: quantize(
        random_model(seed=7, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=96)[1], "q4", 32, scales="f16"), "int8", 4),
    "q4 untied PLE, int8 KV": (lambda: quantize(random_ple_model(seed=5, tied=False, out_vocab=50), "q4", 16),
                               "int8", 4),
}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """board -> firmware.elf, built once for the first case's blob (the same layers and context as
    every case's)."""
    root = tmp_path_factory.mktemp("esp-qemu")
    built = {}

    def image(board: str) -> Path:
        need(board)
        if board not in built:
            make, kv, batch = next(iter(CASES.values()))
            blob = root / f"{board}.flmb"
            write_blob(make(), blob, state=StateTiers(kv=kv, batch=batch))
            built[board] = build_firmware(board, root / board, blob).binary
        return built[board]
    return image


@contextlib.contextmanager
def booted(board: str, image: Path, qm, tmp: Path, kv: str, batch: int):
    """(link, boot HELLO) for ``qm`` on the QEMU ``board``."""
    blob = tmp / "model.flmb"
    write_blob(qm, blob, state=StateTiers(kv=kv, batch=batch))
    with start_qemu_board(image, blob, board) as b:
        port = serial.Serial(b.port, 115200, timeout=0.05)
        try:
            link = Link(port)
            link.send(Ping())
            yield link, recv_until(link, lambda m: isinstance(m, Hello), timeout=120)[-1]
        finally:
            port.close()


@pytest.mark.parametrize("board", BOARDS)
@pytest.mark.parametrize("case", CASES)
def test_qemu_board_is_bit_exact_with_the_reference(board, case, images, tmp_path):
    make, kv, batch = CASES[case]
    qm = make()
    with booted(board, images(board), qm, tmp_path, kv, batch) as (link, hello):
        assert hello.board == board and hello.clock_name == load_board(board)["timer"] == "emulated instructions"
        assert hello.golden == "exact" and hello.bit_exact.startswith("yes")
        toks, _, last = run(link, PROMPT, 8, logits=False, all_logits=True, batch=1)   # every step's whole head
        assert isinstance(last, Done) and last.reason == "max_tokens", last         # what the board said instead
        assert_steps_match(toks, generate(qm, PROMPT, 8, flags=FLAG_ALL_LOGITS, kv=kv))
        assert all(sum(t.us) > 0 for t in toks)                                     # the clock counts
        toks, _, _ = run(link, REPEATS, 6, logits=False, batch=batch)                # prefill in passes
        assert_steps_match(toks, generate(qm, REPEATS, 6, kv=kv, batch=batch))
        assert any(t.kind == "prefill" and t.chunk_len == batch for t in toks)
        toks, _, _ = run(link, PROMPT, 6, temperature=0.8, top_p=0.9, seed=11, logits=False, batch=1)
        assert_steps_match(toks, generate(qm, PROMPT, 6, temperature=0.8, top_p=0.9, seed=11, kv=kv))
        toks, _, done = run(link, REPEATS, 12, logits=False, speculate="lookup", draft_k=3)
        assert_steps_match(toks, generate(qm, REPEATS, 12, kv=kv, batch=batch, speculate="lookup", draft_k=3))
        assert done.verify_passes > 0
        if qm.draft is not None:
            assert hello.can_draft
            toks, _, done = run(link, PROMPT, 10, logits=False, speculate="draft", draft_k=3)
            assert_steps_match(toks, generate(qm, PROMPT, 10, kv=kv, batch=batch, speculate="draft", draft_k=3))
            assert done.verify_passes > 0


@pytest.mark.parametrize("board", BOARDS)
def test_a_bad_image_is_refused_in_one_line(board, images, tmp_path):
    """A blob whose CRC is wrong: the firmware refuses it (HELLO image_ok false, ERROR bad_image) and
    the session says so in one line; a firmware image that is not an ELF: refused before QEMU starts."""
    from host.errors import BoardError
    from host.session.session import Session
    qm = quantize(random_model(seed=3)[1], "q8", 32)
    blob = tmp_path / "model.flmb"
    write_blob(qm, blob)
    raw = bytearray(blob.read_bytes())
    raw[-5] ^= 0x40
    blob.write_bytes(bytes(raw))
    with start_qemu_board(images(board), blob, board) as b:
        port = serial.Serial(b.port, 115200, timeout=0.05)
        try:
            with pytest.raises(BoardError) as e:
                Session(Link(port)).handshake(timeout=60)
        finally:
            port.close()
    assert f"{board} rejected its model image" in str(e.value) and "CRC mismatch" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(BoardError, match="is not an ELF file"):
        start_qemu_board(blob, blob, board)


def test_cli_run_on_the_qemu_board(tmp_path, monkeypatch, capsys):
    """`flashlm run --board` from another folder with a relative model path: built, started, every
    figure in instructions (no µs, no tok/s), the tokens and logits CRCs the reference's (one board:
    the command's path is every QEMU board's)."""
    board = "esp32s3-isa-qemu"
    import csv
    import zlib

    from converter.blob import read_blob
    from converter.llama2c import write_llama2c
    from host.cli.main import main
    need(board)
    _, ir = random_model(seed=9, vocab_size=64, dim=64, n_heads=4, n_kv_heads=2, hidden_dim=128)
    write_llama2c(ir, tmp_path / "model.bin", version=1)
    assert main(["convert", str(tmp_path / "model.bin"), "-o", str(tmp_path / "model"), "--no-report"]) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    prompt = [1, 10, 20]
    rc = main(["run", "--board", board, "--model", "../model", "--prompt-ids", ",".join(map(str, prompt)),
               "--max-tokens", "6", "--all-logits", "--csv", "run.csv"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    ref = generate(read_blob(tmp_path / "model" / "model.flmb"), prompt, 6, flags=FLAG_ALL_LOGITS, kv="k12")
    rows = list(csv.DictReader(open("run.csv")))
    assert [(int(r["out_id"]) if r["out_id"] else NO_TOKEN, int(r["logits_crc"])) for r in rows] == \
        [(r["out_id"], zlib.crc32(r["logits"].tobytes())) for r in ref]
    assert all(r["clock"] == "emulated instructions" and int(r["total_instructions"]) > 0 for r in rows)
    assert "bit-exact with the reference: yes" in out.out and "instructions a token" in out.out
    report = [ln for ln in out.out.splitlines() if not ln.startswith("note:")]   # the note says what it is not
    assert not any("µs" in ln or "tok/s" in ln for ln in report)


def first_differing_step(link, qm, prompt, kv="f32") -> int | None:
    """The golden prompt with every step's whole head: the first step whose CRC or token is not the
    reference's (None: none)."""
    n = golden.STEPS - len(prompt) + 1
    toks, _, _ = run(link, prompt, n, logits=False, all_logits=True, batch=1)
    for t, r in zip(toks, generate(qm, prompt, n, flags=FLAG_ALL_LOGITS, kv=kv)):
        if t.logits_crc != r["logits_crc"] or (NO_TOKEN if t.out_id is None else t.out_id) != r["out_id"]:
            return t.step
    return None


def selftest(link) -> Hello:
    link.send(SelfTest())
    seen: list = []
    return recv_until(link, lambda m: (seen.append(m) or True) and isinstance(m, Hello)
                      and any(isinstance(x, Log) and "golden" in x.text for x in seen), timeout=120)[-1]


def test_rv32_with_a_flush_to_zero_soft_float_is_not_bit_exact(tmp_path):
    """As on the RP2040: subnormal embedding rows make the residual stream subnormal at once, and a
    soft-float that flushes them (as a ROM's may) differs from the first step."""
    need("esp32c3-isa-qemu")
    _, ir = random_model(seed=7)
    ir.tensors["tok_embeddings"] = (ir.tensors["tok_embeddings"] * np.float32(2.0 ** -140)).astype(np.float32)
    qm = quantize(ir, "q8", 32)
    with rebuilt_board(qm, tmp_path, "esp32c3-isa-qemu", define="FLM_FAULT_FTZ 1") as (link, h0, blob):
        first = first_differing_step(link, qm, list(read_golden(blob).prompt))
    assert first is not None and h0.golden == "differs" and h0.golden_first_diff == first
    assert h0.bit_exact.startswith("no")


def test_xtensa_with_fused_multiply_adds_is_not_bit_exact(tmp_path):
    """Every multiply-add the C allows fused into MADD.S (the build ESP-IDF's GCC makes for the S3
    without -ffp-contract=off), with f32 group scales (every row's fold of group terms is a fusion site;
    a row-scaled product has none) and float attention (the f32 KV cache) where the fused roundings
    survive: SELFTEST says "no" at the golden prompt's first differing step (the boot check, 2 steps,
    may not reach it)."""
    need("esp32s3-isa-qemu")
    qm = quantize(random_model(seed=3)[1], "q8", 32, scales="f32")
    with rebuilt_board(qm, tmp_path, "esp32s3-isa-qemu", make_args=["FUSED=1"]) as (link, h0, blob):
        h = selftest(link)
        first = first_differing_step(link, qm, list(read_golden(blob).prompt))
    assert first is not None and h.golden == "differs" and h.golden_first_diff == first
    assert h0.golden == ("differs" if first < golden.BOOT_STEPS else "exact")


def test_rv32_with_f_and_fused_multiply_adds_is_not_bit_exact(tmp_path):
    """The ESP32-P4's rv32imafc with GCC's default contraction (-ffp-contract=fast: FMADD.S, one
    rounding) on f32 group scales' folds and float attention: the reason the P4's build, like the S3's,
    keeps -ffp-contract=off."""
    need("esp32p4-isa-qemu")
    qm = quantize(random_model(seed=3)[1], "q8", 32, scales="f32")
    fused = "CFLAGS=-std=gnu17 -O2 -Wall -Wextra -Werror -ffp-contract=fast -ffunction-sections -fdata-sections"
    with rebuilt_board(qm, tmp_path, "esp32p4-isa-qemu", make_args=[fused]) as (link, h0, blob):
        h = selftest(link)
        first = first_differing_step(link, qm, list(read_golden(blob).prompt))
    assert first is not None and h.golden == "differs" and h.golden_first_diff == first


@pytest.mark.parametrize("board", BOARDS)
def test_clock_is_an_exact_instruction_count_and_helpers_are_exact(board, tmp_path):
    need(board)
    from bench import esp_qemu
    elf = esp_qemu.build_probe(board, tmp_path)
    with esp_qemu.Probe(board, elf, tmp_path) as p:
        base = p.loop(0)
        assert [p.loop(n) - base for n in (1, 2, 3, 10, 1000, 65537)] == [2, 4, 6, 20, 2000, 131074]
        assert p.self_check() == 0
        assert esp_qemu.check_helpers(p, n=100) == []
        n, same = p.floor(16, 32)
        assert same and n > 0
