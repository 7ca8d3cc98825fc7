"""Convert time of a ~15M-parameter random llama2.c v1 checkpoint (dim 288, 6 layers, 6 heads,
vocab 32000, context 256): load + quantize + blob, host clock."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from converter.blob import write_blob
from converter.ir import ModelConfig, ModelIR
from converter.llama2c import write_llama2c
from converter.load import load_model
from converter.quantize import quantize

from .model import FORMATS, GROUP


def convert_15m(work: Path) -> dict:
    cfg = ModelConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, hidden_dim=768,
                      max_seq_len=256, tied=True)
    rng = np.random.default_rng(0)
    tensors = {n: (np.ones(s, np.float32) if len(s) == 1 else rng.standard_normal(s, np.float32) * 0.02)
               for n, s in cfg.tensor_shapes().items()}
    work.mkdir(parents=True, exist_ok=True)
    path = work / "stories15M_random.bin"
    write_llama2c(ModelIR(cfg, tensors), path, version=1)
    out = {"params": cfg.n_params()}
    for fmt in FORMATS:
        t0 = time.perf_counter()
        ir = load_model(path)
        t1 = time.perf_counter()
        qm = quantize(ir, fmt, GROUP)
        t2 = time.perf_counter()
        info = write_blob(qm, work / f"m15_{fmt}.flmb")
        t3 = time.perf_counter()
        out[fmt] = dict(load_s=t1 - t0, quantize_s=t2 - t1, blob_s=t3 - t2, total_s=t3 - t0, blob_bytes=info.size)
    return out


def section(work: Path) -> dict:
    return {"convert_15M_llama2c_v1": convert_15m(work)}
