"""Quantization-aware training (``flashlm convert --calibrate qat``): the fp32 model distilled into a
copy of itself whose matrices are fake-quantized with the blob's own quantizer, so that the weights it
ends with round to codes that track fp32's distributions rather than each weight's own value.

The student's forward pass is torch_model's with, for every matrix the recipe quantizes, the weight
replaced by exactly what converter/quantize.py's row scales give back (per row a power-of-two scale S,
per group a multiplier k, codes round(w / (k S)) within the format's range; the rounding passes
gradients straight through), and every product's input quantized as the device quantizes it (one
scale over the whole input vector, codes within +-127 for q4 and +-2047 for q8). k starts at
quantize's ceil(group scale / S) and is learned with the weights (LearnedGrid; clipping allowed):
quantize(grids=...) then rounds the trained weights against the learned k, the codes the student saw.
The loss is KL(fp32 || student) over the teacher's full next-token distributions (fp32 in torch, a
batch at a time) on text the fp32 model sampled itself (converter/fidelity.py's sampler, a seed apart
from the fidelity probe's), Adam with a cosine schedule. The result is an fp32 ModelIR: quantize()
turns it into the blob's codes as it would any checkpoint, so the format, the engine and
bit-exactness do not change."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from torch.nn.utils import parametrize

from .fidelity import sample_text
from .formats import FORMATS, MULT_MAX
from .ir import ModelError, ModelIR, QTensor, QuantModel
from .numerics import act_qmax
from .quantize import quantize_matrix
from .torch_import import ir_to_module

# measured on stories260K with a q4 embedding, KL to fp32 on the fidelity probe (2,000 positions, k12 KV): g16
# 0.139 rounded to nearest; trained with ceil's k on 16,384 positions 0.041 after 500 steps at 3e-4 (0.055 at
# 1e-3, 0.044 after 800 steps); k learned at 1e-3: 0.034 on 16,384 positions, 0.029 on 65,536, 0.028 on
# 131,072 (0.027 after 1,000 steps; peak rates 5e-4 / 2e-3: 0.028, ΔCE 0.030; from GPTQ's codes: 0.035). The
# text is what limits it, not the steps: 65,536 positions at 8 sequences a step for 1,000 steps 0.029. g32
# 0.183, 0.048 (800 steps, ceil's k)
STEPS = 500            # optimizer steps
POSITIONS = 131072     # fp32 predictions the student learns from (whole sequences from BOS)
BATCH = 4              # sequences a step
LR = 3e-4              # Adam's peak learning rate; the cosine schedule takes it to 0
SEED = 2               # the training text's (the fidelity probe samples with 0, GPTQ's moments with 1)
LR_GRID = 1e-3         # the learned multipliers' peak rate (on log k: a step moves k by about 0.1%)


def act_fake_quant(x: torch.Tensor, qmax: int) -> torch.Tensor:
    """x quantized per vector (its last axis) as a row-scaled product's input: scale amax / qmax;
    gradients straight through."""
    amax = x.detach().abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / qmax, 1.0)
    return x + (torch.clamp(torch.round(x.detach() / s), -qmax, qmax) * s - x.detach()).detach() * (amax > 0)


class LearnedGrid(torch.nn.Module):
    """fake_quant with each group's multiplier learned as in LSQ (Esser et al. 2020): under the row scale S
    the weights start with, k = round(k0 exp(t)) within 1..MULT_MAX (0 stays 0: an all-zero group), t
    trained; below ceil the group's largest weights clip. Straight-through for the rounding of k and of
    w / (k S); float64 as quantize_matrix with the grid given, so the blob's codes are the student's."""

    def __init__(self, w: torch.Tensor, fmt: str, group_size: int):
        super().__init__()
        q = quantize_matrix(w.detach().numpy(), fmt, group_size, rowscale=True)
        self.qmax, self.group_size = FORMATS[fmt].qmax, group_size
        self.register_buffer("row", torch.from_numpy(q.scales.astype(np.float64)))        # [rows, 1]
        self.register_buffer("k0", torch.from_numpy(q.mult.astype(np.float64)))           # [rows, groups]
        self.log_k = torch.nn.Parameter(torch.zeros(q.mult.shape))

    @torch.no_grad()
    def multipliers(self) -> torch.Tensor:
        k = self.k0 * torch.exp(self.log_k.double())
        return torch.where(self.k0 > 0, torch.clamp(torch.round(k), 1, MULT_MAX), 0.0)

    def forward(self, w):
        rows, cols = w.shape
        k = self.k0 * torch.exp(self.log_k.double())
        k = k + (self.multipliers() - k).detach()
        eff = k * self.row
        safe = torch.where(eff > 0, eff, 1.0)
        ng = eff.shape[1]
        wg = torch.nn.functional.pad(w, (0, ng * self.group_size - cols)).reshape(rows, ng, self.group_size)
        x = wg.double() / safe[..., None]
        q = torch.clamp(x + (torch.round(x) - x).detach(), -self.qmax, self.qmax) * eff[..., None]
        return q.float().reshape(rows, ng * self.group_size)[:, :cols]


def quantized_matrices(qm: QuantModel) -> dict[str, QTensor]:
    """The recipe's quantized matrices; refuses what the fake quantizer does not model."""
    mats = {n: t for n, t in qm.tensors.items() if isinstance(t, QTensor)}
    odd = [n for n, t in mats.items() if not t.rowscale]
    if odd:
        raise ModelError(f"--calibrate qat trains against row scales; {odd[0]} has "
                         f"{'f16' if mats[odd[0]].scale16 else 'f32'} scales (use --scales row)")
    return mats


def fp32_module(ir: ModelIR) -> torch.nn.Module:
    """The model in torch with every tensor in float (a quantized checkpoint's dequantized)."""
    return ir_to_module(replace(ir, tensors={n: t.dequantize() if isinstance(t, QTensor) else t
                                             for n, t in ir.tensors.items()}))


def student_of(ir: ModelIR, mats: dict[str, QTensor]) -> torch.nn.Module:
    """The fp32 model in torch with every quantized matrix fake-quantized (LearnedGrid) and each
    product's input quantized as the device does (the tied head's input through the final norm's output)."""
    model = fp32_module(ir)
    for name, t in mats.items():
        mod = model.get_submodule(name)
        parametrize.register_parametrization(mod, "weight", LearnedGrid(mod.weight, t.fmt, t.group_size))
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(lambda m, a, qmax=act_qmax(t): (act_fake_quant(a[0], qmax),))
    head = "tok_embeddings" if ir.config.tied else "output"
    if ir.config.tied and head in mats:
        model.norm.register_forward_hook(lambda m, a, out, qmax=act_qmax(mats[head]): act_fake_quant(out, qmax))
    return model


def train(ir: ModelIR, qm: QuantModel, steps: int | None = None, positions: int | None = None, batch: int = BATCH,
          lr: float = LR, seed: int = SEED, lr_grid: float = LR_GRID, say=None, say_text=None) -> tuple[ModelIR, dict]:
    """``ir`` with weights trained against ``qm``'s recipe (the nearest-rounded model quantize() made
    of ``ir``: its formats and groups) for ``steps`` (None: STEPS) on ``positions`` (None: POSITIONS),
    and per matrix the grid (row scales, multipliers) for quantize(grids=...), learned at ``lr_grid``'s
    peak rate. ``say_text(done, positions)`` as fp32 samples the text, ``say(step, steps, loss)``
    every 50 steps. Deterministic for a seed (torch's CPU kernels, the same thread count)."""
    steps = STEPS if steps is None else steps
    positions = POSITIONS if positions is None else positions
    if steps < 1 or positions < 1 or batch < 1:
        raise ModelError(f"qat needs steps, positions and batch of at least 1 (got {steps}, {positions}, {batch})")
    mats = quantized_matrices(qm)
    seqs = sample_text(ir, positions, seed, say=say_text, answers=False).seqs
    n = min(len(s) - 1 for s in seqs)    # the last sequence may be short: every batch row the same length
    tokens = torch.tensor([s[:n] for s in seqs])
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    teacher = fp32_module(ir).eval()     # fp32's distributions a batch at a time: a long text's would not fit in memory
    student = student_of(ir, mats).train()
    grid = [p for n, p in student.named_parameters() if n.endswith("log_k")]
    rest = [p for n, p in student.named_parameters() if not n.endswith("log_k")]
    opt = torch.optim.Adam([dict(params=rest, lr=lr)] + ([dict(params=grid, lr=lr_grid)] if grid else []))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * i / steps)))
    for i in range(steps):
        idx = torch.randint(0, len(tokens), (min(batch, len(tokens)),), generator=gen)
        with torch.no_grad():
            tl = torch.log_softmax(teacher(tokens[idx]), -1)
        lq = torch.log_softmax(student(tokens[idx]), -1)
        loss = (tl.exp() * (tl - lq)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if say is not None and (i % 50 == 0 or i == steps - 1):
            say(i + 1, steps, loss.item())
    trained, grids = {}, {}
    with torch.no_grad():
        for name in ir.tensors:
            mod = student.get_submodule(name)
            p = mod.parametrizations.weight.original if name in mats else mod.weight
            trained[name] = p.detach().float().numpy().copy()
            if name in mats:
                g = mod.parametrizations.weight[0]
                grids[name] = (g.row.float().numpy()[:, 0].copy(), g.multipliers().numpy().astype(np.uint8))
    return replace(ir, tensors=trained), grids
