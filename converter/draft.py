"""The draft model of speculative decoding (docs/formats.md section 1.4): a small model of the same
tokenizer whose greedy tokens a board proposes, several at a time, for its main model to verify in
one forward pass. It travels inside the main model's blob as the section ``draft`` (a complete blob
of its own), so a board holds both in one flash image and one model hash names the pair.

What the draft proposes decides only how many tokens a verifying pass can skip: the tokens stay
the main model's greedy ones whatever it proposes, so its numerics are free — by default its KV
cache is int8, a quarter of the f32 cache's RAM."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .ir import ModelError, QuantModel, Tokenizer
from .quantize import rope_tables

DRAFT_KV = "int8"    # a draft only proposes (the main model verifies every token): the smallest cache


@dataclass
class Draft:
    qm: QuantModel
    kv: str = DRAFT_KV        # its KV cache's format on the board


def check_pair(main: QuantModel, draft: QuantModel, pieces: bool = True) -> None:
    """Refuse a draft whose tokens would not mean the main model's: another vocabulary, another
    tokenizer (its pieces; not once attached: a blob's draft keeps only the ids), other special
    tokens."""
    c, d = main.config, draft.config
    if d.vocab_size != c.vocab_size:
        raise ModelError(f"the draft model's vocabulary has {d.vocab_size} tokens, the model's {c.vocab_size}: "
                         f"a draft must share the model's tokenizer")
    mt, dt = main.tokenizer, draft.tokenizer
    if mt is not None and dt is not None:
        if pieces and mt.pieces != dt.pieces:
            raise ModelError("the draft model's tokenizer is not the model's (its pieces differ): a draft must "
                             "share the model's tokenizer")
        if (mt.bos_id, mt.eos_id) != (dt.bos_id, dt.eos_id):
            raise ModelError(f"the draft model's BOS/EOS ids {dt.bos_id}/{dt.eos_id} are not the model's "
                             f"{mt.bos_id}/{mt.eos_id}")


def attach(main: QuantModel, draft: QuantModel, kv: str = DRAFT_KV) -> QuantModel:
    """``main`` carrying ``draft`` (checked with check_pair), the draft's context set to the main
    model's (its RoPE tables rewritten: the board runs both at the same positions and slides both
    windows alike) and its tokenizer reduced to the ids (the board prints the main model's pieces)."""
    check_pair(main, draft)
    cfg = replace(draft.config, max_seq_len=main.config.max_seq_len)
    cos, sin = rope_tables(cfg)
    t = main.tokenizer
    ids_only = Tokenizer([b""] * cfg.vocab_size, [0.0] * cfg.vocab_size, kind="blob",
                         bos_id=t.bos_id if t is not None else None, eos_id=t.eos_id if t is not None else None)
    qd = QuantModel(cfg, draft.tensors, cos, sin, ids_only, draft.recipe, draft.source)
    return replace(main, draft=Draft(qd, kv))
