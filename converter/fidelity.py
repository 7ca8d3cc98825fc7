"""How far a quantized model is from its fp32 original: per-tensor weight error, and the logits'
top-1 agreement and KL divergence on sampled positions (``flashlm convert``'s quality report); with
experts also how often the quantized model's routers choose the fp32 model's experts."""
from __future__ import annotations

import numpy as np

from .ir import ModelIR, QTensor, QuantModel
from .numerics import F, attend, rope, top_k
from .reference import Reference


class Fp32Model:
    """The same architecture in plain float math on the unquantized weights (no activation
    quantization, numpy's own sums and exp): what the quantized model is measured against."""

    def __init__(self, ir: ModelIR, rope_cos: np.ndarray, rope_sin: np.ndarray):
        c = self.cfg = ir.config
        self.w = {n: (t.dequantize() if isinstance(t, QTensor) else np.asarray(t, F))
                  for n, t in ir.tensors.items()}
        self.cos, self.sin = rope_cos, rope_sin
        self.kc = np.zeros((c.n_layers, c.max_seq_len, c.n_kv_heads, c.head_dim), F)
        self.vc = np.zeros_like(self.kc)
        self.routes: list[list[int]] = []       # the last forward's chosen experts per layer

    def ffn(self, prefix: str, xb: np.ndarray) -> np.ndarray:
        w = self.w
        h1 = w[prefix + "w1"] @ xb
        return w[prefix + "w2"] @ ((h1 / (F(1) + np.exp(-h1))) * (w[prefix + "w3"] @ xb))

    def experts(self, layer: int, xb: np.ndarray) -> np.ndarray:
        """The mixture: the top k router logits, their softmax, the chosen experts' weighted sum."""
        r = self.w[f"layers.{layer}.ffn.router"] @ xb
        chosen = top_k(r, self.cfg.moe_top_k)
        e = np.exp(r[chosen] - r[chosen[0]])
        self.routes.append(chosen)
        return sum(wt * self.ffn(f"layers.{layer}.ffn.experts.{c}.", xb) for c, wt in zip(chosen, e / e.sum()))

    def forward(self, token: int, pos: int) -> np.ndarray:
        c, w = self.cfg, self.w
        hd, eps = c.head_dim, F(c.norm_eps)

        def norm(x, g):
            return (x / np.sqrt(np.mean(x * x) + eps) * g).astype(F)

        cos, sin = self.cos[pos], self.sin[pos]
        self.routes = []
        x = w["tok_embeddings"][token].copy()
        P = c.ple_dim
        if P:
            z = (w["ple.proj"] @ x) / np.sqrt(F(c.dim))
            t = w["ple.table"][token]
            u = [(norm(z[i * P:(i + 1) * P], w["ple.norm"]) + t[i * P:(i + 1) * P] * np.sqrt(F(P))) / np.sqrt(F(2))
                 for i in range(c.n_layers)]
        for i in range(c.n_layers):
            p = f"layers.{i}."
            xb = norm(x, w[p + "attn_norm"])
            q = rope(w[p + "attn.wq"] @ xb, c.n_heads, hd, cos, sin)
            self.kc[i, pos] = rope(w[p + "attn.wk"] @ xb, c.n_kv_heads, hd, cos, sin).reshape(-1, hd)
            self.vc[i, pos] = (w[p + "attn.wv"] @ xb).reshape(-1, hd)
            att = attend(q, self.kc[i, :pos + 1], self.vc[i, :pos + 1], c.n_heads, c.n_kv_heads,
                         hd, F(1.0 / np.sqrt(hd)), exp=np.exp)
            x = x + w[p + "attn.wo"] @ att
            xb = norm(x, w[p + "ffn_norm"])
            x = x + (self.experts(i, xb) if c.n_experts else self.ffn(p + "ffn.", xb))
            if P:
                g = w[p + "ple.gate"] @ x
                g = F(0.5) * g * (F(1) + np.tanh(np.sqrt(F(2 / np.pi)) * (g + F(0.044715) * g ** 3)))
                x = x + norm(w[p + "ple.proj"] @ (g * u[i]), w[p + "ple.norm"])
        head = w["tok_embeddings" if c.tied else "output"][:c.n_out]
        return (head @ norm(x, w["norm"])).astype(F)


def quality_report(ir: ModelIR, qm: QuantModel, positions: int = 48, tokens=None, seed: int = 0) -> dict:
    """Per-tensor weight error, and on a sample of positions the logits' top-1 agreement and
    KL(fp32 || quantized), both models fed the same token sequence; with experts the share of
    (position, layer) choices where the quantized model's router picks the fp32 model's experts."""
    rows = []
    for name, q in qm.tensors.items():
        if not isinstance(q, QTensor):
            continue
        src = ir.tensors[name]
        w = src.dequantize() if isinstance(src, QTensor) else np.asarray(src, np.float32)
        err = q.dequantize().astype(np.float64) - w
        denom = float(np.sqrt(np.mean(w.astype(np.float64) ** 2))) or 1.0
        rows.append(dict(name=name, format=q.fmt, group_size=q.group_size,
                         rel_rmse=float(np.sqrt(np.mean(err ** 2)) / denom),
                         max_abs_err=float(np.abs(err).max())))
    n = min(positions, qm.config.max_seq_len)
    if tokens is None:
        tokens = np.random.default_rng(seed).integers(0, qm.config.vocab_size, n).tolist()
    tokens = list(tokens)[:n]
    ref, fp = Reference(qm), Fp32Model(ir, qm.rope_cos, qm.rope_sin)
    agree, kls, same_route = 0, [], []
    for pos, tok in enumerate(tokens):
        lq = ref.forward(tok, pos).astype(np.float64)
        lf = fp.forward(tok, pos).astype(np.float64)
        agree += int(np.argmax(lq) == np.argmax(lf))
        same_route += [set(a) == set(b) for a, b in zip(ref.routes[0] if ref.routes else [], fp.routes)]
        pf = np.exp(lf - lf.max()); pf /= pf.sum()
        lpq = lq - lq.max() - np.log(np.exp(lq - lq.max()).sum())
        lpf = np.log(np.maximum(pf, 1e-300))
        kls.append(float(np.sum(pf * (lpf - lpq))))
    out = dict(tensors=rows, positions=len(tokens), top1_agreement=agree / max(len(tokens), 1),
               kl_mean=float(np.mean(kls)) if kls else 0.0)
    if same_route:
        out["router_agreement"] = float(np.mean(same_route))
    return out
