"""Sampling a token from logits as the device does (firmware/engine/sampler.c): its RNG, greedy,
temperature and top-p (docs/numerics.md)."""
from __future__ import annotations

import numpy as np

from .numerics import F, fexp, fold


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
