"""RAM the engine needs for a model: KV cache, scratch and the prompt buffer — the same sums
as flm_state_bytes() in firmware/engine/engine.c plus the app's prompt buffer (app.c)."""
from __future__ import annotations

from .ir import ModelConfig


def _up8(n: int) -> int:
    return (n + 7) & ~7


def state_bytes(cfg: ModelConfig, min_group: int) -> int:
    wide = max(cfg.dim, cfg.hidden_dim)
    kv = cfg.n_layers * cfg.max_seq_len * cfg.kv_dim * 4
    parts = [cfg.dim * 4] * 4 + [cfg.max_seq_len * 4, cfg.hidden_dim * 4, cfg.hidden_dim * 4,
                                 cfg.vocab_size * 4, cfg.head_dim // 2 * 4, cfg.head_dim // 2 * 4,
                                 wide, (wide // min_group + 1) * 4, cfg.vocab_size * 4,
                                 cfg.vocab_size * 4, kv, kv]
    return sum(_up8(p) for p in parts)


def arena_bytes(cfg: ModelConfig, min_group: int) -> int:
    return state_bytes(cfg, min_group) + cfg.max_seq_len * 4
