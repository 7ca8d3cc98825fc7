"""The golden check: a short fixed generation the reference computed, which a board repeats to show
it is bit-exact with the reference (docs/formats.md section 1.3).

The blob's ``golden`` section (formats.GOLDEN) holds, for every KV cache format, a few greedy steps of
``reference.generate`` with ``FLAG_ALL_LOGITS`` (every step computes the whole output layer) from a
fixed prompt: each step's input id, greedy output id and logits CRC-32. The firmware runs the first
``boot_steps`` of them at boot and after every LAYOUT, all of them on SELFTEST, with the KV format it
runs, and reports in HELLO whether every step matched and, if not, the first that did not.

The prompt depends only on the vocabulary size (every model has one, with or without a tokenizer);
its ids are spread over the vocabulary so the check reads different embedding rows.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .formats import KV_CODE, KV_FORMATS, kv_refusal
from .ir import ModelError, QuantModel
from .reference import FLAG_ALL_LOGITS, NO_TOKEN, generate

VERSION = 1
PROMPT_LEN = 2      # prompt steps: step 1 already attends over two positions (RoPE, a real softmax)
STEPS = 4           # forward steps per KV format, SELFTEST runs them all
BOOT_STEPS = 2      # run at boot and after a LAYOUT: 1.8 decode tokens of time (make bench, README)
HEAD = struct.Struct("<4I")          # version, n_prompt, boot_steps, n_blocks
BLOCK = struct.Struct("<2I")         # kv format, n_steps
RECORD = struct.Struct("<3I")        # in_id, out_id, logits_crc


@dataclass(frozen=True)
class Golden:
    prompt: tuple[int, ...]
    boot_steps: int
    blocks: dict[str, list[tuple[int, int, int]]]     # KV format -> per step (in_id, out_id, logits_crc)


def prompt_ids(vocab_size: int, max_seq_len: int) -> list[int]:
    """The fixed prompt: PROMPT_LEN ids spread over the vocabulary (never past the context)."""
    n = max(1, min(PROMPT_LEN, max_seq_len))
    return [(k + 1) * vocab_size // (n + 1) for k in range(n)]


def compute(qm: QuantModel, steps: int = STEPS, boot_steps: int = BOOT_STEPS) -> Golden:
    """Run the reference: ``steps`` forward steps (fewer when the context or a stop id ends them) per KV
    format."""
    c = qm.config
    prompt = prompt_ids(c.vocab_size, c.max_seq_len)
    new = max(1, steps - len(prompt) + 1)          # forward steps = prompt + generated - 1
    blocks = {}
    for kv in (k for k in KV_FORMATS if kv_refusal(k, c.head_dim) is None):
        recs = generate(qm, prompt, new, flags=FLAG_ALL_LOGITS, kv=kv)
        blocks[kv] = [(r["in_id"], r["out_id"], r["logits_crc"]) for r in recs]
    return Golden(tuple(prompt), boot_steps, blocks)


def encode(g: Golden, fault_step: int | None = None) -> bytes:
    """The section's bytes. ``fault_step`` (tests only): that step's logits CRC is altered in every
    block, so a board must report it as the first step that differs."""
    out = bytearray(HEAD.pack(VERSION, len(g.prompt), g.boot_steps, len(g.blocks)))
    for kv, recs in g.blocks.items():
        out += BLOCK.pack(KV_CODE[kv], len(recs))
        for s, (i, o, crc) in enumerate(recs):
            out += RECORD.pack(i, o, crc ^ (1 if s == fault_step else 0))
    return bytes(out)


def section_bytes(qm: QuantModel, fault_step: int | None = None) -> bytes:
    return encode(compute(qm), fault_step)


def decode(buf: bytes, vocab_size: int, n_out: int, max_seq_len: int) -> Golden:
    """Parse and validate a golden section (the same checks as the firmware's app_golden.c)."""
    def bad(why: str):
        raise ModelError(f"golden section: {why}")
    if len(buf) < HEAD.size:
        bad(f"{len(buf)} bytes is too short")
    version, n_prompt, boot, n_blocks = HEAD.unpack_from(buf)
    if version != VERSION:
        bad(f"version {version}, this flashlm reads {VERSION}")
    off, blocks = HEAD.size, {}
    names = {v: k for k, v in KV_CODE.items()}
    for _ in range(n_blocks):
        if off + BLOCK.size > len(buf):
            bad("truncated")
        kv, n = BLOCK.unpack_from(buf, off)
        off += BLOCK.size
        if kv not in names or names[kv] in blocks:
            bad(f"KV format {kv} unknown or given twice")
        if not n_prompt <= n <= min(max_seq_len, 0xFFFE) or off + n * RECORD.size > len(buf):
            bad(f"{n} steps for a prompt of {n_prompt} in a context of {max_seq_len}, or truncated")
        recs = [RECORD.unpack_from(buf, off + k * RECORD.size) for k in range(n)]
        off += n * RECORD.size
        if any(i >= vocab_size or (o != NO_TOKEN and o >= n_out) or (o == NO_TOKEN) != (k + 1 < n_prompt)
               for k, (i, o, _) in enumerate(recs)):
            bad("an id outside the vocabulary, or a prompt step with an output")
        blocks[names[kv]] = recs
    if off != len(buf):
        bad(f"{len(buf) - off} bytes after the last block")
    prompt = tuple(blocks[next(iter(blocks))][k][0] for k in range(n_prompt)) if blocks else ()
    return Golden(prompt, boot, blocks)
