"""The blob's formats in one place (docs/formats.md section 1): every weight format with its byte
size and row layout, the tensor table's format and tier codes, the header's ``state_tiers`` field
as a typed value, the sections the firmware reads from flash only, and the head index's header as
the planner sees it.

It imports nothing of the project but ``ir``, so the writer and reader (blob.py), the cost model,
the planner and the RAM sums (footprint.py) all stand on it without depending on each other.

A quantized row holds its groups of ``group_size`` columns (the last one ragged), each group's
codes padded to 4 bytes, with one of three scale layouts (the format's flag bits):

* f32 scales (no flag): a block per group, its f32 scale then its codes;
* fp16 scales (``FMT_SCALE16``): the row's fp16 scales first (padded to 4), then each group's codes;
* row-scaled (``FMT_ROWSCALE``): the f32 row scale, the groups' u8 multipliers (padded to 4), then
  each group's codes; q4 codes are stored offset by 8 (0..15) instead of two's complement.

``encode_qtensor``/``decode_qtensor`` are the one writer and reader of that layout; the quantizer
(quantize.py ``quantize_matrix``) and ``QTensor.dequantize`` (ir.py) are its float side.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from .ir import ModelError, QTensor


class BlobError(ModelError):
    """A blob, or a field of one, that breaks the format; the message is for the user."""


# ---- weight formats -------------------------------------------------------------------------

@dataclass(frozen=True)
class Format:
    """One format of the tensor table: its code (format bits 0-7), the bits of one stored value and,
    for a quantized format, the largest code (codes lie in [-qmax, qmax])."""
    name: str
    code: int
    bits: int
    qmax: int = 0

    @property
    def quantized(self) -> bool:
        return self.qmax > 0

    def value_bytes(self, n: int) -> int:
        """Bytes of n values, unpadded (int4: two a byte, low nibble first)."""
        return (n * self.bits + 7) // 8


FORMATS = {f.name: f for f in (Format("f32", 0, 32), Format("q8", 1, 8, 127), Format("q4", 2, 4, 7),
                                Format("bytes", 3, 8))}        # bytes: an opaque section
BY_CODE = {f.code: f for f in FORMATS.values()}
FMT_BASE = 0xFF                # format bits 0-7: the base format
FMT_SCALE16 = 0x100            # format bit 8: the quantized rows carry fp16 scales
FMT_ROWSCALE = 0x200           # format bit 9: a row scale and integer group multipliers
MAX_GROUP = 1024               # keeps every int32 group sum below 2**24, so its float conversion is exact
MAX_GROUP_ROW = 512            # row-scaled: keeps multiplier x group sum below 2**31
MULT_MAX = 255                 # row-scaled: the largest group multiplier
TIER_CODE = {"flash": 0, "psram": 1, "sram": 2}
TIER_NAME = {v: k for k, v in TIER_CODE.items()}

# the container's geometry: header, 64-byte table entries, every section's data 64-byte aligned
HEADER_SIZE = 112
ENTRY_SIZE = 64
ALIGN = 64


def up64(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pad4(n: int) -> int:
    return (n + 3) & ~3


def blob_size(lengths) -> int:
    """Bytes of a blob whose sections have these lengths (header, table, aligned data)."""
    lengths = list(lengths)
    return up64(HEADER_SIZE + ENTRY_SIZE * len(lengths)) + sum(up64(n) for n in lengths)


def group_lengths(cols: int, g: int) -> list[int]:
    ng = -(-cols // g)
    return [g] * (ng - 1) + [cols - (ng - 1) * g]


def code_bytes(fmt: str, n: int) -> int:
    """Bytes of n codes, padded to a multiple of 4 (so every group's codes start word aligned)."""
    return pad4(FORMATS[fmt].value_bytes(n))


def block_bytes(fmt: str, n: int) -> int:
    return 4 + code_bytes(fmt, n)


def row_stride(fmt: str, cols: int, g: int = 0, scale16: bool = False, rowscale: bool = False) -> int:
    """Bytes of one row of a table entry: f32 and bytes their values; a quantized row its full
    groups, then the last partial one (closed form, so a header's column count of 2**32 costs
    nothing to check), with its scales laid out as the module doc says."""
    f = FORMATS[fmt]
    if not f.quantized:
        return f.value_bytes(cols)
    full, last = divmod(cols, g)
    ng = full + (1 if last else 0)
    codes = full * code_bytes(fmt, g) + (code_bytes(fmt, last) if last else 0)
    if rowscale:
        return 4 + pad4(ng) + codes
    if scale16:
        return pad4(2 * ng) + codes
    return 4 * ng + codes


def row_padding(e) -> int:
    """Bytes of one of a quantized table entry ``e``'s rows (blob.Entry) that the engine counts
    (whole strides) but no kernel loads: the zeros that align each group's codes to 4, and those
    after a row's fp16 scales or multipliers."""
    ng = -(-e.cols // e.group_size)
    last = e.cols - (ng - 1) * e.group_size
    f = FORMATS[e.fmt]
    scales = 4 + ng if e.rowscale else (2 if e.scale16 else 4) * ng
    return e.row_stride - (scales + (ng - 1) * f.value_bytes(e.group_size) + f.value_bytes(last))


def streams_rows(tier: str, row_stride: int, stream_stride: int) -> bool:
    """Whether a product of a matrix in ``tier`` with rows of ``row_stride`` bytes is streamed from flash
    into SRAM whole, padding and all, on a board streaming rows of a stride up to ``stream_stride``
    (converter/boards.py stream_stride; 0: none; the RP2040's stream_rp2040.c hal_matmul)."""
    return tier == "flash" and 0 < row_stride <= stream_stride


def padding_per_step(h, tied: bool, head_rows: int, tokens: int = 1, scan: bool = True,
                     experts: tuple[int, ...] = (), stream_stride: int = 0) -> dict[str, int]:
    """Per tier, the padding (row_padding) inside the rows a forward pass of ``tokens`` tokens reads
    that no kernel loads: every row of the layers' matrices when one token runs through them (for
    more, the engine copies whole rows, padding and all, to reuse them: kernels.c flm_matmul_rows),
    a row per token of the gathered tables (the embedding, the PLE table), the ``head_rows`` rows of
    the output layer (the embedding's rows when ``tied``) one token's head computed, and, when that
    head ran the tile ``scan``, every row of the head index's centre rows. Of a mixture of experts only
    the experts the pass read count (``experts``: per layer a bitmask, as TOKEN frames carry them).
    On a board that streams a product's rows from flash into SRAM whole (the RP2040's
    stream_rp2040.c: rows of a stride up to ``stream_stride``), those rows' padding is transferred:
    only the gathered tables' rows keep theirs unloaded."""
    by = {e.name: e for e in h.entries}
    head = by["tok_embeddings" if tied else "output"]
    c = h.config
    unread = {f"{pre}{w}" for layer, mask in enumerate(experts) for e, pre in enumerate(c.ffn_prefixes(layer))
              if not mask >> e & 1 for w in ("w1", "w2", "w3")}
    def streamed(e) -> bool:
        return streams_rows(e.tier, e.row_stride, stream_stride)

    rows = {e.name: e.rows if tokens == 1 and not streamed(e) else 0
            for e in h.entries if e.fmt in ("q8", "q4") and e.name not in unread}
    cent = by.get("head.centroids")
    rows.update({"tok_embeddings": tokens, "ple.table": tokens, "output": 0,
                 "head.centroids": cent.rows if scan and cent is not None and not streamed(cent) else 0})
    rows[head.name] = rows.get(head.name, 0) + (0 if streamed(head) else head_rows)
    out = {}
    for name, n in rows.items():
        if name in by:
            out[by[name].tier] = out.get(by[name].tier, 0) + n * row_padding(by[name])
    return out


def scale_flags(t: QTensor) -> int:
    """The format bits that say how a quantized tensor's groups are scaled (0: f32 per group)."""
    return FMT_ROWSCALE if t.rowscale else FMT_SCALE16 if t.scale16 else 0


def format_code(fmt: str, flags: int) -> int:
    return FORMATS[fmt].code | flags


# ---- the quantized row layout ---------------------------------------------------------------

def _pack_codes(fmt: str, codes: np.ndarray, offset: bool = False) -> np.ndarray:
    """[rows, n] int8 codes -> [rows, code_bytes] bytes (int8, or int4 nibble pairs, low first:
    two's complement, or with ``offset`` code + 8)."""
    rows, n = codes.shape
    if fmt == "q8":
        body = codes.astype(np.int8).view(np.uint8)
    else:
        nib = ((codes.astype(np.int16) + (8 if offset else 0)) & 0xF).astype(np.uint8)
        if n % 2:
            nib = np.concatenate([nib, np.zeros((rows, 1), np.uint8)], axis=1)
        body = nib[:, 0::2] | (nib[:, 1::2] << 4)
    return np.concatenate([body, np.zeros((rows, code_bytes(fmt, n) - body.shape[1]), np.uint8)], axis=1)


def encode_qtensor(q: QTensor) -> bytes:
    """Rows of blocks (f32 scale, then the group's codes), or with fp16 scales the row's scales
    then its groups' codes, or row-scaled the row scale, the multipliers, then the groups' codes
    (q4 offset by 8); codes padded to 4 bytes per group."""
    rows, cols = q.shape
    lens = group_lengths(cols, q.group_size)
    starts = np.cumsum([0] + lens[:-1])
    codes = [_pack_codes(q.fmt, q.codes[:, a:a + n], q.rowscale) for a, n in zip(starts, lens)]
    if q.rowscale:
        mult = np.asarray(q.mult, np.uint8)
        parts = [q.scales[:, :1].astype("<f4").view(np.uint8), mult,
                 np.zeros((rows, pad4(mult.shape[1]) - mult.shape[1]), np.uint8)] + codes
    elif q.scale16:
        sc = q.scales.astype("<f2").view(np.uint8)
        parts = [sc, np.zeros((rows, pad4(sc.shape[1]) - sc.shape[1]), np.uint8)] + codes
    else:
        sc = q.scales.astype("<f4").view(np.uint8)
        parts = [x for gi, c in enumerate(codes) for x in (sc[:, 4 * gi:4 * gi + 4], c)]
    return np.ascontiguousarray(np.concatenate(parts, axis=1)).tobytes()


def decode_qtensor(buf: bytes, fmt: str, rows: int, cols: int, g: int, scale16: bool = False,
                   rowscale: bool = False) -> QTensor:
    stride = row_stride(fmt, cols, g, scale16, rowscale)
    raw = np.frombuffer(buf, np.uint8, rows * stride).reshape(rows, stride)
    lens = group_lengths(cols, g)
    codes = np.zeros((rows, cols), np.int8)
    mult = None
    if rowscale:
        scales = raw[:, :4].copy().view("<f4").astype(np.float32)
        mult = raw[:, 4:4 + len(lens)].copy()
        off = 4 + pad4(len(lens))
    elif scale16:
        scales = raw[:, :2 * len(lens)].copy().view("<f2").astype(np.float32)
        off = pad4(2 * len(lens))
    else:
        scales = np.zeros((rows, len(lens)), np.float32)
        off = 0
    start = 0
    for gi, n in enumerate(lens):
        if not (scale16 or rowscale):
            scales[:, gi] = raw[:, off:off + 4].copy().view("<f4")[:, 0]
            off += 4
        body = raw[:, off:off + code_bytes(fmt, n)]
        if fmt == "q8":
            codes[:, start:start + n] = body[:, :n].view(np.int8)
        else:
            nib = np.stack([body & 0xF, body >> 4], axis=2).reshape(rows, -1)[:, :n].astype(np.int8)
            codes[:, start:start + n] = nib - 8 if rowscale else np.where(nib > 7, nib - 16, nib)
        off += code_bytes(fmt, n)
        start += n
    return QTensor(fmt, codes, scales, g, scale16, mult)


# ---- sections -------------------------------------------------------------------------------

DRAFT = "draft"                # the draft model of speculative decoding: a blob in the blob (section 1.4)
GOLDEN = "golden"              # the golden check (section 1.3, converter/golden.py)
PINNED_TO_FLASH = ("tokenizer", "ple.table", DRAFT, GOLDEN)   # sections the firmware reads from flash only


@dataclass(frozen=True)
class HeadScan:
    """A model's greedy head index as the planner needs it (the ``head.tiles`` header)."""
    n_tiles: int
    map_bytes: int
    expected_rows: float      # the calibration's mean head rows a greedy step visits (a prediction)
    expected_tiles: float     # ... and tiles

    @classmethod
    def of(cls, index) -> "HeadScan | None":
        """The scan of a headprune.HeadIndex (None: no index)."""
        return None if index is None else cls(index.n_tiles, index.map_bytes, index.expected_rows,
                                              index.expected_tiles)


# ---- the header's state_tiers field ---------------------------------------------------------

REGIONS = ("kv", "logits", "scratch")   # the engine's RAM regions: FLM_REG_KV, FLM_REG_LOGITS, FLM_REG_SCRATCH
DEFAULT = "default"                     # a region in the board's default arena
KV_CODE = {"f32": 0, "int8": 1, "k12": 2}   # the KV cache's formats (also the golden section's block codes)
KV_FORMATS = tuple(KV_CODE)
KV_DEFAULT = "k12"                      # convert's (12-bit K rows, int8 V rows); int8 for boards short of SRAM
K12_MAX_HEAD_DIM = 512                  # k12's score sum 2047^2 * head_dim stays an int32
MAX_BATCH = 255


def kv_refusal(kv: str, head_dim: int) -> str | None:
    """None when a model with heads of head_dim can keep a ``kv`` cache, else the one-line reason
    (blob.c flm_kv_refusal says the same)."""
    if kv not in KV_CODE:
        return f"KV cache format must be one of {', '.join(KV_CODE)}, got {kv!r}"
    if kv == "k12" and head_dim > K12_MAX_HEAD_DIM:
        return f"a k12 KV cache needs a head of at most {K12_MAX_HEAD_DIM} (flashlm convert --kv int8)"
    return None


def smaller_kv(kv: str, head_dim: int) -> list[str]:
    """The KV formats a model of heads of head_dim can keep in less RAM than ``kv``, largest first
    (f32 > k12 > int8, section 1.2 of docs/formats.md)."""
    order = ["f32", "k12", "int8"]
    return [k for k in order[order.index(kv) + 1:] if kv_refusal(k, head_dim) is None]

_KV_SHIFT, _BATCH_SHIFT = 12, 16


@dataclass(frozen=True)
class StateTiers:
    """What the blob header's (and LAYOUT's) u32 ``state_tiers`` says: the KV cache's format, the
    batch (the most tokens one forward pass runs) and the RAM tier of each state region (REGIONS
    order; ``DEFAULT``: the board's default arena). ``to_u32``/``from_u32`` are the only code that
    knows its bits (docs/formats.md section 1)."""
    kv: str = "f32"
    batch: int = 1
    tiers: tuple[str, ...] = (DEFAULT,) * len(REGIONS)

    def __post_init__(self):
        if self.kv not in KV_CODE:
            raise BlobError(f"KV cache format must be one of {', '.join(KV_CODE)}, got {self.kv!r}")
        if not 1 <= int(self.batch) <= MAX_BATCH:
            raise BlobError(f"batch must be 1..{MAX_BATCH} tokens per forward pass, got {self.batch}")
        object.__setattr__(self, "batch", int(self.batch))
        for region, t in zip(REGIONS, self.tiers):
            if t not in (DEFAULT, "psram", "sram"):
                raise BlobError(f"the {region} buffers cannot live in {t}; choose psram or sram")

    @classmethod
    def of(cls, regions: dict[str, str] | None = None, kv: str = "f32", batch: int = 1) -> "StateTiers":
        """From {"kv": "psram", ...} (a region missing, None or "default": the board's default arena)."""
        regions = regions or {}
        return cls(kv, batch, tuple(regions.get(r) or DEFAULT for r in REGIONS))

    def regions(self, default: str = DEFAULT) -> dict[str, str]:
        """Region -> tier, the regions in the default arena given as ``default``."""
        return {r: default if t == DEFAULT else t for r, t in zip(REGIONS, self.tiers)}

    def to_u32(self) -> int:
        """The field: 4 bits per region from bit 0 (0 the default arena, else TIER_CODE), the KV format
        in bits 12-15, the batch in bits 16-23 (1 written as 0, so a batch of one leaves the field, and
        so the layout id, as it was before batches existed)."""
        v = KV_CODE[self.kv] << _KV_SHIFT | (self.batch if self.batch > 1 else 0) << _BATCH_SHIFT
        for i, t in enumerate(self.tiers):
            if t != DEFAULT:
                v |= TIER_CODE[t] << (4 * i)
        return v

    @classmethod
    def from_u32(cls, v: int) -> "StateTiers":
        """The field's meaning; a bit outside its fields or an unknown code is a BlobError."""
        kv = {c: k for k, c in KV_CODE.items()}.get((v >> _KV_SHIFT) & 0xF)
        codes = [(v >> (4 * i)) & 0xF for i in range(len(REGIONS))]
        if v >> (_BATCH_SHIFT + 8) or kv is None or any(c not in (0, TIER_CODE["psram"], TIER_CODE["sram"])
                                                        for c in codes):
            raise BlobError(f"bad state_tiers 0x{v:x}")
        return cls(kv, ((v >> _BATCH_SHIFT) & 0xFF) or 1, tuple(TIER_NAME[c] if c else DEFAULT for c in codes))


def layout_id_of(tier_codes, state_tiers: int = 0) -> int:
    """crc32 of one byte per table entry (its tier), followed by u32 state_tiers when non-zero."""
    data = bytes(tier_codes)
    if state_tiers:
        data += struct.pack("<I", state_tiers)
    return zlib.crc32(data)
