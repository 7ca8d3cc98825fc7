"""Memory layout planner: place every tensor, the KV cache, the logits buffers and scratch onto a
board's tiers, within each tier's usable budget, minimising the predicted time per token.

Model of the firmware (firmware/app/app_layout.c ``app_place``): the whole blob always lives in flash;
a tensor placed on psram/sram is copied there at boot (or on LAYOUT) and read from the copy; the
engine's three RAM regions (``kv``, ``logits``, ``scratch`` with the prompt buffer) each live in
one RAM tier. Staged tensors are rounded up to 64 bytes; the regions pack after them.

Algorithm (``plan``): user overrides (``--place PATTERN=TIER``) are checked and fixed first. Then
for every assignment of the unfixed state regions to RAM tiers (at most 2^3) the free tensors are
packed: a 0/1 knapsack fills the fastest RAM tier with the tensors whose predicted time saving
there is largest (value: µs saved per token against the best other tier; weight: bytes), a second
knapsack fills the next tier from the rest against flash; whatever is left reads from flash. The
assignment with the lowest predicted time per token wins. Predictions come from
``converter.costmodel`` and are labelled as predictions wherever shown.

A model that cannot fit raises ``NoFit``: the shortfall per tier and the cheapest changes that
would fit (a shorter context, an int8 KV cache, int4 for named tensors, another board).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import costmodel as C
from .boards import board_names, load_board
from .costmodel import ModelSpec, match_pattern
from .formats import MAX_BATCH, PINNED_TO_FLASH, TIER_CODE, StateTiers, kv_refusal, layout_id_of, smaller_kv, up64
from .ir import ModelError
from .timing import Prediction, TierModel, predict, tier_models

REGION_LABEL = {"kv": "KV cache", "logits": "logits buffers", "scratch": "scratch"}
ALIASES = {"head": None, "embedding": "tok_embeddings", "embeddings": "tok_embeddings",
           "state": ("kv", "logits", "scratch")}
KNAPSACK_UNITS = 20000     # capacity resolution of the DP (items are rounded up to a unit)


class PlanError(ModelError):
    """A placement request that cannot be honoured (bad override, unknown tier); one line."""


class NoFit(PlanError):
    """The model does not fit the board. ``str()`` is one line; ``details`` the full explanation."""

    def __init__(self, summary: str, shortfall: dict, details: list[str], suggestions: list[str],
                 fixes: list[dict] | None = None):
        super().__init__(summary)
        self.shortfall = shortfall        # tier -> (need, budget)
        self.details = details
        self.suggestions = suggestions
        # per suggestion, the convert options that make it ({} for none: another board, fewer --place)
        self.fixes = fixes if fixes is not None else [{} for _ in suggestions]


def fmt_bytes(n: float) -> str:
    n = float(n)
    for unit, k in (("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(n) >= k:
            v = n / k
            return f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}"
    return f"{int(n)} B"


# -------------------------------------------------------------------------------------------------
# overrides

@dataclass(frozen=True)
class Place:
    pattern: str
    tier: str
    text: str


def parse_place(items) -> list[Place]:
    out = []
    for item in items or ():
        pat, sep, tier = str(item).partition("=")
        pat, tier = pat.strip(), tier.strip().lower()
        if not sep or not pat or tier not in C.TIERS:
            raise PlanError(f"bad --place {item!r}: expected PATTERN=flash|psram|sram, "
                            f"e.g. 'layers.*.ffn=sram', 'head=psram', 'kv=psram'")
        out.append(Place(pat, tier, str(item)))
    return out


def _targets(spec: ModelSpec, pattern: str) -> list[str]:
    """Tensor and region names a --place pattern addresses."""
    if pattern == "head":
        return ["tok_embeddings" if spec.config.tied else "output"]
    alias = ALIASES.get(pattern)
    if isinstance(alias, tuple):
        return list(alias)
    if isinstance(alias, str):
        return [alias]
    names = [t.name for t in spec.tensors] + list(C.REGIONS)
    return [n for n in names if match_pattern(pattern, n)]


def resolve_overrides(spec: ModelSpec, places: list[Place], tm: dict) -> dict[str, tuple[str, Place]]:
    """name -> (tier, the --place that set it); last match wins. Rejects what cannot be honoured."""
    fixed: dict[str, tuple[str, Place]] = {}
    for pl in places:
        names = _targets(spec, pl.pattern)
        if not names:
            raise PlanError(f"--place {pl.text!r}: the pattern matches no tensor (names look like "
                            f"'layers.0.ffn.w1', 'layers.*.attn', 'tok_embeddings', 'head', 'norm', "
                            f"'rope.cos'; state: 'kv', 'logits', 'scratch')")
        if pl.tier not in tm:
            have = ", ".join(t for t in C.TIERS if t in tm)
            raise PlanError(f"--place {pl.text!r}: this board has no {pl.tier} tier (it has {have})")
        for n in names:
            if n in C.REGIONS and pl.tier == "flash":
                raise PlanError(f"--place {pl.text!r}: the {REGION_LABEL[n]} is written every token; "
                                f"it cannot live in flash (choose psram or sram)")
            if n not in C.REGIONS and spec.by_name()[n].kind == "tokenizer" and pl.tier != "flash":
                raise PlanError(f"--place {pl.text!r}: the tokenizer is read from flash only "
                                f"(the engine does not stage it)")
            if n == "ple.table" and pl.tier != "flash":
                raise PlanError(f"--place {pl.text!r}: ple.table stays in flash: the engine reads one row of "
                                f"it per token in place (a gather costed by row latency) and never stages it")
            fixed[n] = (pl.tier, pl)
    return fixed


# -------------------------------------------------------------------------------------------------
# the plan

@dataclass
class Plan:
    spec: ModelSpec
    board: str
    prof: dict
    tiers: dict            # tensor name -> tier (every table entry)
    regions: dict          # region -> tier
    kv: str
    pos: int
    line: int | None
    need: dict             # tier -> bytes placed there (flash: the whole blob)
    budget: dict           # tier -> usable budget
    prediction: Prediction
    uses: dict = field(repr=False, default_factory=dict)
    overrides: list = field(default_factory=list)
    base: str = "auto"
    head: str | int | None = None     # the output layer the quote costs (costmodel.head_mode)
    batch: int = 1                    # the most tokens one forward pass runs (scratch and logits grow with it)

    @property
    def config(self):
        return self.spec.config

    @property
    def state_tiers(self) -> StateTiers:
        """The header/LAYOUT field: region tiers (sram is the firmware's default arena), the KV cache
        format and the batch."""
        return StateTiers.of({r: t for r, t in self.regions.items() if t != "sram"}, self.kv, self.batch)

    @property
    def tier_codes(self) -> bytes:
        return bytes(TIER_CODE[self.tiers[t.name]] for t in self.spec.tensors)

    @property
    def layout_id(self) -> int:
        return layout_id_of(self.tier_codes, self.state_tiers.to_u32())

    def staged(self, tier: str) -> list[str]:
        return [t.name for t in self.spec.tensors if self.tiers[t.name] == tier]

    def predict_at(self, pos: int, sampling: str = "greedy", head: str | int | None = None,
                   experts=None) -> Prediction:
        """A step at pos with output layer ``head`` (costmodel.head_mode; None: a decode step) and, for a
        mixture of experts, the experts it read (per layer a bitmask; None: the expected ones)."""
        return predict(self.spec, self.prof, self.tiers, self.regions, pos, self.kv, sampling, self.line,
                         head=head, experts=experts)

    def rows(self) -> list[dict]:
        """One row per tensor and region: name, shape, format, bytes, tier, bytes read per token."""
        out = []
        for t in self.spec.tensors:
            u = self.uses.get(t.name)
            out.append(dict(name=t.name, kind=t.kind, shape=list(t.shape), format=t.fmt, bytes=t.length,
                            tier=self.tiers[t.name], read=u.counted if u else 0))
        sizes = C.state_sizes(self.spec, self.kv, self.batch)
        for r in C.REGIONS:
            u = self.uses[r]
            out.append(dict(name=r, kind="state", shape=[], format=self.kv if r == "kv" else "f32",
                            bytes=sizes[r], tier=self.regions[r], read=u.counted))
        return out

    def to_dict(self) -> dict:
        p = self.prediction
        return {
            "board": self.board, "model": self.spec.source, "context": self.config.max_seq_len,
            "kv": self.kv, "position": self.pos, "line_bytes": self.line, "base": self.base,
            "overrides": [o.text for o in self.overrides],
            "layout_id": self.layout_id, "state_tiers": self.state_tiers.to_u32(),
            "tiers": dict(self.tiers), "regions": dict(self.regions),
            "need": dict(self.need), "budget": dict(self.budget),
            "prediction": {"label": "predicted from the board profile (not measured)",
                           "output_layer": output_label(self.head, self.spec),
                           "bytes_read": dict(p.bytes_read), "phase_us": dict(p.phase_us),
                           "memory_us": dict(p.memory_us), "compute_us": dict(p.compute_us),
                           "total_us": p.total_us, "tok_s": p.tok_s},
            "tensors": self.rows(),
        }


def output_label(head: str | int | None, spec: ModelSpec) -> str:
    """What a plan's output-layer figure is (its ``head``)."""
    scan = spec.head_scan
    if head is None:
        if scan is None:
            return "a greedy decode step: the whole head and its argmax (the model has no head index)"
        return (f"a greedy decode step's tile scan at the rows the convert-time calibration measured on average: "
                f"{C.head_mode(spec, 'greedy', None)} of {spec.config.n_out} (predicted; each step's own count "
                f"is in its TOKEN head_rows)")
    if head == "full":
        return "the whole head (sampled steps, ALL_LOGITS)"
    if head == "skip":
        return "no head (a prompt step)"
    return f"a greedy tile scan of {head} rows" if scan else "a greedy step: the whole head and its argmax"


def default_pos(ctx: int) -> int:
    """The position predictions are quoted at: mid-context (KV reads grow linearly with pos)."""
    return ctx // 2


def _item_cost(use: C.Use, tm: TierModel) -> float:
    return sum(tm.us(use.read.get(ph, 0) + use.extra.get(ph, 0), use.rows.get(ph, 0), use.stride)
               for ph in C.PHASES)


def _knapsack(items: list[tuple[str, int, float]], cap: int) -> set[str]:
    """Names maximising total value with sum of weights <= cap (0/1 knapsack, weights in bytes)."""
    items = [it for it in items if it[2] > 0 and it[1] <= cap]
    if not items or cap <= 0:
        return set()
    if sum(w for _, w, _ in items) <= cap:
        return {n for n, _, _ in items}
    unit = max(64, -(-cap // KNAPSACK_UNITS))
    units = cap // unit
    ws = [-(-w // unit) for _, w, _ in items]
    dp = np.zeros(units + 1)
    keep = np.zeros((len(items), units + 1), dtype=bool)
    for i, ((_, _, v), w) in enumerate(zip(items, ws)):
        if w > units:
            continue
        cand = np.full(units + 1, -np.inf)
        cand[w:] = dp[:units + 1 - w] + v
        better = cand > dp
        keep[i] = better
        dp = np.where(better, cand, dp)
    chosen, c = set(), units
    for i in range(len(items) - 1, -1, -1):
        if keep[i, c]:
            chosen.add(items[i][0])
            c -= ws[i]
    return chosen


def plan(spec: ModelSpec, board: str | dict, *, overrides=(), kv: str = "f32", pos: int | None = None,
         line: int | None = None, base: str = "auto", sampling: str = "greedy",
         suggest: bool = True, head: str | int | None = None, batch: int = 1) -> Plan:
    """The fastest placement of ``spec`` on ``board`` (a profile name or dict) within budgets, for
    decode steps whose output layer is ``head`` (costmodel.head_mode; None: greedy, the tile scan at
    the calibration's expected rows, or the whole head without an index), with RAM for forward
    passes of up to ``batch`` tokens."""
    prof = load_board(board) if isinstance(board, str) else board
    bname = prof.get("name", "?")
    if kv_refusal(kv, spec.config.head_dim):
        raise PlanError(kv_refusal(kv, spec.config.head_dim))
    if base not in ("auto", "flash"):
        raise PlanError(f"layout base must be auto or flash, got {base!r}")
    tm = tier_models(prof, line)
    ram = sorted((t for t in C.RAM_TIERS if t in tm), key=lambda t: -tm[t].seq_read_MBps)
    cfg = spec.config
    pos = default_pos(cfg.max_seq_len) if pos is None else int(pos)
    places = overrides if overrides and isinstance(overrides[0], Place) else parse_place(overrides)
    fixed = resolve_overrides(spec, places, tm)
    uses = C.usage(spec, pos, kv, sampling, head)
    if not 1 <= int(batch) <= MAX_BATCH:
        raise PlanError(f"batch must be 1..{MAX_BATCH} tokens per forward pass, got {batch}")
    sizes = C.state_sizes(spec, kv, batch)
    budget = {t: tm[t].budget for t in tm}
    blob = spec.blob_bytes

    weights = [t for t in spec.tensors if t.name not in PINNED_TO_FLASH]   # read in place, whatever the budgets
    cost = {t.name: {tier: _item_cost(uses[t.name], tm[tier]) for tier in tm} for t in weights}
    rcost = {r: {tier: _item_cost(uses[r], tm[tier]) for tier in ram} for r in C.REGIONS}
    fixed_t = {n: v[0] for n, v in fixed.items() if n not in C.REGIONS}
    fixed_r = {n: v[0] for n, v in fixed.items() if n in C.REGIONS}
    free = [t for t in weights if t.name not in fixed_t]

    best, shortfalls = None, []
    free_regions = [r for r in C.REGIONS if r not in fixed_r]
    combos = [{}] if not free_regions else _assignments(free_regions, ram)
    for combo in combos if ram else []:
        regions = {**fixed_r, **combo}
        used = dict.fromkeys(ram, 0)
        for n, tier in fixed_t.items():
            if tier in used:
                used[tier] += up64(spec.by_name()[n].length)
        for r, tier in regions.items():
            used[tier] += sizes[r]          # regions are multiples of 8, packed after the tensors
        short = {t: used[t] - budget[t] for t in ram if used[t] > budget[t]}
        if short:
            shortfalls.append((sum(short.values()), regions, used))
            continue
        tiers = {t.name: "flash" for t in spec.tensors}
        tiers.update(fixed_t)
        if base == "auto" and ram:
            left = list(free)
            for i, tier in enumerate(ram):
                others = ["flash"] + ram[i + 1:]
                items = [(t.name, up64(t.length),
                          min(cost[t.name][o] for o in others) - cost[t.name][tier]) for t in left]
                got = _knapsack(items, budget[tier] - used[tier])
                for t in left:
                    if t.name in got:
                        tiers[t.name] = tier
                        used[tier] += up64(t.length)
                left = [t for t in left if t.name not in got]
        total = sum(cost[t.name][tiers[t.name]] for t in weights) + sum(rcost[r][regions[r]] for r in C.REGIONS)
        key = (round(total, 9), tuple(regions[r] != "sram" for r in C.REGIONS))
        if best is None or key < best[0]:
            best = (key, tiers, regions, used)
    flash_short = blob - budget["flash"] if blob > budget["flash"] else 0
    if best is None or flash_short:
        raise _no_fit(spec, prof, kv, places, blob, budget, ram, shortfalls, best, sizes, suggest, line, batch)
    _, tiers, regions, used = best
    need = {"flash": blob, **used}
    pred = predict(spec, prof, tiers, regions, pos, kv, sampling, line, tm=tm, uses=uses, head=head)
    return Plan(spec, bname, prof, tiers, regions, kv, pos, line, need, budget, pred, uses, places, base, head, batch)


def _assignments(regions: list[str], ram: list[str]) -> list[dict]:
    out = [{}]
    for r in regions:
        out = [{**a, r: t} for a in out for t in ram]
    return out


# -------------------------------------------------------------------------------------------------
# does not fit

def fits(spec: ModelSpec, board, **kw) -> bool:
    try:
        plan(spec, board, suggest=False, **kw)
        return True
    except NoFit:
        return False


def _no_fit(spec, prof, kv, places, blob, budget, ram, shortfalls, best, sizes, suggest, line, batch=1) -> NoFit:
    bname = prof.get("name", "?")
    details, short = [], {}
    if blob > budget["flash"]:
        short["flash"] = (blob, budget["flash"])
        details.append(f"flash: the blob is {fmt_bytes(blob)}, the flash budget {fmt_bytes(budget['flash'])}: "
                       f"short by {fmt_bytes(blob - budget['flash'])}")
    if best is None:
        region_txt = ", ".join(f"{REGION_LABEL[r]} {fmt_bytes(sizes[r])}" for r in C.REGIONS)
        if not ram:
            details.append(f"RAM: the board profile has no psram or sram tier for the {region_txt}")
        else:
            _, regions, used = min(shortfalls, key=lambda s: s[0])
            for t in ram:
                if used[t] > budget[t]:
                    short[t] = (used[t], budget[t])
                    what = [f"{REGION_LABEL[r]} {fmt_bytes(sizes[r])}" for r in C.REGIONS if regions[r] == t]
                    pinned = [p.text for p in places if p.tier == t]
                    if pinned:
                        what.append("tensors placed by " + ", ".join(f"--place {x!r}" for x in pinned))
                    details.append(f"{t}: needs {fmt_bytes(used[t])} ({', '.join(what)}), budget "
                                   f"{fmt_bytes(budget[t])}: short by {fmt_bytes(used[t] - budget[t])}")
            for t in C.RAM_TIERS:
                if t not in ram:
                    details.append(f"{t}: none on this board")
    found = _suggestions(spec, prof, kv, places, line, batch) if suggest else []
    suggestions = [text for text, _ in found]
    parts = [f"{t} short by {fmt_bytes(n - b)}" for t, (n, b) in short.items()]
    summary = f"the model does not fit on {bname}: " + ", ".join(parts)
    if suggestions:
        summary += "; " + "; ".join(suggestions[:2 if suggestions[0].startswith("no quantization") else 1])
    return NoFit(summary, short, details, suggestions, [fix for _, fix in found])


INT4_STEPS = (("layers.*.ffn", "int4 for the FFN matrices"),
              ("layers.*", "int4 for every layer matrix"),
              ("tok_embeddings", "int4 for the token embedding"),
              ("output", "int4 for the output head"))


def _int4(spec: ModelSpec, pattern: str) -> ModelSpec | None:
    names = [t.name for t in spec.tensors if t.fmt == "q8" and match_pattern(pattern, t.name)]
    return spec.with_formats([f"{pattern}=q4"]) if names else None


def _max_ctx(spec: ModelSpec, board, kv, places, line, batch: int = 1) -> int | None:
    lo, hi = 1, spec.config.max_seq_len - 1

    def ok(ctx: int) -> bool:
        return fits(spec.with_context(ctx), board, kv=kv, overrides=places, line=line, batch=batch)
    if hi < 1 or not ok(1):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _suggestions(spec: ModelSpec, prof: dict, kv: str, places, line, batch: int = 1) -> list[tuple[str, dict]]:
    """The cheapest changes that fit, cheapest first, each with the convert options that make it (a
    model's KV format, batch, context and recipe are convert's; a KV format is also run's --kv): a
    smaller batch, then model changes on this board at this batch, then other boards."""
    out: list[tuple[str, dict]] = []

    def ok(s: ModelSpec, kv_: str = kv, b: int = batch, over=places) -> bool:
        return fits(s, prof, kv=kv_, overrides=over, line=line, batch=b)
    if batch > 1:
        fit = next((b for b in range(batch - 1, 0, -1) if ok(spec, b=b)), None)
        if fit is not None:
            return [(f"a batch of {fit} token{'s' * (fit > 1)} per forward pass fits (flashlm convert --batch {fit}; "
                     f"{batch} asked)", {"batch": fit})]
    if places and ok(spec, over=()):
        out.append(("it fits without the --place overrides (" + ", ".join(repr(p.text) for p in places) + ")", {}))
    ctx = spec.config.max_seq_len
    c = _max_ctx(spec, prof, kv, places, line, batch)
    if c is not None:
        out.append((f"a context of {c} tokens fits (flashlm convert --ctx {c}; the model has {ctx})", {"ctx": c}))
    smaller = smaller_kv(kv, spec.config.head_dim)
    out += [(f"the {k} KV cache fits (flashlm convert --kv {k})", {"kv": k}) for k in smaller if ok(spec, kv_=k)][:1]
    for pattern, what in INT4_STEPS:
        s = _int4(spec, pattern)
        if s is not None and ok(s):
            out.append((f"{what} fits (flashlm convert --quant '{pattern}=q4')", {"quant": [f"{pattern}=q4"]}))
            break
    if not out:   # no single change: accumulate, cheapest first
        s, steps = spec, []
        for pattern, what in INT4_STEPS:
            s2 = _int4(s, pattern)
            if s2 is None:
                continue
            s, steps = s2, steps + [(pattern, what)]
            quant = [f"{p}=q4" for p, _ in steps]
            for kv2 in [kv] + smaller:
                label = " + ".join(w for _, w in steps) + (f" + the {kv2} KV cache" if kv2 != kv else "")
                opts = " ".join(f"--quant '{q}'" for q in quant) + (f" --kv {kv2}" if kv2 != kv else "")
                fix = {"quant": quant, **({"kv": kv2} if kv2 != kv else {})}
                if ok(s, kv_=kv2):
                    out.append((f"{label} fits (flashlm convert {opts})", fix))
                    break
                c = _max_ctx(s, prof, kv2, places, line, batch)
                if c is not None:
                    out.append((f"{label} + a context of {c} tokens fits (flashlm convert {opts} --ctx {c})",
                                {**fix, "ctx": c}))
                    break
            if out:
                break
        if not out:
            out.append((f"no quantization or context change makes it fit {prof.get('name')}", {}))
    boards = []
    for b in board_names():
        if b == prof.get("name") or b == "native":
            continue
        try:
            if fits(spec, b, kv=kv, line=None, batch=batch):
                boards.append(b)
        except ModelError:
            continue
    if boards:
        out.append(("it fits as is on " + ", ".join(boards), {}))
    return out


# -------------------------------------------------------------------------------------------------
# layouts for compare: "auto", "flash", overrides, or a mix ("flash,layers.*.ffn=sram")

def parse_layout(text: str) -> tuple[str, list[Place]]:
    """A layout spec: comma-separated items, each ``auto`` (optimise what is not overridden; the
    default), ``flash`` (what is not overridden stays in flash) or ``PATTERN=TIER``."""
    base, places = "auto", []
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise PlanError("empty --layout; give auto, flash or PATTERN=TIER[,...]")
    for it in items:
        if it in ("auto", "flash"):
            base = it
        else:
            places += parse_place([it])
    return base, places


def plan_layout(spec: ModelSpec, board, text: str, **kw) -> Plan:
    base, places = parse_layout(text)
    return plan(spec, board, overrides=places, base=base, **kw)
