"""Convert-time calibration of a mixture of experts' use: how often each layer's router chooses each
expert, counted through the reference (what the device computes) on the model's held-out text
(eval.txt beside the checkpoint, as ``flashlm eval`` reads it) or, without one, on text the model
writes itself (greedy continuations of random tokens).

The planner prices a token's FFN by it — each expert's bytes times the share of tokens that read
it, so predicted bytes and µs count the experts a token is expected to read, not all of them — and
its knapsack then puts the most used experts in the fastest tier. The blob carries the counts as
the section ``moe.use`` (docs/formats.md section 1): ``u32 version = 1, n_layers, n_experts, top_k,
tokens``, then ``u32 count[n_layers][n_experts]``, the tokens whose choice included expert e in layer
l; every layer's counts sum to ``top_k * tokens`` and none exceeds ``tokens`` (readers in Python and
C refuse anything else).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .corpus import split_docs
from .ir import ModelError, QuantModel
from .reference import Reference
from .tokenizer import encode

SECTION = "moe.use"
VERSION = 1
HEADER = struct.Struct("<5I")
TOKENS = 512            # tokens the calibration routes (a few seconds through the reference)


@dataclass(frozen=True)
class ExpertUse:
    """Per layer and expert, the tokens (of ``tokens``) whose top-k included the expert."""
    tokens: int
    counts: tuple[tuple[int, ...], ...]
    source: str = ""          # what text the counts come from (for the report; not in the blob)

    def share(self, layer: int, expert: int) -> float:
        """The share of tokens that read this expert: the planner's expected reads per token."""
        return self.counts[layer][expert] / self.tokens

    def shares(self) -> list[list[float]]:
        return [[n / self.tokens for n in row] for row in self.counts]

    def section_bytes(self, top_k: int) -> bytes:
        L, E = len(self.counts), len(self.counts[0])
        return HEADER.pack(VERSION, L, E, top_k, self.tokens) + np.asarray(self.counts, "<u4").tobytes()


def decode(buf: bytes, n_layers: int, n_experts: int, top_k: int) -> ExpertUse:
    """The counts of a ``moe.use`` section, checked as the firmware checks them."""
    if len(buf) < HEADER.size:
        raise ModelError(f"{SECTION}: {len(buf)} bytes is too short for its header")
    version, L, E, k, tokens = HEADER.unpack_from(buf)
    if version != VERSION:
        raise ModelError(f"{SECTION}: version {version}, this tool reads {VERSION}")
    if (L, E, k) != (n_layers, n_experts, top_k):
        raise ModelError(f"{SECTION}: counts for {L} layers of {E} experts, top {k}; the model has {n_layers} "
                         f"layers of {n_experts}, top {top_k}")
    if len(buf) != HEADER.size + 4 * L * E or tokens == 0:
        raise ModelError(f"{SECTION}: {len(buf)} bytes is not the header and {L} x {E} counts of a positive "
                         f"token count")
    counts = np.frombuffer(buf, "<u4", L * E, HEADER.size).reshape(L, E).astype(np.int64)
    bad = [layer for layer in range(L) if counts[layer].sum() != k * tokens or counts[layer].max() > tokens]
    if bad:
        raise ModelError(f"{SECTION}: layer {bad[0]}'s counts do not sum to top_k x tokens ({k} x {tokens}), "
                         f"each at most {tokens}")
    return ExpertUse(int(tokens), tuple(tuple(int(n) for n in row) for row in counts))


def count(qm: QuantModel, stream, tokens: int = TOKENS, source: str = "") -> ExpertUse:
    """Route the first ``tokens`` of the id stream through the reference in consecutive windows of the
    context (each from an empty cache, one pass per window), counting each layer's choices."""
    c = qm.config
    ids = [int(t) for t in stream[:tokens]]
    if not ids:
        raise ModelError("no tokens to calibrate the experts' use on")
    counts = np.zeros((c.n_layers, c.n_experts), np.int64)
    ref = Reference(qm)
    for s in range(0, len(ids), c.max_seq_len):
        ref.body_many(ids[s:s + c.max_seq_len], 0)
        for route in ref.routes:
            for layer, chosen in enumerate(route):
                counts[layer, chosen] += 1
    return ExpertUse(len(ids), tuple(tuple(int(n) for n in row) for row in counts), source)


def own_text(qm: QuantModel, tokens: int = TOKENS, seed: int = 0) -> list[int]:
    """Text the model writes itself: greedy continuations of random tokens (after BOS when the
    tokenizer has one), a context each, until ``tokens`` ids."""
    c, rng = qm.config, np.random.default_rng(seed)
    bos = qm.tokenizer.bos_id if qm.tokenizer is not None else None
    out: list[int] = []
    while len(out) < tokens:
        ids = ([bos] if bos is not None else []) + [int(rng.integers(c.n_out))]
        ref = Reference(qm)
        x = ref.body_many(ids, 0)[-1]
        while len(ids) < min(c.max_seq_len, tokens - len(out)):
            ids.append(ref.argmax(x)[0])
            x = ref.body(ids[-1], len(ids) - 1)
        out += ids
    return out[:tokens]


def eval_ids(qm: QuantModel, path: Path, tokens: int = TOKENS) -> list[int]:
    """The first ``tokens`` ids of a held-out text as training framed it: each document (form-feed lines
    apart, converter/corpus.py) ``BOS doc EOS``."""
    try:
        docs = split_docs(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: cannot read as UTF-8 text: {e}") from None
    ids: list[int] = []
    for doc in docs:
        if len(ids) >= tokens:
            break
        ids += encode(qm.tokenizer, doc, bos=True, eos=True)
    return ids[:tokens]


def calibrate(qm: QuantModel, eval_text: Path | None = None, tokens: int = TOKENS) -> ExpertUse:
    """The experts' use on ``eval_text`` when given (and the model has a tokenizer that encodes), else on
    the model's own greedy text."""
    if eval_text is not None and qm.tokenizer is not None and qm.tokenizer.kind in ("bpe", "llama2c"):
        ids = eval_ids(qm, eval_text, tokens)
        if ids:
            return count(qm, ids, tokens, f"{eval_text}, its first {len(ids)} tokens")
    ids = own_text(qm, tokens)
    return count(qm, ids, tokens, f"the model's own greedy text from random tokens, {len(ids)} tokens")
