"""Tokenizers: llama2.c ``tokenizer.bin`` (read/write, score-driven merge encoding) and
``tokenizers`` BPE JSON: ByteLevel (what our training produces, GPT-2 style) or SentencePiece
style with byte fallback (Llama-family ``tokenizer.json``), encoded by the library itself.

tokenizer.bin layout (little-endian): ``i32 max_token_length``, then per token
``f32 score, i32 length, length bytes``.  The vocabulary size is not stored; the file ends after
the last token.  Byte-fallback pieces are spelled ``<0xAB>``; ``Tokenizer.pieces`` holds the raw
byte instead and ``Tokenizer.raw_pieces`` keeps the spelling for a lossless write-back.
"""
from __future__ import annotations

import functools
import heapq
import json
import math
import re
import struct

from .files import read_file
from .ir import ModelError, Tokenizer

_BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")
_NO_MERGE = -1e10       # llama2.c only merges pairs scoring above its initial best of -1e10


# ----------------------------------------------------------------------------- tokenizer.bin

def parse_tokenizer_bin(buf: bytes, name: str = "tokenizer.bin") -> Tokenizer:
    n = len(buf)
    if n < 4:
        raise ModelError(f"{name}: truncated: {n} bytes is too short for a tokenizer.bin header")
    (max_len,) = struct.unpack_from("<i", buf, 0)
    if max_len < 0:
        raise ModelError(f"{name}: bad header: max_token_length {max_len} is negative")
    raw: list[bytes] = []
    scores: list[float] = []
    pos = 4
    while pos < n:
        i = len(raw)
        if pos + 8 > n:
            raise ModelError(f"{name}: truncated in token {i}: needs 8 header bytes, {n - pos} left")
        score, length = struct.unpack_from("<fi", buf, pos)
        pos += 8
        if length < 0 or length > n - pos:
            raise ModelError(f"{name}: truncated or corrupt at token {i}: length {length}, "
                             f"{n - pos} bytes left")
        if length > max_len:
            raise ModelError(f"{name}: corrupt: token {i} is {length} bytes, longer than "
                             f"max_token_length {max_len}")
        if math.isnan(score):
            raise ModelError(f"{name}: corrupt: token {i} has a NaN score")
        raw.append(bytes(buf[pos:pos + length]))
        scores.append(score)
        pos += length
    if not raw:
        raise ModelError(f"{name}: holds no tokens")
    pieces = []
    for r in raw:
        m = _BYTE_PIECE.fullmatch(r)
        pieces.append(bytes([int(m.group(1), 16)]) if m else r)
    bos = 1 if len(raw) > 1 and raw[1].strip() == b"<s>" else None
    eos = 2 if len(raw) > 2 and raw[2].strip() == b"</s>" else None
    return Tokenizer(pieces, scores, kind="llama2c", bos_id=bos, eos_id=eos, raw_pieces=raw)


def read_tokenizer_bin(path) -> Tokenizer:
    return parse_tokenizer_bin(read_file(path, "a tokenizer file"), str(path))


def tokenizer_bin_bytes(tok: Tokenizer) -> bytes:
    """tokenizer.bin bytes: the original spellings when the tokenizer came from one, else ``pieces``."""
    raw = tok.raw_pieces if tok.raw_pieces is not None and len(tok.raw_pieces) == len(tok.pieces) \
        else tok.pieces
    if len(tok.scores) != len(raw):
        raise ModelError(f"tokenizer has {len(raw)} pieces but {len(tok.scores)} scores")
    out = [struct.pack("<i", max((len(p) for p in raw), default=0))]
    try:
        for p, s in zip(raw, tok.scores):
            out.append(struct.pack("<fi", s, len(p)))
            out.append(bytes(p))
    except (OverflowError, struct.error) as e:
        raise ModelError(f"tokenizer score cannot be stored as float32: {e}") from None
    return b"".join(out)


def write_tokenizer_bin(tok: Tokenizer, path) -> None:
    data = tokenizer_bin_bytes(tok)
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise ModelError(f"{path}: cannot write: {e.strerror or e}") from None


# ----------------------------------------------------------------------------- HF ByteLevel BPE

@functools.lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the
    other 68 bytes to code points 256, 257, ... in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + extra)] = b
            extra += 1
    return table


@functools.lru_cache(maxsize=8)
def _hf_tokenizer(json_str: str):
    from tokenizers import Tokenizer as HFTokenizer
    return HFTokenizer.from_str(json_str)


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _decoder_steps(d: dict) -> list[dict]:
    """The tokenizer JSON's decoder as a list of steps (a Sequence flattened); a JSON without a
    decoder whose pre-tokenizer is ByteLevel decodes as ByteLevel."""
    dec = d.get("decoder")
    if dec is None:
        return [{"type": "ByteLevel"}] if '"ByteLevel"' in json.dumps(d.get("pre_tokenizer")) else []
    if not isinstance(dec, dict):
        raise ModelError("tokenizer JSON: decoder is not an object")
    steps = dec.get("decoders") if dec.get("type") == "Sequence" else [dec]
    if not isinstance(steps, list) or not all(isinstance(x, dict) for x in steps):
        raise ModelError("tokenizer JSON: decoder Sequence is not a list of decoders")
    return steps


def _piece_decoder(d: dict):
    """A function from a vocabulary token (not an added one) to the bytes it decodes to, from the
    JSON's decoder: ByteLevel (GPT-2's byte alphabet), or SentencePiece style — Replace ("▁" by
    " "), Metaspace, ByteFallback ("<0xAB>" is that byte), Fuse and Strip (both act on the whole
    text, not on a piece)."""
    steps = _decoder_steps(d)
    kinds = [x.get("type") for x in steps]
    if "ByteLevel" in kinds:
        if len(kinds) != 1:
            raise ModelError(f"tokenizer JSON: decoder {'+'.join(map(str, kinds))} mixes ByteLevel with others")
        u2b = _unicode_to_byte()

        def byte_level(s: str) -> bytes:
            try:
                return bytes(u2b[c] for c in s)
            except KeyError:
                raise ModelError(f"tokenizer JSON: token {s!r} is not ByteLevel-encoded") from None
        return byte_level
    if not steps:
        raise ModelError("tokenizer JSON: a BPE without a ByteLevel or SentencePiece-style decoder "
                         "(the bytes of its pieces are unknown)")
    replaces: list[tuple[str, str]] = []
    byte_fallback = False
    for x in steps:
        k = x.get("type")
        if k == "Replace":
            pat = x.get("pattern")
            if not (isinstance(pat, dict) and isinstance(pat.get("String"), str) and isinstance(x.get("content"), str)):
                raise ModelError(f"tokenizer JSON: decoder Replace {_short(pat)} is not a plain string replace")
            replaces.append((pat["String"], x["content"]))
        elif k == "Metaspace":
            rep = x.get("replacement", "\u2581")
            replaces.append((rep if isinstance(rep, str) else "\u2581", " "))
        elif k == "ByteFallback":
            byte_fallback = True
        elif k == "Strip" and x.get("content") == " " and x.get("stop", 0) == 0 and x.get("start", 0) in (0, 1):
            pass          # the leading space of the whole text: decode() drops it
        elif k != "Fuse":
            raise ModelError(f"tokenizer JSON: decoder {_short(k)} is not supported "
                             f"(ByteLevel, or Replace/Metaspace/ByteFallback/Fuse/Strip)")

    def spm(s: str) -> bytes:
        m = _BYTE_PIECE.fullmatch(s.encode("utf-8")) if byte_fallback else None
        if m:
            return bytes([int(m.group(1), 16)])
        for a, b in replaces:
            s = s.replace(a, b)
        return s.encode("utf-8")
    return spm


@functools.lru_cache(maxsize=8)
def _drops_first_space(json_str: str) -> bool:
    """Whether the JSON's decoder drops the text's leading space (SentencePiece's dummy prefix)."""
    for x in _decoder_steps(json.loads(json_str)):
        if x.get("type") == "Strip" and x.get("content") == " " and x.get("start") == 1:
            return True
        if x.get("type") == "Metaspace" and (x.get("prepend_scheme") in ("first", "always")
                                              or x.get("add_prefix_space") is True):
            return True
    return False


def _token_name(v) -> str | None:
    """A special token of tokenizer_config.json: a string or an AddedToken object."""
    v = v.get("content") if isinstance(v, dict) else v
    return v if isinstance(v, str) else None


def _template_bos(post, ids: dict[str, int]) -> tuple[bool, int | None]:
    """(the post-processor is a template, the one token it puts before the text or None)."""
    if not isinstance(post, dict):
        return False, None
    if post.get("type") == "Sequence":
        for p in post.get("processors") or []:
            found, bos = _template_bos(p, ids)
            if found:
                return found, bos
        return False, None
    if post.get("type") != "TemplateProcessing":
        return False, None
    lead = []
    for item in post.get("single") or []:
        if not isinstance(item, dict) or "Sequence" in item:
            break
        name = (item.get("SpecialToken") or {}).get("id")
        spec = (post.get("special_tokens") or {}).get(name) or {}
        lead += spec.get("ids") or ([ids[name]] if name in ids else [])
    if len(lead) > 1:
        raise ModelError(f"tokenizer JSON: the post-processor puts {len(lead)} tokens before the text; "
                         f"flashlm prepends at most one (BOS)")
    return True, (lead[0] if lead else None)


def from_hf_json(json_str: str, config: dict | None = None) -> Tokenizer:
    """A ``tokenizers`` BPE (ByteLevel, or SentencePiece style with byte fallback) as a Tokenizer:
    pieces are the raw bytes each id decodes to, score = -(merge rank) (tokens no merge produces,
    i.e. the base alphabet and special tokens, get the lowest score).

    BOS (what encode() prepends) is the token the JSON's template post-processor puts before the
    text; without a template, ``config`` (a Hugging Face tokenizer_config.json) ``bos_token`` when
    its ``add_bos_token`` is true, else flashlm's own ``<|bos|>``. EOS: ``config``'s ``eos_token``,
    else ``<|eos|>``."""
    try:
        d = json.loads(json_str)
    except (TypeError, ValueError) as e:
        raise ModelError(f"tokenizer JSON does not parse: {e}") from None
    model = d.get("model") if isinstance(d, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ModelError("tokenizer JSON is not a BPE tokenizer from the `tokenizers` library")
    piece_of = _piece_decoder(d)
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key) not in (None, ""):   # pieces would not be the bytes a token decodes to
            raise ModelError(f"tokenizer JSON: BPE {key} {_short(model.get(key))} is not supported")
    try:
        _hf_tokenizer(json_str)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # its own exception types; a Rust panic is a BaseException
        text = (str(e).splitlines() or [type(e).__name__])[0]
        raise ModelError(f"tokenizer JSON rejected by the tokenizers library: {text[:200]}") from None

    by_id: dict[int, str] = {}
    for s, i in model["vocab"].items():
        if not isinstance(i, int) or i < 0 or i in by_id:
            raise ModelError(f"tokenizer JSON: bad or duplicate id {i!r} for token {s!r}")
        by_id[i] = s
    special: dict[int, str] = {}
    added = d.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise ModelError("tokenizer JSON: added_tokens is not a list of objects")
    for t in added:
        i, s = t.get("id"), t.get("content")
        if not isinstance(i, int) or i < 0 or not isinstance(s, str):
            raise ModelError(f"tokenizer JSON: bad added token {t!r}")
        if i in by_id and by_id[i] != s:
            raise ModelError(f"tokenizer JSON: id {i} is both {by_id[i]!r} and added token {s!r}")
        by_id[i] = s
        special[i] = s
    n = max(by_id, default=-1) + 1
    if n == 0 or len(by_id) != n:
        missing = next((i for i in range(n) if i not in by_id), None)
        raise ModelError(f"tokenizer JSON: token ids are not contiguous (id {missing} missing)")

    pieces = [by_id[i].encode("utf-8") if i in special else piece_of(by_id[i]) for i in range(n)]
    merges = model.get("merges") or []
    rank: dict[int, int] = {}
    try:
        for r, m in enumerate(merges):
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            j = model["vocab"].get(a + b)
            if j is not None and j not in rank:
                rank[j] = r
    except (ValueError, TypeError, AttributeError):
        raise ModelError(f"tokenizer JSON: merge {r} {m!r} is not a pair of tokens") from None
    lowest = float(len(merges))
    scores = [-float(rank[i]) if i in rank else -lowest for i in range(n)]
    ids = {s: i for i, s in by_id.items()}
    config = config or {}
    templated, bos = _template_bos(d.get("post_processor"), ids)
    if not templated:
        name = _token_name(config.get("bos_token")) if config.get("add_bos_token") else "<|bos|>"
        bos = ids.get(name) if name is not None else None
    eos_name = _token_name(config.get("eos_token")) or "<|eos|>"
    return Tokenizer(pieces, scores, kind="bpe", bos_id=bos, eos_id=ids.get(eos_name), hf_json=json_str)


# ----------------------------------------------------------------------------- files

def load_tokenizer(path) -> Tokenizer:
    """tokenizer.bin (llama2.c) or tokenizer.json (``tokenizers``), told apart by content (a .json
    name is read as JSON whatever it holds). Every error names the file as the tokenizer, so a
    checkpoint given where a tokenizer goes does not read as a corrupt checkpoint."""
    buf = read_file(path, "a tokenizer file")
    name = f"tokenizer {path}"
    if buf.lstrip()[:1] == b"{" or str(path).lower().endswith(".json"):
        try:
            text = buf.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelError(f"{name}: tokenizer JSON is not UTF-8: {e}") from None
        try:
            return from_hf_json(text)
        except ModelError as e:
            raise ModelError(f"{name}: {e}") from None
    try:
        return parse_tokenizer_bin(buf, name)
    except ModelError as e:
        raise ModelError(f"{e} (neither a llama2.c tokenizer.bin nor a tokenizer.json)") from None


# ----------------------------------------------------------------------------- encode / decode

def _spellings(tok: Tokenizer) -> list[bytes]:
    if tok.raw_pieces is not None and len(tok.raw_pieces) == len(tok.pieces):
        return tok.raw_pieces
    return tok.pieces


def _encode_llama2c(tok: Tokenizer, data: bytes) -> list[int]:
    spell = _spellings(tok)
    vocab: dict[bytes, int] = {}
    for i, s in enumerate(spell):
        vocab.setdefault(s, i)
    byte_id: dict[int, int] = {}
    for i, s in enumerate(spell):
        m = _BYTE_PIECE.fullmatch(s)
        if m:
            byte_id.setdefault(int(m.group(1), 16), i)

    ids: list[int] = []
    if data and b" " in vocab:
        ids.append(vocab[b" "])        # sentencepiece's dummy prefix
    i, n = 0, len(data)
    while i < n:                       # one UTF-8 code point (at most 4 bytes) at a time
        j = i + 1
        while j < n and j - i < 4 and (data[j] & 0xC0) == 0x80:
            j += 1
        cp = data[i:j]
        if cp in vocab:
            ids.append(vocab[cp])
        else:
            for b in cp:
                if b not in byte_id:
                    raise ModelError(f"cannot encode byte 0x{b:02X}: the vocabulary has no piece for it")
                ids.append(byte_id[b])
        i = j
    return _merge(ids, tok.scores, spell, vocab)


def _merge(ids: list[int], scores, spell: list[bytes], vocab: dict[bytes, int]) -> list[int]:
    """Repeatedly merge the adjacent pair whose concatenation is a piece with the highest score,
    leftmost on ties (llama2.c's rule), with a heap over a linked list instead of rescanning.
    Nodes keep their original index, so a smaller index is further left."""
    n = len(ids)
    if n < 2:
        return ids
    tok, text = list(ids), [spell[t] for t in ids]
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
    ver, alive = [0] * n, [True] * n

    def pair(a: int):
        b = nxt[a]
        if b >= n:
            return None
        m = vocab.get(text[a] + text[b])
        if m is None or not scores[m] > _NO_MERGE:
            return None
        return (-scores[m], a, b, ver[a], ver[b], m)

    heap = [e for e in map(pair, range(n - 1)) if e is not None]
    heapq.heapify(heap)
    while heap:
        _, a, b, va, vb, m = heapq.heappop(heap)
        if not (alive[a] and alive[b] and nxt[a] == b and ver[a] == va and ver[b] == vb):
            continue                                # stale: a neighbour merged since
        tok[a], text[a] = m, text[a] + text[b]
        ver[a] += 1
        alive[b] = False
        nxt[a] = nxt[b]
        if nxt[a] < n:
            prv[nxt[a]] = a
        for left in (prv[a], a):
            e = pair(left) if left >= 0 else None
            if e is not None:
                heapq.heappush(heap, e)
    return [tok[i] for i in range(n) if alive[i]]


def encode(tok: Tokenizer, text: str | bytes, bos: bool = True, eos: bool = False) -> list[int]:
    """Token ids for ``text``, with BOS first when ``bos`` and the vocabulary has one."""
    if tok.kind == "llama2c":
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids = _encode_llama2c(tok, data)
    elif tok.kind == "bpe":
        if tok.hf_json is None:
            raise ModelError("BPE tokenizer has no tokenizer JSON to encode with")
        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ModelError(f"BPE tokenizer can only encode UTF-8 text: {e}") from None
        ids = list(_hf_tokenizer(tok.hf_json).encode(text, add_special_tokens=False).ids)
    else:
        raise ModelError(f"cannot encode with a tokenizer of kind {tok.kind!r}")
    if bos and tok.bos_id is not None:
        ids.insert(0, tok.bos_id)
    if eos and tok.eos_id is not None:
        ids.append(tok.eos_id)
    return ids


def decode(tok: Tokenizer, ids) -> bytes:
    """The bytes ``ids`` stand for.  BOS/EOS decode to nothing; for llama2.c vocabularies and
    tokenizer JSONs whose decoder strips it, the leading space of the first piece
    (SentencePiece's dummy prefix) is dropped."""
    n = len(tok.pieces)
    strip = (tok.kind == "llama2c" and b" " in _spellings(tok)) or (
        tok.kind == "bpe" and tok.hf_json is not None and _drops_first_space(tok.hf_json))
    out: list[bytes] = []
    for i in ids:
        i = int(i)
        if not 0 <= i < n:
            raise ModelError(f"token id {i} out of range for a vocabulary of {n}")
        if i == tok.bos_id or i == tok.eos_id:
            continue
        p = tok.pieces[i]
        if strip and not out and p.startswith(b" "):
            p = p[1:]
        out.append(p)
    return b"".join(out)


__all__ = ["parse_tokenizer_bin", "read_tokenizer_bin", "tokenizer_bin_bytes", "write_tokenizer_bin",
           "from_hf_json", "load_tokenizer", "encode", "decode"]


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible_text(text: str) -> str:
    """Decoded text for a terminal: control characters (C0 but newline and tab, DEL, C1) as
    ``\\xNN``. An undertrained model samples stray bytes, and written raw they move the cursor,
    clear lines or start escape sequences."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
