"""The planner's two-core overlap (converter/overlap.py): hand-checked figures, and the prediction of a
board whose HAL splits the products' rows against the same board on one core."""
import pytest

from converter import costmodel as C
from converter import overlap, timing
from converter.boards import load_board
from converter.ir import ModelConfig


def two(w: float) -> dict:
    return {"compute": {"split_cores": 2, "bus_wait": w}}


def test_saving_hand_checked():
    assert overlap.saving({}, 100.0, 40.0, 0.0) == 0.0                      # one core: nothing saved
    # compute-bound: 100 + 40 alone; shared (100 + 40 x 1.5) / 2 = 80
    assert overlap.saving(two(0.5), 100.0, 40.0, 0.0) == pytest.approx(60.0)
    # flash-bound: the bus carries every line once: 100, not (10 + 150) / 2 = 80
    assert overlap.saving(two(0.5), 10.0, 100.0, 0.0) == pytest.approx(10.0)
    # reads from SRAM are the cores' own: (20 + 20 + 0) / 2 = 20
    assert overlap.saving(two(0.0), 20.0, 0.0, 20.0) == pytest.approx(20.0)
    assert overlap.split_cores(two(0.0)) == 2 and overlap.split_cores({"compute": {}}) == 1
    # element-wise work (hal_parallel) halves only where the HAL splits it: parallel_cores
    par = {"compute": {"split_cores": 2, "bus_wait": 0.0, "parallel_cores": 2}}
    assert overlap.saving(par, 20.0, 0.0, 20.0, parallel_us=30.0) == pytest.approx(35.0)
    assert overlap.saving(two(0.0), 20.0, 0.0, 20.0, parallel_us=30.0) == pytest.approx(20.0)


def test_products_are_the_matrices_hal_matmul_runs():
    spec = C.ModelSpec.from_config(ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, vocab_size=64,
                                               hidden_dim=48, max_seq_len=8))
    names = overlap.product_tensors(spec)
    for li in range(2):
        assert names[f"layers.{li}.attn.wq"] == names[f"layers.{li}.attn.wo"] == "attention"
        assert names[f"layers.{li}.ffn.w1"] == names[f"layers.{li}.ffn.w2"] == "ffn"
        assert f"layers.{li}.attn_norm" not in names
    # the tied head's table: a product in the output phase, its embedding row is not one
    assert names[C.head_rows(spec).name] == "output" and C.head_rows(spec).name == "tok_embeddings"


def test_rp2040_prediction_takes_the_cores_saving_off_each_phase():
    spec = C.ModelSpec.from_config(ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=128,
                                               hidden_dim=160, max_seq_len=16))
    prof = load_board("rp2040-emu")
    one = {**prof, "compute": {k: v for k, v in prof["compute"].items() if k != "split_cores"}}
    tiers, regions = {t.name: "flash" for t in spec.tensors}, dict.fromkeys(C.REGIONS, "sram")
    p2 = timing.predict(spec, prof, tiers, regions, 3, "int8", head="full")
    p1 = timing.predict(spec, one, tiers, regions, 3, "int8", head="full")
    assert p1.phase_us == pytest.approx({ph: p1.memory_us[ph] + p1.compute_us[ph] for ph in C.PHASES})
    assert p2.memory_us == p1.memory_us and p2.compute_us == p1.compute_us
    for ph in C.PHASES:
        assert p2.phase_us[ph] == pytest.approx(p1.phase_us[ph] - p2.overlap_us[ph])
    assert p2.overlap_us["embed"] == 0 and all(p2.overlap_us[ph] > 0 for ph in ("attention", "ffn", "output"))
    assert p2.total_us < p1.total_us
