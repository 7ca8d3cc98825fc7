"""The reference's arithmetic, operation by operation: the exp table, SiLU and GELU, left-fold sums,
activation quantization, the quantized matvec, RMSNorm, RoPE, attention (f32, int8 and k12 KV) and the
experts' router, each in the one order the C engine (firmware/engine/) follows. docs/numerics.md is their specification."""
from __future__ import annotations

import numpy as np

from .ir import QTensor

F = np.float32
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


QMAX_12 = 2047   # the largest activation code entering a q8 tensor's product, a k12 K row's, its query's
QMAX_8 = 127     # a q4 tensor's, an int8 KV row's (and k12's V rows), its query's (docs/formats.md 1.1)
KV_QMAX = {"int8": QMAX_8, "k12": QMAX_12}   # an integer KV cache's K rows and queries


def act_qmax(q: QTensor) -> int:
    """The largest activation code a product of q takes (engine flm_act_qmax): 12-bit for q8, 8-bit for q4."""
    return QMAX_12 if q.fmt == "q8" else QMAX_8


def quantize_activation(x: np.ndarray, group_size: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """-> codes int32 [n_groups, group_size] (zero-padded), |code| <= qmax, scales f32 [n_groups]:
    scale = amax / qmax, code = round_half_away(clamp(x * (qmax / amax), +-qmax)), NaN 0."""
    n = x.shape[0]
    ng = -(-n // group_size)
    xp = np.zeros(ng * group_size, F)
    xp[:n] = x
    xp = xp.reshape(ng, group_size)
    amax = np.abs(xp).max(axis=1)
    nz = amax > 0
    safe = np.where(nz, amax, F(1.0))
    qf = F(qmax)
    scale = np.where(nz, safe / qf, F(0.0)).astype(F)
    with np.errstate(over="ignore", invalid="ignore"):   # amax below qmax/FLT_MAX: inv is inf
        inv = (qf / safe).astype(F)
        v = np.clip(xp * inv[:, None], -qf, qf)        # clamped before rounding, NaN (0 * inf) to 0,
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
        # the activation quantization's group (one for the whole input when row-scaled) and largest code
        self.act_group = cols if q.rowscale else q.group_size
        self.act_qmax = act_qmax(q)

    def quantize_input(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x's codes and scales as this matrix's product takes them."""
        return quantize_activation(x, self.act_group, self.act_qmax)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        return self.matvec_q(*self.quantize_input(x))

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


def top_k(r: np.ndarray, k: int) -> list[int]:
    """The indices of the k largest of r, largest first: k times the first maximum of those not yet
    chosen (ties to the lowest index; a NaN never wins a comparison, so it is chosen only when it is
    the first of those left)."""
    chosen: list[int] = []
    for _ in range(k):
        best = -1
        for i in range(len(r)):
            if i not in chosen and (best < 0 or r[i] > r[best]):
                best = i
        chosen.append(best)
    return chosen


def route(router: np.ndarray, x: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    """The experts of one token and their weights, largest logit first: logits r_e = fold(router[e] * x)
    (f32, the fp32 router against the normed input), the top k (top_k), and the softmax over the chosen
    logits only: e_j = fexp(r_j - r_0), w_j = e_j * (1 / fold(e))."""
    r = fold(router * x[None, :], axis=1)
    chosen = top_k(r, k)
    with np.errstate(invalid="ignore"):          # a broken model's inf - inf: NaN, as in C
        e = fexp(r[chosen] - r[chosen[0]])
    return chosen, (e * (F(1.0) / fold(e))).astype(F)


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


def attend_int(q: np.ndarray, kc: np.ndarray, ks: np.ndarray, vc: np.ndarray, vs: np.ndarray,
                n_heads: int, n_kv: int, hd: int, scale: np.float32, qmax: int) -> np.ndarray:
    """q [n_heads*hd]; K/V codes [T, n_kv, hd] (int32) and scales [T, n_kv] -> [n_heads*hd]: integer
    attention (docs/formats.md section 1.2) of an int8 (K codes and the query's within +-127, qmax
    127) or k12 cache (+-2047, qmax 2047; V codes int8 either way). Per head: the query quantized with
    qmax (qc, qs), scores in log2
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
        qc, qs = quantize_activation(q[h * hd:(h + 1) * hd], hd, qmax)
        isum = (kc[:, kh, :].astype(np.int64) @ qc[0].astype(np.int64)).astype(np.int32)   # k12: < 2^31
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
