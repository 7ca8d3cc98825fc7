"""Calibration from the model's own samples (``flashlm convert --calibrate gptq``): the second moments
H = sum x x^T of every matrix's inputs as the fp32 model computes them on text it sampled itself, which
converter/gptq.py's rounding weighs each column's error with."""
from __future__ import annotations

import numpy as np

from .fidelity import fp32_model, sample_text
from .ir import ModelIR

CALIBRATIONS = ("auto", "none", "gptq", "qat")


def resolve(calibrate: str, fmt: str, scales: str | None = None) -> str:
    """``auto`` (convert's default) as ``fmt`` takes it: GPTQ for q8 (measured with q8's defaults, k12 KV:
    stories260K's greedy text follows fp32's for a median 161.5 of 200 tokens, 115 with nearest rounding;
    the default model's 105 of 112, 85), quantization-aware training for q4 (stories260K at q4's default
    recipe, 4.97 bits a weight: KL to fp32 0.034 against 0.139 rounded to nearest, docs/bench.md "Fidelity";
    minutes of convert time; with float group scales, which it does not train against, nearest)."""
    if calibrate != "auto":
        return calibrate
    return "gptq" if fmt == "q8" else "qat" if scales in (None, "row") else "none"


POSITIONS = 1024         # fp32 predictions the moments are summed over (256 were too few on stories260K)


def input_moments(ir: ModelIR, positions: int = POSITIONS, seed: int = 1) -> dict[str, np.ndarray]:
    """Per matrix name, sum x x^T (float64 [cols, cols]) over its inputs on ``positions`` positions of
    fp32's sampled text (a seed of its own: not the text the fidelity measure scores on)."""
    fp = fp32_model(ir)
    fp.taps = {}
    for seq in sample_text(ir, positions, seed, answers=False).seqs:
        for pos, tok in enumerate(seq[:-1]):
            fp.forward(tok, pos)
    return fp.taps
