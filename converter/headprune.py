"""Exact pruning of the greedy output layer: the ``head.prune`` section and the scan that uses it.

The converter writes one record per head row, ``(u32 row, f32 bound)``, sorted by bound
descending then row ascending, where ``bound`` is the row's dequantized L2 norm computed in
float64 and rounded up to binary32. A greedy step (converter/reference.py, firmware/engine/
engine.c ``flm_head_argmax``) quantizes the head input as for any matvec (codes ``xq``, scales
``xs`` per group), then

    X2 = fold_g(float(sum_k xq_k^2) * (xs_g * xs_g));   Xm = sqrt(X2) * MARGIN

and visits the records in order, stopping before record (r, b) when ``b * Xm < best`` while
``X2 >= FLOOR`` and ``best >= FLOOR`` (best: the largest logit seen so far). Every visited row's
logit is the full scan's bit for bit; every skipped row's logit is strictly below ``best``
(docs/formats.md section 3 proves it), so the result is the full scan's first maximum. The
number of records visited is the step's ``head_rows``.
"""
from __future__ import annotations

import numpy as np

from .ir import QTensor

F = np.float32
MARGIN = F(1.0078125)              # 1 + 2^-7 (0x1.02p+0f in engine.c): covers every rounding, see formats.md
FLOOR = F(2.0 ** -64)              # below it the scan never stops early (underflow guard, see formats.md)
RECORD = np.dtype([("row", "<u4"), ("bound", "<f4")])


def row_bounds(head: QTensor, n_out: int) -> np.ndarray:
    """float32 [n_out]: ||dequantized row||_2 of the first n_out rows, float64, rounded up."""
    codes = head.codes[:n_out].astype(np.float64)
    g = np.arange(head.codes.shape[1]) // head.group_size
    w = codes * head.scales[:n_out][:, g].astype(np.float64)      # exact: 8-bit code x 24-bit scale
    norm = np.sqrt(np.sum(w * w, axis=1))
    with np.errstate(over="ignore"):     # a norm past binary32's range rounds up to +inf
        b = norm.astype(F)
    low = b.astype(np.float64) < norm
    b[low] = np.nextafter(b[low], F(np.inf))
    return b


def records(head: QTensor, n_out: int) -> np.ndarray:
    """The head.prune records: rows sorted by bound descending, then by row ascending."""
    b = row_bounds(head, n_out)
    rows = np.arange(n_out, dtype=np.uint32)
    order = np.lexsort((rows, -b))
    out = np.empty(n_out, RECORD)
    out["row"], out["bound"] = rows[order], b[order]
    return out


def section_bytes(head: QTensor, n_out: int) -> bytes:
    return records(head, n_out).tobytes()


def x_margin(xq: np.ndarray, xs: np.ndarray) -> tuple[np.float32, np.float32]:
    """(X2, Xm) for the head input's codes [groups, g] and scales [groups] (fold over groups)."""
    from .reference import fold
    sq = np.sum(xq.astype(np.int64) ** 2, axis=1).astype(F)      # < 2^24 per group: exact
    x2 = fold(sq * (xs * xs))
    return F(x2), F(np.sqrt(F(x2)) * MARGIN)


def scan(logits: np.ndarray, recs: np.ndarray, xq: np.ndarray, xs: np.ndarray) -> tuple[int, int]:
    """(token, head_rows) of the pruned scan, given the full logits (a visited row's logit is the
    full scan's, bit for bit) and the head input's activation codes and scales."""
    x2, xm = x_margin(xq, xs)
    lg = logits[recs["row"]]
    prod = (recs["bound"] * xm).astype(F)
    n = len(recs)
    if x2 >= FLOOR and n > 1:
        best = np.maximum.accumulate(lg)[:-1]                      # best before record i (i >= 1)
        stop = np.nonzero((best >= FLOOR) & (prod[1:] < best))[0]
        if stop.size:
            n = int(stop[0]) + 1
    seen = lg[:n]
    top = seen.max()
    return int(recs["row"][:n][seen == top].min()), n
