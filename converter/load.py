"""One entry point for every model flashlm reads, told apart by content, not name:

- a Hugging Face ``transformers`` folder (config.json + safetensors; converter/hf_import.py);
- llama2.c v1 / v2: the ``ak42`` magic;
- flashlm ``.pt`` checkpoint: a zip archive (what ``torch.save`` writes);
- llama2.c legacy v0: no magic, but a 28-byte header that describes exactly the file's size.
"""
from __future__ import annotations

import os
from dataclasses import replace

from . import llama2c
from .files import regular_file_size
from .hf_import import is_hf_dir, read_hf_dir
from .ir import ModelError, ModelIR
from .tokenizer import load_tokenizer

_ZIP = b"PK\x03\x04"
_HINTS = {
    b"FLMB": "it is a flashlm weights blob (the converter's output), not a checkpoint",
    b"GGUF": "GGUF files are not supported; export to llama2.c format first",
}


def _sniff(path, context: int | None) -> ModelIR:
    if is_hf_dir(path):
        return read_hf_dir(path, context)    # checks the context against the model's own limits
    size = regular_file_size(path, "a model file or a Hugging Face folder with config.json")
    if size == 0:
        raise ModelError(f"not a llama2.c or flashlm checkpoint: {path} is empty")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror or e}") from None
    if head.startswith(_ZIP):
        from .torch_import import load_checkpoint   # torch is slow to import; only when needed
        return load_checkpoint(path)
    if llama2c.is_llama2c_magic(head):
        return llama2c.read_llama2c(path)
    for magic, hint in _HINTS.items():
        if head.startswith(magic):
            raise ModelError(f"not a llama2.c or flashlm checkpoint: {path}: {hint}")
    try:
        return llama2c.read_v0(path)
    except llama2c.FormatMismatch as e:
        reason = str(e)
        prefix = f"{path}: "
        if reason.startswith(prefix):
            reason = reason[len(prefix):]
        raise ModelError(f"not a llama2.c or flashlm checkpoint: {path} (no llama2.c v1/v2 magic, no zip "
                         f"archive, and as a legacy v0 file: {reason})") from None


def with_context(ir: ModelIR, context: int) -> ModelIR:
    """The model holding ``context`` positions, at most its own (RoPE tables cut to match)."""
    have = ir.config.max_seq_len
    if context > have:
        raise ModelError(f"context {context} is longer than the model's {have} positions")
    cut = (lambda t: None if t is None else t[:context].copy())
    return replace(ir, config=replace(ir.config, max_seq_len=context), rope_cos=cut(ir.rope_cos),
                   rope_sin=cut(ir.rope_sin))


def load_model(path, tokenizer_path=None, context: int | None = None) -> ModelIR:
    """A validated ``ModelIR`` from a Hugging Face folder or a llama2.c (v0/v1/v2) or flashlm
    checkpoint, with the tokenizer from ``tokenizer_path`` (tokenizer.bin or tokenizer.json)
    attached when given, holding ``context`` positions when given (at most the model's own)."""
    path = os.fspath(path)
    ir = _sniff(path, context)
    if context is not None and context != ir.config.max_seq_len:
        try:
            ir = with_context(ir, context)
        except ModelError as e:
            raise ModelError(f"{path}: {e}") from None
    if tokenizer_path is not None:
        tokenizer_path = os.fspath(tokenizer_path)
        tok = load_tokenizer(tokenizer_path)
        if len(tok) != ir.config.vocab_size:
            raise ModelError(f"{tokenizer_path}: tokenizer has {len(tok)} pieces but the model {path} has "
                             f"vocab_size {ir.config.vocab_size}")
        ir.tokenizer = tok
    try:
        ir.validate()
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    return ir


__all__ = ["load_model"]
