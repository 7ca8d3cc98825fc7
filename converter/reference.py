"""The NumPy reference forward pass and generation: the specification the C engine reproduces bit
for bit (docs/numerics.md states it; converter/numerics.py holds its operations). ``generate`` is what
the device does for one GENERATE (docs/formats.md section 2)."""
from __future__ import annotations

import zlib

import numpy as np

from . import headprune
from .formats import kv_refusal
from .ir import QTensor, QuantModel
from .numerics import (KV_QMAX, QMAX_8, F, PackedMatrix, attend, attend_int, gelu, quantize_activation, rmsnorm,
                       rope, rotate_back, route, silu)
from .sampling import Rng, sample

NO_TOKEN = 0xFFFFFFFF
# GENERATE flags (docs/formats.md section 2): what the device does, and what generate() mirrors
FLAG_LOGITS = 0x1        # a LOGITS frame after every step; implies FLAG_ALL_LOGITS
FLAG_SLIDE = 0x2         # a full context slides its window instead of ending the generation
FLAG_ALL_LOGITS = 0x4    # every step computes the whole output layer, never pruned or skipped


class Reference:
    """Quantized forward pass, one token at a time, with its own KV cache (f32; or codes with one
    scale per row: ``kv="int8"`` K and V codes within +-127, ``kv="k12"`` K codes within +-2047 and V
    codes within +-127)."""

    def __init__(self, qm: QuantModel, kv: str = "f32"):
        c = self.cfg = qm.config
        self.qm = qm
        self.mats = {n: PackedMatrix(t) for n, t in qm.tensors.items() if isinstance(t, QTensor)}
        self.vecs = {n: np.asarray(t, F) for n, t in qm.tensors.items() if not isinstance(t, QTensor)}
        self.head = self.mats["tok_embeddings" if c.tied else "output"].first_rows(c.n_out)
        self.eps = F(c.norm_eps)
        self.att_scale = F(1.0) / np.sqrt(F(c.head_dim))
        self.inv_sqrt_d = F(1.0) / np.sqrt(F(c.dim))
        self.sqrt_p = np.sqrt(F(c.ple_dim))
        self.inv_sqrt2 = F(1.0) / np.sqrt(F(2.0))
        why = kv_refusal(kv, c.head_dim)   # an unknown format, or k12 for a head longer than it holds
        if why:
            raise ValueError(why)
        self.kv = kv
        shape = (c.n_layers, c.max_seq_len, c.n_kv_heads, c.head_dim)
        if kv == "f32":
            self.kc, self.vc = np.zeros(shape, F), np.zeros(shape, F)
        else:   # codes and one scale per (layer, position, kv head) row
            self.kc, self.vc = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
            self.ks, self.vs = np.zeros(shape[:3], F), np.zeros(shape[:3], F)
        self.index = qm.head_index
        # the last pass's routing: per token, per layer, the chosen experts (largest weight first)
        self.routes: list[list[list[int]]] = []

    def ple_inputs(self, token: int, x: np.ndarray) -> np.ndarray:
        """u [L, P]: each layer's per-layer input, from the embedding row x and the table row."""
        c, m, P = self.cfg, self.mats, self.cfg.ple_dim
        z = m["ple.proj"].matvec(x) * self.inv_sqrt_d
        t = m["ple.table"].row(token)
        u = np.empty((c.n_layers, P), F)
        for i in range(c.n_layers):
            zl = rmsnorm(z[i * P:(i + 1) * P], self.vecs["ple.norm"], self.eps)
            u[i] = (zl + t[i * P:(i + 1) * P] * self.sqrt_p) * self.inv_sqrt2
        return u

    def _store(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        c = self.cfg
        k, v = k.reshape(c.n_kv_heads, c.head_dim), v.reshape(c.n_kv_heads, c.head_dim)
        if self.kv == "f32":
            self.kc[layer, pos], self.vc[layer, pos] = k, v
            return
        kq, ks = quantize_activation(k.reshape(-1), c.head_dim, KV_QMAX[self.kv])   # one group per kv head's row
        vq, vs = quantize_activation(v.reshape(-1), c.head_dim, QMAX_8)
        self.kc[layer, pos], self.ks[layer, pos] = kq, ks
        self.vc[layer, pos], self.vs[layer, pos] = vq, vs

    def _attend(self, layer: int, q: np.ndarray, pos: int) -> np.ndarray:
        c, t = self.cfg, pos + 1
        if self.kv == "f32":
            return attend(q, self.kc[layer, :t], self.vc[layer, :t], c.n_heads, c.n_kv_heads, c.head_dim,
                          self.att_scale)
        return attend_int(q, self.kc[layer, :t], self.ks[layer, :t], self.vc[layer, :t], self.vs[layer, :t],
                          c.n_heads, c.n_kv_heads, c.head_dim, self.att_scale, KV_QMAX[self.kv])

    def slide(self, n_drop: int) -> None:
        """Keep position 0, drop positions [1, 1 + n_drop), move [1 + n_drop, S) to [1, S - n_drop)
        with every moved K row rotated back by n_drop positions."""
        c = self.cfg
        S, hd = c.max_seq_len, c.head_dim
        cos, sin = self.qm.rope_cos[n_drop], self.qm.rope_sin[n_drop]
        src, dst = slice(1 + n_drop, S), slice(1, S - n_drop)
        if self.kv == "f32":
            self.kc[:, dst] = rotate_back(self.kc[:, src], cos, sin)
            self.vc[:, dst] = self.vc[:, src]
            return
        k = rotate_back(self.kc[:, src].astype(F) * self.ks[:, src][..., None], cos, sin)
        codes, scales = quantize_activation(k.reshape(-1), hd, KV_QMAX[self.kv])   # one group per row
        self.kc[:, dst] = codes.reshape(k.shape)
        self.ks[:, dst] = scales.reshape(k.shape[:-1])
        self.vc[:, dst], self.vs[:, dst] = self.vc[:, src], self.vs[:, src]

    def body_many(self, tokens, pos: int) -> np.ndarray:
        """Tokens at positions pos, pos + 1, ... through every layer together, as the engine's
        multi-token pass (flm_body_many): their residual streams x [T, dim]. Every token's arithmetic
        is the one-token pass's; each layer stores the K and V rows of all T before token i attends
        positions up to pos + i (causal: it never reads a later token's rows)."""
        c, m, v = self.cfg, self.mats, self.vecs
        hd, n = c.head_dim, len(tokens)
        cos, sin = self.qm.rope_cos[pos:pos + n], self.qm.rope_sin[pos:pos + n]
        x = np.stack([m["tok_embeddings"].row(t) for t in tokens])
        u = [self.ple_inputs(t, x[i]) for i, t in enumerate(tokens)] if c.ple_dim else None
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            xb = np.stack([rmsnorm(xi, v[p + "attn_norm"], self.eps) for xi in x])
            q = [rope(qi, c.n_heads, hd, cos[i], sin[i]) for i, qi in enumerate(m[p + "attn.wq"].matmul(xb))]
            k = [rope(ki, c.n_kv_heads, hd, cos[i], sin[i]) for i, ki in enumerate(m[p + "attn.wk"].matmul(xb))]
            for i, vi in enumerate(m[p + "attn.wv"].matmul(xb)):
                self._store(layer, pos + i, k[i], vi)
            att = np.stack([self._attend(layer, q[i], pos + i) for i in range(n)])
            x = x + m[p + "attn.wo"].matmul(att)
            xb = np.stack([rmsnorm(xi, v[p + "ffn_norm"], self.eps) for xi in x])
            x = x + (self.experts(layer, xb) if c.n_experts else self.ffn(p + "ffn.", xb))
            if u is not None:
                h = gelu(m[p + "ple.gate"].matmul(x)) * np.stack([ui[layer] for ui in u])
                x = x + np.stack([rmsnorm(yi, v[p + "ple.norm"], self.eps) for yi in m[p + "ple.proj"].matmul(h)])
        return x

    def ffn(self, prefix: str, xb: np.ndarray) -> np.ndarray:
        """A SwiGLU FFN (the dense one, or an expert) on inputs xb [T, dim]: w2 (silu(w1 xb) * w3 xb)."""
        m = self.mats
        return m[prefix + "w2"].matmul(silu(m[prefix + "w1"].matmul(xb)) * m[prefix + "w3"].matmul(xb))

    def experts(self, layer: int, xb: np.ndarray) -> np.ndarray:
        """A mixture-of-experts FFN on the pass's normed inputs xb [T, dim]: each token routed (numerics.route),
        then expert by expert in index order the tokens routed to it together (its rows read once for
        all of them), each token's output the sum of weight * expert output over its experts in index
        order (the first term alone, then + each next)."""
        c, n = self.cfg, len(xb)
        routes = [route(self.vecs[f"layers.{layer}.ffn.router"], xi, c.moe_top_k) for xi in xb]
        if layer == 0:
            self.routes = [[] for _ in range(n)]
        for t, (chosen, _) in enumerate(routes):
            self.routes[t].append(chosen)
        y = np.zeros_like(xb)
        started = np.zeros(n, bool)
        for e in range(c.n_experts):
            toks = [t for t, (chosen, _) in enumerate(routes) if e in chosen]
            if not toks:
                continue
            out = self.ffn(f"layers.{layer}.ffn.experts.{e}.", xb[toks])
            for i, t in enumerate(toks):
                chosen, w = routes[t]
                term = w[chosen.index(e)] * out[i]
                y[t] = y[t] + term if started[t] else term
                started[t] = True
        return y

    def body(self, token: int, pos: int) -> np.ndarray:
        """Token at pos through every layer (its K and V rows stored): the residual stream x."""
        return self.body_many([token], pos)[0]

    def head_input(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The final RMSNorm of x, quantized for the head: (codes, scales)."""
        return self.head.quantize_input(rmsnorm(x, self.vecs["norm"], self.eps))

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The whole output layer: out_vocab logits."""
        return self.head.matvec_q(*self.head_input(x))

    def argmax(self, x: np.ndarray) -> tuple[int, int]:
        """The greedy token by the head index's scan (the whole head without one), and the head
        rows it computed."""
        xq, xs = self.head_input(x)
        return headprune.scan(self.index, self.head.matvec_q(xq, xs), xq, xs)[:2]

    def forward(self, token: int, pos: int) -> np.ndarray:
        return self.logits(self.body(token, pos))


PASS_ONE, PASS_PREFILL, PASS_VERIFY = "one", "prefill", "verify"   # the forward pass a step came from
NGRAM_MAX = 3          # prompt lookup matches the context's last 3, 2, then 1 tokens


def lookup_drafts(ctx: list[int], pos: int, k: int) -> list[int]:
    """Prompt lookup: k tokens following the most recent earlier occurrence (ending at j < pos) of
    the context's last n tokens ctx[pos-n+1..pos] (n = NGRAM_MAX down to 1, the longest that occurs
    first): draft i is the token i places after j, the drafts extending the context as they are
    made (so a repeating stretch shorter than k repeats); none when nothing matches."""
    for n in range(NGRAM_MAX, 0, -1):
        if pos < n:
            continue
        tail = ctx[pos - n + 1:pos + 1]
        for j in range(pos - 1, n - 2, -1):
            if ctx[j - n + 1:j + 1] == tail:
                ext = list(ctx[:pos + 1])
                for i in range(1, k + 1):
                    ext.append(ext[j + i])
                return ext[pos + 1:]
    return []


class DraftProposer:
    """The draft model's side of speculative decoding (firmware/app/app_speculate.c): its own cache,
    kept in step with the context — it holds the context's positions [0, pos) — catching up in passes
    of up to ``batch`` tokens before it proposes; its greedy tokens are the drafts."""

    def __init__(self, draft, batch: int):
        self.ref = Reference(draft.qm, draft.kv)
        self.batch = max(1, batch)
        self.pos = 0

    def propose(self, ctx: list[int], pos: int, k: int) -> list[int]:
        while self.pos <= pos:
            n = min(self.batch, pos + 1 - self.pos)
            xs = self.ref.body_many(ctx[self.pos:self.pos + n], self.pos)
            self.pos += n
        d = [self.ref.argmax(xs[-1])[0]]
        while len(d) < k:
            x = self.ref.body(d[-1], pos + len(d))
            self.pos = pos + len(d) + 1
            d.append(self.ref.argmax(x)[0])
        return d

    def accepted(self, pos: int, used: int) -> None:
        """A verifying pass at pos produced `used` steps: rows after them are not the context's."""
        self.pos = min(self.pos, pos + used)

    def slide(self, n_drop: int) -> None:
        self.ref.slide(n_drop)
        self.pos = self.pos - n_drop if self.pos > 1 + n_drop else min(self.pos, 1)


def pass_experts(routes: list[list[list[int]]], n_layers: int) -> dict:
    """The experts a pass read: per layer a bitmask (bit e: expert e ran for some token of the pass)."""
    masks = [0] * n_layers
    for token in routes:
        for layer, chosen in enumerate(token):
            for e in chosen:
                masks[layer] |= 1 << e
    return {"pass_experts": masks}


def step_experts(moe: dict, routes: list[list[list[int]]], i: int) -> dict:
    """A step's expert fields (a model with experts only): its token's chosen experts per layer,
    largest weight first, and its pass's (pass_experts)."""
    return dict(moe, experts=routes[i]) if moe else {}


def generate(qm: QuantModel, prompt_ids, max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 0.0, seed: int = 0, flags: int = 0, kv: str = "f32", batch: int = 1,
             speculate: str = "none", draft_k: int = 0) -> list[dict]:
    """What the device does for one GENERATE with these ``flags`` (FLAG_*), prefill passes of up to
    ``batch`` tokens and ``speculate`` ("none", "lookup", "draft": qm.draft's greedy tokens,
    DraftProposer) with up to ``draft_k`` drafts a pass: one
    record per step — pos (the cache position), in_id, out_id (NO_TOKEN for a prompt step whose
    output is unused), head_rows, logits (the whole output layer when the step computed it, else
    None), logits_crc (their crc32, else 0) and the forward pass it came from (chunk: its first step,
    chunk_len: its tokens, chunk_used: the steps it produced, kind: PASS_*; with experts also experts, the
    step's token's chosen experts per layer, and pass_experts, the pass's per layer as a bitmask) —
    stopping on max tokens,
    any of the model's stop ids (``qm.stops``) or a full context.

    The prompt runs in passes of up to ``batch`` tokens, never crossing the context's end, the last
    of them ending with the prompt's last token; then one token a pass. Without
    FLAG_LOGITS/FLAG_ALL_LOGITS a prompt step whose output is unused skips the head (head_rows 0);
    the last prompt step and the generated ones compute it pruned when greedy, whole when sampling.

    Speculation (greedy only): after the prompt, each pass first drafts k = min(draft_k, tokens still
    to generate - 1, positions left before the context's end - 1) tokens (lookup_drafts); with any,
    the pass verifies them: it runs the last token and the drafts, computes every token's whole head,
    and produces steps while each step's argmax equals the next draft (and is no stop id), plus the
    step after the last accepted draft — so the tokens are plain greedy decoding's, one for one."""
    if speculate not in ("none", "lookup", "draft"):
        raise ValueError(f"speculate must be none, lookup or draft, got {speculate!r}")
    if speculate != "none" and temperature > 0:
        raise ValueError("speculative decoding verifies greedy tokens only (temperature 0)")
    if speculate == "draft" and qm.draft is None:
        raise ValueError("speculate='draft' needs a model carrying a draft (converter.draft.attach)")
    ref, rng = Reference(qm, kv), Rng(seed)
    drafter = DraftProposer(qm.draft, batch) if speculate == "draft" else None
    stops = set(qm.stops.ids)
    every = bool(flags & (FLAG_LOGITS | FLAG_ALL_LOGITS))
    S = qm.config.max_seq_len
    steps, prompt = [], list(prompt_ids)
    ctx = prompt + [0] * (S - len(prompt))      # the id at each cache position
    tok, generated, pos = None, 0, 0        # tok: the last generated token
    while generated < max_new_tokens:
        if pos >= S:
            if not flags & FLAG_SLIDE or S < 3:
                break
            n_drop = (S - 1) // 2
            ref.slide(n_drop)
            if drafter is not None:
                drafter.slide(n_drop)
            pos = S - n_drop
            ctx[1:pos] = ctx[1 + n_drop:S]
        step = len(steps)
        n, drafts = min(batch, len(prompt) - step, S - pos) if step + 1 < len(prompt) else 1, []
        if step >= len(prompt):         # a generated token's pass (ctx holds the prompt's)
            ctx[pos] = tok
        if step + 1 >= len(prompt) and speculate != "none":
            k = min(draft_k, max_new_tokens - generated - 1, S - 1 - pos)
            drafts = [] if k <= 0 else drafter.propose(ctx, pos, k) if drafter else lookup_drafts(ctx, pos, k)
            ctx[pos + 1:pos + 1 + len(drafts)] = drafts
            n += len(drafts)
        xs = ref.body_many(ctx[pos:pos + n], pos)
        moe = pass_experts(ref.routes, qm.config.n_layers) if qm.config.n_experts else {}
        if drafts:                      # verify: every token's head, the argmax of each
            logits = [ref.logits(x) for x in xs]
            outs = [int(np.argmax(lg)) for lg in logits]
            used = 1
            while used < n and outs[used - 1] == ctx[pos + used] and outs[used - 1] not in stops:
                used += 1
            for i in range(used):
                steps.append(dict(pos=pos + i, in_id=ctx[pos + i], out_id=outs[i], head_rows=qm.config.n_out,
                                  logits=logits[i], logits_crc=zlib.crc32(logits[i].tobytes()),
                                  chunk=step, chunk_len=n, chunk_used=used, kind=PASS_VERIFY,
                                  **step_experts(moe, ref.routes, i)))
            generated += used
            tok, out = outs[used - 1], outs[used - 1]
            if drafter is not None:
                drafter.accepted(pos, used)
            pos += used
            if out in stops:
                break
            continue
        used = step + n >= len(prompt)
        out, rows, logits = NO_TOKEN, 0, [None] * n
        if every:
            logits = [ref.logits(x) for x in xs]
            rows = qm.config.n_out
        elif used and temperature > 0:
            logits[-1] = ref.logits(xs[-1])
            rows = qm.config.n_out
        if used:
            if logits[-1] is None:
                out, rows = ref.argmax(xs[-1])
            else:
                out = sample(logits[-1], temperature, top_p, rng)
            generated += 1
            tok = out
        kind = PASS_PREFILL if n > 1 else PASS_ONE
        for i in range(n):
            lg = logits[i]
            steps.append(dict(pos=pos + i, in_id=ctx[pos + i], out_id=out if i == n - 1 else NO_TOKEN,
                              head_rows=rows if every or i == n - 1 else 0, logits=lg,
                              logits_crc=zlib.crc32(lg.tobytes()) if lg is not None else 0,
                              chunk=step, chunk_len=n, chunk_used=n, kind=kind, **step_experts(moe, ref.routes, i)))
        pos += n
        if out in stops:
            break
    return steps
