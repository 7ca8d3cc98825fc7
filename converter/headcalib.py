"""Convert-time calibration of the greedy head's tile index (converter/headprune.py): whether a
model gets one, and its tile size.

The reference runs a few greedy generations of the quantized model (``greedy_inputs``: what a
pruned scan sees), and for each tile size the index is built and its scan run on every recorded
head input, exactly as the engine would (rows and tiles visited), from the largest size down while
the cost falls. Each tile size is priced against
the whole head on three cost measures, because which one dominates depends on the board:

* bytes read (flash/PSRAM-bound boards): centre rows + tile records + visited rows and their map
  entries, against every row;
* compute on a core with an FPU and on one without (the RP2040's soft float: a float operation
  costs about 12x a multiply-accumulate), with converter/costmodel.py's cycles per MAC and per float
  operation: centre rows, two float operations per tile (U_t), visited rows, and integer work per
  tile and row (the tests and the row map: a MAC's worth each), against every row and the argmax.

The index is kept when its worst ratio over the three is at most ``1 - MIN_GAIN`` (it also costs
sampled steps a scatter of the logits through the row map, and a tied head's embedding row one map
entry, section 1 of docs/formats.md); the tile size with the lowest worst ratio wins. The tiles'
stored order — the order the scan sweeps them after the best-bounded one — is by how often a
tile held the argmax; the figures reported (and written into the index for the planner's
prediction) are measured on half the steps with the order taken from the other half, so the
order never sees the steps it is judged on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import headprune as hp
from .computecost import CHIP_COMPUTE, Q4_MAC_FACTOR
from .formats import row_stride
from .reference import Reference

TILE_SIZES = (8, 16, 32, 64)
MIN_GAIN = 0.05
STEPS, RUNS = 96, 6
MEASURES = {"bytes": None, "compute (FPU)": (4.0, 2.0, Q4_MAC_FACTOR), "compute (no FPU, RP2040)": CHIP_COMPUTE["RP2040"]}


@dataclass
class Inputs:
    """Head inputs of greedy steps: activation codes and scales, and the whole head's logits."""
    xq: list = field(default_factory=list)
    xs: list = field(default_factory=list)
    logits: list = field(default_factory=list)


def greedy_inputs(qm, steps: int = STEPS, runs: int = RUNS, seed: int = 0) -> Inputs:
    """``runs`` greedy generations of ``steps // runs`` steps each (at most the context), each
    from a random token (after BOS when the tokenizer has one), through the reference."""
    ref = Reference(qm)
    c = qm.config
    rng = np.random.default_rng(seed)
    bos = qm.tokenizer.bos_id if qm.tokenizer is not None else None
    per = max(1, min(steps // runs, c.max_seq_len - 1))
    out = Inputs()
    for _ in range(runs):
        prompt = ([bos] if bos is not None else []) + [int(rng.integers(c.n_out))]
        tok = prompt[0]
        for pos in range(len(prompt) - 1 + per):
            xq, xs = ref.head_input(ref.body(tok, pos))
            if pos + 1 < len(prompt):
                tok = prompt[pos + 1]
                continue
            lg = ref.head.matvec_q(xq, xs)
            out.xq.append(xq), out.xs.append(xs), out.logits.append(lg)
            tok = hp.first_max(lg)
    return out


def measure(index: hp.HeadIndex, inp: Inputs, steps) -> tuple[float, float]:
    """Mean (head rows, tiles) the scan visits over the given steps."""
    got = [hp.scan(index, inp.logits[i], inp.xq[i], inp.xs[i])[1:] for i in steps]
    return float(np.mean([g[0] for g in got])), float(np.mean([g[1] for g in got]))


def by_argmax(index: hp.HeadIndex, inp: Inputs, steps) -> np.ndarray:
    """Tile numbers, most often holding the steps' argmax first (then in build order)."""
    tile_of = np.empty(index.n_out, np.int64)
    for t, (a, b) in enumerate(zip(index.starts, index.ends())):
        tile_of[index.perm[a:b]] = t
    hits = np.bincount([tile_of[hp.first_max(inp.logits[i])] for i in steps], minlength=index.n_tiles)
    return np.argsort(-hits, kind="stable")


def costs(head, n_out: int, index: hp.HeadIndex, rows: float, tiles: float) -> dict[str, float]:
    """Pruned / whole head on each measure (see the module doc)."""
    dim, g = head.shape[1], head.group_size
    groups = -(-dim // g)
    stride = row_stride(head.fmt, dim, g, head.scale16, head.rowscale)
    cstride = row_stride("q8", dim, g, head.scale16, head.rowscale)
    nt, mb = index.n_tiles, index.map_bytes
    out = {}
    for name, cm in MEASURES.items():
        if cm is None:
            full = n_out * stride
            pruned = nt * cstride + hp.TILE.itemsize * nt + rows * (stride + mb)
        else:
            mac, flop, q4f = cm
            # a row's scaling: per group a float term, or row-scaled an integer one and 3 floats a row
            scaling = groups * mac + 3 * flop if head.rowscale else 3 * groups * flop
            row = dim * mac * (q4f if head.fmt == "q4" else 1.0) + scaling
            crow = dim * mac + scaling
            full = n_out * (row + mac)          # + the argmax's integer compare per row
            pruned = dim * mac + nt * (crow + 2 * flop + 2 * mac) + rows * (row + 2 * mac) + tiles * mac
        out[name] = pruned / full
    return out


def calibrate(qm, inp: Inputs | None = None, sizes=TILE_SIZES, force: bool = False) -> tuple[hp.HeadIndex | None, dict]:
    """(the index, or None when it does not pay, and a report: per tile size the mean rows and tiles
    visited and the cost ratios; the choice and why). ``force``: keep the best tiling even when it
    does not pay (``flashlm convert --head-index on``)."""
    head, n_out = qm.head(), qm.config.n_out
    inp = inp or greedy_inputs(qm)
    n = len(inp.logits)
    fit, judge = range(0, n, 2), range(1, n, 2)
    report = {"steps": n, "out_vocab": n_out, "min_gain": MIN_GAIN, "tile_sizes": {}}
    best = None
    for size in sorted(sizes, reverse=True):      # largest first (the cheapest to build); stop once
        if size >= n_out:                          # a smaller size no longer lowers the cost
            continue
        idx = hp.build(head, n_out, size)
        rows, tiles = measure(hp.reorder(idx, by_argmax(idx, inp, fit)), inp, judge)
        c = costs(head, n_out, idx, rows, tiles)
        worst = max(c.values())
        report["tile_sizes"][size] = dict(n_tiles=idx.n_tiles, rows_pct=100 * rows / n_out,
                                          tiles_pct=100 * tiles / idx.n_tiles, cost_ratio=c, worst=worst)
        if best is not None and worst >= best[0]:
            break
        best = (worst, size, idx, rows, tiles)
    if best is None:
        report.update(kept=False, reason=f"an output layer of {n_out} rows is too small to tile")
        return None, report
    worst, size, idx, rows, tiles = best
    report.update(tile_size=size, worst=worst)
    if worst > 1 - MIN_GAIN and not force:
        report.update(kept=False, reason=f"the best tiling (tiles of {size}) would cost {100 * worst:.0f} % of the "
                                         f"whole head at worst (kept only at <= {100 * (1 - MIN_GAIN):.0f} %)")
        return None, report
    out = hp.reorder(idx, by_argmax(idx, inp, range(n)))
    out.expected_rows, out.expected_tiles, out.calib_steps = rows, tiles, n
    report.update(kept=True, reason=f"tiles of {size}: {100 * rows / n_out:.1f} % of the rows visited, "
                                    f"{100 * worst:.0f} % of the whole head's cost at worst"
                                    + (" (--head-index on)" if worst > 1 - MIN_GAIN else ""))
    return out, report
