"""The small models the fuzz targets run: fixed seeds, so a committed input means the same thing
on every machine. ``models()`` -> {name: blob bytes}; ``FUZZ_MODEL`` is the one fuzz_app boots."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

# vocab 24, context 12, 1 layer, dim 16: 15 table entries (with tokenizer.enc: FUZZ_PIECES, a
# llama2.c vocabulary without byte fallback); a GENERATE may run to the context end
FUZZ_MODEL = dict(seed=7, dim=16, n_heads=2, n_kv_heads=1, hidden_dim=24, vocab_size=24, max_seq_len=12,
                  n_layers=1)
FUZZ_PIECES = ["<unk>", "<s>", "</s>", " ", "a", "b", "c", "ab", " a", "bc", "abc", "\u00e9", "x", "y", "z", " x",
               "xy", "\n", "1", "2", "12", ".", "!", " b"]


def models() -> dict[str, bytes]:
    import dataclasses

    from converter.blob import build_blob
    from converter.formats import StateTiers
    from converter.ir import Tokenizer
    from converter.quantize import quantize
    from converter.tokenizer import load_tokenizer
    from modelzoo import random_ple_model, random_model, spread_head, with_head_index
    out = {}
    tok = Tokenizer([p.encode() for p in FUZZ_PIECES], [-float(i) for i in range(len(FUZZ_PIECES))],
                    kind="llama2c", bos_id=1, eos_id=2)
    _, ir = random_model(**FUZZ_MODEL)
    ir = dataclasses.replace(ir, tokenizer=tok)
    from converter.draft import attach
    _, small = random_model(**{**FUZZ_MODEL, "seed": 11, "dim": 8, "n_layers": 1})
    draft = quantize(small, "q8", 8)                             # speculative decoding's draft model
    # greedy: tiles; prefill in passes of up to 4
    out["app_q8"] = build_blob(attach(with_head_index(quantize(spread_head(ir, span=6.0), "q8", 8), 4), draft),
                               state=StateTiers(batch=4))
    _, ir2 = random_model(**{**FUZZ_MODEL, "seed": 8, "tied": False, "n_layers": 2, "n_kv_heads": 2})
    out["untied_q4"] = build_blob(quantize(ir2, "q4", 6, ["tok_embeddings=q8:16"]))
    out["placed"] = build_blob(quantize(ir, "q8", 8), tiers={"layers.0.ffn.w1": "psram", "norm": "sram"})
    # Per-Layer Embeddings, untied head over part of the vocabulary, fp16 scales, ragged groups
    ple = random_ple_model(seed=9, dim=16, n_heads=2, n_kv_heads=1, hidden_dim=24, vocab_size=24, max_seq_len=12,
                           n_layers=2, ple_dim=6, tied=False, out_vocab=17)
    out["ple_q4_f16"] = build_blob(with_head_index(quantize(ple, "q4", 8, ["ple.proj=q8:5"], scales="f16"), 3),
                                   state=StateTiers(batch=5))
    # the default ByteLevel BPE (vocab 1024) on a tiny model: a tokenizer.enc of every table kind
    _, ir3 = random_model(**{**FUZZ_MODEL, "seed": 9, "vocab_size": 1024, "max_seq_len": 8, "n_layers": 2,
                             "n_kv_heads": 2})
    ir3 = dataclasses.replace(ir3, tokenizer=load_tokenizer(ROOT / "models" / "default" / "tokenizer.json"))
    out["bpe_q8"] = build_blob(quantize(ir3, "q8", 8))
    # an int8 KV cache (head_dim 6: padded rows), a head whose row norms differ (the greedy scan skips tiles)
    _, ir4 = random_model(**{**FUZZ_MODEL, "seed": 10, "dim": 12, "n_kv_heads": 2})
    out["int8_kv_spread_head"] = build_blob(with_head_index(quantize(spread_head(ir4), "q8", 6), 2),
                                            state=StateTiers(kv="int8"))
    return out


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build" / "fuzz")
    out.mkdir(parents=True, exist_ok=True)
    for name, blob in models().items():
        (out / f"{name}.flmb").write_bytes(blob)
    print(out / "app_q8.flmb")
