"""The golden check (docs/formats.md section 1.3): the converter writes the reference's per-step
logits CRCs into the blob, the firmware repeats the steps at boot, after a LAYOUT and on SELFTEST
and says in HELLO whether it is bit-exact with the reference. Broken on purpose: a blob whose golden
CRC is wrong at a chosen step, a native build with fused multiply-adds, an emulated RP2040 whose
soft-float flushes subnormals to zero (as the boot ROM's may) — each board says "no" with the step
where its own logits first leave the reference's."""
import struct
import subprocess
import zlib
from dataclasses import replace

import numpy as np
import pytest
import serial

from converter import golden
from converter.blob import build_blob, parse_header, read_golden, retier_blob
from converter.formats import GOLDEN, KV_FORMATS, BlobError, StateTiers
from converter.quantize import quantize
from converter.reference import FLAG_ALL_LOGITS, NO_TOKEN, generate
from host.link.messages import Hello, Layout, Log, SelfTest
from modelzoo import random_model, random_ple_model
from nativeboard import assert_steps_match, native_link, rebuilt_board, recv_until, run

MODELS = {
    "q8-tied": lambda: quantize(random_model(seed=3)[1], "q8", 32),
    "q4-untied-ple": lambda: quantize(random_ple_model(seed=5, tied=False, out_vocab=50), "q4", 16),
}


def hello_after(link, send) -> tuple[Hello, list]:
    """Send a message, collect until the HELLO that follows the golden check's LOG."""
    link.send(send)
    seen = []
    msgs = recv_until(link, lambda m: (seen.append(m) or True) and isinstance(m, Hello)
                      and any(isinstance(x, Log) and "golden" in x.text for x in seen), timeout=120)
    return msgs[-1], [m.text for m in msgs if isinstance(m, Log)]


def patch_section(blob: bytes, name: str, data: bytes) -> bytes:
    """The blob with section ``name``'s bytes replaced (same length) and its CRC redone."""
    e = next(e for e in parse_header(blob).entries if e.name == name)
    assert len(data) == e.length
    out = bytearray(blob)
    out[e.offset:e.offset + e.length] = data
    struct.pack_into("<I", out, 12, zlib.crc32(memoryview(out)[16:]))
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# the section

@pytest.mark.parametrize("name", MODELS)
def test_golden_section_holds_the_references_steps(name):
    qm = MODELS[name]()
    g = read_golden(build_blob(qm))
    c = qm.config
    assert g.prompt == tuple(golden.prompt_ids(c.vocab_size, c.max_seq_len)) and len(g.prompt) == golden.PROMPT_LEN
    assert all(0 <= i < c.vocab_size for i in g.prompt) and len(set(g.prompt)) == len(g.prompt)
    assert g.boot_steps == golden.BOOT_STEPS and set(g.blocks) == set(KV_FORMATS)
    for kv in KV_FORMATS:
        ref = generate(qm, list(g.prompt), golden.STEPS - 1, flags=FLAG_ALL_LOGITS, kv=kv)
        assert g.blocks[kv] == [(r["in_id"], r["out_id"], r["logits_crc"]) for r in ref]
        assert len(ref) == golden.STEPS and ref[0]["out_id"] == NO_TOKEN and ref[-1]["out_id"] != NO_TOKEN
    # the KV format changes the numerics: each format has its own CRCs (from step 1: step 0 attends
    # over its own row only, where int8 rounding of V still differs, so compare from there)
    assert [r[2] for r in g.blocks["f32"][1:]] != [r[2] for r in g.blocks["int8"][1:]]


def test_golden_fault_alters_one_step_and_placement_keeps_the_section():
    qm = MODELS["q8-tied"]()
    g, bad = read_golden(build_blob(qm)), read_golden(build_blob(qm, golden_fault=2))
    for kv in KV_FORMATS:
        diff = [s for s, (a, b) in enumerate(zip(g.blocks[kv], bad.blocks[kv])) if a != b]
        assert diff == [2] and g.blocks[kv][2][2] ^ bad.blocks[kv][2][2] == 1
    moved = retier_blob(build_blob(qm), {"tok_embeddings": "sram"}, StateTiers(kv="int8"))
    assert read_golden(moved) == g          # valid for every placement: both KV formats are there


def test_golden_prompt_fits_any_vocabulary_and_context():
    assert golden.prompt_ids(1024, 128) == [341, 682]
    assert golden.prompt_ids(3, 128) == [1, 2] and golden.prompt_ids(2, 1) == [1]
    tiny = quantize(random_model(seed=1, max_seq_len=2, vocab_size=20)[1], "q8", 8)
    g = read_golden(build_blob(tiny))
    assert all(len(recs) == 2 for recs in g.blocks.values())       # the context ends it


@pytest.mark.parametrize("mutate, message", [
    (lambda b: struct.pack("<I", 2) + b[4:], "version 2"),
    (lambda b: b[:28] + struct.pack("<I", 0) + b[32:], "prompt step with an output"),
    (lambda b: b[:16 + 8] + struct.pack("<I", 10**6) + b[16 + 12:], "outside the vocabulary"),
])
@pytest.mark.native
def test_malformed_golden_sections_are_refused_in_python_and_ignored_by_the_firmware(mutate, message, tmp_path):
    qm = MODELS["q8-tied"]()
    blob = build_blob(qm)
    e = next(e for e in parse_header(blob).entries if e.name == GOLDEN)
    bad = patch_section(blob, GOLDEN, mutate(blob[e.offset:e.offset + e.length]))
    with pytest.raises(BlobError, match=message):
        read_golden(bad)
    with native_link(qm, tmp_path, tmp_path, blob_bytes=bad) as (link, boot):
        h, logs = hello_after(link, SelfTest())
    assert h.image_ok and h.golden == "none" and "no golden check" in h.bit_exact
    assert any("golden section is malformed" in t for t in logs)


# ---------------------------------------------------------------------------------------------
# native board

@pytest.mark.native
@pytest.mark.parametrize("name", MODELS)
def test_native_board_is_bit_exact_at_boot_on_selftest_and_after_a_layout(name, tmp_path):
    qm = MODELS[name]()
    blob = build_blob(qm)
    with native_link(qm, tmp_path, tmp_path) as (link, boot):
        h = boot[-1]
        assert (h.golden, h.golden_checked, h.golden_total, h.golden_first_diff) == ("exact", 2, 4, None)
        assert h.bit_exact.startswith("yes")
        h, logs = hello_after(link, SelfTest())
        assert (h.golden, h.golden_checked) == ("exact", 4) and any("steps 0-3 of 4 bit-exact" in t for t in logs)
        # the check leaves nothing behind: a generation right after it is the reference's
        toks, _, _ = run(link, [5, 9, 2], 6, logits=False)
        assert_steps_match(toks, generate(qm, [5, 9, 2], 6))
        # a LAYOUT to the int8 KV cache: the check runs again, against the int8 block
        h0 = parse_header(blob)
        st = replace(h0.state_tiers, kv="int8").to_u32()
        moved = parse_header(retier_blob(blob, state=StateTiers(kv="int8")))
        h, logs = hello_after(link, Layout(moved.layout_id, st, bytes(len(h0.entries))))
        assert h.layout_id == moved.layout_id and h.golden == "exact" and any("KV cache int8" in t for t in logs)
        toks, _, _ = run(link, [5, 9, 2], 6, logits=False)
        assert_steps_match(toks, generate(qm, [5, 9, 2], 6, kv="int8"))


@pytest.mark.native
@pytest.mark.parametrize("fault", [1, 3])
def test_native_board_reports_the_first_step_of_a_wrong_golden(fault, tmp_path):
    qm = MODELS["q8-tied"]()
    with native_link(qm, tmp_path, tmp_path, blob_bytes=build_blob(qm, golden_fault=fault)) as (link, boot):
        h = boot[-1]
        if fault < golden.BOOT_STEPS:     # the boot check reaches it
            assert (h.golden, h.golden_first_diff, h.golden_checked) == ("differs", fault, fault + 1)
        else:                             # only SELFTEST does
            assert (h.golden, h.golden_checked) == ("exact", golden.BOOT_STEPS)
        h, logs = hello_after(link, SelfTest())
        assert h.golden == "differs" and h.golden_first_diff == fault
        assert h.bit_exact == f"no (first step that differs: {fault})"
        assert any(f"step {fault} differs from the reference: logits CRC" in t for t in logs)
        assert h.image_ok          # the board still generates: the host is told, loudly
        toks, _, done = run(link, [5, 9], 2, logits=False)
        assert done.reason == "max_tokens"


@pytest.mark.native
@pytest.mark.slow
def test_a_build_without_the_boot_check_says_not_run_until_selftest(tmp_path):
    with rebuilt_board(MODELS["q8-tied"](), tmp_path, define="FLM_GOLDEN_AT_BOOT 0") as (link, h0, _):
        h, _ = hello_after(link, SelfTest())
    assert (h0.golden, h0.golden_checked, h0.golden_total) == ("not_run", 0, golden.STEPS)
    assert h0.bit_exact.startswith("not checked yet") and "--selftest" in h0.bit_exact
    assert (h.golden, h.golden_checked) == ("exact", golden.STEPS)


def first_differing_step(link, qm, prompt, kv="f32") -> int | None:
    """Run the golden prompt with ALL_LOGITS on a board: the first step whose logits CRC or token
    differs from the reference's (None: all equal)."""
    n = golden.STEPS - len(prompt) + 1
    toks, _, _ = run(link, prompt, n, logits=False, all_logits=True)
    ref = generate(qm, prompt, n, flags=FLAG_ALL_LOGITS, kv=kv)
    for t, r in zip(toks, ref):
        if t.logits_crc != r["logits_crc"] or (NO_TOKEN if t.out_id is None else t.out_id) != r["out_id"]:
            return t.step
    return None


def fma_supported() -> bool:
    try:
        return " fma " in open("/proc/cpuinfo").read().replace("\n", " ")
    except OSError:
        return False


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.skipif(not fma_supported(), reason="this CPU has no fused multiply-add (FMA3)")
def test_native_build_with_fused_multiply_add_is_not_bit_exact(tmp_path):
    """What a board compiler that contracts a*b+c does (the reason for -ffp-contract=off). f32 scales:
    every row's fold of group terms acc + float(isum) * (scale * xscale) is a contraction site (a
    row-scaled model's products have none; its float steps before a quantizer rarely move a code)."""
    qm = quantize(random_model(seed=3)[1], "q8", 32, scales="f32")
    fma = "CFLAGS=-std=c99 -O2 -Wall -Wextra -Werror -ffp-contract=fast -mfma"
    with rebuilt_board(qm, tmp_path, make_args=[fma]) as (link, h0, blob):
        h, _ = hello_after(link, SelfTest())
        first = first_differing_step(link, qm, list(read_golden(blob).prompt))
    assert first is not None
    assert h.golden == "differs" and h.golden_first_diff == first
    assert h0.golden == ("differs" if first < golden.BOOT_STEPS else "exact")


# ---------------------------------------------------------------------------------------------
# emulated RP2040

@pytest.fixture(scope="module")
def emu_root(tmp_path_factory):
    from emuboard import require_emulator
    require_emulator()
    return tmp_path_factory.mktemp("emu-golden")


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_rp2040_is_bit_exact_and_reports_a_wrong_golden(tmp_path, emu_root):
    from emuboard import emu_link
    qm = MODELS["q8-tied"]()
    with emu_link(qm, tmp_path, emu_root) as (link, boot, board):
        assert (boot[-1].golden, boot[-1].golden_checked) == ("exact", golden.BOOT_STEPS)
        board.read_counts()
        h, _ = hello_after(link, SelfTest())
        assert (h.golden, h.golden_checked) == ("exact", golden.STEPS)
        assert board.read_counts() == []            # not a generation: no step marks for the harness
    with emu_link(qm, tmp_path, emu_root, blob_bytes=build_blob(qm, golden_fault=1)) as (link, boot, _):
        assert (boot[-1].golden, boot[-1].golden_first_diff) == ("differs", 1)


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_emulated_rp2040_with_a_flush_to_zero_soft_float_is_not_bit_exact(tmp_path):
    """The boot ROM's float routines may flush subnormals; a model whose embedding rows are subnormal
    (the residual stream starts below 2^-126) shows it at once."""
    from emuboard import require_emulator
    require_emulator()
    _, ir = random_model(seed=7)
    ir.tensors["tok_embeddings"] = (ir.tensors["tok_embeddings"] * np.float32(2.0 ** -140)).astype(np.float32)
    qm = quantize(ir, "q8", 32)
    with rebuilt_board(qm, tmp_path, "rp2040-emu", define="FLM_FAULT_FTZ 1") as (link, h0, blob):
        first = first_differing_step(link, qm, list(read_golden(blob).prompt))
    assert first is not None and h0.golden == "differs" and h0.golden_first_diff == first
