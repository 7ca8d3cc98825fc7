"""The weights blob (flash image), format version 4 — layout in docs/formats.md section 1: its
writer (``build_blob``, ``retier_blob``), header parser and reader.

The formats of its rows and fields are converter/formats.py's. The C reader (firmware/engine/blob.c)
validates the same fields; ``read_blob`` turns a blob back into the QuantModel it encodes, so tests
run the reference on exactly the bytes the firmware reads.
"""
from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import expertuse, golden, headprune
from .draft import Draft, check_pair
from .files import read_file
from .formats import (ALIGN, BY_CODE, DRAFT, ENTRY_SIZE, FMT_BASE, FMT_ROWSCALE, FMT_SCALE16, GOLDEN, HEADER_SIZE,
                      MAX_GROUP, MAX_GROUP_ROW, PINNED_TO_FLASH, TIER_CODE, TIER_NAME, BlobError, HeadScan, StateTiers,
                      decode_qtensor, encode_qtensor, format_code, kv_refusal, layout_id_of, row_stride,
                      scale_flags, up64)
from .ir import MAX_STOP_IDS, ModelConfig, ModelError, QTensor, QuantModel, StopIds, Tokenizer
from .tokenizer_enc import SECTION as ENC_SECTION, device_section

MAGIC = b"FLMB"
VERSION = 4                    # the format and numerics version: 4 = 12-bit activations, k12 KV (issue 22)
NONE_ID = 0xFFFFFFFF
CONFIG_FMT = "<10I2f4I"        # 64-byte config block at offset 48 (ple_dim, out_vocab, n_experts, moe_top_k last)
STOP_SECTION = "tokenizer.stop"   # u32 n, u32 ids[n]: generation ends at any of these ids
ENTRY_FMT = "<32s8I"


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


@dataclass(frozen=True)
class Section:
    """One table entry's worth of a model: name, format, shape, group size, format flags, bytes."""
    name: str
    fmt: str
    rows: int
    cols: int
    group: int
    flags: int
    data: bytes

    @classmethod
    def raw(cls, name: str, data: bytes) -> "Section":
        return cls(name, "bytes", 1, len(data), 0, 0, data)

    @classmethod
    def tensor(cls, name: str, t) -> "Section":
        """A QTensor in its format, anything else as f32 rows (a norm's vector: one row; a router: its rows)."""
        if isinstance(t, QTensor):
            return cls(name, t.fmt, t.shape[0], t.shape[1], t.group_size, scale_flags(t), encode_qtensor(t))
        a = np.ascontiguousarray(t, "<f4")
        a = a.reshape(1, -1) if a.ndim == 1 else a
        return cls(name, "f32", a.shape[0], a.shape[1], 0, 0, a.tobytes())

    @property
    def scale16(self) -> bool:
        return bool(self.flags & FMT_SCALE16)

    @property
    def rowscale(self) -> bool:
        return bool(self.flags & FMT_ROWSCALE)

    @property
    def row_stride(self) -> int:
        return row_stride(self.fmt, self.cols, self.group, self.scale16, self.rowscale)


def sections(qm: QuantModel, batch: int = 1, golden_fault: int | None = None) -> list[Section]:
    """A model's sections in blob order: tokenizer (its stop ids, tokenizer.stop, and its device
    encoder's tables, tokenizer.enc), RoPE tables, tensors, with a head index its centre rows and
    tiles (the head's rows then stored in tile order, converter/headprune.py), the experts' calibrated
    use (converter/expertuse.py), the draft model (a
    blob of its own, its passes ``batch`` tokens like the model's), and the golden check
    (converter/golden.py; ``golden_fault``: a test's deliberately wrong step)."""
    c = qm.config
    qm.stops.check(c.vocab_size)
    out = [Section.raw("tokenizer", encode_tokenizer(qm.tokenizer, c.vocab_size)),
           Section.raw(STOP_SECTION, encode_stop_ids(qm.stops))]
    enc, _ = device_section(qm.tokenizer, c)      # the device's text encoder, when it can have one
    if enc is not None:
        out.append(Section.raw(ENC_SECTION, enc))
    for name, t in (("rope.cos", qm.rope_cos), ("rope.sin", qm.rope_sin)):
        a = np.ascontiguousarray(t, "<f4")
        out.append(Section(name, "f32", a.shape[0], a.shape[1], 0, 0, a.tobytes()))
    index = qm.head_index
    head = "tok_embeddings" if c.tied else "output"
    for name in c.tensor_shapes():
        t = qm.tensors[name]
        out.append(Section.tensor(name, headprune.stored_head(t, index) if index is not None and name == head else t))
    if index is not None:
        out.append(Section.tensor(headprune.CENTROIDS, index.centroids))
        out.append(Section.raw(headprune.SECTION, headprune.section_bytes(index, qm.head().shape[0])))
    if qm.expert_use is not None:
        out.append(Section.raw(expertuse.SECTION, qm.expert_use.section_bytes(c.moe_top_k)))
    if qm.draft is not None:
        out.append(Section.raw(DRAFT, build_blob(qm.draft.qm, state=StateTiers(qm.draft.kv, batch))))
    out.append(Section.raw(GOLDEN, golden.section_bytes(qm, golden_fault)))
    return out


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
                       c.norm_eps, c.rope_theta, c.ple_dim, c.n_out, c.n_experts, c.moe_top_k)


def check_kv(kv: str, head_dim: int) -> None:
    why = kv_refusal(kv, head_dim)
    if why:
        raise BlobError(why)


def build_blob(qm: QuantModel, tiers: dict[str, str] | None = None, state: StateTiers = StateTiers(),
               golden_fault: int | None = None) -> bytes:
    """Serialize; ``tiers`` maps tensor name -> tier (default: everything read from flash);
    ``state`` is the header's state_tiers (the KV cache format, the batch, the RAM regions' tiers);
    ``golden_fault`` (tests only): the golden check's CRC of that step is wrong, so a board reports
    the step as the first that differs."""
    tiers = tiers or {}
    check_pinned(tiers)
    check_kv(state.kv, qm.config.head_dim)
    secs = sections(qm, state.batch, golden_fault)
    if any(len(s.name) > 31 for s in secs):
        raise BlobError("a tensor name is longer than 31 bytes")
    table_off = HEADER_SIZE
    off = up64(table_off + ENTRY_SIZE * len(secs))
    entries, body = [], bytearray()
    hasher = hashlib.sha256(config_block(qm.config, qm.tokenizer))
    tier_codes = []
    for s in secs:
        tier = TIER_CODE[tiers.get(s.name, "flash")]
        tier_codes.append(tier)
        code = format_code(s.fmt, s.flags)
        entries.append(struct.pack(ENTRY_FMT, s.name.encode(), code, s.rows, s.cols, s.group, tier, off, len(s.data),
                                   s.row_stride))
        hasher.update(struct.pack("<32s4I", s.name.encode(), code, s.rows, s.cols, s.group) + s.data)
        pad = up64(len(s.data)) - len(s.data)
        body += s.data + bytes(pad)
        off += len(s.data) + pad
    table = b"".join(entries)
    data_start = up64(table_off + len(table))
    total = data_start + len(body)
    st = state.to_u32()
    head = bytearray(MAGIC + struct.pack("<3I", VERSION, total, 0) + hasher.digest()[:16]
                     + struct.pack("<4I", layout_id_of(tier_codes, st), len(secs), table_off, st)
                     + config_block(qm.config, qm.tokenizer))
    assert len(head) == HEADER_SIZE
    blob = head + table + bytes(data_start - table_off - len(table)) + body
    struct.pack_into("<I", blob, 12, zlib.crc32(memoryview(blob)[16:]))
    return bytes(blob)


def retier_blob(blob: bytes, tiers: dict[str, str] | None = None, state: StateTiers = StateTiers()) -> bytes:
    """The same blob with a new placement: every table entry's tier (``tiers`` by name, others
    flash), the header's state_tiers (``state``), layout_id and CRC rewritten; data and model hash
    unchanged."""
    h = parse_header(blob)
    tiers = tiers or {}
    check_pinned(tiers)
    check_kv(state.kv, h.config.head_dim)
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
    st = state.to_u32()
    struct.pack_into("<I", out, 32, layout_id_of(codes, st))
    struct.pack_into("<I", out, 44, st)
    struct.pack_into("<I", out, 12, zlib.crc32(memoryview(out)[16:]))
    return bytes(out)


def write_blob(qm: QuantModel, path, tiers: dict[str, str] | None = None, state: StateTiers = StateTiers()
               ) -> BlobInfo:
    path = Path(path)
    blob = build_blob(qm, tiers, state)
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
    state_tiers: StateTiers = StateTiers()   # the KV cache format, the batch, the RAM regions' tiers
    draft: "BlobHeader | None" = None   # the header of its draft model's blob (section draft), if any
    head_scan: HeadScan | None = None   # the head index's header, if the blob has one
    expert_use: expertuse.ExpertUse | None = None   # the experts' calibrated use, if the blob has it

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
    if version != VERSION:   # the format version is the numerics' (docs/formats.md section 1)
        raise BlobError(f"{what}: made for numerics {version}, this flashlm is {VERSION}: re-run flashlm convert")
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
                          out_vocab=0 if v[13] == v[5] else v[13], n_experts=v[14], moe_top_k=v[15])
        cfg.validate()
    except (ModelError, ZeroDivisionError) as e:
        raise BlobError(f"{what}: bad model config in header: {e}") from None
    try:
        state = StateTiers.from_u32(state_tiers)
    except BlobError as e:
        raise BlobError(f"{what}: {e} in header") from None
    if table_off + n * ENTRY_SIZE > total or n > 100000:
        raise BlobError(f"{what}: tensor table out of bounds")
    entries = []
    for i in range(n):
        raw = struct.unpack_from(ENTRY_FMT, blob, table_off + i * ENTRY_SIZE)
        name = raw[0].split(b"\0", 1)[0].decode("ascii", "replace")
        fmt, rows, cols, g, tier, off, length, stride = raw[1:]
        f, s16, rs = BY_CODE.get(fmt & FMT_BASE), bool(fmt & FMT_SCALE16), bool(fmt & FMT_ROWSCALE)
        fname = f.name if f is not None else None
        if f is None or fmt & ~(FMT_BASE | FMT_SCALE16 | FMT_ROWSCALE) or (s16 and rs) \
                or ((s16 or rs) and not f.quantized) or tier not in TIER_NAME:
            raise BlobError(f"{what}: tensor {name}: unknown format {fmt:#x} or tier {tier}")
        if off % ALIGN or off + length > total or off < table_off + n * ENTRY_SIZE:
            raise BlobError(f"{what}: tensor {name}: data out of bounds")
        if f.quantized:
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
                      state, draft, _head_scan(blob, entries), _expert_use(blob, entries, cfg, what))


def _expert_use(blob: bytes, entries: list[Entry], c: ModelConfig, what: str) -> expertuse.ExpertUse | None:
    """The experts' calibrated use, checked (a model without experts must not carry it)."""
    e = next((e for e in entries if e.name == expertuse.SECTION), None)
    if e is None:
        return None
    if e.fmt != "bytes" or not c.n_experts:
        raise BlobError(f"{what}: a {expertuse.SECTION} section needs a bytes section of a model with experts")
    try:
        return expertuse.decode(blob[e.offset:e.offset + e.length], c.n_layers, c.n_experts, c.moe_top_k)
    except ModelError as err:
        raise BlobError(f"{what}: {err}") from None


def _head_scan(blob: bytes, entries: list[Entry]) -> HeadScan | None:
    """The head index's header fields the planner uses (read_blob validates the rest)."""
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
            if e.fmt != "f32" or (e.rows, e.cols) != ((1, shape[0]) if len(shape) == 1 else shape):
                raise BlobError(f"{what}: tensor {name}: {e.fmt} [{e.rows}, {e.cols}], expected f32 {list(shape)}")
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
        e = by[DRAFT]
        dq = read_blob(blob[e.offset:e.offset + e.length])
        check_pair(qm, dq, pieces=False)
        if dq.config.max_seq_len != c.max_seq_len:
            raise BlobError(f"{what}: the draft model's context {dq.config.max_seq_len} is not the model's "
                            f"{c.max_seq_len}")
        qm.draft = Draft(dq, h.draft.state_tiers.kv)
    qm.head_index = _read_head_index(blob, by, qm, what)
    qm.expert_use = h.expert_use
    read_golden(blob, h, what)
    return qm


def read_golden(blob: bytes, h: BlobHeader | None = None, what: str = "blob") -> golden.Golden | None:
    """The blob's golden check (converter/golden.py), validated; None for a blob without one."""
    h = h or parse_header(blob, what)
    e = next((e for e in h.entries if e.name == GOLDEN), None)
    if e is None:
        return None
    if e.fmt != "bytes":
        raise BlobError(f"{what}: the {GOLDEN} section is not a bytes section")
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
