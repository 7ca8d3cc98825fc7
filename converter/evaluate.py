"""``flashlm eval``: how well a trained model predicts its held-out text, in fp32 (our PyTorch
model) and quantized to int8 and int4 through the NumPy reference (converter/reference.py: the
numbers the device computes), plus how often the quantized model's top token is the fp32 one.

The text is cut into consecutive windows of ``max_seq_len`` predictions, each started from an
empty KV cache, exactly as ``converter.train.evaluate`` does; the reference runs a token at a time
(tens of ms each), so only the first ``targets`` predictions are scored.  Targets the output layer
cannot predict (ids >= out_vocab) are skipped.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .corpus import split_docs
from .ir import ModelError, ModelIR
from .quantize import quantize
from .reference import Reference

FORMATS = {"int8": "q8", "int4": "q4"}      # row label -> quantizer default format


@dataclass
class Source:
    """A checkpoint and the held-out text it is scored on."""
    checkpoint: Path
    eval_text: Path


def locate(path: str | os.PathLike, text: str | os.PathLike | None = None) -> Source:
    """MODEL_DIR (its model.pt and eval.txt) or a checkpoint file (eval.txt beside it unless ``text``)."""
    p = Path(path)
    if p.is_dir():
        ckpt = p / "model.pt"
        if not ckpt.is_file():
            raise ModelError(f"{p}: no model.pt in this directory (a 'flashlm train' output folder)")
    elif p.is_file():
        ckpt = p
    else:
        raise ModelError(f"{p}: no such file or directory")
    ev = Path(text) if text is not None else ckpt.parent / "eval.txt"
    if not ev.is_file():
        raise ModelError(f"{ev}: no such file (the held-out text to score on; give one with --text)")
    return Source(ckpt, ev)


def load(src: Source):
    """(ModelIR, ``tokenizers`` tokenizer, token stream of the held-out text)."""
    # these import torch: only when a checkpoint is read, not whenever bench imports this module
    from .torch_import import load_checkpoint
    from .train import encode_docs, tokenizer_from_json

    ir = load_checkpoint(src.checkpoint)
    if ir.tokenizer is None or not ir.tokenizer.hf_json:
        raise ModelError(f"{src.checkpoint}: checkpoint has no BPE tokenizer (tokenizer_json), so its text "
                         f"cannot be encoded")
    tok = tokenizer_from_json(ir.tokenizer.hf_json)
    try:
        text = src.eval_text.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{src.eval_text}: cannot read as UTF-8 text: {e}") from None
    docs = split_docs(text)
    if not any(docs):
        raise ModelError(f"{src.eval_text}: empty text")
    return ir, tok, encode_docs(tok, docs).numpy()


def windows(n_pred: int, T: int):
    """(start, length) of each consecutive window of at most T predictions."""
    return [(s, min(T, n_pred - s)) for s in range(0, n_pred, T)]


def fp32_logits(ir: ModelIR, stream: np.ndarray, n_pred: int, tick=None) -> np.ndarray:
    """The PyTorch model's logits [n_pred, n_out] for inputs stream[:n_pred]; ``tick(done)`` after
    each window."""
    import torch

    from .torch_import import ir_to_module     # imports torch, as above
    model = ir_to_module(ir)
    out = []
    with torch.no_grad():
        for s, n in windows(n_pred, ir.config.max_seq_len):
            out.append(model(torch.from_numpy(stream[s:s + n])[None])[0].numpy())
            if tick:
                tick(s + n)
    return np.concatenate(out)


def reference_logits(qm, stream: np.ndarray, n_pred: int, kv: str = "f32", tick=None) -> np.ndarray:
    """The reference's logits [n_pred, n_out] with a ``kv`` ("f32" / "int8" / "k12") cache, one token at a
    time (the KV cache is overwritten from position 0 in each window, and attention reads only
    positions up to the current one); ``tick(done)`` after each token."""
    ref = Reference(qm, kv)
    out = np.empty((n_pred, qm.config.n_out), np.float32)
    for s, n in windows(n_pred, qm.config.max_seq_len):
        for pos in range(n):
            out[s + pos] = ref.forward(int(stream[s + pos]), pos)
            if tick:
                tick(s + pos + 1)
    return out


def score(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed cross-entropy (nats, float64) of ``targets`` (all below n_out)."""
    z = logits.astype(np.float64)
    m = z.max(axis=1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
    return float((lse - z[np.arange(len(targets)), targets]).sum())


def evaluate(path: str | os.PathLike, targets: int | None = 4096, group_size: int = 32,
             text: str | os.PathLike | None = None, progress=None) -> dict:
    """Loss, perplexity and bits/char of fp32, int8 and int4 over the first ``targets`` predictions
    (None: all of them), and the quantized models' top-1 agreement with fp32.  ``progress(label,
    total)`` is called before each model runs and returns None or ``tick(done)``, called as its
    predictions are made."""
    src = locate(path, text)
    ir, tok, stream = load(src)
    c = ir.config
    available = len(stream) - 1
    n_pred = available if targets is None else min(int(targets), available)
    tgt = stream[1:n_pred + 1]
    keep = tgt < c.n_out
    if not keep.any():
        raise ModelError(f"{src.eval_text}: none of the first {n_pred} targets can be predicted by the model")
    chars = len(tok.decode(tgt.tolist(), skip_special_tokens=True))
    rows = []

    def row(label: str, recipe: str, logits: np.ndarray, top1: np.ndarray | None) -> np.ndarray:
        lg = logits[keep]
        nats = score(lg, tgt[keep])
        loss = nats / int(keep.sum())
        am = lg.argmax(axis=1)
        rows.append(dict(model=label, recipe=recipe, loss=loss, ppl=math.exp(loss),
                         bits_per_char=nats / (chars * math.log(2)) if chars else float("nan"),
                         top1_agreement=None if top1 is None else float(np.mean(am == top1))))
        return am

    def start(label: str):
        return progress(label, n_pred) if progress else None

    top1 = row("fp32", "PyTorch fp32", fp32_logits(ir, stream, n_pred, start("fp32 (PyTorch)")), None)
    for label, fmt in FORMATS.items():
        qm = quantize(ir, fmt, group_size)
        # the gathered tensors the recipe keeps in another format (q4: the embedding q8; the table q4)
        other = [n for n in ("tok_embeddings", "output", "ple.table") if not qm.recipe.get(n, fmt).startswith(fmt)]
        recipe = f"{fmt} g{group_size}" + "".join(f", {n} {qm.recipe[n]}" for n in other)
        tick = start(f"{label} ({recipe}, NumPy reference)")
        row(label, recipe, reference_logits(qm, stream, n_pred, tick=tick), top1)
    split = c.param_split()
    return dict(checkpoint=str(src.checkpoint), eval_text=str(src.eval_text), n_params=c.n_params(),
                param_split=split, targets=int(keep.sum()), targets_window=n_pred, targets_available=available,
                skipped_unpredictable=int((~keep).sum()), chars=chars, group_size=group_size, rows=rows,
                recorded_eval_loss=(ir.meta.get("train") or {}).get("eval_loss"))
