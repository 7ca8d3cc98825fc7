"""Per-Layer Embeddings in our PyTorch model: its fp32 logits against the NumPy Fp32Model (the
reference architecture in plain float math), parameter names one-to-one with the IR, the zero-gain
start, and checkpoints of PLE models through the importer."""
import dataclasses

import numpy as np
import pytest
import torch

from converter.ir import ModelError
from converter.quantize import rope_tables
from converter.fidelity import Fp32Model
from converter.torch_import import (ir_to_module, ir_to_state_dict, load_checkpoint, module_to_ir, save_checkpoint,
                                    state_dict_to_ir)
from converter.torch_model import Transformer
from modelzoo import random_ple_model


@pytest.mark.parametrize("cfg", [dict(tied=True, out_vocab=55), dict(tied=False, out_vocab=61),
                                 dict(tied=False), dict(dim=40, n_heads=4, n_kv_heads=1, hidden_dim=52,
                                                        ple_dim=20, n_layers=3, tied=True, out_vocab=33)])
def test_torch_logits_match_the_fp32_reference(cfg):
    """Every position of one torch forward against Fp32Model token by token: the same math, only the
    order of float sums differs. The PLE post-norm gains are ~1 here, so the PLE path counts."""
    ir = random_ple_model(seed=7, **cfg)
    c = ir.config
    toks = np.random.default_rng(1).integers(0, c.vocab_size, c.max_seq_len)
    toks[3] = c.vocab_size - 1                        # an input the head never predicts (out_vocab)
    with torch.no_grad():
        got = ir_to_module(ir)(torch.from_numpy(toks)[None])[0].numpy()
    fp = Fp32Model(ir, *rope_tables(c))
    want = np.stack([fp.forward(int(t), pos) for pos, t in enumerate(toks)])
    assert got.shape == want.shape == (c.max_seq_len, c.n_out)
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()
    # the same model without its table rows: a different answer, so the comparison saw the PLE path
    ir.tensors["ple.table"] = np.zeros_like(ir.tensors["ple.table"])
    with torch.no_grad():
        off = ir_to_module(ir)(torch.from_numpy(toks)[None])[0].numpy()
    assert np.abs(off - got).max() > 0.1 * np.abs(want).max()


def test_parameter_names_are_the_ir_names_and_the_ple_gains_start_at_zero():
    ir = random_ple_model(seed=2, tied=False, out_vocab=50)
    m = Transformer(ir.config)
    assert [n for n, _ in m.named_parameters()] == [f"{n}.weight" for n in ir.config.tensor_shapes()]
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == \
        {f"{n}.weight": s for n, s in ir.config.tensor_shapes().items()}
    gains = [m.layers[i].ple.norm.weight for i in range(ir.config.n_layers)]
    assert all(torch.count_nonzero(g) == 0 for g in gains)
    # with zero gains a fresh model ignores the table: the PLE path starts as a no-op
    toks = torch.tensor([[1, 5, 69, 3]])
    with torch.no_grad():
        a = m(toks)
        m.ple.table.weight.normal_()
        assert torch.equal(a, m(toks))


def test_fresh_model_trains_the_ple_path():
    """One backward step of a fresh model reaches every PLE parameter (the zero gains pass gradient to
    themselves first; gate, proj and table get theirs once the gains move)."""
    torch.manual_seed(0)
    ir = random_ple_model(seed=3)
    m = Transformer(ir.config)
    toks = torch.randint(0, ir.config.vocab_size, (2, 9))
    m(toks).logsumexp(-1).mean().backward()
    assert all(m.layers[i].ple.norm.weight.grad.abs().sum() > 0 for i in range(ir.config.n_layers))
    with torch.no_grad():
        for layer in m.layers:
            layer.ple.norm.weight.fill_(1.0)
    m.zero_grad()
    m(toks).logsumexp(-1).mean().backward()
    for name, p in m.named_parameters():
        if "ple" in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("tied", [True, False])
def test_ple_checkpoint_round_trip(tmp_path, tied):
    ir = random_ple_model(seed=4, tied=tied, out_vocab=40)
    m = ir_to_module(ir)
    back = module_to_ir(m)
    assert back.config == ir.config and list(back.tensors) == list(ir.tensors)
    assert all(np.array_equal(back.tensors[n], t) for n, t in ir.tensors.items())
    p = tmp_path / "ple.pt"
    save_checkpoint(p, m)
    loaded = load_checkpoint(p)
    assert loaded.config == ir.config
    assert all(np.array_equal(loaded.tensors[n], t) for n, t in ir.tensors.items())


def test_ple_state_dict_mismatches_are_one_line():
    ir = random_ple_model(seed=5)
    sd = ir_to_state_dict(ir)
    dense = dataclasses.replace(ir.config, ple_dim=0)
    with pytest.raises(ModelError, match="unexpected .*ple.*config's ple_dim is 0") as e:
        state_dict_to_ir(sd, dense)
    assert "\n" not in str(e.value)
    del sd["layers.1.ple.gate.weight"]
    with pytest.raises(ModelError, match="missing layers.1.ple.gate.weight"):
        state_dict_to_ir(sd, ir.config)
