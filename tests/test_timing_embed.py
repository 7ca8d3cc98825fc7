"""The planner's embed phase (converter/costmodel.py dequant_row, converter/timing.py embed_code_us): an
element of the dequantized embedding row at [compute] dequant_flops float operations, and on the RP2040's XIP
flash the embed step's code fetched once a step ([tiers.flash] embed_code_lines)."""
import pytest

from converter import computecost as K
from converter import costmodel as C
from converter import passcost, timing
from converter.boards import load_board
from converter.ir import ModelConfig

SPEC = C.ModelSpec.from_config(ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=128,
                                           hidden_dim=160, max_seq_len=16))
TIERS, REGIONS = {t.name: "flash" for t in SPEC.tensors}, dict.fromkeys(C.REGIONS, "sram")


def without(prof: dict) -> dict:
    """``prof`` without the two embed terms: two float operations an element, no code lines."""
    tiers = {**prof["tiers"], "flash": {k: v for k, v in prof["tiers"]["flash"].items() if k != "embed_code_lines"}}
    return {**prof, "tiers": tiers, "compute": {k: v for k, v in prof["compute"].items() if k != "dequant_flops"}}


def test_rp2040_embed_is_its_elements_row_and_code_lines():
    prof = load_board("rp2040-emu")
    clock = float(prof["clock_mhz"])
    cpf = float(prof["compute"].get("cycles_per_flop", K.CHIP_COMPUTE[prof["chip"]][1]))
    dq, lines = float(prof["compute"]["dequant_flops"]), int(prof["tiers"]["flash"]["embed_code_lines"])
    assert dq > 2 and lines > 0
    got = timing.predict(SPEC, prof, TIERS, REGIONS, 3, "int8", head="skip")
    base = timing.predict(SPEC, without(prof), TIERS, REGIONS, 3, "int8", head="skip")
    assert base.compute_us["embed"] == pytest.approx(2 * 64 * cpf / clock)      # an int-to-float and a product
    assert got.compute_us["embed"] == pytest.approx(dq * 64 * cpf / clock)
    line_us = float(prof["tiers"]["flash"]["line_cycles"]) / clock
    assert got.memory_us["embed"] - base.memory_us["embed"] == pytest.approx(lines * line_us)
    for ph in C.PHASES:      # the other phases as before
        if ph != "embed":
            assert got.phase_us[ph] == pytest.approx(base.phase_us[ph])


@pytest.mark.parametrize("board", ["pico", "esp32s3-n16r8"])
def test_other_boards_keep_two_float_operations_and_no_code_lines(board):
    prof = load_board(board)
    got = timing.predict(SPEC, prof, TIERS, REGIONS, 3, "int8", head="skip")
    base = timing.predict(SPEC, without(prof), TIERS, REGIONS, 3, "int8", head="skip")
    assert got.phase_us == base.phase_us


def test_a_pass_pays_the_code_lines_once_whichever_tier_holds_the_embedding():
    prof = load_board("rp2040-emu")
    for emb in ("flash", "sram"):
        pl = passcost.Placement(SPEC, prof, {**TIERS, "tok_embeddings": emb}, REGIONS, "int8")
        want = timing.predict(SPEC, prof, pl.tiers, REGIONS, 3, "int8", head="skip")
        got = passcost.predict_pass(pl, 3, 1, "skip")
        assert got.phase_us["embed"] == pytest.approx(want.phase_us["embed"], rel=1e-12)
