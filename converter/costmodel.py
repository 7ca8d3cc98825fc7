"""What one token costs: the model's shape as the planner sees it (``ModelSpec``), the bytes the
engine reads from each tier and the arithmetic it does per phase; converter/timing.py turns both
into a predicted time.

Everything here mirrors firmware/engine/engine.c (and sampler.c) operation by operation:

* ``usage(spec, pos)`` lists, per tensor and state region, the bytes a forward step at position
  ``pos`` reads from it and how many separate rows it gathers — exactly the bytes the engine adds
  to its per-tier counters (weights, norms per call, the two RoPE rows, one embedding row, one PLE
  table row, the head's rows, the KV cache per head), plus the activation/logits traffic the
  engine does not count (used for timing only). The output layer of a step (``head``) is the whole
  head ("full": sampled steps, ALL_LOGITS), none ("skip": a prompt step whose output is unused),
  or a greedy step computing k rows (int k): with a head index (converter/headprune.py) the tile
  scan — every centre row, every tile record, k head rows in runs of a tile each and their row ->
  token map entries; without one the whole head (k = out_vocab) with its argmax. A mixture of
  experts' FFN reads its router and each expert's matrices times the share of tokens that choose the
  expert (``ModelSpec.expert_share``: the convert-time calibration, converter/expertuse.py, or k/E
  without one; **predicted**), or, given the experts a step read (``experts``: per layer a bitmask, as
  TOKEN frames carry them), exactly those. Predictions of
  greedy steps quote k = the rows the convert-time calibration measured on average
  (``HeadScan.expected_rows``, **predicted**), or out_vocab without an index; the rows a real step
  visits depend on its activations and are reported per step (TOKEN head_rows);
* converter/computecost.py's ``compute_cycles(spec, pos)`` counts multiply-accumulates and float
  operations per phase; ``timing.predict`` turns both into microseconds for a board profile (a prediction, labelled as
  one wherever it is shown).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace

from .blob import sections
from .footprint import prompt_bytes, region_bytes
from .formats import REGIONS, HeadScan, blob_size, row_stride
from .ir import ModelConfig, ModelError
from .quantize import check_scales, default_spec, head_name, is_router, parse_overrides, resolve_head

PHASES = ("embed", "attention", "ffn", "ple", "output", "sampling")
TIERS = ("flash", "psram", "sram")
RAM_TIERS = ("psram", "sram")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor-table entry, as the planner needs it (no data)."""
    name: str
    fmt: str            # f32, q8, q4, bytes
    rows: int
    cols: int
    group: int
    length: int
    row_stride: int
    scale16: bool = False
    rowscale: bool = False     # a row scale and integer group multipliers (one activation scale per matvec)

    @property
    def kind(self) -> str:
        n = self.name
        if n == "tok_embeddings":
            return "embedding"
        if n == "output":
            return "head"
        if n == "ple.table":
            return "ple_table"
        if n in ("head.tiles", "head.centroids"):
            return "head_index"
        if n.startswith("rope."):
            return "rope"
        if n == "tokenizer" or n.startswith("tokenizer."):   # the pieces, the device encoder's tables
            return "tokenizer"
        if n.endswith("norm"):
            return "norm"
        if ".attn." in n:
            return "attention"
        if ".ffn." in n:
            return "ffn"
        if n.startswith("ple.") or ".ple." in n:
            return "ple"
        return "other"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows, self.cols)


@dataclass(frozen=True)
class ModelSpec:
    """A model's shape as the planner sees it: config, tensor table (blob order), blob size, and its
    greedy head index if it has one."""
    config: ModelConfig
    tensors: tuple[TensorSpec, ...]
    source: str = ""
    tokenizer_estimated: bool = False
    head_scan: HeadScan | None = None
    expert_use: object = None          # converter.expertuse.ExpertUse: the experts' calibrated use

    def expert_share(self, layer: int, expert: int) -> float:
        """The share of tokens whose router chooses ``expert`` in ``layer``: the calibration's, or k/E
        (every expert alike) without one. A prediction."""
        c = self.config
        return c.moe_top_k / c.n_experts if self.expert_use is None else self.expert_use.share(layer, expert)

    @property
    def blob_bytes(self) -> int:
        return blob_size(t.length for t in self.tensors)

    @property
    def min_group(self) -> int:
        return min(t.group for t in self.tensors if t.fmt in ("q8", "q4"))

    def by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors}

    @property
    def weight_bytes(self) -> int:
        return sum(t.length for t in self.tensors if t.kind != "tokenizer")

    def n_params(self) -> int:
        return self.config.n_params()

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_header(cls, h, source: str = "") -> "ModelSpec":
        ts = tuple(TensorSpec(e.name, e.fmt, e.rows, e.cols, e.group_size, e.length, e.row_stride, e.scale16,
                              e.rowscale)
                   for e in h.entries)
        return cls(h.config, ts, source, head_scan=h.head_scan, expert_use=h.expert_use)

    @classmethod
    def from_quant(cls, qm, source: str = "") -> "ModelSpec":
        ts = tuple(TensorSpec(s.name, s.fmt, s.rows, s.cols, s.group, len(s.data), s.row_stride, s.scale16, s.rowscale)
                   for s in sections(qm))
        return cls(qm.config, ts, source or qm.source, head_scan=HeadScan.of(qm.head_index), expert_use=qm.expert_use)

    @classmethod
    def from_config(cls, cfg: ModelConfig, fmt: str = "q8", group_size: int = 32, overrides=(),
                    tokenizer_bytes: int | None = None, source: str = "", scales: str = "row") -> "ModelSpec":
        """A shape without weights: the converter's default recipe (matrices ``fmt``, embedding and
        untied head q8 when ``fmt`` is q4, the PLE table q4, norms f32; ``scales`` row, f32 or f16) with
        ``--quant``-style overrides. The tokenizer section is estimated (8 bytes a piece) unless
        ``tokenizer_bytes`` is given. No head index: that needs weights to calibrate."""
        cfg.validate()
        check_scales(scales)
        ovs = resolve_head(parse_overrides(overrides), cfg.tied)
        s16, rsc = scales == "f16", scales == "row"
        est = tokenizer_bytes is None
        tok = tokenizer_bytes if tokenizer_bytes is not None else 8 + 4 * (cfg.vocab_size + 1) + 8 * cfg.vocab_size
        ts = [TensorSpec("tokenizer", "bytes", 1, tok, 0, tok, tok),
              TensorSpec("tokenizer.stop", "bytes", 1, 8, 0, 8, 8)]      # one stop id
        hd2 = cfg.head_dim // 2
        for name in ("rope.cos", "rope.sin"):
            ts.append(TensorSpec(name, "f32", cfg.max_seq_len, hd2, 0, cfg.max_seq_len * hd2 * 4, hd2 * 4))
        for name, shape in cfg.tensor_shapes().items():
            if len(shape) == 1 or is_router(name):
                rows, cols = (1, shape[0]) if len(shape) == 1 else shape
                ts.append(TensorSpec(name, "f32", rows, cols, 0, rows * cols * 4, cols * 4))
                continue
            f, g = default_spec(name, fmt, group_size, head_name(cfg.tied))
            for o in reversed(ovs):
                if o.matches(name):
                    f, g = o.fmt, (o.group_size or g)
                    break
            rs = row_stride(f, shape[1], g, s16, rsc)
            ts.append(TensorSpec(name, f, shape[0], shape[1], g, shape[0] * rs, rs, s16, rsc))
        return cls(cfg, tuple(ts), source or "shape only", est)

    def with_formats(self, overrides) -> "ModelSpec":
        """The same model re-quantized by ``--quant``-style overrides (shape arithmetic only)."""
        ovs = resolve_head(parse_overrides(overrides), self.config.tied)
        out = []
        for t in self.tensors:
            if t.fmt in ("q8", "q4"):
                for o in reversed(ovs):
                    if o.matches(t.name):
                        g = o.group_size or t.group
                        rs = row_stride(o.fmt, t.cols, g, t.scale16, t.rowscale)
                        t = replace(t, fmt=o.fmt, group=g, row_stride=rs, length=t.rows * rs)
                        break
            out.append(t)
        return replace(self, tensors=tuple(out))

    def with_context(self, ctx: int) -> "ModelSpec":
        """The same model with a shorter context (RoPE tables cut to ``ctx`` rows)."""
        if not 1 <= ctx <= self.config.max_seq_len:
            raise ModelError(f"context {ctx} must be in 1..{self.config.max_seq_len} (the model's own)")
        out = []
        for t in self.tensors:
            if t.kind == "rope":
                t = replace(t, rows=ctx, length=ctx * t.row_stride)
            out.append(t)
        return replace(self, config=replace(self.config, max_seq_len=ctx), tensors=tuple(out))


# -------------------------------------------------------------------------------------------------
# what a step reads

@dataclass
class Use:
    """Per-token traffic of one tensor or state region, by phase."""
    read: dict = field(default_factory=dict)       # phase -> bytes the engine counts
    rows: dict = field(default_factory=dict)       # phase -> separately gathered rows
    extra: dict = field(default_factory=dict)      # phase -> bytes not counted (activations, logits)
    stride: int = 0                                # bytes of one gathered row

    def add(self, phase: str, nbytes: int, rows: int = 0, counted: bool = True, stride: int = 0) -> None:
        d = self.read if counted else self.extra
        d[phase] = d.get(phase, 0) + nbytes
        if rows:
            self.rows[phase] = self.rows.get(phase, 0) + rows
            self.stride = stride

    @property
    def counted(self) -> int:
        return sum(self.read.values())


def state_sizes(spec: ModelSpec, kv: str = "f32", batch: int = 1) -> dict[str, int]:
    """Bytes of each state region the planner places (the prompt buffer rides with scratch), for
    forward passes of up to ``batch`` tokens."""
    cfg = spec.config
    rb = region_bytes(cfg, spec.min_group, kv, batch)
    return {"kv": rb["kv"], "logits": rb["logits"], "scratch": rb["scratch"] + prompt_bytes(cfg)}


def head_rows(spec: ModelSpec) -> TensorSpec:
    """The rows the output layer reads: ``output``, or a tied head's first out_vocab embedding rows."""
    cfg, by = spec.config, spec.by_name()
    if not cfg.tied:
        return by["output"]
    emb = by["tok_embeddings"]
    return replace(emb, rows=cfg.n_out, length=cfg.n_out * emb.row_stride)


def head_mode(spec: ModelSpec, sampling: str, head: str | int | None) -> str | int:
    """The output layer a step computes: "full", "skip" or the rows k of a greedy step (None: what a
    decode step does — greedy: the calibration's expected rows of the tile scan with a head index,
    out_vocab without one)."""
    n_out, scan = spec.config.n_out, spec.head_scan
    if head is None:
        if sampling != "greedy":
            return "full"
        return n_out if scan is None else min(n_out, max(1, round(scan.expected_rows)))
    if head in ("full", "skip"):
        return head
    if not (isinstance(head, int) and 0 < head <= n_out) or (scan is None and head != n_out):
        raise ModelError(f"head must be full, skip or the rows of a greedy step ({'1..' if scan else ''}{n_out}"
                         f"{'' if scan else ': this model has no head index, a greedy step computes every row'}),"
                         f" got {head!r}")
    return head


def tiles_visited(spec: ModelSpec, rows: int) -> int:
    """The tiles a scan of ``rows`` head rows visits, as the planner estimates it: rows over the mean
    tile size, rounded up (each tile is one run of contiguous rows: one gather)."""
    return min(spec.head_scan.n_tiles, -(-rows * spec.head_scan.n_tiles // spec.config.n_out))


def expert_reads(spec: ModelSpec, experts=None) -> list[list[float]]:
    """Per layer and expert the times a step reads the expert's matrices: its share of tokens
    (spec.expert_share, a prediction), or with ``experts`` (per layer a bitmask of the experts read) 1
    or 0; [] without experts."""
    c = spec.config
    if not c.n_experts:
        return []
    if experts is not None:
        return [[float(mask >> e & 1) for e in range(c.n_experts)] for mask in experts]
    return [[spec.expert_share(layer, e) for e in range(c.n_experts)] for layer in range(c.n_layers)]


def expert_tensors(spec: ModelSpec) -> dict[str, float]:
    """Each expert matrix's name and the share of tokens that read it (spec.expert_share)."""
    c = spec.config
    return {f"{pre}{w}": spec.expert_share(layer, e) for layer in range(c.n_layers)
            for e, pre in enumerate(c.ffn_prefixes(layer)) if c.n_experts for w in ("w1", "w2", "w3")}


def usage(spec: ModelSpec, pos: int, kv: str = "f32", sampling: str = "greedy",
          head: str | int | None = None, experts=None) -> dict[str, Use]:
    """Traffic per tensor name and per state region ("kv", "logits", "scratch") for a step at
    ``pos`` whose output layer is ``head`` (see head_mode): ``read`` is exactly what engine.c adds
    to ``bytes[tier]`` — for a mixture of experts what it adds on average over the calibration's
    choices, or exactly with ``experts`` (expert_reads)."""
    cfg = spec.config
    if not 0 <= pos < cfg.max_seq_len:
        raise ModelError(f"position {pos} is outside the context of {cfg.max_seq_len}")
    by = spec.by_name()
    u: dict[str, Use] = {t.name: Use() for t in spec.tensors}
    for r in REGIONS:
        u[r] = Use()
    d, hd, P, L = cfg.dim, cfg.head_dim, cfg.ple_dim, cfg.n_layers
    emb = by["tok_embeddings"]
    u["tok_embeddings"].add("embed", emb.row_stride, rows=1, stride=emb.row_stride)   # one row, dequantized
    scan = spec.head_scan
    if scan is not None and cfg.tied:   # the head's rows in tile order: the token -> row map
        u["head.tiles"].add("embed", scan.map_bytes)
    if P:   # engine.c ple_inputs(): one table row gathered, ple.proj, L norms of P
        u["ple.table"].add("embed", by["ple.table"].row_stride, rows=1, stride=by["ple.table"].row_stride)
        u["ple.proj"].add("embed", by["ple.proj"].length)
        _act(u, "embed", by["ple.proj"])
        u["ple.norm"].add("embed", L * P * 4)
        u["scratch"].add("embed", L * P * 4 * 4, counted=False)           # scale, norm, table row, combine
    reads = expert_reads(spec, experts)
    u["rope.cos"].add("attention", hd // 2 * 4, rows=1, stride=hd // 2 * 4)
    u["rope.sin"].add("attention", hd // 2 * 4, rows=1, stride=hd // 2 * 4)
    for li in range(cfg.n_layers):
        p = f"layers.{li}."
        u[p + "attn_norm"].add("attention", d * 4)
        for w in ("attn.wq", "attn.wk", "attn.wv", "attn.wo"):
            u[p + w].add("attention", by[p + w].length)
            _act(u, "attention", by[p + w])
        # per head: keys then values for t = 0..pos (engine.c attention(); a row's padding unread): f32
        # rows, or a scale and int8 codes (k12's K rows: int16 codes)
        pair = 2 * hd * 4 if kv == "f32" else 8 + hd * (3 if kv == "k12" else 2)
        contiguous = cfg.kv_dim == hd
        u["kv"].add("attention", cfg.n_heads * (pos + 1) * pair,
                    rows=cfg.n_heads * 2 * (1 if contiguous else pos + 1))
        u["scratch"].add("attention", cfg.n_heads * (pos + 1) * 4 * 3, counted=False)   # att[] passes
        u[p + "ffn_norm"].add("ffn", d * 4)
        if cfg.n_experts:   # engine.c experts(): the router's f32 rows, each chosen expert's matrices
            u[p + "ffn.router"].add("ffn", by[p + "ffn.router"].length)
            u["scratch"].add("ffn", d * 4 + cfg.n_experts * 4, counted=False)           # its input, logits
        for e, f in enumerate(cfg.ffn_prefixes(li)):
            share = reads[li][e] if cfg.n_experts else 1.0
            for w in ("w1", "w3", "w2"):
                u[f + w].add("ffn", by[f + w].length * share)
                _act(u, "ffn", by[f + w], share)
            # SiLU * up; with experts the gathered input, the weighted sum
            u["scratch"].add("ffn", (cfg.hidden_dim * 3 + (d * 4 if cfg.n_experts else 0)) * 4 * share, counted=False)
        if P:   # engine.c ple_block()
            for w in ("ple.gate", "ple.proj"):
                u[p + w].add("ple", by[p + w].length)
                _act(u, "ple", by[p + w])
            u[p + "ple.norm"].add("ple", d * 4)
            u["scratch"].add("ple", P * 4 * 3 + d * 4 * 3, counted=False)              # gelu * u; norm; residual
    mode = head_mode(spec, sampling, head)
    if mode == "skip":
        return u
    u["norm"].add("output", d * 4)
    hr = head_rows(spec)
    n_out = cfg.n_out
    if mode == "full" or scan is None:   # engine.c whole_head (+ the argmax of a greedy step)
        u[hr.name].add("output", hr.length)
        _act(u, "output", hr)
        u["logits"].add("output", n_out * 4, counted=False)                              # written
        if scan is not None:   # through probs and the row -> token map into token order
            u["head.tiles"].add("output", n_out * scan.map_bytes)
            u["logits"].add("output", n_out * 8, counted=False)
        if mode != "full":
            u["logits"].add("output", n_out * 4, counted=False)                          # the argmax
        elif sampling == "greedy":
            u["logits"].add("sampling", n_out * 4, counted=False)
        else:   # scale+max, exp+sum, normalize, cdf: logits once, probs three times
            u["logits"].add("sampling", n_out * 4 * 5, counted=False)
    else:       # engine.c tile_scan: centre rows, tile records, k rows in runs of a tile each, their map entries
        cen = by["head.centroids"]
        u["head.centroids"].add("output", cen.length)
        _act(u, "output", cen)
        u["head.tiles"].add("output", 8 * scan.n_tiles + mode * scan.map_bytes)
        runs = tiles_visited(spec, mode)
        u[hr.name].add("output", mode * hr.row_stride, rows=runs, stride=hr.row_stride * max(1, mode // runs))
        _act(u, "output", replace(hr, rows=mode))
        u["logits"].add("output", scan.n_tiles * 8, counted=False)                      # U and each tile's start
    return u


def _act(u: dict, phase: str, w: TensorSpec, share: float = 1.0) -> None:
    """Activation traffic of one matvec (not counted by the engine): the fp32 input once, its int8
    codes and scales once per row (cache-resident after the first), the outputs; times ``share``, the
    times a step runs it (an expert's)."""
    groups = -(-w.cols // w.group)
    u["scratch"].add(phase, (w.cols * 4 + w.cols + groups * 4 + w.rows * 4) * share, counted=False)


def match_pattern(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
