"""The weights blob (flash image), format version 3 — layout in docs/formats.md section 1.

The C reader (firmware/engine/blob.c) validates the same fields; ``read_blob`` turns a blob
back into the QuantModel it encodes, so tests run the reference on exactly the bytes the
firmware reads.
"""
from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import golden, headprune
from .files import read_file
from .ir import MAX_STOP_IDS, ModelConfig, ModelError, QTensor, StopIds, Tokenizer
from .quantize import MAX_GROUP, MAX_GROUP_ROW, QuantModel
from .tokenizer_enc import SECTION as ENC_SECTION, device_section

MAGIC = b"FLMB"
VERSION = 3
HEADER_SIZE = 112
ENTRY_SIZE = 64
ALIGN = 64
FMT_CODE = {"f32": 0, "q8": 1, "q4": 2, "bytes": 3}
FMT_NAME = {v: k for k, v in FMT_CODE.items()}
FMT_SCALE16 = 0x100            # format bit 8: the quantized rows carry fp16 scales
FMT_ROWSCALE = 0x200           # format bit 9: a row scale and integer group multipliers
FMT_BASE = 0xFF                # bits 0-7: the base format
TIER_CODE = {"flash": 0, "psram": 1, "sram": 2}
TIER_NAME = {v: k for k, v in TIER_CODE.items()}
NONE_ID = 0xFFFFFFFF
CONFIG_FMT = "<10I2f4I"        # 64-byte config block at offset 48 (v2: ple_dim, out_vocab, 2 reserved)
PINNED_TO_FLASH = ("tokenizer", "ple.table", "draft", golden.SECTION)   # sections the firmware reads from flash only
DRAFT = "draft"                # the draft model of speculative decoding: a blob in the blob (section 1.4)
STOP_SECTION = "tokenizer.stop"   # u32 n, u32 ids[n]: generation ends at any of these ids
ENTRY_FMT = "<32s8I"


class BlobError(ModelError):
    pass


@dataclass(frozen=True)
class BlobInfo:
    path: Path
    size: int
    model_hash: bytes
    layout_id: int
    crc: int


@dataclass
class Entry:
    name: str
    fmt: str
    rows: int
    cols: int
    group_size: int
    tier: str
    offset: int
    length: int
    row_stride: int
    scale16: bool = False
    rowscale: bool = False


def _pad4(n: int) -> int:
    return (n + 3) & ~3


def group_lengths(cols: int, g: int) -> list[int]:
    ng = -(-cols // g)
    return [g] * (ng - 1) + [cols - (ng - 1) * g]


def code_bytes(fmt: str, n: int) -> int:
    """Bytes of n codes, padded to a multiple of 4 (so every group's codes start word aligned)."""
    return _pad4(n if fmt == "q8" else (n + 1) // 2)


def block_bytes(fmt: str, n: int) -> int:
    return 4 + code_bytes(fmt, n)


def row_stride(fmt: str, cols: int, g: int, scale16: bool = False, rowscale: bool = False) -> int:
    """Bytes of one row: full groups, then the last partial one (closed form, so a header's
    column count of 2**32 costs nothing to check). f32 scales: a block per group (scale, codes);
    fp16 scales: the row's scales first (padded to 4), then each group's codes; row-scaled: the
    f32 row scale, the groups' u8 multipliers (padded to 4), then each group's codes."""
    full, last = divmod(cols, g)
    ng = full + (1 if last else 0)
    codes = full * code_bytes(fmt, g) + (code_bytes(fmt, last) if last else 0)
    if rowscale:
        return 4 + _pad4(ng) + codes
    if scale16:
        return _pad4(2 * ng) + codes
    return 4 * ng + codes


def row_padding(e: Entry) -> int:
    """Bytes of one of ``e``'s rows that the engine counts (whole strides) but no kernel loads: the
    zeros that align each group's codes to 4, and those after a row's fp16 scales or multipliers."""
    ng = -(-e.cols // e.group_size)
    last = e.cols - (ng - 1) * e.group_size
    code = (lambda n: n) if e.fmt == "q8" else (lambda n: (n + 1) // 2)
    scales = 4 + ng if e.rowscale else (2 if e.scale16 else 4) * ng
    return e.row_stride - (scales + (ng - 1) * code(e.group_size) + code(last))


def padding_per_step(h: "BlobHeader", tied: bool, head_rows: int) -> dict[str, int]:
    """Per tier, the padding (row_padding) inside the rows one forward step of one token reads:
    every row of the layers' matrices, one row each of the gathered tables (the embedding, the PLE
    table), and ``head_rows`` rows of the output layer (the embedding's rows when ``tied``)."""
    by = {e.name: e for e in h.entries}
    head = by["tok_embeddings" if tied else "output"]
    rows = {e.name: e.rows for e in h.entries if e.fmt in ("q8", "q4")}
    rows.update({"tok_embeddings": 1, "ple.table": 1, "output": 0})
    rows[head.name] = rows.get(head.name, 0) + head_rows
    out = {}
    for name, n in rows.items():
        if name in by:
            out[by[name].tier] = out.get(by[name].tier, 0) + n * row_padding(by[name])
    return out


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
                 np.zeros((rows, _pad4(mult.shape[1]) - mult.shape[1]), np.uint8)] + codes
    elif q.scale16:
        sc = q.scales.astype("<f2").view(np.uint8)
        parts = [sc, np.zeros((rows, _pad4(sc.shape[1]) - sc.shape[1]), np.uint8)] + codes
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
        off = 4 + _pad4(len(lens))
    elif scale16:
        scales = raw[:, :2 * len(lens)].copy().view("<f2").astype(np.float32)
        off = _pad4(2 * len(lens))
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


def encode_tokenizer(tok: Tokenizer | None, vocab: int) -> bytes:
    pieces = tok.pieces if tok is not None else [f"<{i}>".encode() for i in range(vocab)]
    offs = np.zeros(len(pieces) + 1, "<u4")
    offs[1:] = np.cumsum([len(p) for p in pieces])
    maxlen = max((len(p) for p in pieces), default=0)
    return struct.pack("<2I", len(pieces), maxlen) + offs.tobytes() + b"".join(pieces)


def decode_tokenizer(buf: bytes) -> list[bytes]:
    if len(buf) < 8:
        raise BlobError("tokenizer section too short")
    n, _ = struct.unpack_from("<2I", buf)
    if 8 + 4 * (n + 1) > len(buf):
        raise BlobError("tokenizer section truncated")
    offs = np.frombuffer(buf, "<u4", n + 1, 8)
    base = 8 + 4 * (n + 1)
    if np.any(np.diff(offs.astype(np.int64)) < 0) or offs[0] != 0 or base + int(offs[-1]) > len(buf):
        raise BlobError("tokenizer section has bad offsets")
    return [bytes(buf[base + offs[i]:base + offs[i + 1]]) for i in range(n)]


def encode_stop_ids(stops: StopIds) -> bytes:
    return struct.pack(f"<{1 + len(stops.ids)}I", len(stops.ids), *stops.ids)


def decode_stop_ids(buf: bytes, vocab: int) -> tuple[int, ...]:
    """The ids of a tokenizer.stop section, checked as the firmware checks them."""
    n = struct.unpack_from("<I", buf)[0] if len(buf) >= 4 else None
    if n is None or n > MAX_STOP_IDS or len(buf) != 4 + 4 * n:
        raise BlobError(f"{STOP_SECTION} section of {len(buf)} bytes is not u32 n (at most {MAX_STOP_IDS}) "
                        f"and n ids")
    ids = struct.unpack_from(f"<{n}I", buf, 4)
    if any(i >= vocab for i in ids):
        raise BlobError(f"{STOP_SECTION}: stop id {max(ids)} is outside the vocabulary of {vocab}")
    return ids


def _sections(qm: QuantModel, batch: int = 1, golden_fault: int | None = None
              ) -> list[tuple[str, str, int, int, int, int, bytes]]:
    """(name, fmt, rows, cols, group, format flags, data) in blob order: tokenizer (its stop ids,
    tokenizer.stop, and its device encoder's tables, tokenizer.enc), RoPE tables, tensors, with
    a head index its centre rows and tiles (the head's rows then stored in tile order,
    converter/headprune.py), the draft model (a blob of its own, its passes as long as the
    model's), and the golden check (converter/golden.py; ``golden_fault``: a test's deliberately
    wrong step)."""
    c = qm.config
    tok = encode_tokenizer(qm.tokenizer, c.vocab_size)
    qm.stops.check(c.vocab_size)
    stop = encode_stop_ids(qm.stops)
    out = [("tokenizer", "bytes", 1, len(tok), 0, False, tok), (STOP_SECTION, "bytes", 1, len(stop), 0, False, stop)]
    enc, _ = device_section(qm.tokenizer, c)      # the device's text encoder, when it can have one
    if enc is not None:
        out.append((ENC_SECTION, "bytes", 1, len(enc), 0, False, enc))
    for name, t in (("rope.cos", qm.rope_cos), ("rope.sin", qm.rope_sin)):
        a = np.ascontiguousarray(t, "<f4")
        out.append((name, "f32", a.shape[0], a.shape[1], 0, False, a.tobytes()))
    index = qm.head_index
    head = "tok_embeddings" if c.tied else "output"
    for name in c.tensor_shapes():
        t = qm.tensors[name]
        if index is not None and name == head:
            t = headprune.stored_head(t, index)
        if isinstance(t, QTensor):
            out.append((name, t.fmt, t.shape[0], t.shape[1], t.group_size, scale_flags(t), encode_qtensor(t)))
        else:
            a = np.ascontiguousarray(t, "<f4").reshape(1, -1)
            out.append((name, "f32", 1, a.shape[1], 0, False, a.tobytes()))
    if index is not None:
        cen = index.centroids
        out.append((headprune.CENTROIDS, cen.fmt, cen.shape[0], cen.shape[1], cen.group_size, scale_flags(cen),
                    encode_qtensor(cen)))
        tiles = headprune.section_bytes(index, qm.head().shape[0])
        out.append((headprune.SECTION, "bytes", 1, len(tiles), 0, False, tiles))
    if qm.draft is not None:
        d = build_blob(qm.draft.qm, kv=qm.draft.kv, batch=batch)
        out.append((DRAFT, "bytes", 1, len(d), 0, False, d))
    gold = golden.section_bytes(qm, golden_fault)
    out.append((golden.SECTION, "bytes", 1, len(gold), 0, False, gold))
    return out


def scale_flags(t: QTensor) -> int:
    """The format bits that say how a quantized tensor's groups are scaled (0: f32 per group)."""
    return FMT_ROWSCALE if t.rowscale else FMT_SCALE16 if t.scale16 else 0


def format_code(fmt: str, flags: int) -> int:
    return FMT_CODE[fmt] | flags


def check_pinned(tiers: dict[str, str]) -> None:
    """Refuse a placement that moves a flash-only section (the tokenizer, the PLE table) off flash."""
    for name in PINNED_TO_FLASH:
        t = tiers.get(name, "flash")
        if t != "flash":
            why = ("it is a gather of one row per token that the firmware reads in place and never stages"
                   if name == "ple.table" else "the firmware reads it in place and never stages it")
            raise BlobError(f"{name} cannot be placed in {t}: {why}; it stays in flash")


def config_block(c: ModelConfig, tok: Tokenizer | None) -> bytes:
    bos = tok.bos_id if tok is not None and tok.bos_id is not None else NONE_ID
    eos = tok.eos_id if tok is not None and tok.eos_id is not None else NONE_ID
    return struct.pack(CONFIG_FMT, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.hidden_dim,
                       c.vocab_size, c.max_seq_len, 1 if c.tied else 0, bos, eos,
                       c.norm_eps, c.rope_theta, c.ple_dim, c.n_out, 0, 0)


STATE_REGIONS = ("kv", "logits", "scratch")   # 4-bit fields of the header's state_tiers, low bits first
STATE_DEFAULT = 0                             # field value: the board's default arena
KV_SHIFT = 12                                 # state_tiers bits 12-15: the KV cache's format
KV_CODE = {"f32": 0, "int8": 1}
KV_NAME = {v: k for k, v in KV_CODE.items()}


BATCH_SHIFT = 16                              # state_tiers bits 16-23: the batch (0 stands for 1)
MAX_BATCH = 255


def pack_state_tiers(state: dict[str, str] | int | None, kv: str = "f32", batch: int = 1) -> int:
    """Header field ``state_tiers`` from {"kv": "psram", ...} (missing or "default": the board's arena),
    the KV cache format ``kv`` (f32 or int8) and the batch (the most tokens one forward pass runs);
    an int is taken as the whole field."""
    if isinstance(state, int):
        return state
    v = with_batch(with_kv(0, kv), batch)
    if state is None:
        return v
    for i, region in enumerate(STATE_REGIONS):
        t = state.get(region, "default")
        if t in (None, "default"):
            continue
        if t not in ("psram", "sram"):
            raise BlobError(f"the {region} buffers cannot live in {t}; choose psram or sram")
        v |= TIER_CODE[t] << (4 * i)
    return v


def with_kv(state_tiers: int, kv: str) -> int:
    """A state_tiers field with its KV cache format replaced by kv (f32, int8)."""
    if kv not in KV_CODE:
        raise BlobError(f"KV cache format must be f32 or int8, got {kv!r}")
    return (state_tiers & ~(0xF << KV_SHIFT)) | (KV_CODE[kv] << KV_SHIFT)


def with_batch(state_tiers: int, batch: int) -> int:
    """A state_tiers field with its batch replaced (1 is written as 0, so a batch of one leaves the
    field, and so the layout id, as it was before batches existed)."""
    if not 1 <= int(batch) <= MAX_BATCH:
        raise BlobError(f"batch must be 1..{MAX_BATCH} tokens per forward pass, got {batch}")
    return (state_tiers & ~(0xFF << BATCH_SHIFT)) | ((int(batch) if batch > 1 else 0) << BATCH_SHIFT)


def batch_of(state_tiers: int) -> int:
    """The batch a header's (or LAYOUT's) state_tiers field names."""
    return ((state_tiers >> BATCH_SHIFT) & 0xFF) or 1


def kv_format(state_tiers: int) -> str:
    """The KV cache format a header's (or LAYOUT's) state_tiers field names."""
    return KV_NAME.get((state_tiers >> KV_SHIFT) & 0xF, f"kv{(state_tiers >> KV_SHIFT) & 0xF}")


def unpack_state_tiers(v: int) -> dict[str, str]:
    out = {}
    for i, region in enumerate(STATE_REGIONS):
        code = (v >> (4 * i)) & 0xF
        out[region] = "default" if code == STATE_DEFAULT else TIER_NAME.get(code, f"tier{code}")
    return out


def layout_id_of(tier_codes, state_tiers: int = 0) -> int:
    """crc32 of one byte per table entry (its tier), followed by u32 state_tiers when non-zero."""
    data = bytes(tier_codes)
    if state_tiers:
        data += struct.pack("<I", state_tiers)
    return zlib.crc32(data)


def build_blob(qm: QuantModel, tiers: dict[str, str] | None = None,
               state: dict[str, str] | int | None = None, kv: str = "f32", batch: int = 1,
               golden_fault: int | None = None) -> bytes:
    """Serialize; ``tiers`` maps tensor name -> tier (default: everything read from flash);
    ``state`` places the engine's RAM buffers (``kv``, ``logits``, ``scratch``) on psram/sram;
    ``kv`` is the KV cache's format (f32, int8); ``batch`` the most tokens one forward pass runs;
    ``golden_fault`` (tests only): the golden check's CRC of that step is wrong, so a board reports
    the step as the first that differs."""
    tiers = tiers or {}
    check_pinned(tiers)
    state_tiers = pack_state_tiers(state, kv, batch)
    secs = _sections(qm, batch_of(state_tiers), golden_fault)
    if any(len(s[0]) > 31 for s in secs):
        raise BlobError("a tensor name is longer than 31 bytes")
    table_off = HEADER_SIZE
    off = -(-(table_off + ENTRY_SIZE * len(secs)) // ALIGN) * ALIGN
    entries, body = [], bytearray()
    hasher = hashlib.sha256(config_block(qm.config, qm.tokenizer))
    tier_codes = []
    for name, fmt, rows, cols, g, flags, data in secs:
        tier = TIER_CODE[tiers.get(name, "flash")]
        tier_codes.append(tier)
        stride = (row_stride(fmt, cols, g, bool(flags & FMT_SCALE16), bool(flags & FMT_ROWSCALE))
                  if fmt in ("q8", "q4") else (cols * 4 if fmt == "f32" else cols))
        code = format_code(fmt, flags)
        entries.append(struct.pack(ENTRY_FMT, name.encode(), code, rows, cols, g, tier, off, len(data), stride))
        hasher.update(struct.pack("<32s4I", name.encode(), code, rows, cols, g) + data)
        pad = -(-len(data) // ALIGN) * ALIGN - len(data)
        body += data + bytes(pad)
        off += len(data) + pad
    table = b"".join(entries)
    data_start = -(-(table_off + len(table)) // ALIGN) * ALIGN
    total = data_start + len(body)
    layout_id = layout_id_of(tier_codes, state_tiers)
    head = bytearray(MAGIC + struct.pack("<3I", VERSION, total, 0) + hasher.digest()[:16]
                     + struct.pack("<4I", layout_id, len(secs), table_off, state_tiers)
                     + config_block(qm.config, qm.tokenizer))
    assert len(head) == HEADER_SIZE
    blob = head + table + bytes(data_start - table_off - len(table)) + body
    struct.pack_into("<I", blob, 12, zlib.crc32(memoryview(blob)[16:]))
    return bytes(blob)


def retier_blob(blob: bytes, tiers: dict[str, str] | None = None,
                state: dict[str, str] | int | None = None, kv: str = "f32", batch: int = 1) -> bytes:
    """The same blob with a new placement: every table entry's tier (``tiers`` by name, others
    flash), the header's state_tiers (regions and KV format), layout_id and CRC rewritten; data and
    model hash unchanged."""
    h = parse_header(blob)
    tiers = tiers or {}
    check_pinned(tiers)
    unknown = sorted(set(tiers) - {e.name for e in h.entries})
    if unknown:
        raise BlobError(f"no tensor {unknown[0]!r} in the blob")
    out = bytearray(blob)
    table_off = struct.unpack_from("<I", blob, 40)[0]
    codes = []
    for i, e in enumerate(h.entries):
        t = tiers.get(e.name, "flash")
        if t not in TIER_CODE:
            raise BlobError(f"unknown tier {t!r} for {e.name}")
        codes.append(TIER_CODE[t])
        struct.pack_into("<I", out, table_off + i * ENTRY_SIZE + 48, TIER_CODE[t])
    st = pack_state_tiers(state, kv, batch)
    struct.pack_into("<I", out, 32, layout_id_of(codes, st))
    struct.pack_into("<I", out, 44, st)
    struct.pack_into("<I", out, 12, zlib.crc32(memoryview(out)[16:]))
    return bytes(out)


def write_blob(qm: QuantModel, path, tiers: dict[str, str] | None = None, kv: str = "f32",
               batch: int = 1) -> BlobInfo:
    path = Path(path)
    blob = build_blob(qm, tiers, kv=kv, batch=batch)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    tmp.replace(path)
    h = parse_header(blob, str(path))
    return BlobInfo(path, len(blob), h.model_hash, h.layout_id, h.crc)


@dataclass
class BlobHeader:
    version: int
    total_size: int
    crc: int
    model_hash: bytes
    layout_id: int
    config: ModelConfig
    bos_id: int | None
    eos_id: int | None
    entries: list[Entry]
    state_tiers: int = 0          # where the engine's RAM buffers live (see unpack_state_tiers)
    draft: "BlobHeader | None" = None   # the header of its draft model's blob (section draft), if any
    head_scan: object = None      # costmodel.HeadScan: the head index's header, if the blob has one

    @property
    def tiers(self) -> dict[str, str]:
        return {e.name: e.tier for e in self.entries}


def parse_header(blob: bytes, what: str = "blob", check_crc: bool = True) -> BlobHeader:
    """Validate magic, version, size, CRC and the tensor table's bounds (the same checks as the C reader)."""
    if len(blob) < HEADER_SIZE:
        raise BlobError(f"{what}: {len(blob)} bytes is too short for a flashlm blob header")
    if blob[:4] != MAGIC:
        raise BlobError(f"{what}: not a flashlm blob (magic {blob[:4]!r}, expected {MAGIC!r})")
    version, total, crc = struct.unpack_from("<3I", blob, 4)
    if version < VERSION:
        raise BlobError(f"{what}: blob format version {version} was written by an older flashlm; "
                        f"re-run flashlm convert (this flashlm reads version {VERSION})")
    if version != VERSION:
        raise BlobError(f"{what}: blob format version {version}, this tool reads version {VERSION}")
    if total != len(blob):
        raise BlobError(f"{what}: truncated or padded: header says {total} bytes, file has {len(blob)}")
    if check_crc and zlib.crc32(memoryview(blob)[16:]) != crc:
        raise BlobError(f"{what}: CRC mismatch: the image is corrupted")
    mhash = bytes(blob[16:32])
    layout_id, n, table_off, state_tiers = struct.unpack_from("<4I", blob, 32)
    v = struct.unpack_from(CONFIG_FMT, blob, 48)
    try:
        if not 1 <= v[13] <= v[5]:      # the writer stores the effective out_vocab, never 0
            raise ModelError(f"out_vocab {v[13]} is not in 1..vocab_size {v[5]}")
        cfg = ModelConfig(dim=v[0], n_layers=v[1], n_heads=v[2], n_kv_heads=v[3], hidden_dim=v[4],
                          vocab_size=v[5], max_seq_len=v[6], tied=bool(v[7] & 1),
                          norm_eps=float(v[10]), rope_theta=float(v[11]), ple_dim=v[12],
                          out_vocab=0 if v[13] == v[5] else v[13])
        cfg.validate()
    except (ModelError, ZeroDivisionError) as e:
        raise BlobError(f"{what}: bad model config in header: {e}") from None
    if state_tiers >> (BATCH_SHIFT + 8) or (state_tiers >> KV_SHIFT) & 0xF not in KV_NAME or any(
            ((state_tiers >> (4 * i)) & 0xF) not in (STATE_DEFAULT, TIER_CODE["psram"], TIER_CODE["sram"])
            for i in range(len(STATE_REGIONS))):
        raise BlobError(f"{what}: bad state_tiers 0x{state_tiers:x} in header")
    if table_off + n * ENTRY_SIZE > total or n > 100000:
        raise BlobError(f"{what}: tensor table out of bounds")
    entries = []
    for i in range(n):
        raw = struct.unpack_from(ENTRY_FMT, blob, table_off + i * ENTRY_SIZE)
        name = raw[0].split(b"\0", 1)[0].decode("ascii", "replace")
        fmt, rows, cols, g, tier, off, length, stride = raw[1:]
        fname, s16, rs = FMT_NAME.get(fmt & FMT_BASE), bool(fmt & FMT_SCALE16), bool(fmt & FMT_ROWSCALE)
        if fname is None or fmt & ~(FMT_BASE | FMT_SCALE16 | FMT_ROWSCALE) or (s16 and rs) \
                or ((s16 or rs) and fname not in ("q8", "q4")) or tier not in TIER_NAME:
            raise BlobError(f"{what}: tensor {name}: unknown format {fmt:#x} or tier {tier}")
        if off % ALIGN or off + length > total or off < table_off + n * ENTRY_SIZE:
            raise BlobError(f"{what}: tensor {name}: data out of bounds")
        if fname in ("q8", "q4"):
            if not 1 <= g <= (MAX_GROUP_ROW if rs else MAX_GROUP) or stride != row_stride(fname, cols, g, s16, rs) \
                    or length != rows * stride:
                raise BlobError(f"{what}: tensor {name}: inconsistent quantized layout")
        elif fname == "f32" and length != rows * cols * 4:
            raise BlobError(f"{what}: tensor {name}: length {length} != {rows}x{cols} f32")
        entries.append(Entry(name, fname, rows, cols, g, TIER_NAME[tier], off, length, stride, s16, rs))
    d = next((e for e in entries if e.name == DRAFT), None)
    draft = parse_header(blob[d.offset:d.offset + d.length], f"{what}: draft model", check_crc) if d else None
    return BlobHeader(version, total, crc, mhash, layout_id, cfg,
                      None if v[8] == NONE_ID else v[8], None if v[9] == NONE_ID else v[9], entries,
                      state_tiers, draft, _head_scan(blob, entries))


def _head_scan(blob: bytes, entries: list[Entry]):
    """The head index's header fields the planner uses (read_blob validates the rest)."""
    from .costmodel import HeadScan
    e = next((e for e in entries if e.name == headprune.SECTION and e.fmt == "bytes"), None)
    if e is None or e.length < headprune.HEADER.size:
        return None
    n_tiles, mb, rows, tiles = headprune.HEADER.unpack_from(blob, e.offset)[:4]
    return HeadScan(n_tiles, mb, rows, tiles)


def read_header(path) -> BlobHeader:
    return parse_header(read_file(path, "a .flmb blob", BlobError), str(path))


def read_blob(path_or_bytes) -> QuantModel:
    """Decode a blob back into the QuantModel it holds (checks everything parse_header checks)."""
    if isinstance(path_or_bytes, (bytes, bytearray)):
        blob, what = bytes(path_or_bytes), "blob"
    else:
        what = str(path_or_bytes)
        blob = read_file(path_or_bytes, "a .flmb blob", BlobError)
    h = parse_header(blob, what)
    c = h.config
    by = {e.name: e for e in h.entries}
    want = set(c.tensor_shapes()) | {"tokenizer", STOP_SECTION, "rope.cos", "rope.sin"}
    missing = want - set(by)
    if missing:
        raise BlobError(f"{what}: missing tensors: {', '.join(sorted(missing)[:3])}")
    tensors: dict = {}
    for name, shape in c.tensor_shapes().items():
        e = by[name]
        buf = blob[e.offset:e.offset + e.length]
        if e.fmt in ("q8", "q4"):
            if (e.rows, e.cols) != shape:
                raise BlobError(f"{what}: tensor {name}: shape {(e.rows, e.cols)}, expected {shape}")
            tensors[name] = decode_qtensor(buf, e.fmt, e.rows, e.cols, e.group_size, e.scale16, e.rowscale)
        else:
            if e.fmt != "f32" or e.rows * e.cols != int(np.prod(shape)):
                raise BlobError(f"{what}: tensor {name}: bad format or size")
            tensors[name] = np.frombuffer(buf, "<f4").reshape(shape).astype(np.float32)
    rope = {}
    for name in ("rope.cos", "rope.sin"):
        e = by[name]
        if e.fmt != "f32" or (e.rows, e.cols) != (c.max_seq_len, c.head_dim // 2):
            raise BlobError(f"{what}: {name} has the wrong shape")
        rope[name] = np.frombuffer(blob, "<f4", e.rows * e.cols, e.offset).reshape(e.rows, e.cols).copy()
    e = by["tokenizer"]
    try:
        pieces = decode_tokenizer(blob[e.offset:e.offset + e.length])
    except BlobError as err:
        raise BlobError(f"{what}: {err}") from None
    if len(pieces) != c.vocab_size:
        raise BlobError(f"{what}: tokenizer has {len(pieces)} pieces, vocab is {c.vocab_size}")
    tok = Tokenizer(pieces, [0.0] * len(pieces), kind="blob", bos_id=h.bos_id, eos_id=h.eos_id)
    e = by[STOP_SECTION]
    try:
        stops = StopIds(decode_stop_ids(blob[e.offset:e.offset + e.length], c.vocab_size), f"the blob's {STOP_SECTION}")
    except BlobError as err:
        raise BlobError(f"{what}: {err}") from None
    qm = QuantModel(c, tensors, rope["rope.cos"], rope["rope.sin"], tok, source=what, stops=stops)
    if h.draft is not None:
        from .draft import Draft, check_pair
        e = by[DRAFT]
        dq = read_blob(blob[e.offset:e.offset + e.length])
        check_pair(qm, dq, pieces=False)
        if dq.config.max_seq_len != c.max_seq_len:
            raise BlobError(f"{what}: the draft model's context {dq.config.max_seq_len} is not the model's "
                            f"{c.max_seq_len}")
        qm.draft = Draft(dq, kv_format(h.draft.state_tiers))
    qm.head_index = _read_head_index(blob, by, qm, what)
    read_golden(blob, h, what)
    return qm


def read_golden(blob: bytes, h: BlobHeader | None = None, what: str = "blob") -> golden.Golden | None:
    """The blob's golden check (converter/golden.py), validated; None for a blob without one."""
    h = h or parse_header(blob, what)
    e = next((e for e in h.entries if e.name == golden.SECTION), None)
    if e is None:
        return None
    if e.fmt != "bytes":
        raise BlobError(f"{what}: the {golden.SECTION} section is not a bytes section")
    try:
        return golden.decode(blob[e.offset:e.offset + e.length], h.config.vocab_size, h.config.n_out,
                             h.config.max_seq_len)
    except ModelError as err:
        raise BlobError(f"{what}: {err}") from None


def _read_head_index(blob: bytes, by: dict, qm: QuantModel, what: str):
    """The head index, if the blob has one, with the head's rows put back in token order; refused
    unless its structure is sound (blob.c's checks) and every radius is exactly the one the rows
    and centres give (a smaller one would break the scan's exactness)."""
    names = {headprune.CENTROIDS, headprune.SECTION}
    if not names & set(by):
        return None
    if not names <= set(by):
        raise BlobError(f"{what}: {headprune.CENTROIDS} and {headprune.SECTION} come together")
    c, head_name = qm.config, "tok_embeddings" if qm.config.tied else "output"
    head, e = qm.tensors[head_name], by[headprune.CENTROIDS]
    if e.fmt != "q8" or e.cols != c.dim or e.group_size != head.group_size or e.scale16 != head.scale16 \
            or e.rowscale != head.rowscale:
        raise BlobError(f"{what}: {headprune.CENTROIDS} must be q8 rows of dim {c.dim} in the head's groups "
                        f"and scale kind")
    cen = decode_qtensor(blob[e.offset:e.offset + e.length], "q8", e.rows, e.cols, e.group_size, e.scale16,
                         e.rowscale)
    e = by[headprune.SECTION]
    try:
        index = headprune.read_section(blob[e.offset:e.offset + e.length], c.n_out, head.shape[0], cen)
    except ModelError as err:
        raise BlobError(f"{what}: {err}") from None
    qm.tensors[head_name] = head = headprune.token_order_head(head, index)
    w = head.exact64(c.n_out)
    tiles = [index.perm[a:b] for a, b in zip(index.starts, index.ends())]
    if not np.array_equal(index.radius.view("<u4"), headprune.radii(w, tiles, cen).view("<u4")):
        raise BlobError(f"{what}: {headprune.SECTION}: a tile radius is not the one its rows give (re-run flashlm convert)")
    return index
