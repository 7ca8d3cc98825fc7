"""A roofline per board: each phase of a forward pass as a point — its arithmetic intensity (operations
per byte moved from the tier that binds it) against the operations per second it attains — under
the board's compute ceilings and each memory tier's bandwidth roof. Points are predictions (from
passcost / costmodel and the board profile) or measurements (a run's device-clock µs for the same
pass, its operations and bytes counted from the model's shape — the engine's byte counters equal
them, docs/formats.md 2.4).

An operation is an int8 multiply-accumulate (a q4 one counts computecost.Q4_MAC_FACTOR: its nibble
unpacking) or a float operation. A board has two compute ceilings, from its profile's [compute]
calibration: clock / cycles_per_mac int8 MACs a second and clock / cycles_per_flop float
operations a second (the RP2040's soft-float makes the second 25 times lower); a phase's own
ceiling lies between them by its mix. A tier's roof is its sequential bandwidth times the
intensity (a tier given by line fills: line_bytes per fill).

The cost model adds memory and compute time (an in-order core waits for each cache-line fill), so
a point sits below both roofs, at half the lower one where the two times are equal; a phase is
memory-bound when its memory time exceeds its compute time. A pass of T tokens reads each weight
once, so its weight-bound phases move right by about T: speculation pays where they were left of
the ridge (bound by their bytes, e.g. an output layer read from PSRAM on the ESP32-S3), and not
where arithmetic already bound them (the RP2040's soft-float).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import computecost as K
from . import costmodel as C
from .ir import ModelConfig
from .passcost import PassPrediction
from .timing import tier_models


@dataclass(frozen=True)
class Point:
    """One phase of one pass on a roofline."""
    label: str            # which pass: "1 token", "T=4 (3 drafts)", ...
    phase: str            # a costmodel phase, or "pass" (the whole pass)
    tokens: int
    ops: float
    macs: float
    flops: float
    tier: str             # the tier whose bytes bind it (the largest memory time)
    tier_bytes: float     # bytes moved from that tier
    bytes: dict           # tier -> bytes moved
    memory_us: float
    compute_us: float
    us: float             # predicted, or measured when ``measured``
    measured: bool = False

    @property
    def intensity(self) -> float:
        """Operations per byte moved from the binding tier."""
        return self.ops / self.tier_bytes if self.tier_bytes else float("inf")

    @property
    def ops_per_s(self) -> float:
        return self.ops / (self.us * 1e-6) if self.us > 0 else float("inf")

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us > self.compute_us else "compute"

    def with_time(self, us: float) -> "Point":
        """The same phase measured: ``us`` from the device's clock."""
        return Point(self.label, self.phase, self.tokens, self.ops, self.macs, self.flops, self.tier,
                     self.tier_bytes, self.bytes, self.memory_us, self.compute_us, us, True)


@dataclass(frozen=True)
class Roofs:
    """A board's ceilings: operations per second (compute) and bytes per second (per tier)."""
    board: str
    clock_mhz: float
    mac_per_s: float
    flop_per_s: float
    bandwidth: dict       # tier -> bytes per second

    @property
    def peak(self) -> float:
        return max(self.mac_per_s, self.flop_per_s)

    def ridge(self, tier: str) -> float:
        """Intensity (ops/byte) where the tier's roof meets the int8 MAC ceiling."""
        return self.mac_per_s / self.bandwidth[tier]

    def attainable(self, tier: str, intensity: float, ceiling: float | None = None) -> float:
        return min(ceiling or self.mac_per_s, self.bandwidth[tier] * intensity)


def roofs(prof: dict, line: int | None = None) -> Roofs:
    """The board's compute ceilings from its [compute] calibration (costmodel's, by chip where the
    profile has none) and its tiers' bandwidths (timing.tier_models)."""
    clock = float(prof.get("clock_mhz", 100)) * 1e6
    cpm, cpf = cycles_per_op(prof)
    tm = tier_models(prof, line)
    return Roofs(str(prof.get("name", "?")), clock / 1e6, clock / cpm, clock / cpf,
                 {t: m.seq_read_MBps * 1e6 for t, m in tm.items()})


def cycles_per_op(prof: dict) -> tuple[float, float]:
    """(cycles per int8 MAC, cycles per float operation) as computecost.compute_cycles charges them on
    ``prof`` (its [compute] calibration, or costmodel's default for its chip), read back from
    compute_cycles with the other kind of operation made free, so no constant is copied here."""
    cfg = ModelConfig(dim=32, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=32, hidden_dim=32, max_seq_len=2)
    spec = C.ModelSpec.from_config(cfg)
    comp = prof.get("compute", {})

    def cycles(**kw) -> float:
        return sum(K.compute_cycles(spec, 0, {**prof, "compute": {**comp, **kw}}, head="full").values())
    macs, flops = cycles(cycles_per_mac=1.0, cycles_per_flop=0.0), cycles(cycles_per_mac=0.0, cycles_per_flop=1.0)
    return cycles(cycles_per_flop=0.0) / macs, cycles(cycles_per_mac=0.0) / flops


def pass_points(p: PassPrediction, label: str, tokens: int | None = None) -> list[Point]:
    """A pass's phases (those that move bytes and do arithmetic) and the whole pass, as roofline points
    (``tokens``: tokens a pass, when ``p`` sums several passes)."""
    out = []
    for ph in list(C.PHASES) + ["pass"]:
        if ph == "pass":
            mem = p.tier_us()
            traffic = {t: sum(p.traffic[x].get(t, 0) for x in C.PHASES) for t in C.TIERS}
            macs, flops, comp = sum(p.macs.values()), sum(p.flops.values()), sum(p.compute_us.values())
        else:
            mem, traffic = p.memory_us[ph], p.traffic[ph]
            macs, flops, comp = p.macs[ph], p.flops[ph], p.compute_us[ph]
        if not traffic or macs + flops <= 0:
            continue
        tier = max(traffic, key=lambda t: (mem.get(t, 0.0), traffic[t]))
        m = sum(mem.values())
        us = p.total_us if ph == "pass" else p.phase_us[ph]   # the cores' overlap taken off (overlap.py)
        out.append(Point(label, ph, tokens or p.tokens, macs + flops, macs, flops, tier, traffic[tier], dict(traffic),
                         m, comp, us))
    return out
