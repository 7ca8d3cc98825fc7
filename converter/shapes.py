"""Named model shapes the planner costs without weights (``flashlm plan shape:NAME``): a config
plus the recipe the model ships with."""
from __future__ import annotations

from .costmodel import ModelSpec
from .ir import ModelConfig, ModelError

SHAPES = {
    # The landmark Per-Layer-Embedding model: 28.9M parameters (25.2M in the PLE table) on an
    # ESP32-S3, int4 groups of 128 with fp16 scales, embedding tied to the head. The heads are
    # taken as 4 query and 4 KV heads (no grouping was published).
    "ple-28m": dict(
        description="28.9M-parameter PLE TinyStories model (vocab 32768 in / 25353 out, dim 96, 6 layers, "
                    "PLE dim 128), int4 g128 fp16 scales",
        config=ModelConfig(dim=96, n_layers=6, n_heads=4, n_kv_heads=4, vocab_size=32768, hidden_dim=66,
                           max_seq_len=256, tied=True, rope_theta=10000.0, ple_dim=128, out_vocab=25353),
        recipe=dict(fmt="q4", group_size=128, overrides=("head=q4:128",), scales="f16"),
        # the published per-token breakdown of the baseline build of this model on the ESP32-S3 (ms):
        # "input" is our embed phase, "head" our output phase; sampling was not broken out. best_ms: the
        # best published build of the same model on the chip (no phase breakdown published)
        published=dict(board="esp32s3-n16r8", total_ms=102.9, best_ms=13.3,
                       phase_ms={"embed": 4.4, "attention": 25.6, "ffn": 6.9, "ple": 8.5, "output": 57.6}),
    ),
}


def shape_spec(name: str) -> ModelSpec:
    """The ModelSpec of a named shape, quantized by its recipe (tokenizer size estimated)."""
    if name not in SHAPES:
        raise ModelError(f"no model shape {name!r} (shapes: {', '.join(sorted(SHAPES))})")
    s = SHAPES[name]
    return ModelSpec.from_config(s["config"], source=f"shape {name}", **s["recipe"])
