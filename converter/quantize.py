"""Symmetric group-wise int8/int4 weight quantization with a per-tensor recipe.

Recipe: every matrix gets the default format and group size; the token embedding and an untied
output head (the tensors whose error reaches the logits directly) take groups of at most HEAD_GROUP_Q8
with q8 (the output layer) and HEAD_GROUP_Q4 with q4 (both); the PLE table (``ple.table``, most of a PLE model, read one row per token) is q4
whatever the default; norms and the experts' routers (``layers.*.ffn.router``: their top-k choices
should not move with quantization error of their own) stay f32.  Overrides ``PATTERN=FMT[:GROUP]`` (fnmatch on tensor
names; a pattern also matches everything below it, so ``layers.*.ffn=q4`` covers
``layers.3.ffn.w1``; ``head`` names the output layer: ``tok_embeddings`` when tied, else
``output``) win, last one first.

Group scales (``scales``, docs/formats.md section 1): ``row`` (the default) gives each row one
power-of-two scale and each group an integer multiplier 0..255 under it (the group's ideal scale
rounded up to a multiple of the row scale); a matvec then accumulates the whole row in integers.
``f32`` gives each group its own float scale, ``f16`` one rounded to fp16 before the codes are
chosen (stored as fp16: half the scale bytes). A tensor that arrives quantized (llama2.c v2 Q8_0:
f32 scales per group) is kept as it is unless ``scales`` or an override asks for something else.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

import numpy as np

from . import gptq
from .formats import FORMATS, MAX_GROUP, MAX_GROUP_ROW, MULT_MAX
from .ir import ModelConfig, ModelError, ModelIR, QTensor, QuantModel

SCALES = ("row", "f32", "f16")
# q8's output layer at most this group: its rounding flips the near-ties greedy decoding meets (stories260K,
# GPTQ: fp32's greedy text followed for a median 161.5 tokens of 200 against 124 at group 32; the default
# model's head rows grow 136 -> 148 bytes, its decode token 1.01x in flash bytes and emulated RP2040 cycles)
HEAD_GROUP_Q8 = 8
# q4's token embedding and output layer at most this group (q4 instead of q8, as they were until stop 29: the
# q4 default within 5 bits a weight, stories260K's 4.97 against 5.43)
HEAD_GROUP_Q4 = 16
# convert's group when --group-size is not given: q4's default trains at 16 (stories260K QAT: KL 0.034 at 4.97
# bits a weight against 0.045 at group 32's 4.93; its rows of 64 weights take as many bytes either way)
DEFAULT_GROUP = {"q8": 32, "q4": 16}


@dataclass(frozen=True)
class Override:
    pattern: str
    fmt: str
    group_size: int | None

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern) or fnmatch.fnmatchcase(name, self.pattern + ".*")


def parse_overrides(items) -> list[Override]:
    out = []
    for item in items or ():
        pat, sep, spec = item.partition("=")
        fmt, _, gs = spec.partition(":")
        if not sep or not pat or fmt not in ("q8", "q4"):
            raise ModelError(f"bad --quant {item!r}: expected PATTERN=q8|q4[:GROUP], e.g. 'layers.*.ffn=q4:32'")
        try:
            g = int(gs) if gs else None
        except ValueError:
            raise ModelError(f"bad --quant {item!r}: group size {gs!r} is not an integer") from None
        if g is not None:
            check_group_size(g)
        out.append(Override(pat, fmt, g))
    return out


def resolve_head(ovs: list[Override], tied: bool) -> list[Override]:
    """Overrides with the alias ``head`` replaced by the output layer's name."""
    head = head_name(tied)
    return [replace(o, pattern=head) if o.pattern == "head" else o for o in ovs]


def check_scales(scales: str) -> None:
    if scales not in SCALES:
        raise ModelError(f"scales must be row, f32 or f16, got {scales!r}")


def check_group_size(g: int, scales: str = "f32") -> None:
    top = MAX_GROUP_ROW if scales == "row" else MAX_GROUP
    if not 1 <= g <= top:
        raise ModelError(f"group size {g} out of range 1..{top}" + (" for row scales" if scales == "row" else ""))


def rope_tables(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_seq_len, head_dim/2]: float64 angles rounded once to float32."""
    hd = cfg.head_dim
    inv = cfg.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(cfg.max_seq_len, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def pow2_at_least(v: np.ndarray) -> np.ndarray:
    """float32: the smallest power of two >= v (v >= 0; at least 2^-149, the smallest subnormal)."""
    m, e = np.frexp(np.maximum(v.astype(np.float64), 2.0 ** -149))   # v = m 2^e, m in [0.5, 1)
    return np.ldexp(1.0, e - (m == 0.5)).astype(np.float32)


def quantize_matrix(w: np.ndarray, fmt: str, group_size: int, scale16: bool = False,
                    rowscale: bool = False, moments: np.ndarray | None = None,
                    grid: tuple[np.ndarray, np.ndarray] | None = None) -> QTensor:
    """Per row, per group of ``group_size`` columns: scale = max|w| / qmax, code = round(w / scale).
    ``scale16``: the scale is first rounded to fp16 (nearest even), and the codes use that scale.
    ``rowscale``: one power-of-two scale per row, S = the smallest >= (largest group scale) / 255,
    and per group the multiplier k = ceil(scale / S) (0 for an all-zero group), codes round(w / (k S)).
    ``moments``: the inputs' sum x x^T [cols, cols]: the same scales, the codes by GPTQ's rounding.
    ``grid`` (row scales only): the row scales [rows] and multipliers [rows, groups] to round against
    instead of the ones the weights give (converter/qat.py learns them; clipping allowed)."""
    rows, cols = w.shape
    ng = -(-cols // group_size)
    wp = np.zeros((rows, ng * group_size), np.float32)
    wp[:, :cols] = w
    wg = wp.reshape(rows, ng, group_size)
    amax = np.abs(wg).max(axis=2)
    qmax = FORMATS[fmt].qmax
    scales = (amax / np.float32(qmax)).astype(np.float32)
    mult = None
    if grid is not None and not rowscale:
        raise ModelError("a given grid (row scales and multipliers) needs row scales")
    if rowscale:
        if grid is not None:
            row, mult = grid_of(grid, rows, ng)
        else:
            smax = scales.max(axis=1)
            row = np.where(smax > 0, pow2_at_least(smax / np.float64(MULT_MAX)), np.float32(0))
            safe_row = np.where(row > 0, row, np.float32(1)).astype(np.float64)
            mult = np.ceil(scales.astype(np.float64) / safe_row[:, None]).astype(np.uint8)   # exact quotient
        eff = mult.astype(np.float64) * row.astype(np.float64)[:, None]                   # exact
        safe = np.where(eff > 0, eff, 1.0)
        codes = np.clip(np.rint(wg / safe[:, :, None]), -qmax, qmax).astype(np.int8)
        codes[eff == 0] = 0
        codes = codes.reshape(rows, ng * group_size)[:, :cols]
        if moments is not None:
            codes = gptq.round_codes(w, moments, eff, group_size, qmax)
        return QTensor(fmt, codes.copy(), row[:, None].copy(), group_size, False, mult)
    if scale16:
        with np.errstate(over="ignore"):
            scales = scales.astype(np.float16).astype(np.float32)
        if not np.all(np.isfinite(scales)):
            raise ModelError(f"weights up to {float(amax.max()):.3g} overflow fp16 scales (largest 65504); "
                             f"use f32 scales")
    safe = np.where(scales > 0, scales, np.float32(1))
    codes = np.rint(wg / safe[:, :, None])
    codes = np.clip(codes, -qmax, qmax).astype(np.int8)
    codes[scales == 0] = 0
    codes = codes.reshape(rows, ng * group_size)[:, :cols]
    if moments is not None:
        codes = gptq.round_codes(w, moments, scales.astype(np.float64), group_size, qmax)
    return QTensor(fmt, codes.copy(), scales, group_size, scale16)


def grid_of(grid: tuple[np.ndarray, np.ndarray], rows: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """A given grid as quantize_matrix keeps it: row scales float32 [rows] (powers of two or 0), multipliers
    uint8 [rows, groups]; refused when its shape or a value does not fit the format."""
    row, mult = np.asarray(grid[0], np.float32).reshape(-1), np.asarray(grid[1])
    if row.shape != (rows,) or mult.shape != (rows, groups):
        raise ModelError(f"a grid of {row.shape[0]} row scales and {mult.shape} multipliers for a matrix of "
                         f"{rows} rows of {groups} groups")
    m, _ = np.frexp(row)
    if np.any((row < 0) | ((row > 0) & (m != 0.5))) or np.any((mult < 0) | (mult > MULT_MAX)):
        raise ModelError(f"a grid's row scales must be powers of two and its multipliers within 0..{MULT_MAX}")
    return row, mult.astype(np.uint8)


def is_router(name: str) -> bool:
    """A mixture of experts' router (kept f32 whatever the recipe)."""
    return name.endswith(".ffn.router")


def head_name(tied: bool) -> str:
    """The tensor that is the output layer."""
    return "tok_embeddings" if tied else "output"


def default_spec(name: str, default_format: str, group_size: int, head: str) -> tuple[str, int]:
    """A tensor's format and group before overrides; ``head``: head_name(config.tied)."""
    if name == "ple.table":
        return "q4", group_size
    if name == head and default_format == "q8":
        return "q8", min(group_size, HEAD_GROUP_Q8)
    if name in ("tok_embeddings", "output") and default_format == "q4":
        return "q4", min(group_size, HEAD_GROUP_Q4)
    return default_format, group_size


def scheme_of(t: QTensor) -> str:
    """A quantized tensor's group scales: row, f32 or f16."""
    return "row" if t.rowscale else "f16" if t.scale16 else "f32"


def recipe_entry(fmt: str, g: int, scales: str) -> str:
    return f"{fmt}:{g}" + ("" if scales == "row" else f":{scales}")


def quantize(ir: ModelIR, default_format: str = "q8", group_size: int = 32, overrides=(),
             scales: str | None = None, moments: dict | None = None, grids: dict | None = None) -> QuantModel:
    """``scales`` None: row scales, and a tensor that arrived quantized stays as it is (unless an
    override names it). ``moments`` (converter/calibrate.py): per matrix its inputs' sum x x^T, whose
    matrices get GPTQ's codes; a tied token embedding's are the head's inputs (an untied one has none:
    it is only looked up), and GPTQ's damping keeps the error of the rows it looks up small. ``grids``
    (converter/qat.py): per matrix the row scales and multipliers its codes are rounded against."""
    if default_format not in ("q8", "q4"):
        raise ModelError(f"format must be q8 or q4, got {default_format!r}")
    scheme = scales or "row"
    check_scales(scheme)
    check_group_size(group_size, scheme)
    ovs = overrides if overrides and isinstance(overrides[0], Override) else parse_overrides(overrides)
    for o in ovs:
        if o.group_size is not None:
            check_group_size(o.group_size, scheme)
    ir.validate()
    cfg = ir.config
    ovs = resolve_head(ovs, cfg.tied)
    unused = [o.pattern for o in ovs if not any(o.matches(n) for n in ir.tensors)]
    if unused:
        raise ModelError(f"--quant pattern {unused[0]!r} matches no tensor (names look like "
                         f"'layers.0.ffn.w1', 'tok_embeddings', 'output', 'head')")
    tensors: dict[str, QTensor | np.ndarray] = {}
    recipe: dict[str, str] = {}
    for name, t in ir.tensors.items():
        if len(t.shape) == 1 or is_router(name):
            if any(fnmatch.fnmatchcase(name, o.pattern) for o in ovs) and is_router(name):
                raise ModelError(f"--quant: {name} stays f32 (a router's choices must not move by its "
                                 f"own quantization error)")
            tensors[name] = np.asarray(t.dequantize() if isinstance(t, QTensor) else t, np.float32)
            recipe[name] = "f32"
            continue
        fmt, g = default_spec(name, default_format, group_size, head_name(cfg.tied))
        named = [o for o in reversed(ovs) if o.matches(name)]
        if isinstance(t, QTensor) and scales is None and not named:
            tensors[name] = t                 # arrived quantized: keep it unless told otherwise
            recipe[name] = recipe_entry(t.fmt, t.group_size, scheme_of(t))
            continue
        if named:
            fmt, g = named[0].fmt, (named[0].group_size or g)
        if isinstance(t, QTensor) and (t.fmt, t.group_size, scheme_of(t)) == (fmt, g, scheme):
            tensors[name] = t
        else:
            w = t.dequantize() if isinstance(t, QTensor) else np.asarray(t, np.float32)
            try:
                h = (moments or {}).get(name)
                tensors[name] = quantize_matrix(w, fmt, g, scheme == "f16", scheme == "row", h, (grids or {}).get(name))
            except ModelError as e:
                raise ModelError(f"tensor {name}: {e}") from None
        recipe[name] = recipe_entry(fmt, g, scheme)
    if ir.rope_cos is not None and ir.rope_sin is not None:
        cos, sin = np.asarray(ir.rope_cos, np.float32), np.asarray(ir.rope_sin, np.float32)
    else:
        cos, sin = rope_tables(cfg)
    return QuantModel(cfg, tensors, cos, sin, ir.tokenizer, recipe, ir.source, ir.stop_ids())
