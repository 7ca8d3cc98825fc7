"""The ``tokenizer.enc`` blob section: what the firmware's encoder (firmware/engine/tokenize.c)
needs to turn a text prompt into exactly the token ids the host's ``converter.tokenizer.encode``
gives (layout: docs/formats.md section 1.1).

Two kinds:

* ByteLevel BPE (``tokenizers`` JSON, what ``flashlm train`` makes, GPT-2 style): the added
  tokens the library splits the text on first, the Unicode classes of the GPT-2 pre-tokenizer
  regex (letters, numbers, white space) as compact code-point runs, the byte -> symbol id map and
  the merges as pairs sorted by (left, right) for a binary search.
* llama2.c ``tokenizer.bin``: the dummy-prefix id, the pieces that are one UTF-8 character, the
  byte-fallback ids and, as pairs, every merge the score-driven loop can make, its score turned
  into a rank (a higher score is a lower rank; equal scores share a rank, so the leftmost wins).
* a SentencePiece-style ``tokenizers`` BPE (Llama-family tokenizer.json: "▁" for a space, byte
  fallback, no pre-tokenizer splitting words) is the same kind: the "▁" piece is the dummy prefix
  (and the piece of a space), the merges are pairs ranked by their line, and the added tokens
  split the text first, each stretch between them with its own prefix by the JSON's rule
  (``PREFIX_*``).

Both kinds then run one merge loop on the device: merge the adjacent pair of lowest rank,
leftmost on ties.  A tokenizer whose configuration the device cannot reproduce exactly gets no
section (``device_section`` says why); the device then refuses text prompts and the host encodes.

The Unicode classes come from the installed ``tokenizers`` library's own regex engine (Oniguruma),
so they are the ones the host's encoder uses; ``unicode_version`` names the Unicode version they
follow (16.0 for tokenizers 0.23).
"""
from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass

from .ir import ModelConfig, Tokenizer
from .tokenizer import _BYTE_PIECE, _NO_MERGE, _decoder_steps, _spellings, _unicode_to_byte

SECTION = "tokenizer.enc"
VERSION = 1
KIND_BPE, KIND_LLAMA2C = 1, 2
KIND_NAME = {KIND_BPE: "ByteLevel BPE", KIND_LLAMA2C: "SentencePiece-style (llama2.c)"}
# kind 2: which stretch of text between added tokens gets the dummy prefix (header field 56): every
# non-empty one (llama2.c, Llama 2's Prepend normalizer); each not starting with a space (Metaspace
# "always"); only the text's start, unless a space (Metaspace "first")
PREFIX_ALWAYS, PREFIX_UNLESS_SPACE, PREFIX_FIRST = 0, 1, 2
SPACE = "\u2581"                 # SentencePiece's visible space
NONE_ID = 0xFFFFFFFF
HEADER_FMT = "<16I"              # 64 bytes; field order in docs/formats.md section 1.1
HEADER_SIZE = struct.calcsize(HEADER_FMT)
PAIR_FMT = "<4I"                 # left, right, rank, merged
CLASS_OTHER, CLASS_LETTER, CLASS_NUMBER, CLASS_SPACE = 0, 1, 2, 3
N_CODEPOINTS = 0x110000
# One letter first assigned in each Unicode version: the newest the regex engine knows names the
# version of its tables.
VERSION_SENTINELS = (((17, 0), 0x323B0), ((16, 0), 0x1C89), ((15, 1), 0x2EBF0), ((15, 0), 0x11F04),
                     ((14, 0), 0x0870))


@dataclass(frozen=True)
class SectionInfo:
    """The header of a ``tokenizer.enc`` section."""
    kind: int
    span: int            # most text bytes (and initial symbols) one token covers
    unicode: tuple[int, int] | None
    n_pairs: int
    n_ranges: int
    n_added: int
    n_chars: int
    size: int

    def text_capacity(self, seq_len: int) -> int:
        """The longest text (bytes) whose ids can fit a context of seq_len: longer is too long."""
        return seq_len * self.span

    def scratch_bytes(self, seq_len: int) -> int:
        """RAM the device encoder works in: two u32 per symbol, at most text_capacity + 1 symbols."""
        return 8 * (self.text_capacity(seq_len) + 1)

    def describe(self) -> str:
        uni = f", Unicode {self.unicode[0]}.{self.unicode[1]} classes ({self.n_ranges} runs)" if self.unicode else ""
        return f"{KIND_NAME[self.kind]}, {self.n_pairs} merge pairs{uni}, {self.size:,} bytes"


# ----------------------------------------------------------------------------- Unicode classes

@functools.lru_cache(maxsize=1)
def unicode_classes() -> bytes:
    """One class byte per code point (CLASS_*): ``\\p{L}``, ``\\p{N}``, ``\\s`` as the
    ``tokenizers`` library's regex engine defines them (the same engine runs its GPT-2
    pre-tokenizer). Surrogates are CLASS_OTHER (they never occur in UTF-8)."""
    from tokenizers import Regex, normalizers
    text = "".join(chr(c) if not 0xD800 <= c < 0xE000 else "\0" for c in range(N_CODEPOINTS))
    mark = "\U0010FFFF"           # a noncharacter: in no class, so it marks the replaced ones
    out = bytearray(N_CODEPOINTS)
    for cls, rx in ((CLASS_LETTER, r"\p{L}"), (CLASS_NUMBER, r"\p{N}"), (CLASS_SPACE, r"\s")):
        got = normalizers.Replace(Regex(rx), mark).normalize_str(text)
        if len(got) != N_CODEPOINTS:
            raise RuntimeError(f"tokenizers regex {rx} matched more than one character at a time")
        for i, ch in enumerate(got):
            if ch == mark and i != N_CODEPOINTS - 1:
                out[i] = cls
    for c in range(0xD800, 0xE000):
        out[c] = CLASS_OTHER
    return bytes(out)


@functools.lru_cache(maxsize=1)
def class_runs() -> tuple[tuple[int, int], ...]:
    """(first code point, class) of every run of equal class, from code point 0."""
    cls = unicode_classes()
    return tuple((c, cls[c]) for c in range(N_CODEPOINTS) if c == 0 or cls[c] != cls[c - 1])


def unicode_version() -> tuple[int, int] | None:
    cls = unicode_classes()
    return next((v for v, cp in VERSION_SENTINELS if cls[cp] == CLASS_LETTER), None)


# ----------------------------------------------------------------------------- the section

def device_section(tok: Tokenizer | None, cfg: ModelConfig) -> tuple[bytes | None, str]:
    """(section bytes, description) for a tokenizer the device can reproduce exactly, else
    (None, why not)."""
    if tok is None:
        return None, "the model has no tokenizer"
    if tok.kind == "bpe" and tok.hf_json is not None:
        byte_level = any(x.get("type") == "ByteLevel" for x in _decoder_steps(json.loads(tok.hf_json)))
        data, why = _bpe_section(tok) if byte_level else _spm_section(tok)
    elif tok.kind == "llama2c":
        data, why = _llama2c_section(tok), ""
    else:
        return None, f"a tokenizer of kind {tok.kind!r} has no device encoder"
    if data is None:
        return None, why
    info = parse_section(data)
    kv = 2 * ((cfg.n_layers * cfg.max_seq_len * cfg.kv_dim * 4 + 7) & ~7)
    if info.scratch_bytes(cfg.max_seq_len) > kv:
        return None, (f"the device encoder works in the KV cache, {kv:,} bytes, but needs "
                      f"{info.scratch_bytes(cfg.max_seq_len):,} bytes for a full-context text "
                      f"({cfg.max_seq_len} tokens of up to {info.span} bytes)")
    return data, info.describe()


def parse_section(data: bytes) -> SectionInfo:
    if len(data) < HEADER_SIZE:
        raise ValueError(f"{SECTION}: {len(data)} bytes is too short for its header")
    h = struct.unpack_from(HEADER_FMT, data)
    if h[0] != VERSION or h[1] not in KIND_NAME:
        raise ValueError(f"{SECTION}: version {h[0]} kind {h[1]} is not one this tool writes")
    uni = (h[3] >> 8, h[3] & 0xFF) if h[3] else None
    return SectionInfo(h[1], h[2], uni, h[5], h[7], h[9], h[11], len(data))


def section_info(path, header) -> SectionInfo | None:
    """The ``tokenizer.enc`` header of the blob file at path, whose blob.BlobHeader is ``header``, or None."""
    e = next((e for e in header.entries if e.name == SECTION), None)
    if e is None:
        return None
    with open(path, "rb") as f:
        f.seek(e.offset)
        return parse_section(f.read(e.length))


def _pack(kind: int, span: int, unicode: int, prefix: int, pairs: dict, runs,
          added: list[tuple[bytes, int]], chars: list[tuple[int, int]], byte_ids: list[int],
          prefix_rule: int = PREFIX_ALWAYS) -> bytes:
    parts: list[bytes] = []
    off = HEADER_SIZE

    def table(blob: bytes) -> int:
        nonlocal off
        at = off
        parts.append(blob)
        off += len(blob)
        return at

    pair_off = table(b"".join(struct.pack(PAIR_FMT, a, b, r, m) for (a, b), (r, m) in sorted(pairs.items())))
    run_off = table(b"".join(struct.pack("<I", c << 2 | k) for c, k in runs))
    text_start = off + 12 * len(added) + 4 * 2 * len(chars) + 4 * 256
    heads, texts = [], b""
    for content, i in added:
        heads.append(struct.pack("<3I", i, text_start + len(texts), len(content)))
        texts += content
    added_off = table(b"".join(heads))
    char_off = table(b"".join(struct.pack("<2I", k, i) for k, i in sorted(chars)))
    byte_off = table(struct.pack("<256I", *byte_ids))
    table(texts)
    head = struct.pack(HEADER_FMT, VERSION, kind, span, unicode, prefix, len(pairs), pair_off, len(runs),
                       run_off, len(added), added_off, len(chars), char_off, byte_off, prefix_rule, 0)
    out = head + b"".join(parts)
    return out + bytes(-len(out) % 4)


# ----------------------------------------------------------------------------- ByteLevel BPE

def _json_pairs(model: dict) -> dict[tuple[int, int], tuple[int, int]]:
    """A tokenizer JSON's merges: (left id, right id) -> (rank = the merge's line, merged id)."""
    vocab = model["vocab"]
    pairs: dict[tuple[int, int], tuple[int, int]] = {}
    for r, m in enumerate(model.get("merges") or []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        pairs[(vocab[a], vocab[b])] = (r, vocab[a + b])     # a repeated pair: the last one counts, as in the library
    return pairs


def _plain_post(post) -> bool:
    """Whether a post-processor leaves a single text's ids as the encoder made them, but for at most
    one token before them (the BOS the host's encoder and the device put first): none, ByteLevel
    (offsets only), a template of the text alone or one special token and the text (transformers 5
    saves ``TemplateProcessing`` of the text alone with a tokenizer that has none), or a sequence of
    those."""
    if post is None:
        return True
    if not isinstance(post, dict):
        return False
    kind = post.get("type")
    if kind == "ByteLevel":
        return True
    if kind == "Sequence":
        return all(_plain_post(p) for p in post.get("processors") or [])
    if kind != "TemplateProcessing":
        return False
    single = post.get("single") or []
    seqs = [i for i, item in enumerate(single) if isinstance(item, dict) and "Sequence" in item]
    return seqs in ([0], [1]) and seqs[0] == len(single) - 1 and all(
        isinstance(item, dict) and "SpecialToken" in item for item in single[:seqs[0]])


def _bpe_unsupported(d: dict) -> str | None:
    """Why this tokenizer JSON is not the ByteLevel BPE the device encoder reproduces, or None."""
    pre = d.get("pre_tokenizer")
    if not isinstance(pre, dict) or pre.get("type") != "ByteLevel":
        return "its pre-tokenizer is not a lone ByteLevel (GPT-2 regex) pre-tokenizer"
    if pre.get("add_prefix_space") is not False or pre.get("use_regex", True) is not True:
        return "its ByteLevel pre-tokenizer adds a prefix space or does not use the GPT-2 regex"
    for key in ("normalizer", "truncation", "padding"):
        if d.get(key) is not None:
            return f"it has a {key}"
    if not _plain_post(d.get("post_processor")):
        return "its post-processor adds tokens to a text other than one BOS before it"
    model = d["model"]
    if model.get("dropout") not in (None, 0, 0.0):
        return "its BPE has dropout"
    if model.get("ignore_merges"):
        return "its BPE ignores merges for words in the vocabulary"
    added = d.get("added_tokens") or []
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") or not t.get("content") for t in added):
        return "an added token strips spaces, matches single words only or is empty"
    if len({bool(t.get("normalized")) for t in added}) > 1:
        return "its added tokens mix normalized and raw matching"
    return None


def _bpe_section(tok: Tokenizer) -> tuple[bytes | None, str]:
    d = json.loads(tok.hf_json)
    why = _bpe_unsupported(d)
    if why:
        return None, f"the tokenizer cannot be reproduced on the device: {why}"
    model = d["model"]
    vocab: dict[str, int] = model["vocab"]
    char_of = {b: c for c, b in _unicode_to_byte().items()}
    missing = [b for b in range(256) if char_of[b] not in vocab]
    if missing:
        return None, (f"the tokenizer cannot be reproduced on the device: its ByteLevel alphabet lacks "
                      f"{len(missing)} byte symbol(s) (first 0x{missing[0]:02X})")
    pairs = _json_pairs(model)
    added = [(t["content"].encode("utf-8"), t["id"]) for t in d.get("added_tokens") or []]
    span = max(max(len(p) for p in tok.pieces), 1)       # the bytes of the longest token
    major_minor = unicode_version() or (0, 0)
    data = _pack(KIND_BPE, span, major_minor[0] << 8 | major_minor[1], NONE_ID, pairs, class_runs(), added, [],
                 [vocab[char_of[b]] for b in range(256)])
    return data, ""


# ----------------------------------------------------------------------------- SentencePiece style

def _spm_rule(d: dict) -> tuple[int | None, str]:
    """(the prefix rule of a SentencePiece-style tokenizer JSON, or None and why the device cannot
    reproduce it)."""
    norm, pre = d.get("normalizer"), d.get("pre_tokenizer")
    legacy = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE},
                                                  {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}
    if norm == legacy and pre is None:
        return PREFIX_ALWAYS, ""
    if norm is None and isinstance(pre, dict) and pre.get("type") == "Metaspace":
        if pre.get("replacement") != SPACE or pre.get("split") is not False:
            return None, "its Metaspace pre-tokenizer splits words or uses another replacement than '\u2581'"
        rule = {"always": PREFIX_UNLESS_SPACE, "first": PREFIX_FIRST}.get(pre.get("prepend_scheme"))
        return (rule, "") if rule is not None else (None, f"its Metaspace prepend_scheme "
                                                          f"{pre.get('prepend_scheme')!r} is not 'always' or 'first'")
    if norm is not None:
        return None, "its normalizer is not Llama's Prepend('\u2581') + Replace(' ', '\u2581')"
    return None, "its pre-tokenizer is not a Metaspace that keeps the text whole (split: false)"


def _spm_section(tok: Tokenizer) -> tuple[bytes | None, str]:
    d = json.loads(tok.hf_json)
    rule, why = _spm_rule(d)
    model = d["model"]
    if rule is not None:
        if model.get("dropout") not in (None, 0, 0.0) or model.get("ignore_merges"):
            rule, why = None, "its BPE has dropout or ignores merges"
        elif not model.get("byte_fallback"):
            rule, why = None, "its BPE has no byte fallback"
    added = d.get("added_tokens") or []
    if rule is not None and any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") or t.get("normalized")
                                or not t.get("content") for t in added):
        rule, why = None, "an added token strips spaces, matches single words only, is normalized or is empty"
    vocab: dict[str, int] = model["vocab"]
    byte_ids = [vocab.get(f"<0x{b:02X}>", NONE_ID) for b in range(256)]
    if rule is not None and (SPACE not in vocab or NONE_ID in byte_ids):
        rule, why = None, "its vocabulary lacks the '\u2581' piece or a byte-fallback piece"
    if rule is None:
        return None, f"the tokenizer cannot be reproduced on the device: {why}"
    pairs = _json_pairs(model)
    # one-character pieces by the text's UTF-8: a space is "▁" to the library (and so is "▁" itself)
    chars = {c: i for c, i in vocab.items() if len(c) == 1 and c != " "}
    if SPACE in chars:
        chars[" "] = chars[SPACE]
    keys = [(int.from_bytes(c.encode("utf-8").ljust(4, b"\0"), "big"), i) for c, i in chars.items()]
    span = max(max(len(p) for p in tok.pieces), 1)
    data = _pack(KIND_LLAMA2C, span, 0, vocab[SPACE], pairs, [],
                 [(t["content"].encode("utf-8"), t["id"]) for t in added], keys, byte_ids, rule)
    return data, ""


# ----------------------------------------------------------------------------- llama2.c

def _llama2c_section(tok: Tokenizer) -> bytes:
    """The tables converter/tokenizer.py's _encode_llama2c and _merge use, precomputed."""
    spell = _spellings(tok)
    vocab: dict[bytes, int] = {}
    for i, s in enumerate(spell):
        vocab.setdefault(s, i)
    byte_ids = [NONE_ID] * 256
    for i, s in enumerate(spell):
        m = _BYTE_PIECE.fullmatch(s)
        if m and byte_ids[int(m.group(1), 16)] == NONE_ID:
            byte_ids[int(m.group(1), 16)] = i
    targets = {s: m for s, m in vocab.items() if len(s) >= 2 and tok.scores[m] > _NO_MERGE}
    rank_of = {sc: r for r, sc in enumerate(sorted({tok.scores[m] for m in targets.values()}, reverse=True))}
    pairs = {}
    for s, m in targets.items():
        for k in range(1, len(s)):
            a, b = vocab.get(s[:k]), vocab.get(s[k:])
            if a is not None and b is not None:
                pairs[(a, b)] = (rank_of[tok.scores[m]], m)
    chars = [(int.from_bytes(s.ljust(4, b"\0"), "big"), i) for s, i in vocab.items()
             if 1 <= len(s) <= 4 and all(x & 0xC0 == 0x80 for x in s[1:])]
    span = max(len(s) for s in spell)
    return _pack(KIND_LLAMA2C, max(span, 1), 0, vocab.get(b" ", NONE_ID), pairs, [], [], chars, byte_ids)


__all__ = ["SECTION", "SectionInfo", "device_section", "parse_section", "section_info", "unicode_classes",
           "class_runs", "unicode_version"]
