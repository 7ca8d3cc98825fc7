"""One entry point for every model file flashlm reads, told apart by content, not name:

- llama2.c v1 / v2: the ``ak42`` magic;
- flashlm ``.pt`` checkpoint: a zip archive (what ``torch.save`` writes);
- llama2.c legacy v0: no magic, but a 28-byte header that describes exactly the file's size.
"""
from __future__ import annotations

import os

from . import llama2c
from .files import regular_file_size
from .ir import ModelError, ModelIR
from .tokenizer import load_tokenizer

_ZIP = b"PK\x03\x04"
_HINTS = {
    b"FLMB": "it is a flashlm weights blob (the converter's output), not a checkpoint",
    b"GGUF": "GGUF files are not supported; export to llama2.c format first",
}


def _sniff(path) -> ModelIR:
    size = regular_file_size(path)
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


def load_model(path, tokenizer_path=None) -> ModelIR:
    """A validated ``ModelIR`` from a llama2.c (v0/v1/v2) or flashlm checkpoint, with the tokenizer
    from ``tokenizer_path`` (tokenizer.bin or tokenizer.json) attached when given."""
    path = os.fspath(path)
    ir = _sniff(path)
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
