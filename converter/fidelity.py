"""How far a quantized model is from its fp32 original, with the device's numerics (the NumPy
reference with the blob's KV format: integer attention over an int8 cache included): per-tensor weight
error; teacher-forced on text the fp32 model sampled itself, the logits' top-1 agreement, mean
KL(fp32 || quantized) and the extra cross-entropy per token (ΔCE); greedy agreement, how many tokens of
fp32's greedy continuation of a prompt the quantized model repeats before it first differs; with
experts how often the quantized model's routers choose the fp32 model's experts. One measure for
``flashlm convert``'s quality report, ``flashlm eval --fidelity`` and ``make bench``'s fidelity section."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .formats import KV_DEFAULT
from .ir import ModelIR, QTensor, QuantModel
from .numerics import F, attend, rope, top_k
from .quantize import rope_tables
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
        # when a dict: per matrix the sum of x x^T (float64) over the inputs it multiplies (calibrate.py)
        self.taps: dict[str, np.ndarray] | None = None

    def mv(self, name: str, x: np.ndarray, rows: int | None = None) -> np.ndarray:
        """Matrix ``name`` (its first ``rows`` rows) times x, the input counted in ``taps`` when on."""
        if self.taps is not None:
            x64 = x.astype(np.float64)
            self.taps[name] = self.taps.get(name, 0) + np.outer(x64, x64)
        return self.w[name][:rows] @ x

    def ffn(self, prefix: str, xb: np.ndarray) -> np.ndarray:
        w = self.w
        h1 = self.mv(prefix + "w1", xb)
        return self.mv(prefix + "w2", (h1 / (F(1) + np.exp(-h1))) * self.mv(prefix + "w3", xb))

    def experts(self, layer: int, xb: np.ndarray) -> np.ndarray:
        """The mixture: the top k router logits, their softmax, the chosen experts' weighted sum."""
        r = self.mv(f"layers.{layer}.ffn.router", xb)
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
            z = self.mv("ple.proj", x) / np.sqrt(F(c.dim))
            t = w["ple.table"][token]
            u = [(norm(z[i * P:(i + 1) * P], w["ple.norm"]) + t[i * P:(i + 1) * P] * np.sqrt(F(P))) / np.sqrt(F(2))
                 for i in range(c.n_layers)]
        for i in range(c.n_layers):
            p = f"layers.{i}."
            xb = norm(x, w[p + "attn_norm"])
            q = rope(self.mv(p + "attn.wq", xb), c.n_heads, hd, cos, sin)
            self.kc[i, pos] = rope(self.mv(p + "attn.wk", xb), c.n_kv_heads, hd, cos, sin).reshape(-1, hd)
            self.vc[i, pos] = self.mv(p + "attn.wv", xb).reshape(-1, hd)
            att = attend(q, self.kc[i, :pos + 1], self.vc[i, :pos + 1], c.n_heads, c.n_kv_heads,
                         hd, F(1.0 / np.sqrt(hd)), exp=np.exp)
            x = x + self.mv(p + "attn.wo", att)
            xb = norm(x, w[p + "ffn_norm"])
            x = x + (self.experts(i, xb) if c.n_experts else self.ffn(p + "ffn.", xb))
            if P:
                g = self.mv(p + "ple.gate", x)
                g = F(0.5) * g * (F(1) + np.tanh(np.sqrt(F(2 / np.pi)) * (g + F(0.044715) * g ** 3)))
                x = x + norm(self.mv(p + "ple.proj", g * u[i]), w[p + "ple.norm"])
        return self.mv("tok_embeddings" if c.tied else "output", norm(x, w["norm"]), c.n_out).astype(F)


def bos_of(ir: ModelIR) -> int:
    """The token a sampled text starts from: the tokenizer's BOS, else 1 (llama2.c's, whose v0/v1
    checkpoints carry no tokenizer)."""
    t = ir.tokenizer
    return t.bos_id if t is not None and t.bos_id is not None else 1


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@dataclass
class Probe:
    """What every recipe is measured on, with fp32's answers computed once: teacher-forced sequences
    (BOS first; position p predicts seq[p + 1]) with fp32's logits and expert choices at every
    position, and greedy prompts with fp32's greedy continuation."""
    seqs: list[list[int]]
    fp_logp: list[np.ndarray]                       # log-softmax of fp32's logits [len(seq) - 1, n_out]
    fp_routes: list[list[list[int]]]                # per sequence, per position: per layer the experts
    prompts: list[list[int]] = field(default_factory=list)
    fp_greedy: list[list[int]] = field(default_factory=list)

    @property
    def positions(self) -> int:
        return sum(len(s) - 1 for s in self.seqs)


def fp32_model(ir: ModelIR) -> Fp32Model:
    return Fp32Model(ir, *rope_tables(ir.config))


def sample_text(ir: ModelIR, positions: int, seed: int = 0, tokens=None, say=None, answers: bool = True) -> Probe:
    """Sequences of at most the context's length holding ``positions`` predictions in all, sampled
    from fp32 at temperature 1 from BOS (numpy's generator seeded with ``seed``), or the one sequence
    ``tokens`` when given (its first ``positions`` predictions, as many as it and the context hold);
    ``say(done, positions)`` after each sequence. ``answers`` False keeps the tokens alone, not fp32's
    distributions and routes (a long text of a large vocabulary's would not fit in memory)."""
    fp, c = fp32_model(ir), ir.config
    rng = np.random.default_rng(seed)
    probe = Probe([], [], [])
    left = positions if tokens is None else min(positions, len(tokens) - 1)
    while left > 0:
        n = min(left, c.max_seq_len)
        seq = [bos_of(ir)] if tokens is None else list(tokens[:n + 1])
        logp, routes = [], []
        for pos in range(n):
            lp = log_softmax(fp.forward(seq[pos], pos))
            if answers:
                logp.append(lp)
                routes.append(fp.routes)
            if tokens is None:
                p = np.exp(lp)
                seq.append(int(rng.choice(len(p), p=p / p.sum())))
        probe.seqs.append(seq[:n + 1])
        if answers:
            probe.fp_logp.append(np.stack(logp[:len(seq) - 1]))
            probe.fp_routes.append(routes)
        left = 0 if tokens is not None else left - n
        if say is not None:
            say(probe.positions, positions)
    return probe


def fp32_greedy(ir: ModelIR, probe: Probe, prompts: int, tokens: int, prompt_len: int = 16) -> None:
    """Adds ``prompts`` distinct prompts (BOS and prompt_len - 1 tokens fp32 samples, one sampling seed
    each from 1000 on, a seed whose prompt repeats an earlier one skipped: a small model's stories often
    begin alike) and fp32's greedy continuation of each, ``tokens`` long (or to the context's end)."""
    fp, c = fp32_model(ir), ir.config
    n = min(tokens, c.max_seq_len - prompt_len)
    seed = 1000
    while len(probe.prompts) < prompts and seed < 1000 + 20 * prompts:
        p = sample_text(ir, prompt_len - 1, seed=seed).seqs[0]
        seed += 1
        if p in probe.prompts:
            continue
        probe.prompts.append(p)
        probe.fp_greedy.append(continue_greedy(lambda t, pos: int(np.argmax(fp.forward(t, pos))), p, n))


def continue_greedy(step, prompt: list[int], n: int) -> list[int]:
    """n tokens after ``prompt``, each the argmax ``step(token, pos)`` returns for the one before."""
    out, nxt = [], 0
    for pos, t in enumerate(prompt):
        nxt = step(t, pos)
    for pos in range(len(prompt), len(prompt) + n):
        out.append(nxt)
        if len(out) < n:
            nxt = step(nxt, pos)
    return out


def teacher_forced(qm: QuantModel, kv: str, probe: Probe) -> dict:
    """The reference (device numerics, ``kv`` cache) fed the probe's sequences: top-1 agreement with
    fp32, mean KL(fp32 || quantized), ΔCE (quantized minus fp32 cross-entropy of the sampled next
    token, nats per token), and with experts the router agreement."""
    ref = Reference(qm, kv)
    agree, kls, dce, same_route = 0, [], [], []
    for seq, fpl, fpr in zip(probe.seqs, probe.fp_logp, probe.fp_routes):
        for pos in range(len(seq) - 1):
            lq = log_softmax(ref.forward(seq[pos], pos))
            lf = fpl[pos]
            agree += int(np.argmax(lq) == np.argmax(lf))
            kls.append(float(np.sum(np.exp(lf) * (lf - lq))))
            dce.append(float(lf[seq[pos + 1]] - lq[seq[pos + 1]]))
            same_route += [set(a) == set(b) for a, b in zip(ref.routes[0] if ref.routes else [], fpr[pos])]
    n = max(len(kls), 1)
    out = dict(positions=len(kls), kv=kv, top1_agreement=agree / n, kl_mean=float(np.sum(kls)) / n,
               delta_ce=float(np.sum(dce)) / n)
    if same_route:
        out["router_agreement"] = float(np.mean(same_route))
    return out


def greedy_agreement(qm: QuantModel, kv: str, probe: Probe) -> dict:
    """Per prompt, the tokens of fp32's greedy continuation the reference's greedy decoding (the
    device's: the head index's scan) repeats before its first different token; their median."""
    matched = []
    for prompt, want in zip(probe.prompts, probe.fp_greedy):
        ref = Reference(qm, kv)
        got = continue_greedy(lambda t, pos: ref.argmax(ref.body(t, pos))[0], prompt, len(want))
        diff = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        matched.append(diff[0] if diff else len(want))
    return dict(prompts=len(matched), tokens=len(probe.fp_greedy[0]) if probe.fp_greedy else 0, matched=matched,
                median=float(np.median(matched)) if matched else 0.0)


def tensor_errors(ir: ModelIR, qm: QuantModel) -> list[dict]:
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
    return rows


def quality_report(ir: ModelIR, qm: QuantModel, kv: str = KV_DEFAULT, positions: int = 256, tokens=None,
                   seed: int = 0) -> dict:
    """``flashlm convert``'s report: per-tensor weight error, and teacher_forced over ``positions``
    predictions of fp32's own sampled text (or of the sequence ``tokens``) with the ``kv`` cache."""
    probe = sample_text(ir, positions, seed, tokens)
    return dict(tensors=tensor_errors(ir, qm), **teacher_forced(qm, kv, probe))
