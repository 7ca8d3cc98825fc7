"""The models ``flashlm train`` makes (``--preset``): each one's shape and training schedule
(the trainer is converter/train.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .ir import ModelConfig
from .shapes import SHAPES


@dataclass(frozen=True)
class Preset:
    config: ModelConfig
    steps: int
    batch_size: int
    lr: float
    min_lr_ratio: float = 0.1          # cosine decays lr to lr * min_lr_ratio
    warmup: int = 100
    weight_decay: float = 0.1          # on matrices and the (tied) embedding, not on norms
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_max_tokens: int = 16384       # periodic evals use the first this-many held-out tokens
    ckpt_every: int = 500
    seed: int = 0
    description: str = ""
    tokenizer_of: str = ""             # a shipped model folder whose tokenizer this one shares (a draft)
    aux_loss: float = 0.01             # weight of the experts' load-balancing loss (models with experts)


def param_summary(cfg: ModelConfig) -> str:
    """Parameters in all, in the PLE table (read one row per token, from flash) and in the core; with
    experts, those in the experts and those a token reads."""
    split = cfg.param_split()
    n = cfg.n_params()
    if cfg.n_experts:
        return (f"{n:,} parameters: experts {split['experts']:,} ({100 * split['experts'] / n:.1f}%), "
                f"{split['active']:,} read per token")
    if not split["table"]:
        return f"{n:,} parameters (no PLE table)"
    return (f"{n:,} parameters: PLE table {split['table']:,} ({100 * split['table'] / n:.1f}%), "
            f"core {split['core']:,}")


_DEFAULT = ModelConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=1, vocab_size=1024, hidden_dim=352,
                       max_seq_len=128, tied=True)
_TINY = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=320, hidden_dim=64, max_seq_len=32,
                    tied=True)
_PLE_FAMILY = dict(dim=96, n_layers=4, n_heads=3, n_kv_heads=1, vocab_size=2048, max_seq_len=128, tied=True)
_PLE = ModelConfig(**_PLE_FAMILY, hidden_dim=192, ple_dim=128)
# the same family without PLE, its FFN widened until the core matches _PLE's (664,416 vs 664,928)
_PLE_DENSE = ModelConfig(**_PLE_FAMILY, hidden_dim=320)
_PLE_28M = SHAPES["ple-28m"]["config"]
# the draft model of models/default's speculative decoding: its tokenizer, an eighth of its parameters
_DRAFT_DEFAULT = ModelConfig(dim=48, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=1024, hidden_dim=128,
                             max_seq_len=128, tied=True)
# the default model's FFN cut into 4 experts of half its width, 2 read per token: a token reads the
# default's bytes (FFN 2 x 176 = 352 wide, plus a 4 x 128 router), the experts hold twice its FFN
_MOE_FAMILY = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=1, vocab_size=1024, max_seq_len=128, tied=True)
_MOE = ModelConfig(**_MOE_FAMILY, hidden_dim=176, n_experts=4, moe_top_k=2)
# moe's baseline of equal total parameters: one dense FFN as wide as its four experts (1,377,408 vs 1,379,456)
_MOE_DENSE = ModelConfig(**_MOE_FAMILY, hidden_dim=704)
_TINY_MOE = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=320, hidden_dim=32,
                        max_seq_len=32, tied=True, n_experts=4, moe_top_k=2)
_TINY_PLE = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=320, hidden_dim=64,
                        max_seq_len=32, tied=True, ple_dim=16, out_vocab=300)

PRESETS: dict[str, Preset] = {
    # ~0.84 M parameters.  int8 weights ~0.85 MB of the Pico's 2 MB flash; fp32 KV cache
    # 4 layers x 128 positions x 32 (one kv head) x 2 x 4 B = 128 KiB of its 264 KB SRAM.
    "default": Preset(
        config=_DEFAULT, steps=4000, batch_size=32, lr=3e-3, warmup=100, eval_every=250, ckpt_every=500,
        description="Raspberry Pi Pico sized: dim 128, 4 layers, MQA, vocab 1024, context 128; "
                    f"{param_summary(_DEFAULT)}"),
    # seconds on a laptop CPU; for smoke tests
    "tiny": Preset(
        config=_TINY, steps=60, batch_size=8, lr=3e-3, warmup=5, eval_every=30, eval_max_tokens=4096,
        ckpt_every=30, description=f"smoke tests: dim 32, 2 layers, vocab 320, context 32; {param_summary(_TINY)}"),
    # The shipped PLE model: most of its parameters sit in the flash-resident table (int4 by the
    # quantizer's recipe), the core is smaller than the default model's.
    "ple": Preset(
        config=_PLE, steps=2000, batch_size=32, lr=3e-3, warmup=100, eval_every=250, ckpt_every=500,
        description="PLE, Pico sized: dim 96, 4 layers, 3/1 heads, FFN 192, vocab 2048, PLE dim 128, "
                    f"context 128; {param_summary(_PLE)}"),
    # ple's baseline for bench.ple_vs_dense: no table, the same core parameter count
    "ple-dense": Preset(
        config=_PLE_DENSE, steps=2000, batch_size=32, lr=3e-3, warmup=100, eval_every=250, ckpt_every=500,
        description="ple without PLE, FFN 320 so the core matches ple's: dim 96, 4 layers, 3/1 heads, "
                    f"vocab 2048, context 128; {param_summary(_PLE_DENSE)}"),
    # the 28.9M PLE shape that runs on an ESP32-S3 in the published build (converter/shapes.py); trainable on a CPU, not shipped
    "ple-28m": Preset(
        config=_PLE_28M, steps=4000, batch_size=16, lr=2e-3, warmup=200, eval_every=250, ckpt_every=500,
        description="the 28.9M seed shape: vocab 32768 in / 25353 out, dim 96, 6 layers, 4 heads, FFN 66, "
                    f"PLE dim 128, context 256; {param_summary(_PLE_28M)}"),
    # the shipped draft of models/default (models/default/draft): proposes tokens that the default
    # model verifies several at a time (flashlm convert --draft, flashlm run --speculate draft)
    "draft": Preset(
        config=_DRAFT_DEFAULT, steps=1500, batch_size=32, lr=4e-3, warmup=100, eval_every=500, ckpt_every=500,
        tokenizer_of="models/default",
        description="draft of the default model (its tokenizer): dim 48, 2 layers, 2/1 heads, FFN 128; "
                    f"{param_summary(_DRAFT_DEFAULT)}"),
    # The shipped mixture of experts: the default model's shape, tokenizer and recipe, its FFN 4 experts
    # of width 176 of which each token reads 2 (flashlm eval: beside default, same bytes per token, and
    # moe-dense, same parameters)
    "moe": Preset(
        config=_MOE, steps=4000, batch_size=32, lr=3e-3, warmup=100, eval_every=250, ckpt_every=500,
        tokenizer_of="models/default",
        description="mixture of experts, Pico sized: default's shape, 4 experts of FFN 176, top 2 a token; "
                    f"{param_summary(_MOE)}"),
    # moe's baseline of equal total parameters (and twice the FFN bytes per token): dense FFN 704
    "moe-dense": Preset(
        config=_MOE_DENSE, steps=4000, batch_size=32, lr=3e-3, warmup=100, eval_every=250, ckpt_every=500,
        tokenizer_of="models/default",
        description="moe's parameters in one dense FFN of 704 (default's tokenizer): "
                    f"{param_summary(_MOE_DENSE)}"),
    # seconds; four experts, two a token, for smoke tests
    "tiny-moe": Preset(
        config=_TINY_MOE, steps=60, batch_size=8, lr=3e-3, warmup=5, eval_every=30, eval_max_tokens=4096,
        ckpt_every=30, description=f"smoke tests: tiny with 4 experts of FFN 32, top 2; {param_summary(_TINY_MOE)}"),
    # seconds; PLE and an output layer smaller than the vocabulary, for smoke tests
    "tiny-ple": Preset(
        config=_TINY_PLE, steps=60, batch_size=8, lr=3e-3, warmup=5, eval_every=30, eval_max_tokens=4096,
        ckpt_every=30, description="smoke tests: tiny with PLE dim 16 and 300 of 320 tokens predicted; "
                                   f"{param_summary(_TINY_PLE)}"),
}
