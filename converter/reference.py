"""The NumPy reference forward pass: the specification the C engine reproduces bit for bit.

Every float is IEEE binary32 and every operation has one order (the C engine in
firmware/engine/ does the same operations in the same order):

* sequential sums are left folds that start from the first term: ((t0 + t1) + t2) + ...
  (``np.add.accumulate`` is such a fold; ``np.sum`` is not and is never used on floats here);
* activation quantization, per group of the matrix's activation group (its group size; the whole
  input, one group, for a row-scaled matrix):
  ``amax = max|x|``; if 0 all codes and the scale are 0, else ``scale = amax / 127``,
  ``inv = 127 / amax``, ``v = x * inv`` clamped to ±127 (NaN: 0), ``code = trunc(v + (v >= 0 ? 0.5 : -0.5))``;
* matmul row r: ``isum_g = sum_k wcode * xcode`` (int32, exact); with a float scale per group
  ``term_g = float(isum_g) * (wscale_rg * xscale_g)``, ``y_r = fold(term_g)``; row-scaled (one
  activation scale X, row scale S_r, group multipliers k_rg): ``acc = sum_g k_rg * isum_g`` (exact
  integer, below 2^40), ``y_r = float(acc) * (S_r * X)`` (acc rounded once to binary32);
* RMSNorm: ``ss = fold(x*x) / n + eps``, ``inv = 1 / sqrt(ss)`` (IEEE sqrt), ``y = (x * inv) * w``;
* RoPE with converter-written tables: ``(a*c - b*s, a*s + b*c)`` on pairs (2i, 2i+1);
* attention: ``s_t = fold(q*k_t) * (1/sqrt(head_dim))``, softmax ``e = exp(s - max)``,
  ``a = e * (1 / fold(e))``, ``out = fold_t(a_t * v_t)``;
* ``exp`` is ``fexp`` below (a 257-entry table of 2^(j/256), interpolated, no libm), SiLU is
  ``x / (1 + fexp(-x))``; GELU (tanh approximation) is ``u = x * (K0 + K1 * (x * x))``,
  ``x / (1 + fexp(-(u + u)))`` with K0 = sqrt(2/pi) and K1 = sqrt(2/pi) * 0.044715, each rounded
  once to binary32;
* Per-Layer Embeddings (``ple_dim`` P > 0, L layers, d = dim), for token t:
  before layer 0 ("embed"): ``z = matvec(ple.proj, x) * inv_sqrt_d`` with
  ``inv_sqrt_d = 1 / sqrt(d)``, then per layer l
  ``u_l = (rmsnorm(z[lP:(l+1)P], ple.norm) + (T[t][lP:(l+1)P] * sqrt_P)) * inv_sqrt2``
  (T[t]: the dequantized table row; ``sqrt_P = sqrt(P)``, ``inv_sqrt2 = 1 / sqrt(2)``);
  after each layer's FFN ("ple"): ``h = gelu(matvec(layers.l.ple.gate, x)) * u_l``,
  ``x = x + rmsnorm(matvec(layers.l.ple.proj, h), layers.l.ple.norm)``;
* the head computes ``out_vocab`` rows (a tied head: the first rows of the embedding); sampling
  runs over them. A greedy step computes it pruned (converter/headprune.py: the same token, fewer
  rows); a prompt step whose output is unused skips the final RMSNorm and the head (``generate``);
* int8 KV cache (``kv="int8"``): each (layer, position, kv head) K and V row is quantized like an
  activation with group = head_dim (codes, one scale); a head's query is quantized the same way
  once per step; the attention is then integer but for one float product per position on each
  side and one per output (``attend_int8``: scores in fixed-point log2 units, softmax weights by
  the exp table in Q15, the V scales folded into them and the result quantized to integers under
  one power-of-two scale, ``out_i = float(sum_t wc_t * vc_t[i]) * ((1 / sum p) * W)``);
* sliding window (``generate`` with FLAG_SLIDE): when the context is full, position 0 stays,
  ``n_drop = (S-1)//2`` positions after it are dropped, the rest move down by n_drop; a moved K row
  is rotated back by n_drop: ``(a, b) -> (a*c + b*s, b*c - a*s)`` with c, s the RoPE tables' row
  n_drop (an int8 K row is dequantized ``code * scale`` first and quantized again after).
"""
from __future__ import annotations

import zlib

import numpy as np

from . import headprune
from .ir import ModelIR, QTensor
from .quantize import QuantModel

F = np.float32
NO_TOKEN = 0xFFFFFFFF
KV_FORMATS = ("f32", "int8")
# GENERATE flags (docs/formats.md section 2): what the device does, and what generate() mirrors
FLAG_LOGITS = 0x1        # a LOGITS frame after every step; implies FLAG_ALL_LOGITS
FLAG_SLIDE = 0x2         # a full context slides its window instead of ending the generation
FLAG_ALL_LOGITS = 0x4    # every step computes the whole output layer, never pruned or skipped

LOG2E = F(1.44269504088896341)
EXP_LO, EXP_HI = F(-86.0), F(88.0)
EXP_T = F(LOG2E * F(65536.0))          # fexp's x -> log2 units, 16 fractional bits (exact: a power of two)
# 2^(j/256) in Q23 for j = 0..256 (2^23 .. 2^24): firmware/engine/flm_math.c holds the same literal
EXP2_Q23 = np.round(2.0 ** (np.arange(257) / 256.0) * 2.0 ** 23).astype(np.int64)


def round_half_away(v: np.ndarray) -> np.ndarray:
    return (v + np.where(v >= 0, F(0.5), F(-0.5)).astype(F)).astype(np.int32)


def exp2_frac(f) -> np.ndarray:
    """2^(f / 65536) in Q23 for integers f in [0, 65536): the table's neighbours j = f >> 8 and
    j + 1, interpolated linearly by the low 8 bits (floor): in [2^23, 2^24)."""
    f = np.asarray(f, np.int64)
    j, r = f >> 8, f & 255
    lo = EXP2_Q23[j]
    return lo + (((EXP2_Q23[j + 1] - lo) * r) >> 8)


def fexp(x) -> np.ndarray:
    """exp by a table: n = round_half_away(x * EXP_T), 2^(n / 65536) = 2^(n >> 16) * exp2_frac(n & 0xFFFF)
    / 2^23, packed straight into a binary32 (normal for x in [-86, 88]; below 0, above +inf, NaN
    stays NaN). Relative error below 7e-6."""
    x = np.asarray(x, F)
    with np.errstate(invalid="ignore"):                  # NaN: replaced below
        xc = np.clip(x, EXP_LO, EXP_HI)
        n = round_half_away((xc * EXP_T).astype(F)).astype(np.int64)       # |n| < 2^23
    bits = ((n >> 16) + 127) * 2 ** 23 + exp2_frac(n & 0xFFFF) - 2 ** 23
    y = bits.astype(np.uint32).view(F)
    y = np.where(x < EXP_LO, F(0.0), y)
    y = np.where(np.isnan(x), x, y)
    return np.where(x > EXP_HI, F(np.inf), y).astype(F)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (x / (F(1.0) + fexp(-x))).astype(F)


GELU_K0 = F(0.7978845608028654)                 # sqrt(2/pi)
GELU_K1 = F(0.7978845608028654 * 0.044715)      # sqrt(2/pi) * 0.044715, rounded once


def gelu(x: np.ndarray) -> np.ndarray:
    """tanh-approximation GELU as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    x = np.asarray(x, F)
    with np.errstate(over="ignore", invalid="ignore"):
        u = x * (GELU_K0 + GELU_K1 * (x * x))
        return (x / (F(1.0) + fexp(-(u + u)))).astype(F)


def fold(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sequential left-fold sum along ``axis`` (the engine's loop order)."""
    return np.take(np.add.accumulate(a, axis=axis, dtype=F), -1, axis=axis)


def quantize_activation(x: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """-> codes int32 [n_groups, group_size] (zero-padded), scales f32 [n_groups]."""
    n = x.shape[0]
    ng = -(-n // group_size)
    xp = np.zeros(ng * group_size, F)
    xp[:n] = x
    xp = xp.reshape(ng, group_size)
    amax = np.abs(xp).max(axis=1)
    nz = amax > 0
    safe = np.where(nz, amax, F(1.0))
    scale = np.where(nz, safe / F(127.0), F(0.0)).astype(F)
    with np.errstate(over="ignore", invalid="ignore"):   # amax below 127/FLT_MAX: inv is inf
        inv = (F(127.0) / safe).astype(F)
        v = np.clip(xp * inv[:, None], F(-127), F(127))   # clamped before rounding, NaN (0 * inf) to 0,
    codes = round_half_away(np.where(np.isnan(v), F(0), v))   # as kernels.c: the same codes for finite v
    codes[~nz] = 0
    return codes, scale


class PackedMatrix:
    """A QTensor with codes padded to whole groups, as int32, ready for exact integer dots."""

    def __init__(self, q: QTensor):
        rows, cols = q.shape
        self.q, self.group_size, self.rows, self.cols = q, q.group_size, rows, cols
        ng = q.n_groups
        c = np.zeros((rows, ng * q.group_size), np.int32)
        c[:, :cols] = q.codes
        self.codes = c.reshape(rows, ng, q.group_size)
        self.scales = q.scales.astype(F)
        # the activation quantization's group: one for the whole input when row-scaled
        self.act_group = cols if q.rowscale else q.group_size

    def matvec(self, x: np.ndarray) -> np.ndarray:
        return self.matvec_q(*quantize_activation(x, self.act_group))

    def matvec_q(self, xq: np.ndarray, xs: np.ndarray) -> np.ndarray:
        """The matvec of an input already quantized by quantize_activation (codes, scales)."""
        if self.q.rowscale:
            _, ng, g = self.codes.shape
            x = np.zeros(ng * g, np.int64)
            x[:self.cols] = xq.reshape(-1)[:self.cols]
            isum = np.einsum("rgk,gk->rg", self.codes, x.reshape(ng, g), dtype=np.int64)
            acc = np.einsum("rg,rg->r", isum, self.q.mult.astype(np.int64))
            # |acc| < 2^53: exact in float64, then rounded once to binary32
            return acc.astype(np.float64).astype(F) * (self.scales[:, 0] * xs[0])
        isum = np.einsum("rgk,gk->rg", self.codes, xq, dtype=np.int64).astype(np.int32)
        terms = isum.astype(F) * (self.scales * xs[None, :])
        return fold(terms, axis=1)

    def matmul(self, xs: np.ndarray) -> np.ndarray:
        """The matvec of each of several inputs xs [T, cols] -> [T, rows]: the engine's multi-token
        product (each weight row read once for all T), every token's arithmetic its matvec's."""
        return np.stack([self.matvec(x) for x in xs])

    def row(self, r: int) -> np.ndarray:
        return self.q.dequantize(r)

    def first_rows(self, n: int) -> "PackedMatrix":
        """The matrix of rows [0, n) (a tied head over out_vocab rows)."""
        return PackedMatrix(self.q.take_rows(slice(0, n)))


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: np.float32) -> np.ndarray:
    ss = fold(x * x) / F(x.shape[0]) + eps
    inv = F(1.0) / np.sqrt(F(ss))
    return ((x * inv) * w).astype(F)


def rope(v: np.ndarray, n_heads: int, hd: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    v = v.reshape(n_heads, hd // 2, 2)
    a, b = v[:, :, 0], v[:, :, 1]
    out = np.empty_like(v)
    out[:, :, 0] = a * cos - b * sin
    out[:, :, 1] = a * sin + b * cos
    return out.reshape(-1)


def attend(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, n_heads: int, n_kv: int, hd: int,
           scale: np.float32, exp=fexp) -> np.ndarray:
    """q [n_heads*hd], kc/vc [T, n_kv, hd] -> [n_heads*hd]"""
    rep = n_heads // n_kv
    out = np.empty(n_heads * hd, F)
    for h in range(n_heads):
        kh = h // rep
        qh = q[h * hd:(h + 1) * hd]
        s = fold(qh[None, :] * kc[:, kh, :], axis=1) * scale
        e = exp(s - s.max())
        a = e * (F(1.0) / fold(e))
        out[h * hd:(h + 1) * hd] = fold(a[:, None] * vc[:, kh, :], axis=0)
    return out


def to_fixed(v: np.ndarray) -> np.ndarray:
    """int64: the integer nearest to the binary32 v (ties away from zero), v clamped to +-2^30
    first; NaN gives 0."""
    v = np.clip(np.nan_to_num(np.asarray(v, np.float64), nan=0.0), -2.0 ** 30, 2.0 ** 30)
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int64)


def softmax_q15(n: np.ndarray) -> np.ndarray:
    """int64 weights p_t = 2^(d_t / 2^16) in Q15, d_t = n_t - max n (<= 0, log2 units with 16
    fractional bits): exp2_frac(d & 0xFFFF) >> (8 - (d >> 16)), 0 from a shift of 24 on (2^15 at the max)."""
    d = n - n.max()
    sh = 8 - (d >> 16)
    return np.where(sh < 24, exp2_frac(d & 0xFFFF) >> np.minimum(sh, 24), 0)


def pow2_f32(e: int) -> np.float32:
    """2^e as binary32: subnormal from -127 down, 0 below -149, inf above 127."""
    return F(np.ldexp(1.0, e)) if -149 <= e <= 127 else F(0.0) if e < -149 else F(np.inf)


def attend_int8(q: np.ndarray, kc: np.ndarray, ks: np.ndarray, vc: np.ndarray, vs: np.ndarray,
                n_heads: int, n_kv: int, hd: int, scale: np.float32) -> np.ndarray:
    """q [n_heads*hd]; K/V codes [T, n_kv, hd] (int32) and scales [T, n_kv] -> [n_heads*hd]: integer
    attention (docs/formats.md section 1.2). Per head: the query quantized (qc, qs), scores in log2
    units with 16 fractional bits n_t = to_fixed(float(sum qc*kc_t) * (ks_t * (qs * kq))), kq =
    (scale * LOG2E) * 2^16; weights p_t = softmax_q15(n); w_t = float(p_t) * vs_t; wc_t = the integer
    nearest to w_t / W (ties away), W = 2^E the smallest power of two with max w <= 2^(24 - bitlen(T)) W;
    out_i = float(sum_t wc_t * vc_t[i]) * ((1 / float(sum p)) * W), or 0 when every w_t is 0."""
    rep = n_heads // n_kv
    T = kc.shape[0]
    kT = 24 - int(T).bit_length()                 # sum_t wc_t * 127 < 2^24 * 127 < 2^31
    kq = F(F(scale * LOG2E) * F(65536.0))
    out = np.zeros(n_heads * hd, F)
    for h in range(n_heads):
        kh = h // rep
        qc, qs = quantize_activation(q[h * hd:(h + 1) * hd], hd)
        isum = (kc[:, kh, :].astype(np.int64) @ qc[0].astype(np.int64)).astype(np.int32)
        c = F(qs[0] * kq)
        with np.errstate(over="ignore", invalid="ignore"):
            n = to_fixed(isum.astype(F) * (ks[:, kh] * c))
        p = softmax_q15(n)
        with np.errstate(over="ignore", invalid="ignore"):
            w = p.astype(F) * vs[:, kh]
        w = np.where(np.isfinite(w), w, F(0))      # a broken model's inf/NaN scales weigh nothing
        wmax = F(w.max())
        if not wmax > 0:
            continue
        m, e = np.frexp(np.float64(wmax))                   # wmax = m 2^e, m in [0.5, 1)
        E = int(e) - (m == 0.5) - kT                        # 2^(E + kT) >= wmax > 2^(E + kT - 1)
        wc = np.floor(w.astype(np.float64) / np.ldexp(1.0, E) + 0.5).astype(np.int64)   # exact: w >= 0
        acc = (wc @ vc[:, kh, :].astype(np.int64)).astype(np.int32)
        with np.errstate(over="ignore", invalid="ignore"):
            c2 = F(F(F(1.0) / F(p.sum())) * pow2_f32(E))
            out[h * hd:(h + 1) * hd] = acc.astype(F) * c2
    return out


def rotate_back(k: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """K rows [..., hd] rotated by minus the angle of one RoPE table row (pairs (2i, 2i+1))."""
    v = k.reshape(*k.shape[:-1], -1, 2)
    a, b = v[..., 0], v[..., 1]
    out = np.empty_like(v)
    out[..., 0] = a * cos + b * sin
    out[..., 1] = b * cos - a * sin
    return out.reshape(k.shape)


class Reference:
    """Quantized forward pass, one token at a time, with its own KV cache (f32, or int8 codes
    with one scale per row: ``kv="int8"``)."""

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
        if kv not in KV_FORMATS:
            raise ValueError(f"KV cache format must be one of {KV_FORMATS}, got {kv!r}")
        self.kv = kv
        shape = (c.n_layers, c.max_seq_len, c.n_kv_heads, c.head_dim)
        if kv == "f32":
            self.kc, self.vc = np.zeros(shape, F), np.zeros(shape, F)
        else:   # codes and one scale per (layer, position, kv head) row
            self.kc, self.vc = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
            self.ks, self.vs = np.zeros(shape[:3], F), np.zeros(shape[:3], F)
        self.index = qm.head_index

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
        kq, ks = quantize_activation(k.reshape(-1), c.head_dim)     # one group per kv head's row
        vq, vs = quantize_activation(v.reshape(-1), c.head_dim)
        self.kc[layer, pos], self.ks[layer, pos] = kq, ks
        self.vc[layer, pos], self.vs[layer, pos] = vq, vs

    def _attend(self, layer: int, q: np.ndarray, pos: int) -> np.ndarray:
        c, t = self.cfg, pos + 1
        if self.kv == "f32":
            return attend(q, self.kc[layer, :t], self.vc[layer, :t], c.n_heads, c.n_kv_heads, c.head_dim,
                          self.att_scale)
        return attend_int8(q, self.kc[layer, :t], self.ks[layer, :t], self.vc[layer, :t], self.vs[layer, :t],
                           c.n_heads, c.n_kv_heads, c.head_dim, self.att_scale)

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
        codes, scales = quantize_activation(k.reshape(-1), hd)      # one group per row
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
            hb = silu(m[p + "ffn.w1"].matmul(xb)) * m[p + "ffn.w3"].matmul(xb)
            x = x + m[p + "ffn.w2"].matmul(hb)
            if u is not None:
                h = gelu(m[p + "ple.gate"].matmul(x)) * np.stack([ui[layer] for ui in u])
                x = x + np.stack([rmsnorm(yi, v[p + "ple.norm"], self.eps) for yi in m[p + "ple.proj"].matmul(h)])
        return x

    def body(self, token: int, pos: int) -> np.ndarray:
        """Token at pos through every layer (its K and V rows stored): the residual stream x."""
        return self.body_many([token], pos)[0]

    def head_input(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The final RMSNorm of x, quantized for the head: (codes, scales)."""
        return quantize_activation(rmsnorm(x, self.vecs["norm"], self.eps), self.head.act_group)

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

    def forward(self, token: int, pos: int) -> np.ndarray:
        c, w = self.cfg, self.w
        hd, eps = c.head_dim, F(c.norm_eps)

        def norm(x, g):
            return (x / np.sqrt(np.mean(x * x) + eps) * g).astype(F)

        cos, sin = self.cos[pos], self.sin[pos]
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
            h1 = w[p + "ffn.w1"] @ xb
            x = x + w[p + "ffn.w2"] @ ((h1 / (F(1) + np.exp(-h1))) * (w[p + "ffn.w3"] @ xb))
            if P:
                g = w[p + "ple.gate"] @ x
                g = F(0.5) * g * (F(1) + np.tanh(np.sqrt(F(2 / np.pi)) * (g + F(0.044715) * g ** 3)))
                x = x + norm(w[p + "ple.proj"] @ (g * u[i]), w[p + "ple.norm"])
        head = w["tok_embeddings" if c.tied else "output"][:c.n_out]
        return (head @ norm(x, w["norm"])).astype(F)


class Rng:
    """xorshift64* — the device's RNG, so a seed gives the same tokens on every target."""
    MASK = (1 << 64) - 1

    def __init__(self, seed: int):
        s = (seed ^ 0x9E3779B97F4A7C15) & self.MASK
        self.state = s or 1

    def next_u32(self) -> int:
        x = self.state
        x ^= x >> 12
        x ^= (x << 25) & self.MASK
        x ^= x >> 27
        self.state = x
        return ((x * 0x2545F4914F6CDD1D) & self.MASK) >> 32

    def coin(self) -> np.float32:
        return F(self.next_u32() >> 8) * F(1.0 / 16777216.0)


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: Rng) -> int:
    """Greedy (first maximum) when temperature <= 0; else softmax(logits / T) with our fexp,
    optionally restricted to the top-p nucleus (sorted by probability, then index)."""
    temperature, top_p = F(temperature), F(top_p)   # what travels on the wire
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits * (F(1.0) / temperature)
    e = fexp(z - z.max())
    p = e * (F(1.0) / fold(e))
    coin = rng.coin()
    n = p.shape[0]
    if top_p <= 0 or top_p >= 1:
        idx = np.nonzero(coin < np.add.accumulate(p, dtype=F))[0]
        return int(idx[0]) if idx.size else n - 1
    cutoff = (F(1.0) - top_p) / F(n - 1)
    cand = np.nonzero(p >= cutoff)[0]
    if cand.size == 0:
        return int(np.argmax(p))
    order = cand[np.lexsort((cand, -p[cand]))]
    cum = np.add.accumulate(p[order], dtype=F)
    over = np.nonzero(cum > top_p)[0]
    last = int(over[0]) if over.size else len(order) - 1
    r = coin * cum[last]
    hit = np.nonzero(r < cum[:last + 1])[0]
    return int(order[hit[0]] if hit.size else order[last])


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


def generate(qm: QuantModel, prompt_ids, max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 0.0, seed: int = 0, flags: int = 0, kv: str = "f32", batch: int = 1,
             speculate: str = "none", draft_k: int = 0) -> list[dict]:
    """What the device does for one GENERATE with these ``flags`` (FLAG_*), prefill passes of up to
    ``batch`` tokens and ``speculate`` ("none", "lookup", "draft": qm.draft's greedy tokens,
    DraftProposer) with up to ``draft_k`` drafts a pass: one
    record per step — pos (the cache position), in_id, out_id (NO_TOKEN for a prompt step whose
    output is unused), head_rows, logits (the whole output layer when the step computed it, else
    None), logits_crc (their crc32, else 0) and the forward pass it came from (chunk: its first step,
    chunk_len: its tokens, chunk_used: the steps it produced, kind: PASS_*) — stopping on max tokens,
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
        if drafts:                      # verify: every token's head, the argmax of each
            logits = [ref.logits(x) for x in xs]
            outs = [int(np.argmax(lg)) for lg in logits]
            used = 1
            while used < n and outs[used - 1] == ctx[pos + used] and outs[used - 1] not in stops:
                used += 1
            for i in range(used):
                steps.append(dict(pos=pos + i, in_id=ctx[pos + i], out_id=outs[i], head_rows=qm.config.n_out,
                                  logits=logits[i], logits_crc=zlib.crc32(logits[i].tobytes()),
                                  chunk=step, chunk_len=n, chunk_used=used, kind=PASS_VERIFY))
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
                              chunk=step, chunk_len=n, chunk_used=n, kind=kind))
        pos += n
        if out in stops:
            break
    return steps
