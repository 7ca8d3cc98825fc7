"""Predicted time: a board profile's memory tiers as timing models (``TierModel``), and one step's
predicted µs per phase (``predict``) from the bytes and rows converter/costmodel.py says it reads
and the cycles it says it computes. Per tier ``bytes / seq_read_MBps + rows * row_latency_us`` (on
a tier given by ``line_cycles``, the RP2040's XIP flash: one line fill per ``line_bytes`` read, and
a gathered row pays the extra lines its alignment makes it touch; the embed step's code its cold
lines: ``embed_code_us``), plus cycles / clock, less what a board's cores save by sharing the
products' rows and, where the board streams a product's rows from flash into SRAM while they
compute, by that overlap (converter/overlap.py). It is a prediction, and is labelled as one
wherever it is shown.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import overlap
from .boards import stream_stride
from .computecost import compute_parts
from .costmodel import PHASES, TIERS, ModelSpec, Use, usage
from .formats import streams_rows
from .ir import ModelError


def lines_per_row(stride: int, line: int) -> float:
    """Cache lines a gathered row of ``stride`` bytes touches, on average over the rows of a
    line-aligned tensor (row r starts r * stride bytes in)."""
    period = line // math.gcd(stride, line)
    return sum(-(-((r * stride) % line + stride) // line) for r in range(period)) / period


@dataclass(frozen=True)
class TierModel:
    name: str
    budget: int
    seq_read_MBps: float
    row_latency_us: float
    line_bytes: int
    line_us: float = 0.0      # one line fill (tiers given by line_cycles: XIP flash), else 0

    def us(self, nbytes: float, rows: float = 0, stride: int = 0) -> float:
        """Reading ``nbytes`` of which ``rows`` rows of ``stride`` bytes are gathered apart: a
        line-fill tier pays the lines a row touches beyond its bytes' share, others row_latency_us."""
        t = nbytes / self.seq_read_MBps
        if not rows:
            return t
        if self.line_us and stride:
            return t + rows * (lines_per_row(stride, self.line_bytes) - stride / self.line_bytes) * self.line_us
        return t + rows * self.row_latency_us


def tier_models(prof: dict, line: int | None = None) -> dict[str, TierModel]:
    """The profile's tiers; ``line`` picks ``seq_read_MBps_by_line`` where a tier has it. A tier
    given by ``line_cycles`` (clk_sys cycles to fill one ``line_bytes`` line: the RP2040's XIP
    flash, host/emu/xip.mjs) reads at line_bytes per fill and pays one fill per gathered row's
    extra line."""
    out = {}
    clock = float(prof.get("clock_mhz", 100))
    for name in TIERS:
        t = prof.get("tiers", {}).get(name)
        if t is None:
            continue
        lb = int(t.get("line_bytes", 4))
        budget = int(t.get("budget", t.get("capacity", 0)))
        if "line_cycles" in t:
            line_us = float(t["line_cycles"]) / clock
            out[name] = TierModel(name, budget, lb / line_us, line_us, lb, line_us)
            continue
        bw = float(t.get("seq_read_MBps", 1e9))
        by_line = t.get("seq_read_MBps_by_line")
        if line is not None and by_line:
            key = str(line)
            if key not in {str(k) for k in by_line}:
                raise ModelError(f"board {prof.get('name')}: no {name} bandwidth for {line}-byte lines "
                                 f"(has {', '.join(str(k) for k in by_line)})")
            bw = float({str(k): v for k, v in by_line.items()}[key])
            lb = line
        out[name] = TierModel(name, budget, bw, float(t.get("row_latency_us", 0.0)), lb)
    if "flash" not in out:
        raise ModelError(f"board {prof.get('name')} has no flash tier in its profile")
    return out


def embed_code_us(prof: dict, tm: dict[str, TierModel]) -> float:
    """The embed step's code fetched from flash once a step, on a board that runs it from a line-fill
    tier (the RP2040's XIP cache): ``embed_code_lines`` of [tiers.flash] line fills; the code of every
    other phase runs in loops long enough that its first fetches are lost in the fitted compute."""
    return float(prof.get("tiers", {}).get("flash", {}).get("embed_code_lines", 0)) * tm["flash"].line_us


@dataclass
class Prediction:
    """Predicted cost of one token (a prediction, from the board profile's numbers)."""
    pos: int
    bytes_read: dict          # tier -> bytes the engine counts (what TOKEN frames report)
    phase_us: dict            # phase -> predicted µs
    memory_us: dict           # phase -> the memory part of phase_us (on one core)
    compute_us: dict          # phase -> the compute part (on one core)
    overlap_us: dict          # phase -> what the cores save sharing the products (overlap.py; 0 on one core)
    bus_us: dict              # phase -> of memory_us, the products' reads through a line-fill bus (overlap.py)
    ram_us: dict              # phase -> and their reads from the other tiers
    streamed: dict            # phase -> the products streamed from flash into SRAM (overlap.Streamed)

    @property
    def total_us(self) -> float:
        return sum(self.phase_us.values())

    @property
    def tok_s(self) -> float:
        return 1e6 / self.total_us if self.total_us > 0 else float("inf")


def predict(spec: ModelSpec, prof: dict, tiers: dict[str, str], regions: dict[str, str], pos: int,
            kv: str = "f32", sampling: str = "greedy", line: int | None = None,
            tm: dict[str, TierModel] | None = None, uses: dict[str, Use] | None = None,
            head: str | int | None = None, experts=None) -> Prediction:
    """Predict one step at ``pos`` with tensors on ``tiers`` (name -> tier), state regions on
    ``regions`` (region -> tier), output layer ``head`` (see head_mode) and, for a mixture of
    experts, the experts read (costmodel.expert_reads; None: the expected ones)."""
    tm = tm or tier_models(prof, line)
    uses = uses if uses is not None else usage(spec, pos, kv, sampling, head, experts)
    where = {**{t.name: tiers.get(t.name, "flash") for t in spec.tensors}, **regions}
    bytes_read = dict.fromkeys(TIERS, 0)
    mem = dict.fromkeys(PHASES, 0.0)
    products = overlap.product_tensors(spec)
    strides = {t.name: t.row_stride for t in spec.tensors}
    chunk = stream_stride(prof)
    bus, ram = dict.fromkeys(PHASES, 0.0), dict.fromkeys(PHASES, 0.0)   # the products' reads, by path
    streamed = dict.fromkeys(PHASES, overlap.Streamed())
    for name, use in uses.items():
        tier = where[name]
        model = tm[tier]
        bytes_read[tier] += use.counted
        for ph in PHASES:
            b = use.read.get(ph, 0) + use.extra.get(ph, 0)
            if b or use.rows.get(ph):
                us = model.us(b, use.rows.get(ph, 0), use.stride)
                mem[ph] += us
                if products.get(name) != ph:
                    continue
                if streams_rows(tier, strides.get(name, 0), chunk):   # gathered runs: a product each (head tiles)
                    n = use.rows.get(ph, 0) or 1
                    streamed[ph] += overlap.Streamed(us, b, n, overlap.read_ahead(spec, name, n))
                else:
                    (bus if model.line_us else ram)[ph] += us
    if "tok_embeddings" in uses:    # (passcost asks tier by tier: the embedding's tier pays it, once)
        mem["embed"] += embed_code_us(prof, tm)
    clock = float(prof.get("clock_mhz", 100))
    cycles, rows, par = compute_parts(spec, pos, prof, kv, sampling, head, experts,
                                      rows_after=overlap.rows_after(streamed))
    comp = {ph: c / clock for ph, c in cycles.items()}
    saved = {ph: overlap.saving(prof, rows[ph] / clock, bus[ph], ram[ph], streamed[ph], par[ph] / clock)
             for ph in PHASES}
    return Prediction(pos, bytes_read, {ph: mem[ph] + comp[ph] - saved[ph] for ph in PHASES}, mem, comp, saved, bus,
                      ram, streamed)
