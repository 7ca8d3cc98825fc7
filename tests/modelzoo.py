"""Small random models for tests: our PyTorch Transformer with perturbed norms, as ModelIR; and
Per-Layer-Embedding models drawn straight in NumPy (every tensor of the config's shape list); and
where the real models shared beside the project are."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from converter.ir import ModelConfig, ModelIR
from converter.torch_model import Transformer


def random_model(seed: int = 0, **cfg) -> tuple[Transformer, ModelIR]:
    base = dict(dim=72, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=97, hidden_dim=100,
                max_seq_len=48, tied=True)
    base.update(cfg)
    config = ModelConfig(**base)
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    with torch.no_grad():       # norms away from 1 so their multiply matters; larger weights so
        for name, p in model.named_parameters():    # attention is not uniform
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.mul_(4.0)
    tensors = {k[: -len(".weight")]: v.detach().numpy().astype(np.float32)
               for k, v in model.state_dict().items()}
    return model, ModelIR(config, tensors, source=f"random seed {seed}")


def random_ple_model(seed: int = 0, **cfg) -> ModelIR:
    """A random PLE model (``ple_dim`` > 0): Gaussian matrices scaled by 2/sqrt(fan-in), the PLE
    table and embedding unit-scale, norms around 1 (the PLE post-norms too, so every path counts)."""
    base = dict(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=70, hidden_dim=64,
                max_seq_len=48, tied=True, ple_dim=24, out_vocab=0)
    base.update(cfg)
    config = ModelConfig(**base)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in config.tensor_shapes().items():
        if len(shape) == 1:
            t = 1 + 0.2 * rng.standard_normal(shape)
        elif name in ("tok_embeddings", "ple.table"):
            t = rng.standard_normal(shape)
        else:
            t = rng.standard_normal(shape) * (2.0 / np.sqrt(shape[1]))
        tensors[name] = t.astype(np.float32)
    return ModelIR(config, tensors, source=f"random PLE seed {seed}")


def spread_head(ir: ModelIR, seed: int = 0, span: float = 3.0) -> ModelIR:
    """The same model with its output layer's rows scaled by exp(-span * U[0, 1)) each: row norms
    spread over a factor e^span, so a greedy step's tile scan can skip tiles (in a trained model
    a few rows dominate; random rows are all alike and need every row scanned)."""
    name = "tok_embeddings" if ir.config.tied else "output"
    w = ir.tensors[name]
    scale = np.exp(-span * np.random.default_rng(seed).random(w.shape[0]))
    ir.tensors[name] = (w * scale[:, None]).astype(np.float32)
    return ir


def with_head_index(qm, size: int = 8):
    """qm with a head index of tiles of at most ``size`` rows, whatever it costs (flashlm convert's
    calibration, converter/headcalib.py, decides for real models)."""
    from converter import headprune
    qm.head_index = headprune.build(qm.head(), qm.config.n_out, size)
    return qm


def shared_model(name: str) -> Path:
    """A real model's folder shared beside the project: ../shared/models/NAME from the project root
    (from a git worktree one folder deeper, ../../shared); the first path when neither exists."""
    root = Path(__file__).resolve().parent.parent
    found = [up / "shared" / "models" / name for up in (root.parent, root.parent.parent)]
    return next((d for d in found if d.is_dir()), found[0])
