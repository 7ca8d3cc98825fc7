"""What a forward pass of several tokens is predicted to cost on a board: batched prefill per prompt
token at each batch T, and the best T a board's RAM allows. A prediction, labelled as one wherever
it is shown.

The engine's multi-token pass (firmware/engine/engine.c ``flm_body_many``, kernels.c
``flm_matmul_rows``; docs/formats.md section 2.4) runs T tokens through each layer together. Per pass:

* every weight matrix is read once from its tier (a row is copied into an SRAM row buffer, then
  multiplied by the T tokens' activations): the matrix's bytes and gather costs once, plus the
  copy's writes (the row's bytes again, into the scratch region's tier);
* a mixture of experts' expert matrices once if any token chooses the expert, which the prediction
  takes as 1 - (1 - share)^T of them (share: the expert's calibrated share of tokens,
  costmodel.ModelSpec.expert_share; the T tokens' choices taken as independent); its f32 router once
  per token (read in place, not copied);
* everything else is per token, exactly the one-token step's: the embedding (and PLE table) row it
  gathers, the RoPE rows, the norms' weights (the engine reads them once per vector), its attention
  over the KV cache up to its own position, the activations it moves, and all of its arithmetic.

So a pass is assembled from ``costmodel.usage`` / ``computecost.compute_cycles`` of its tokens (one
way of counting a token's traffic and arithmetic) with the matrices' reads taken once, and timed by
``timing.predict`` per tier. Nothing here adds a physical constant: bandwidths, line fills and the
compute calibration are the board profile's (boards/*.toml) and costmodel's. The row copies are
charged as the scratch tier's sequential traffic (on the ESP32-S3 its SRAM rate is a measured memcpy,
[X51b] in its profile). The evidence that this is enough: on the emulated RP2040 (XIP model on) the
predicted prefill of the default model per prompt token is 0.98x / 0.95x / 0.97x the emulated one at
T = 1 / 4 / 8, with the bytes of every pass equal (bench.passes; tests/test_roofline.py holds a loose
band). What remains: the harness's call profile (XIP model off) puts a prompt token's matrix
products at 1.11x / 1.08x the one-token kernel's cycles at T = 4 / 8, the row copies and a kernel
call per pair of rows and token included, which nothing here charges. BATCHES and BEST_T_TOLERANCE
are choices of what to quote, not measurements.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import computecost as K
from . import costmodel as C
from . import overlap
from .ir import ModelError
from .planner import NoFit, default_pos, plan
from .timing import TierModel, predict, tier_models

# the forward passes a board runs (reference.PASS_*): what each computes of the output layer
HEAD_SKIP = "skip"      # a prefill chunk whose outputs are unused
HEAD_ALL = "all"        # a verification: every token's whole head and its argmax
# otherwise the last token's head as costmodel.head_mode says (None: a greedy step's pruned scan at
# its upper bound; "full"; or a scan of k rows)

# the batches the planner tries (denser where the gain changes fastest); capped by the context
BATCHES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 255)
BEST_T_TOLERANCE = 0.05   # the chosen batch: the smallest within 5 % of the best prediction (more RAM buys little)


@dataclass(frozen=True)
class Placement:
    """Where a model's tensors and state regions live on a board (a planner.Plan's, or the draft
    model's: read from flash in place, its state in the scratch region's tier)."""
    spec: C.ModelSpec
    prof: dict
    tiers: dict
    regions: dict
    kv: str = "f32"
    line: int | None = None
    batch: int = 1

    @classmethod
    def of(cls, plan) -> "Placement":
        return cls(plan.spec, plan.prof, dict(plan.tiers), dict(plan.regions), plan.kv, plan.line,
                   getattr(plan, "batch", 1))

    @classmethod
    def of_header(cls, h, prof: dict, source: str = "") -> "Placement":
        """A blob's own placement (its header's tiers, state regions, KV format and batch) on ``prof``."""
        st = h.state_tiers
        return cls(C.ModelSpec.from_header(h, source), prof, dict(h.tiers), st.regions("sram"), st.kv, None, st.batch)

    def where(self) -> dict[str, str]:
        return {**{t.name: self.tiers.get(t.name, "flash") for t in self.spec.tensors}, **self.regions}

    @property
    def tier_models(self) -> dict[str, TierModel]:
        return tier_models(self.prof, self.line)


def draft_placement(draft: C.ModelSpec, main: Placement, kv: str) -> Placement:
    """The draft model on the main model's board: every tensor read from flash in place (the blob's
    section ``draft``, docs/formats.md 1.4), its three state regions after the prompt buffer in the
    scratch region's tier (app_speculate.c app_draft_place), its batch the main model's."""
    tier = main.regions["scratch"]
    return Placement(draft, main.prof, {t.name: "flash" for t in draft.tensors}, dict.fromkeys(C.REGIONS, tier),
                     kv, main.line, main.batch)


@dataclass
class PassPrediction:
    """Predicted cost of one forward pass of ``tokens`` tokens starting at ``pos`` (a prediction)."""
    pos: int
    tokens: int
    head: object
    bytes_read: dict          # tier -> bytes the engine counts (what the pass's TOKEN frames report)
    traffic: dict             # phase -> tier -> bytes moved (counted, plus activations and row copies)
    memory_us: dict           # phase -> tier -> µs
    compute_us: dict          # phase -> µs
    macs: dict                # phase -> multiply-accumulates (a q4 one counts computecost.Q4_MAC_FACTOR)
    flops: dict               # phase -> float operations
    steps: int = 1            # tokens it produces (a verification: the accepted drafts + 1)
    parts: list = field(default_factory=list, repr=False)
    overlap_us: dict = field(default_factory=dict)   # phase -> what the cores save sharing the products

    @property
    def phase_us(self) -> dict:
        return {ph: sum(self.memory_us[ph].values()) + self.compute_us[ph] - self.overlap_us.get(ph, 0.0)
                for ph in C.PHASES}

    @property
    def total_us(self) -> float:
        return sum(self.phase_us.values())

    @property
    def ops(self) -> dict:
        return {ph: self.macs[ph] + self.flops[ph] for ph in C.PHASES}

    def tier_us(self) -> dict:
        return {t: sum(self.memory_us[ph].get(t, 0.0) for ph in C.PHASES) for t in C.TIERS}

    def __add__(self, o: "PassPrediction") -> "PassPrediction":
        """Two passes run one after the other (their sums; pos, head: the first's)."""
        def add2(a, b):
            return {ph: {t: a[ph].get(t, 0) + b[ph].get(t, 0) for t in set(a[ph]) | set(b[ph])} for ph in C.PHASES}
        return PassPrediction(self.pos, self.tokens + o.tokens, self.head,
                              {t: self.bytes_read[t] + o.bytes_read[t] for t in C.TIERS},
                              add2(self.traffic, o.traffic), add2(self.memory_us, o.memory_us),
                              _add(self.compute_us, o.compute_us), _add(self.macs, o.macs), _add(self.flops, o.flops),
                              self.steps + o.steps, overlap_us=_add(self.overlap_us, o.overlap_us))

    def scaled(self, f: float) -> "PassPrediction":
        """This pass's figures times f (an expectation over passes that run with probability f)."""
        return PassPrediction(self.pos, self.tokens, self.head, {t: v * f for t, v in self.bytes_read.items()},
                              {ph: {t: v * f for t, v in d.items()} for ph, d in self.traffic.items()},
                              {ph: {t: v * f for t, v in d.items()} for ph, d in self.memory_us.items()},
                              {ph: v * f for ph, v in self.compute_us.items()}, {ph: v * f for ph, v in self.macs.items()},
                              {ph: v * f for ph, v in self.flops.items()}, self.steps,
                              overlap_us={ph: v * f for ph, v in self.overlap_us.items()})


def _add(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}


def token_heads(n: int, head, sampling: str) -> list:
    """The output layer each of a pass's n tokens computes (costmodel.head_mode's terms)."""
    if head == HEAD_SKIP:
        return [HEAD_SKIP] * n
    if head == HEAD_ALL:
        return ["full"] * n
    return [HEAD_SKIP] * (n - 1) + [head]


def pass_usage(spec: C.ModelSpec, pos: int, n: int, kv: str, sampling: str, head) -> dict[str, C.Use]:
    """Traffic of a pass of n tokens at pos..pos+n-1 per tensor and state region: the tokens'
    costmodel.usage summed, a weight matrix's read (a quantized tensor read whole in a phase, not
    gathered by rows) taken once, and with n > 1 its rows' copies written to the scratch region."""
    out: dict[str, C.Use] = {}
    heads = token_heads(n, head, sampling)
    for t in range(n):
        for name, u in C.usage(spec, pos + t, kv, sampling, heads[t]).items():
            o = out.setdefault(name, C.Use())
            for ph, b in u.read.items():
                o.add(ph, b, rows=u.rows.get(ph, 0), stride=u.stride)
            for ph, b in u.extra.items():
                o.add(ph, b, counted=False)
    by, experts = spec.by_name(), C.expert_tensors(spec)
    for name, o in out.items():
        t = by.get(name)
        if t is None or t.fmt not in ("q8", "q4"):
            continue
        for ph in list(o.read):
            if o.rows.get(ph):
                continue
            tokens_read = sum(1 for h in heads if ph != "output" or h != HEAD_SKIP)
            once = o.read[ph] // tokens_read
            if name in experts:     # read once if any of the pass's tokens chose it
                once = t.length * (1.0 - (1.0 - min(1.0, experts[name])) ** n)
            o.read[ph] = once
            if n > 1:   # kernels.c flm_matmul_rows: memcpy of each row into row_buf, then n dot products
                out["scratch"].add(ph, once, counted=False)
    return out


def _split(d: dict, keys) -> dict:
    return {k: d.get(k, 0.0) for k in keys}


def predict_pass(pl: Placement, pos: int, n: int, head=HEAD_SKIP, sampling: str = "greedy",
                 tm: dict | None = None) -> PassPrediction:
    """A forward pass of n tokens at positions pos..pos+n-1 whose output layer is ``head`` (HEAD_SKIP,
    HEAD_ALL, or the last token's as costmodel.head_mode), on placement ``pl``."""
    S = pl.spec.config.max_seq_len
    if n < 1 or pos < 0 or pos + n > S:
        raise ModelError(f"a pass of {n} tokens at position {pos} does not fit the context of {S}")
    tm = tm or pl.tier_models
    uses = pass_usage(pl.spec, pos, n, pl.kv, sampling, head)
    where = pl.where()
    bytes_read = dict.fromkeys(C.TIERS, 0)
    traffic = {ph: {} for ph in C.PHASES}
    memory = {ph: {} for ph in C.PHASES}
    bus, ram = dict.fromkeys(C.PHASES, 0.0), dict.fromkeys(C.PHASES, 0.0)   # the products' reads, by path
    streamed = dict.fromkeys(C.PHASES, overlap.Streamed())
    for tier in tm:     # timing.predict's memory time, tier by tier
        sub = {k: u for k, u in uses.items() if where[k] == tier}
        p = predict(pl.spec, pl.prof, pl.tiers, pl.regions, pos, pl.kv, sampling, pl.line, tm=tm, uses=sub,
                    head=HEAD_SKIP)
        bytes_read[tier] = p.bytes_read[tier]
        for ph in C.PHASES:
            b = sum(u.read.get(ph, 0) + u.extra.get(ph, 0) for u in sub.values())
            if b:
                traffic[ph][tier] = b
                memory[ph][tier] = p.memory_us[ph]
            bus[ph] += p.bus_us[ph]
            ram[ph] += p.ram_us[ph]
            streamed[ph] += p.streamed[ph]
    clock = float(pl.prof.get("clock_mhz", 100))
    count_mac = {**pl.prof, "compute": {"cycles_per_mac": 1.0, "cycles_per_flop": 0.0}}
    count_flop = {**pl.prof, "compute": {"cycles_per_mac": 0.0, "cycles_per_flop": 1.0}}
    comp, rows, par, macs, flops = {}, {}, {}, {}, {}
    for t, h in enumerate(token_heads(n, head, sampling)):
        c, r, e = K.compute_parts(pl.spec, pos + t, pl.prof, pl.kv, sampling, h, pass_n=n,
                                  rows_after=overlap.rows_after(streamed))
        comp, rows, par = _add(comp, c), _add(rows, r), _add(par, e)
        macs = _add(macs, K.compute_cycles(pl.spec, pos + t, count_mac, pl.kv, sampling, h))
        flops = _add(flops, K.compute_cycles(pl.spec, pos + t, count_flop, pl.kv, sampling, h))
    saved = {ph: overlap.saving(pl.prof, rows.get(ph, 0.0) / clock, bus[ph], ram[ph], streamed[ph],
                                par.get(ph, 0.0) / clock)
             for ph in C.PHASES}
    return PassPrediction(pos, n, head, bytes_read, traffic, memory,
                          {ph: comp.get(ph, 0.0) / clock for ph in C.PHASES}, _split(macs, C.PHASES),
                          _split(flops, C.PHASES), overlap_us=saved)


def prefill(pl: Placement, start: int, count: int, batch: int, tm: dict | None = None) -> list[PassPrediction]:
    """The passes of prompt tokens at positions start..start+count-1 whose outputs are unused, in
    passes of up to ``batch`` tokens (reference.generate's chunking)."""
    tm = tm or pl.tier_models
    out, p = [], start
    while p < start + count:
        n = min(batch, start + count - p)
        out.append(predict_pass(pl, p, n, HEAD_SKIP, tm=tm))
        p += n
    return out


@dataclass
class BatchQuote:
    """Prefill at one batch T on a board (predicted): whether its RAM fits, µs and bytes per prompt token."""
    batch: int
    fits: bool
    us_per_token: float | None = None
    bytes_per_token: dict | None = None
    ram: dict | None = None          # tier -> bytes placed (the plan at this batch)
    why: str = ""


def prompt_tokens(spec: C.ModelSpec) -> int:
    """The prompt the batch quotes run: from position 0 to mid-context (the planner's quote position)."""
    return max(1, default_pos(spec.config.max_seq_len))


def batch_quotes(spec: C.ModelSpec, board, batches=None, plan_kw: dict | None = None,
                 count: int | None = None) -> list[BatchQuote]:
    """Predicted prefill per prompt token for each batch T (the plan at that batch: its RAM and
    placement), over a prompt of ``count`` tokens from position 0 (prompt_tokens by default)."""
    count = count or prompt_tokens(spec)
    out = []
    for T in batches or [b for b in BATCHES if b <= max(1, count)]:
        try:
            p = plan(spec, board, batch=T, suggest=False, **(plan_kw or {}))
        except NoFit as e:
            out.append(BatchQuote(T, False, why=str(e)))
            continue
        passes = prefill(Placement.of(p), 0, count, T)
        out.append(BatchQuote(T, True, sum(q.total_us for q in passes) / count,
                              {t: sum(q.bytes_read[t] for q in passes) / count for t in C.TIERS},
                              {t: n for t, n in p.need.items() if t != "flash"}))
    return out


def best_batch(quotes: list[BatchQuote]) -> BatchQuote | None:
    """The smallest fitting batch within BEST_T_TOLERANCE of the lowest predicted µs per prompt token."""
    ok = [q for q in quotes if q.fits]
    if not ok:
        return None
    low = min(q.us_per_token for q in ok)
    return min((q for q in ok if q.us_per_token <= low * (1 + BEST_T_TOLERANCE)), key=lambda q: q.batch)
