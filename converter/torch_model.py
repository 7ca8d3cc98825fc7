"""Our PyTorch Llama-style model: RMSNorm, interleaved-pair RoPE, grouped/multi-query heads,
SwiGLU FFN or a mixture of SwiGLU experts (``n_experts`` > 0: a router, the top ``moe_top_k`` experts
per token weighted by the softmax of their logits, as Mixtral), tied or untied head over the first
``n_out`` tokens, optional Per-Layer Embeddings (``ple_dim`` > 0); the forward pass of
converter/reference.py.  Parameter names map one-to-one
onto ``ir`` tensor names (see ``state_dict_to_ir`` in ``torch_import``)."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .ir import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_seq_len, head_dim/2], computed in float64 then rounded to float32."""
    hd = cfg.head_dim
    inv = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(cfg.max_seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, T, H, hd]; rotate (x[2i], x[2i+1]) by angle pos * theta^(-2i/hd)
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        c, hd = self.cfg, self.cfg.head_dim
        q = apply_rope(self.wq(x).view(B, T, c.n_heads, hd), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, c.n_kv_heads, hd), cos, sin)
        v = self.wv(x).view(B, T, c.n_kv_heads, hd)
        rep = c.n_heads // c.n_kv_heads
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, c.n_heads * hd))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """A mixture of experts FFN: router logits ``r = router(x)``, the k largest chosen, their weights the
    softmax of the chosen logits, ``y = sum_j w_j expert_j(x)``. Each expert runs on the tokens routed
    to it only. ``aux`` holds the last forward pass's load-balancing loss (Switch Transformer's
    ``E * sum_e f_e P_e``: f_e the share of the choices that went to expert e, P_e its mean router
    probability), which is 1 when the experts share the tokens evenly."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.k = cfg.moe_top_k
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(cfg) for _ in range(cfg.n_experts))
        self.aux = torch.zeros(())

    def forward(self, x):
        shape, E = x.shape, len(self.experts)
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        top, chosen = torch.topk(logits, self.k, dim=-1)
        w = F.softmax(top, dim=-1, dtype=torch.float32).to(x.dtype)
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.nonzero(chosen == e, as_tuple=True)
            if tok.numel():
                y.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None])
        share = F.one_hot(chosen, E).sum(1).float().mean(0) / self.k
        self.aux = E * torch.sum(share * F.softmax(logits, dim=-1, dtype=torch.float32).mean(0))
        return y.reshape(shape)


class PLEInputs(nn.Module):
    """The per-layer inputs u [B, T, L, P]: (rmsnorm(proj(x) / sqrt(dim)) + table[token] * sqrt(P)) / sqrt(2),
    the projection cut into L slices of P that share one norm gain."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        L, P = cfg.n_layers, cfg.ple_dim
        self.table = nn.Embedding(cfg.vocab_size, L * P)
        self.proj = nn.Linear(cfg.dim, L * P, bias=False)
        self.norm = RMSNorm(P, cfg.norm_eps)

    def forward(self, tokens, x):
        c = self.cfg
        B, T = tokens.shape
        z = self.proj(x) * c.dim ** -0.5
        z = self.norm(z.view(B, T, c.n_layers, c.ple_dim))
        t = self.table(tokens).view(B, T, c.n_layers, c.ple_dim)
        return (z + t * math.sqrt(c.ple_dim)) * 2 ** -0.5


class PLEBlock(nn.Module):
    """A layer's PLE residual: norm(proj(gelu_tanh(gate(x)) * u_l)); the gain starts at zero, so a fresh
    model computes what it would without PLE."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.ple_dim, bias=False)
        self.proj = nn.Linear(cfg.ple_dim, cfg.dim, bias=False)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x, u):
        return self.norm(self.proj(F.gelu(self.gate(x), approximate="tanh") * u))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = MoE(cfg) if cfg.n_experts else FeedForward(cfg)
        self.ple = PLEBlock(cfg) if cfg.ple_dim else None

    def forward(self, x, cos, sin, u=None):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        x = x + self.ffn(self.ffn_norm(x))
        return x if self.ple is None else x + self.ple(x, u)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.ple = PLEInputs(cfg) if cfg.ple_dim else None
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = None if cfg.tied else nn.Linear(cfg.dim, cfg.n_out, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():   # GPT-2 style scaled init of residual projections
            if name.endswith("attn.wo.weight") or name.endswith(".w2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))
        for layer in self.layers:
            if layer.ple is not None:
                nn.init.zeros_(layer.ple.norm.weight)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def aux_loss(self) -> torch.Tensor:
        """The mean over MoE layers of their load-balancing losses in the last forward pass (0 without
        experts)."""
        losses = [layer.ffn.aux for layer in self.layers if isinstance(layer.ffn, MoE)]
        return torch.stack(losses).mean() if losses else torch.zeros(())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, n_out]"""
        T = tokens.shape[1]
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {T} exceeds max_seq_len {self.cfg.max_seq_len}")
        x = self.tok_embeddings(tokens)
        u = None if self.ple is None else self.ple(tokens, x)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if u is None else u[:, :, i])
        x = self.norm(x)
        head = self.tok_embeddings.weight[:self.cfg.n_out] if self.output is None else self.output.weight
        return x @ head.t()
