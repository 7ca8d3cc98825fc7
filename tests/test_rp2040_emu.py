"""The engine built for the Cortex-M0+ and run in rp2040js reproduces the NumPy reference bit for
bit over the same pty path the host uses for real boards, and the emulator harness's count of the
bytes the core reads per region equals the engine's own per-tier counters on every step."""
import csv
import json
import subprocess
import zlib

import pytest

from converter.blob import build_blob, parse_header
from converter.boards import load_board, stream_stride
from converter.formats import padding_per_step as blob_padding
from converter.quantize import quantize
from converter.reference import FLAG_ALL_LOGITS, FLAG_LOGITS, NO_TOKEN, generate
from emuboard import BOARD, emu_link, image_for, require_emulator
from firmware.build import build_firmware
from firmware.build_meta import BuildError
from host.link.messages import PHASES, Error, Hello, Log
from modelzoo import random_ple_model, random_model, spread_head, with_head_index
from nativeboard import assert_matches_reference, assert_steps_match, drain, run, token_bytes_read

STREAM = stream_stride(load_board(BOARD))

CASES = {
    # name: (model config, default format, group size, overrides) — no code padding: the core
    # reads the bytes the engine counts but the zeros that pad a row's multipliers to 4
    "q8-tied-gqa": (dict(), "q8", 32, []),
    "q4-untied-mha": (dict(dim=64, n_heads=4, n_kv_heads=4, hidden_dim=96, tied=False, vocab_size=120),
                      "q4", 16, ["tok_embeddings=q4:16", "output=q4:32"]),
}


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    require_emulator()
    return tmp_path_factory.mktemp("emu-builds")


def padding_per_step(qm) -> int:
    """The padding inside the rows one step reads with every logit computed (formats.padding_per_step),
    all in flash here, the products' rows streamed whole where the board does."""
    return blob_padding(parse_header(build_blob(qm)), qm.config.tied, qm.config.n_out,
                        stream_stride=STREAM).get("flash", 0)


def check_run(link, board, qm, prompt, n, temperature, top_p, seed, padding=0):
    board.read_counts()
    ref = generate(qm, prompt, n, temperature, top_p, seed, flags=FLAG_LOGITS)
    toks, logits, done = run(link, prompt, n, temperature, top_p, seed)
    assert done.reason == "max_tokens" and len(toks) == len(ref) == len(prompt) - 1 + n
    assert_matches_reference(toks, logits, ref)
    counts = {c["step"]: c for c in board.read_counts()}
    assert sorted(counts) == [t.step for t in toks]
    for t in toks:
        c = counts[t.step]
        flash, psram, sram = t.bytes_read
        assert c["bytes"] == [flash - padding, psram, sram], f"step {t.step}"
        assert c["cycles"] > 0 and c["us"] > 0
    return toks


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_emulated_rp2040_matches_reference_bit_for_bit(case, tmp_path, build_root):
    cfg, fmt, g, ov = CASES[case]
    _, ir = random_model(seed=len(case), **cfg)
    qm = quantize(ir, fmt, g, ov)
    pad = padding_per_step(qm)
    with emu_link(qm, tmp_path, build_root) as (link, boot, board):
        hello = boot[-1]
        assert hello.board == BOARD and hello.clock == 2 and hello.image_ok
        check_run(link, board, qm, [1, 7, 3], 10, 0.0, 0.0, 0, padding=pad)
        check_run(link, board, qm, [5], 10, 0.8, 0.9, 12345, padding=pad)


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("case", ["q4-f16-untied", "q8-tied"])
def test_ple_model_bit_exact_on_the_emulated_rp2040(case, tmp_path, build_root):
    """Per-Layer Embeddings on the Cortex-M0+: out_vocab < vocab, ragged groups, fp16 scales; every
    step's logits and tokens equal the reference's, and the harness's byte counts the engine's."""
    if case == "q4-f16-untied":
        ir = random_ple_model(seed=21, dim=32, n_heads=2, n_kv_heads=1, hidden_dim=40, vocab_size=40, ple_dim=12,
                              tied=False, out_vocab=29, max_seq_len=40)
        qm = quantize(ir, "q4", 16, ["ple.proj=q8:12"], scales="f16")
    else:
        ir = random_ple_model(seed=22, dim=32, n_heads=2, n_kv_heads=2, hidden_dim=40, vocab_size=40, ple_dim=8,
                              out_vocab=33, max_seq_len=40)
        qm = quantize(ir, "q8", 16)
    with emu_link(qm, tmp_path, build_root) as (link, boot, board):
        assert boot[-1].out_vocab == qm.config.n_out
        toks = check_run(link, board, qm, [1, 39, 3], 32, 0.0, 0.0, 0, padding=padding_per_step(qm))
        check_run(link, board, qm, [5], 8, 0.8, 0.9, 7, padding=padding_per_step(qm))
    assert all(t.head_rows == qm.config.n_out and t.us[3] > 0 for t in toks)


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("case", ["q4-untied", "ple-q8-tied-out-lt-vocab"])
def test_head_index_tile_scan_bit_exact_on_the_emulated_rp2040(case, tmp_path, build_root):
    """A head index on the Cortex-M0+: greedy steps scan tiles (the same tokens and rows visited as
    the reference), whole-head steps go through the row map into token order (the same logits),
    and the harness counts exactly the centre rows, records, rows and map entries the engine does."""
    if case == "q4-untied":
        _, ir = random_model(seed=23, dim=128, n_heads=4, n_kv_heads=4, hidden_dim=128, tied=False, vocab_size=120)
        qm = quantize(spread_head(ir, span=6.0), "q4", 32, ["output=q4:32"])
    else:
        ir = random_ple_model(seed=24, dim=32, n_heads=2, n_kv_heads=2, hidden_dim=64, vocab_size=40, ple_dim=32,
                              out_vocab=33, max_seq_len=40)
        qm = quantize(spread_head(ir, span=6.0), "q8", 8)
    with_head_index(qm, 4)    # (shapes of 4k groups: row-scaled rows without padding after the multipliers)
    assert padding_per_step(qm) == 0
    prompt = [1, 39, 3]
    with emu_link(qm, tmp_path, build_root) as (link, boot, board):
        for flags in (0, FLAG_ALL_LOGITS):
            board.read_counts()
            toks, _, done = run(link, prompt, 12, logits=False, all_logits=bool(flags))
            assert_steps_match(toks, generate(qm, prompt, 12, flags=flags))
            counts = {c["step"]: c for c in board.read_counts()}
            assert [list(t.bytes_read) for t in toks] == [counts[t.step]["bytes"] for t in toks]
            assert all(t.bytes_read == token_bytes_read(qm, t) for t in toks)
            if not flags:
                assert any(0 < t.head_rows < qm.config.n_out for t in toks), "no tile skipped: proves nothing"
        check_run(link, board, qm, [5], 6, 0.8, 0.9, 7)


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_ragged_groups_bit_exact_and_padding_is_the_only_difference(tmp_path, build_root):
    _, ir = random_model(seed=7, dim=48, n_heads=4, n_kv_heads=1, hidden_dim=70, n_layers=3, vocab_size=61)
    qm = quantize(ir, "q8", 20, ["layers.*.ffn=q4:7", "layers.1.attn.wq=q4:48"])
    pad = padding_per_step(qm)
    assert pad > 0
    with emu_link(qm, tmp_path, build_root) as (link, _, board):
        check_run(link, board, qm, [2, 4], 8, 0.9, 0.0, 11, padding=pad)


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_tensors_staged_in_sram_are_counted_there_by_both(tmp_path):
    """A layout that stages tensors into SRAM: the firmware copies them at boot, the engine counts
    them as sram, and the harness sees the core read them there (the region marks name them)."""
    import serial

    from converter.blob import retier_blob
    from host.link.messages import Ping
    from host.link.port import Link
    from host.boards.emulated import start_emulated_board
    from nativeboard import recv_until
    require_emulator()
    _, ir = random_model(seed=2, dim=64, n_heads=4, hidden_dim=128)
    qm = quantize(ir, "q8", 16)                 # 4 and 8 groups a row: no bytes pad the multipliers
    assert padding_per_step(qm) == 0
    blob = tmp_path / "m.flmb"
    blob.write_bytes(retier_blob(build_blob(qm), tiers={"tok_embeddings": "sram", "layers.0.ffn.w1": "sram",
                                                        "norm": "sram", "rope.cos": "sram"}))
    fw = build_firmware(BOARD, tmp_path / "fw", blob)
    with start_emulated_board(fw.binary, blob) as board:
        port = serial.Serial(board.port, 115200, timeout=0.05)
        try:
            link = Link(port)
            link.send(Ping())
            boot = recv_until(link, lambda m: isinstance(m, Hello))
            assert any(isinstance(m, Log) and "in SRAM" in m.text and "staged 0 bytes in PSRAM, 0 " not in m.text
                       for m in boot)
            board.read_counts()
            toks, _, done = run(link, [1, 2], 3, logits=False)
            counts = {c["step"]: c for c in board.read_counts()}
        finally:
            port.close()
    assert done.reason == "max_tokens" and len(toks) == 4
    for t in toks:
        assert counts[t.step]["bytes"] == list(t.bytes_read)
        assert t.bytes_read[2] > qm.config.vocab_size * qm.config.dim   # the tied embedding, read from SRAM


@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_call_profile_times_the_engines_parts_and_changes_no_cycle(tmp_path, build_root):
    """The harness's call profile (make bench's attention itself) on a 2-layer q8 model with the
    int8 KV cache: every step costs the same cycles with the profile as without; per one-token step
    each part of a layer is called as often as engine.c calls it, the parts never overlap, so their
    cycles add up to no more than the step's, and the attention's fit inside the firmware's own
    attention phase (its TIMER: emulated cycles at 125 MHz, a µs per timed interval)."""
    from bench.emulated import PROFILE
    _, ir = random_model(seed=9)
    qm = quantize(ir, "q8", 32)
    L = qm.config.n_layers
    got = {}
    for profile in ((), PROFILE):
        with emu_link(qm, tmp_path, build_root, kv="int8", xip_model=False, profile=profile) as (link, _, board):
            board.read_counts()
            toks, _, _ = run(link, [1, 7, 3], 5, logits=False)
            got[profile] = toks, {c["step"]: c for c in board.read_counts()}
    (toks, plain), (_, prof) = got[()], got[PROFILE]
    for t in toks:   # (the prompt's steps but its last skip the head and its norm)
        calls_per_step = dict(attention=L, rope=L, kv_put=2 * L, rmsnorm=2 * L + (t.head_rows > 0))
        c = prof[t.step]
        assert "calls" not in plain[t.step] and c["cycles"] == plain[t.step]["cycles"]
        assert set(c["calls"]) == set(PROFILE) and all(cyc > 0 for cyc, _ in c["calls"].values())
        assert {n: c["calls"][n][1] for n in calls_per_step} == calls_per_step
        assert c["calls"]["product"][1] == 7 * L + (t.head_rows > 0)
        assert sum(cyc for cyc, _ in c["calls"].values()) <= c["cycles"]
        attn_us = t.us[PHASES.index("attention")]
        assert c["calls"]["attention"][0] + c["calls"]["rope"][0] + c["calls"]["kv_put"][0] <= (attn_us + 1) * 125


@pytest.mark.emulated
@pytest.mark.slow
def test_bad_image_refused_over_the_emulated_uart(tmp_path, build_root):
    _, ir = random_model(seed=3)
    qm = quantize(ir, "q8", 32)
    bad = bytearray(build_blob(qm))
    bad[-1] ^= 0x55
    with emu_link(qm, tmp_path, build_root, blob_bytes=bytes(bad)) as (link, boot, _):
        msgs = boot + drain(link)
        hello = next(m for m in msgs if isinstance(m, Hello))
        assert not hello.image_ok
        errs = [m for m in msgs if isinstance(m, Error)]
        assert errs and errs[0].name == "bad_image" and "CRC" in errs[0].text
        assert any(isinstance(m, Log) and "refused" in m.text for m in msgs)


@pytest.mark.cross
def test_engine_and_hal_compile_warning_free_for_cortex_m0plus(tmp_path, build_root):
    _, ir = random_model(seed=4)
    qm = quantize(ir, "q4", 32)
    blob = tmp_path / "m.flmb"
    blob.write_bytes(build_blob(qm))
    proj = image_for(blob, build_root).parent
    srcs = sorted((proj / "src").rglob("*.c"))
    assert any(p.parent.name == "hal" for p in srcs) and any(p.parent.name == "engine" for p in srcs)
    for src in srcs:
        r = subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m0plus", "-mthumb", "-std=gnu17", "-O2",
                            "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-include", "flm_config.h",
                            "-include", "src/hal/hal_rp2040.h", "-Isrc/engine", "-Isrc/app", "-Isrc/hal", "-c", str(src),
                            "-o", str(tmp_path / (src.stem + ".o"))], cwd=proj, capture_output=True, text=True)
        assert r.returncode == 0 and not r.stderr, f"{src.name}: {r.stderr}"
    # the linked image: the vector table at 0x10000100 and RAM within the chip's 264 KB
    nm = subprocess.run(["arm-none-eabi-nm", str(proj / "firmware.elf")], capture_output=True, text=True).stdout
    syms = {p[2]: int(p[0], 16) for p in (ln.split() for ln in nm.splitlines()) if len(p) == 3}
    assert syms["__vectors_start"] == 0x10000100 and syms["__flm_blob_start"] == 0x10020000
    assert syms["__bss_end"] <= 0x20042000 - 8192


def test_model_too_big_for_sram_is_a_one_line_build_error(tmp_path):
    require_emulator()
    _, ir = random_model(seed=1, max_seq_len=1024)     # KV cache alone: 2 x 2 x 1024 x 24 x 4 = 384 KB
    blob = tmp_path / "m.flmb"
    blob.write_bytes(build_blob(quantize(ir, "q8", 32)))
    with pytest.raises(BuildError) as e:
        build_firmware(BOARD, tmp_path / "fw", blob)
    msg = str(e.value)     # refused before the link, with the planner's shortfall and what would fit
    assert "does not fit on rp2040-emu: sram short by" in msg and "a context of" in msg and "\n" not in msg


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_cli_run_board_rp2040_emu(tmp_path, build_root, capsys):
    """`flashlm run --board rp2040-emu` builds, starts the harness and reports its counts."""
    from converter.blob import read_blob
    from converter.boards import load_board
    from converter.llama2c import write_llama2c
    from host.cli.main import main
    require_emulator()
    _, ir = random_model(seed=9, vocab_size=64, tied=False, dim=64, n_heads=4, n_kv_heads=2,
                         hidden_dim=128)         # no padding (4 or 8 groups of 16 a row)
    write_llama2c(ir, tmp_path / "model.bin", version=1)
    out = tmp_path / "model"
    assert main(["convert", str(tmp_path / "model.bin"), "-o", str(out), "--format", "q4",
                 "--group-size", "16", "--calibrate", "none", "--no-report"]) == 0
    prompt = [1, 10, 20]
    rc = main(["run", "--board", BOARD, "--model", str(out), "--prompt-ids", ",".join(map(str, prompt)),
               "--max-tokens", "8", "--csv", str(tmp_path / "run.csv"), "--json", str(tmp_path / "run.json"),
               "--all-logits"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    ref = generate(read_blob(out / "model.flmb"), prompt, 8, flags=FLAG_ALL_LOGITS, kv="k12")   # convert's default KV
    rows = list(csv.DictReader((tmp_path / "run.csv").open()))
    assert len(rows) == len(ref)
    for row, r in zip(rows, ref):
        assert (int(row["out_id"]) if row["out_id"] else NO_TOKEN) == r["out_id"]
        assert int(row["logits_crc"]) == zlib.crc32(r["logits"].tobytes())
        assert row["board"] == BOARD and row["clock"] == "emulated timer"
    d = json.loads((tmp_path / "run.json").read_text())
    h = d["summary"]["harness"]
    passes = len({row["pass_first"] for row in rows})     # the prompt runs in one pass (convert's batch 4)
    assert passes == len(ref) - 2 and h["steps"] == h["agree_steps"] == passes and not h["mismatch_steps"]
    assert all(s["agree"] for s in d["harness_steps"])
    # the XIP model (on by default): per step its misses, each the line transfer the profile states
    assert "XIP model" in d["summary"]["timing_note"]
    x = d["summary"]["harness"]["xip_per_token"]
    assert x["misses"]["p50"] > 0 and x["miss_cycles"] == load_board(BOARD)["tiers"]["flash"]["line_cycles"]
    assert all(s["xip"]["stall_cycles"] == s["xip"]["misses"] * x["miss_cycles"] for s in d["harness_steps"])
    assert "agree on" in captured.out and "XIP cache per decode token" in captured.out
    # the weights the firmware streamed: the SSI's direct reads, part of the harness's flash bytes
    d_ssi = d["summary"]["harness"]["ssi_per_token"]
    assert d_ssi["words"]["p50"] > 0 and 0 < d_ssi["flash_share"] <= 1 and 0 < d_ssi["bus_share"] < 1
    assert "SSI direct reads per decode token" in captured.out
