"""Host side of the framed serial protocol (docs/formats.md section 2).

Wire: every frame is ``COBS(u8 type | u16 seq | payload | u32 crc32)`` followed by one ``0x00``.
All integers are little-endian, floats are IEEE-754 binary32.

Layers, bottom up:

* ``cobs_encode`` / ``cobs_decode`` -- canonical COBS, byte-identical to the firmware's streaming
  encoder (a frame whose last zero-free run fills a 254-byte block exactly gets no trailing
  0x01 block);
* ``encode_raw_frame`` / ``decode_raw_frame`` -- type, seq, payload <-> one delimited frame;
* ``encode_payload`` / ``decode_payload`` -- message dataclasses <-> (type, payload);
* ``FrameDecoder`` -- a byte stream in, ``Frame`` objects out, with counters in ``stats``;
* ``Link`` -- a decoder plus a transmit seq over a pyserial-like port.
"""
from __future__ import annotations

import enum
import struct
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

PROTO_VERSION = 2


class MsgType(enum.IntEnum):
    PING = 0x01
    GENERATE = 0x02
    LAYOUT = 0x03
    STOP = 0x04
    RESEND = 0x05
    GENERATE_TEXT = 0x06
    HELLO = 0x81
    TOKEN = 0x82
    DONE = 0x83
    ERROR = 0x84
    LOGITS = 0x85
    LOG = 0x86
    RESENT = 0x87


PHASES = ("embed", "attention", "ffn", "ple", "output", "sampling")
TIERS = ("flash", "psram", "sram")
NO_TOKEN = 0xFFFFFFFF
STOP_REASONS = ("max_tokens", "eos", "context_full", "stopped")
ERROR_CODES = {
    1: "bad_frame",
    2: "bad_message",
    3: "bad_image",
    4: "prompt_too_long",
    5: "bad_token",
    6: "busy",
    7: "no_model",
    8: "bad_layout",
    9: "cannot_encode",
    10: "self_check",
}
CLOCKS = ("host clock", "chip timer", "emulated timer")

MAX_FRAME = 65536  # bytes of type|seq|payload|crc before COBS
FRAME_OVERHEAD = 7  # type + seq + crc
MAX_PAYLOAD = MAX_FRAME - FRAME_OVERHEAD
GENERATE_FLAG_LOGITS = 0x1      # a LOGITS frame after every step (implies ALL_LOGITS)
GENERATE_FLAG_SLIDE = 0x2       # a full context slides its window instead of ending the generation
GENERATE_FLAG_ALL_LOGITS = 0x4  # every step computes the whole output layer (never pruned or skipped)
HELLO_FLAG_IMAGE_OK = 0x1
HELLO_FLAG_RESEND = 0x2       # the device keeps recent TOKEN frames and answers RESEND
HELLO_FLAG_TEXT = 0x4         # the device encodes text prompts (GENERATE_TEXT, the text console)
RESEND_MAX = 32               # steps one RESEND may name
RESEND_DONE = 0xFFFFFFFF      # the step number that asks for the generation's DONE
RESENT_STATES = ("idle", "generating", "ended")


def cobs_max_encoded(n: int) -> int:
    """Upper bound on the COBS encoding of ``n`` bytes (delimiter not included)."""
    return n + n // 254 + 1


MAX_ENCODED = cobs_max_encoded(MAX_FRAME)


class ProtocolError(ValueError):
    """A frame or message that does not follow the protocol (one-line message)."""


class FrameError(ProtocolError):
    """A frame that fails COBS decoding, is too short, or fails its CRC.

    ``kind`` is ``"cobs"`` (including too short) or ``"crc"``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------------------------------------
# COBS


def cobs_encode(data: bytes) -> bytes:
    """Canonical COBS encoding of ``data`` (no delimiter appended; the output has no zero)."""
    out = bytearray()
    segments = bytes(data).split(b"\x00")
    last = len(segments) - 1
    for i, seg in enumerate(segments):
        n = len(seg)
        pos = 0
        while n - pos >= 254:
            out.append(0xFF)
            out += seg[pos : pos + 254]
            pos += 254
        # A final run that ended on a full block needs no closing block.
        if i != last or pos < n or n == 0:
            out.append(n - pos + 1)
            out += seg[pos:]
    return bytes(out)


def cobs_decode(data: bytes) -> bytes:
    """Inverse of ``cobs_encode``; raises ``FrameError`` (kind "cobs") for invalid input.

    Also accepts the non-canonical trailing 0x01 after a final 0xFF block."""
    data = bytes(data)
    n = len(data)
    out = bytearray()
    i = 0
    while i < n:
        code = data[i]
        if code == 0:
            raise FrameError("cobs", f"COBS: zero byte at offset {i}")
        end = i + code
        if end > n:
            raise FrameError("cobs", f"COBS: block at offset {i} runs {end - n} bytes past the end")
        block = data[i + 1 : end]
        if 0 in block:
            raise FrameError("cobs", f"COBS: zero byte inside the block at offset {i}")
        out += block
        i = end
        if code != 0xFF and i < n:
            out.append(0)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Frames


def encode_raw_frame(msg_type: int, seq: int, payload: bytes) -> bytes:
    """One wire frame (COBS + 0x00 delimiter) for a raw type/seq/payload."""
    if not 0 <= msg_type <= 0xFF:
        raise ProtocolError(f"frame type {msg_type} does not fit in u8")
    payload = bytes(payload)
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    body = struct.pack("<BH", msg_type, seq & 0xFFFF) + payload
    body += struct.pack("<I", zlib.crc32(body))
    return cobs_encode(body) + b"\x00"


def decode_raw_frame(encoded: bytes) -> tuple[int, int, bytes]:
    """(type, seq, payload) from one COBS-encoded frame without its delimiter.

    Raises ``FrameError`` for bad COBS, a frame under 7 bytes, or a CRC mismatch."""
    body = cobs_decode(encoded)
    if len(body) < FRAME_OVERHEAD:
        raise FrameError("cobs", f"frame of {len(body)} bytes is shorter than {FRAME_OVERHEAD}")
    (crc,) = struct.unpack_from("<I", body, len(body) - 4)
    if zlib.crc32(body[:-4]) != crc:
        raise FrameError("crc", "frame CRC mismatch")
    msg_type, seq = struct.unpack_from("<BH", body)
    return msg_type, seq, body[3:-4]


# ---------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Layout:
    """Switch placement without reflashing: one tier (0 flash, 1 psram, 2 sram) per tensor-table
    entry in table order, and the state regions' tiers (the blob header's state_tiers field);
    ``layout_id`` is what the device will report in HELLO (converter.blob.layout_id_of)."""

    layout_id: int
    state_tiers: int
    tiers: bytes


@dataclass(frozen=True)
class Resend:
    """Ask for kept frames of generation ``generation`` again (docs/formats.md section 2.1):
    TOKEN steps, and ``RESEND_DONE`` for its DONE. No steps: a status query."""

    generation: int
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Resent:
    """Ends the device's answer to a RESEND: its generation state and what it did not send."""

    state: str  # one of RESENT_STATES
    generation: int
    steps: int  # TOKEN steps the current/last generation has sent
    first_kept: int  # oldest step still kept
    unavailable: tuple[int, ...]


@dataclass(frozen=True)
class Generate:
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    send_logits: bool = False
    slide: bool = False
    all_logits: bool = False


@dataclass(frozen=True)
class GenerateText:
    """GENERATE with the prompt as UTF-8 text, which the device encodes (BOS first, as the host's
    encode_prompt does) with its blob's tokenizer.enc section."""
    text: str
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    send_logits: bool = False
    slide: bool = False
    all_logits: bool = False


GENERATE_FLAGS = GENERATE_FLAG_LOGITS | GENERATE_FLAG_SLIDE | GENERATE_FLAG_ALL_LOGITS


def generate_flags(m: Generate | GenerateText) -> int:
    """The u32 flags of a GENERATE or GENERATE_TEXT."""
    return ((GENERATE_FLAG_LOGITS if m.send_logits else 0) | (GENERATE_FLAG_SLIDE if m.slide else 0)
            | (GENERATE_FLAG_ALL_LOGITS if m.all_logits else 0))


def _flag_fields(name: str, flags: int) -> tuple[bool, bool, bool]:
    """(send_logits, slide, all_logits) of a flags field; unknown bits are a ProtocolError."""
    if flags & ~GENERATE_FLAGS:
        raise ProtocolError(f"{name} flags 0x{flags:x} has unknown bits (known: 0x{GENERATE_FLAGS:x})")
    return (bool(flags & GENERATE_FLAG_LOGITS), bool(flags & GENERATE_FLAG_SLIDE),
            bool(flags & GENERATE_FLAG_ALL_LOGITS))


@dataclass(frozen=True)
class Hello:
    proto_version: int
    image_ok: bool
    model_hash: bytes
    layout_id: int
    vocab_size: int
    out_vocab: int  # rows of the output layer: LOGITS carry this many values
    max_seq_len: int
    clock: int
    fw_version: str
    board: str
    can_resend: bool = False  # HELLO flag bit1
    can_encode: bool = False  # HELLO flag bit2

    @property
    def clock_name(self) -> str:
        return CLOCKS[self.clock] if 0 <= self.clock < len(CLOCKS) else f"clock {self.clock}"


@dataclass(frozen=True)
class Token:
    step: int
    pos: int
    in_id: int
    out_id: int | None  # None on the wire is NO_TOKEN (a prompt step whose output is unused)
    us: tuple[int, ...]  # per phase, PHASES order
    bytes_read: tuple[int, ...]  # per tier, TIERS order
    head_rows: int  # rows of the output layer this step computed (0: head skipped; < out_vocab: pruned)
    logits_crc: int
    piece: bytes


@dataclass(frozen=True)
class Done:
    steps: int
    generated: int
    reason: str  # one of STOP_REASONS
    total_us: int
    phase_us: tuple[int, ...]  # per phase, PHASES order


@dataclass(frozen=True)
class Error:
    code: int
    text: str

    @property
    def name(self) -> str:
        return ERROR_CODES.get(self.code, f"error_{self.code}")


@dataclass(frozen=True, eq=False)
class Logits:
    step: int
    values: np.ndarray  # float32, out_vocab entries

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Logits):
            return NotImplemented
        return self.step == other.step and (
            np.asarray(self.values, dtype="<f4").tobytes()
            == np.asarray(other.values, dtype="<f4").tobytes()
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Log:
    text: str


Message = Any  # one of the dataclasses above


@dataclass(frozen=True)
class Frame:
    seq: int
    msg: Message


def _cut_utf8(text: str, limit: int) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return raw
    end = limit
    while end > 0 and (raw[end] & 0xC0) == 0x80:  # do not split a character
        end -= 1
    return raw[:end]


def _s8(text: str) -> bytes:
    raw = _cut_utf8(text, 0xFF)
    return bytes([len(raw)]) + raw


def _s16(text: str, room: int) -> bytes:
    raw = _cut_utf8(text, room - 2)  # cut so the frame stays within MAX_FRAME
    return struct.pack("<H", len(raw)) + raw


def _fixed(values, n: int, what: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    if len(values) != n:
        raise ProtocolError(f"{what} needs {n} values, got {len(values)}")
    return values


def _enc_generate(m: Generate) -> bytes:
    ids = [int(i) for i in m.prompt_ids]
    head = struct.pack("<IffQII", m.max_new_tokens, m.temperature, m.top_p, m.seed, generate_flags(m), len(ids))
    return head + struct.pack(f"<{len(ids)}I", *ids)


def _enc_generate_text(m: GenerateText) -> bytes:
    raw = m.text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ProtocolError(f"GENERATE_TEXT: text of {len(raw)} bytes does not fit in s16")
    return (struct.pack("<IffQIH", m.max_new_tokens, m.temperature, m.top_p, m.seed, generate_flags(m), len(raw))
            + raw)


def _enc_hello(m: Hello) -> bytes:
    model_hash = bytes(m.model_hash)
    if len(model_hash) != 16:
        raise ProtocolError(f"HELLO model_hash must be 16 bytes, got {len(model_hash)}")
    flags = ((HELLO_FLAG_IMAGE_OK if m.image_ok else 0) | (HELLO_FLAG_RESEND if m.can_resend else 0)
             | (HELLO_FLAG_TEXT if m.can_encode else 0))
    if m.proto_version == 1:   # version 1 had no out_vocab (what an old board sends)
        if m.out_vocab != m.vocab_size:
            raise ProtocolError("HELLO version 1 cannot carry an out_vocab other than vocab_size")
        sizes = struct.pack("<IIIB", m.layout_id, m.vocab_size, m.max_seq_len, m.clock)
    else:
        sizes = struct.pack("<IIIIB", m.layout_id, m.vocab_size, m.out_vocab, m.max_seq_len, m.clock)
    return (
        struct.pack("<HH", m.proto_version, flags)
        + model_hash
        + sizes
        + _s8(m.fw_version)
        + _s8(m.board)
    )


def _enc_token(m: Token) -> bytes:
    piece = bytes(m.piece)
    if len(piece) > 0xFF:
        raise ProtocolError(f"TOKEN piece of {len(piece)} bytes does not fit in s8")
    out_id = NO_TOKEN if m.out_id is None else m.out_id
    return (
        struct.pack("<4I", m.step, m.pos, m.in_id, out_id)
        + struct.pack(f"<{len(PHASES)}I", *_fixed(m.us, len(PHASES), "TOKEN us"))
        + struct.pack("<3I", *_fixed(m.bytes_read, len(TIERS), "TOKEN bytes_read"))
        + struct.pack("<IIB", m.head_rows, m.logits_crc, len(piece))
        + piece
    )


def _enc_done(m: Done) -> bytes:
    if m.reason not in STOP_REASONS:
        raise ProtocolError(f"DONE reason {m.reason!r} is not one of {STOP_REASONS}")
    return struct.pack("<IIBQ", m.steps, m.generated, STOP_REASONS.index(m.reason), m.total_us) + (
        struct.pack(f"<{len(PHASES)}Q", *_fixed(m.phase_us, len(PHASES), "DONE phase_us"))
    )


def _enc_logits(m: Logits) -> bytes:
    values = np.asarray(m.values, dtype="<f4").reshape(-1)
    return struct.pack("<I", m.step) + values.tobytes()


def _enc_resend(m: Resend) -> bytes:
    steps = [int(s) for s in m.steps]
    if len(steps) > RESEND_MAX:
        raise ProtocolError(f"RESEND names {len(steps)} steps, at most {RESEND_MAX}")
    return struct.pack(f"<II{len(steps)}I", m.generation, len(steps), *steps)


def _enc_resent(m: Resent) -> bytes:
    if m.state not in RESENT_STATES:
        raise ProtocolError(f"RESENT state {m.state!r} is not one of {RESENT_STATES}")
    un = [int(s) for s in m.unavailable]
    return struct.pack(f"<BIIII{len(un)}I", RESENT_STATES.index(m.state), m.generation, m.steps,
                       m.first_kept, len(un), *un)


_ENCODERS: dict[type, tuple[MsgType, Callable[[Any], bytes]]] = {
    Ping: (MsgType.PING, lambda m: b""),
    Generate: (MsgType.GENERATE, _enc_generate),
    GenerateText: (MsgType.GENERATE_TEXT, _enc_generate_text),
    Layout: (MsgType.LAYOUT, lambda m: struct.pack("<3I", m.layout_id, m.state_tiers, len(m.tiers))
             + bytes(m.tiers)),
    Stop: (MsgType.STOP, lambda m: b""),
    Resend: (MsgType.RESEND, _enc_resend),
    Resent: (MsgType.RESENT, _enc_resent),
    Hello: (MsgType.HELLO, _enc_hello),
    Token: (MsgType.TOKEN, _enc_token),
    Done: (MsgType.DONE, _enc_done),
    Error: (MsgType.ERROR, lambda m: struct.pack("<H", m.code) + _s16(m.text, MAX_PAYLOAD - 2)),
    Logits: (MsgType.LOGITS, _enc_logits),
    Log: (MsgType.LOG, lambda m: _s16(m.text, MAX_PAYLOAD)),
}


def encode_payload(msg: Message) -> tuple[int, bytes]:
    """(type, payload bytes) for a message; ``ProtocolError`` if a field does not fit."""
    try:
        msg_type, enc = _ENCODERS[type(msg)]
    except KeyError:
        raise ProtocolError(f"not a protocol message: {type(msg).__name__}") from None
    try:
        return int(msg_type), enc(msg)
    except (struct.error, OverflowError, TypeError, ValueError) as e:
        if isinstance(e, ProtocolError):
            raise
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ProtocolError(f"{msg_type.name}: {detail}") from None


def encode_frame(msg: Message, seq: int) -> bytes:
    """One wire frame (COBS-encoded, 0x00-terminated) carrying ``msg`` with ``seq``."""
    msg_type, payload = encode_payload(msg)
    return encode_raw_frame(msg_type, seq, payload)


class _Reader:
    def __init__(self, name: str, data: bytes):
        self.name = name
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ProtocolError(
                f"{self.name} payload truncated: needs at least {self.pos + n} bytes, "
                f"got {len(self.data)}"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))

    def s8(self) -> bytes:
        (n,) = self.unpack("B")
        return self.take(n)

    def s16(self) -> bytes:
        (n,) = self.unpack("H")
        return self.take(n)

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(
                f"{self.name} payload has {len(self.data) - self.pos} extra bytes "
                f"({len(self.data)} bytes, expected {self.pos})"
            )


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")  # s8/s16 strings may be cut mid-character


def _dec_empty(cls):
    def dec(r: _Reader):
        r.end()
        return cls()

    return dec


def _dec_generate(r: _Reader) -> Generate:
    max_new, temp, top_p, seed, flags, n = r.unpack("IffQII")
    if len(r.data) - r.pos != 4 * n:
        raise ProtocolError(
            f"GENERATE payload: n_prompt={n} needs {r.pos + 4 * n} bytes, got {len(r.data)}"
        )
    ids = list(r.unpack(f"{n}I"))
    r.end()
    return Generate(ids, max_new, temp, top_p, seed, *_flag_fields("GENERATE", flags))


def _dec_generate_text(r: _Reader) -> GenerateText:
    max_new, temp, top_p, seed, flags = r.unpack("IffQI")
    text = r.s16()
    r.end()
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"GENERATE_TEXT text is not UTF-8: {e}") from None
    return GenerateText(s, max_new, temp, top_p, seed, *_flag_fields("GENERATE_TEXT", flags))


def _dec_hello(r: _Reader) -> Hello:
    version, flags = r.unpack("HH")
    model_hash = r.take(16)
    if version == 1:   # no out_vocab yet: decoded so the session can name the version it refuses
        layout_id, vocab, max_seq, clock = r.unpack("IIIB")
        out_vocab = vocab
    else:
        layout_id, vocab, out_vocab, max_seq, clock = r.unpack("IIIIB")
    fw, board = _text(r.s8()), _text(r.s8())
    r.end()
    return Hello(version, bool(flags & HELLO_FLAG_IMAGE_OK), model_hash, layout_id, vocab, out_vocab,
                 max_seq, clock, fw, board, bool(flags & HELLO_FLAG_RESEND), bool(flags & HELLO_FLAG_TEXT))


def _dec_token(r: _Reader) -> Token:
    step, pos, in_id, out_id = r.unpack("4I")
    us = r.unpack(f"{len(PHASES)}I")
    bytes_read = r.unpack("3I")
    head_rows, logits_crc = r.unpack("II")
    piece = r.s8()
    r.end()
    return Token(step, pos, in_id, None if out_id == NO_TOKEN else out_id, us, bytes_read,
                 head_rows, logits_crc, piece)


def _dec_done(r: _Reader) -> Done:
    steps, generated, reason, total = r.unpack("IIBQ")
    phase_us = r.unpack(f"{len(PHASES)}Q")
    r.end()
    if reason >= len(STOP_REASONS):
        raise ProtocolError(f"DONE reason code {reason} is unknown")
    return Done(steps, generated, STOP_REASONS[reason], total, phase_us)


def _dec_error(r: _Reader) -> Error:
    (code,) = r.unpack("H")
    text = _text(r.s16())
    r.end()
    return Error(code, text)


def _dec_logits(r: _Reader) -> Logits:
    (step,) = r.unpack("I")
    rest = len(r.data) - r.pos
    if rest % 4:
        raise ProtocolError(f"LOGITS payload: {rest} bytes of values is not a multiple of 4")
    values = np.frombuffer(r.take(rest), dtype="<f4").astype(np.float32)
    return Logits(step, values)


def _dec_log(r: _Reader) -> Log:
    text = _text(r.s16())
    r.end()
    return Log(text)


def _dec_layout(r: _Reader) -> Layout:
    layout_id, state_tiers, n = r.unpack("3I")
    tiers = r.take(n)
    r.end()
    return Layout(layout_id, state_tiers, tiers)


def _dec_resend(r: _Reader) -> Resend:
    generation, n = r.unpack("II")
    if n > RESEND_MAX or len(r.data) - r.pos != 4 * n:
        raise ProtocolError(f"RESEND payload: n={n} needs {r.pos + 4 * n} bytes (n <= {RESEND_MAX}), "
                            f"got {len(r.data)}")
    steps = r.unpack(f"{n}I")
    r.end()
    return Resend(generation, tuple(steps))


def _dec_resent(r: _Reader) -> Resent:
    state, generation, steps, first_kept, n = r.unpack("BIIII")
    if state >= len(RESENT_STATES):
        raise ProtocolError(f"RESENT state code {state} is unknown")
    if len(r.data) - r.pos != 4 * n:
        raise ProtocolError(f"RESENT payload: n={n} needs {r.pos + 4 * n} bytes, got {len(r.data)}")
    un = r.unpack(f"{n}I")
    r.end()
    return Resent(RESENT_STATES[state], generation, steps, first_kept, tuple(un))


_DECODERS: dict[int, Callable[[_Reader], Message]] = {
    MsgType.PING: _dec_empty(Ping),
    MsgType.GENERATE: _dec_generate,
    MsgType.GENERATE_TEXT: _dec_generate_text,
    MsgType.LAYOUT: _dec_layout,
    MsgType.STOP: _dec_empty(Stop),
    MsgType.RESEND: _dec_resend,
    MsgType.RESENT: _dec_resent,
    MsgType.HELLO: _dec_hello,
    MsgType.TOKEN: _dec_token,
    MsgType.DONE: _dec_done,
    MsgType.ERROR: _dec_error,
    MsgType.LOGITS: _dec_logits,
    MsgType.LOG: _dec_log,
}


def decode_payload(msg_type: int, payload: bytes) -> Message:
    """The message for (type, payload); ``ProtocolError`` for an unknown type or bad length."""
    try:
        name = MsgType(msg_type).name
    except ValueError:
        raise ProtocolError(f"unknown message type 0x{msg_type:02x}") from None
    return _DECODERS[msg_type](_Reader(name, bytes(payload)))


# ---------------------------------------------------------------------------------------------
# Stream decoder

_KNOWN_TYPES = frozenset(int(t) for t in MsgType)
RESYNC_WINDOW = 8192  # how far into a failing chunk to look for a frame glued to junk
_RESYNC_TRIES = 64


@dataclass
class DecoderStats:
    frames: int = 0  # frames delivered
    bad_crc: int = 0  # valid COBS, CRC mismatch
    bad_cobs: int = 0  # invalid COBS, shorter than 7 bytes, or longer than MAX_FRAME
    bad_message: int = 0  # good frame, payload not a valid message (unknown type, bad length)
    junk_bytes: int = 0  # bytes skipped outside frames (before the first frame, boot logs)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (expected seq, got seq)
    resets: int = 0  # HELLO with seq 0 after earlier traffic: the device rebooted

    @property
    def bad_frames(self) -> int:
        return self.bad_crc + self.bad_cobs + self.bad_message


class FrameDecoder:
    """Turns a received byte stream into ``Frame`` objects.

    Bytes up to each 0x00 delimiter form a candidate frame.  Until the first good frame,
    anything that does not decode counts as ``junk_bytes`` (boot logs, a partial frame at
    connect); after it, each candidate that does not decode is one ``bad_cobs`` / ``bad_crc``.
    A candidate that fails to decode is also searched for a valid frame glued to the end of junk
    (a boot log followed by HELLO with no delimiter in between): that frame is delivered and the
    bytes before it are skipped as above.  A candidate longer than any valid frame keeps only its
    last ``MAX_ENCODED`` bytes.

    Seq: each good frame is checked against the previous seq + 1 (mod 65536); a mismatch is
    recorded in ``stats.gaps``, except a HELLO with seq 0, which is counted as a reset.
    """

    def __init__(self) -> None:
        self.stats = DecoderStats()
        self._buf = bytearray()
        self._dropped = 0  # bytes cut from the front of an oversize candidate
        self._synced = False
        self._last_seq: int | None = None

    @property
    def last_seq(self) -> int | None:
        return self._last_seq

    def feed(self, data: bytes) -> list[Frame]:
        data = bytes(data)
        out: list[Frame] = []
        pos = 0
        while True:
            z = data.find(0, pos)
            if z < 0:
                self._append(data[pos:])
                return out
            self._append(data[pos:z])
            self._candidate(out)
            pos = z + 1

    def _append(self, piece: bytes) -> None:
        if not piece:
            return
        self._buf += piece
        extra = len(self._buf) - MAX_ENCODED
        if extra > 0:
            del self._buf[:extra]
            self._dropped += extra

    def _candidate(self, out: list[Frame]) -> None:
        chunk = bytes(self._buf)
        dropped = self._dropped
        self._buf.clear()
        self._dropped = 0
        if not chunk and not dropped:
            return  # empty frame: idle delimiter
        try:
            msg_type, seq, payload = decode_raw_frame(chunk)
            skipped = dropped
        except FrameError as err:
            found = self._resync(chunk)
            if found is None:
                self._skip(len(chunk) + dropped, "crc" if err.kind == "crc" and not dropped
                           else "cobs")
                return
            start, (msg_type, seq, payload) = found
            skipped = dropped + start
        if skipped:
            self._skip(skipped, "cobs")
        self._accept(msg_type, seq, payload, out)

    def _skip(self, n: int, kind: str) -> None:
        """Bytes that are not a frame: junk before the first good frame, else one bad frame."""
        if not self._synced:
            self.stats.junk_bytes += n
        elif kind == "crc":
            self.stats.bad_crc += 1
        else:
            self.stats.bad_cobs += 1

    @staticmethod
    def _resync(chunk: bytes):
        n = len(chunk)
        reach: bytearray | None = None
        tries = 0
        for s in range(1, min(n - 1, RESYNC_WINDOW)):
            # A frame starts with a code byte >= 2 followed by a known message type.
            if chunk[s] < 2 or chunk[s + 1] not in _KNOWN_TYPES:
                continue
            if reach is None:  # reach[i]: the COBS block chain from i lands exactly on n
                reach = bytearray(n + 1)
                reach[n] = 1
                for i in range(n - 1, 0, -1):
                    j = i + chunk[i]
                    if j <= n and reach[j]:
                        reach[i] = 1
            if not reach[s]:
                continue
            try:
                return s, decode_raw_frame(chunk[s:])
            except FrameError:
                tries += 1
                if tries >= _RESYNC_TRIES:
                    return None
        return None

    def _accept(self, msg_type: int, seq: int, payload: bytes, out: list[Frame]) -> None:
        st = self.stats
        self._synced = True
        if self._last_seq is not None:
            expected = (self._last_seq + 1) & 0xFFFF
            if seq != expected:
                if seq == 0 and msg_type == MsgType.HELLO:
                    st.resets += 1
                else:
                    st.gaps.append((expected, seq))
        self._last_seq = seq
        try:
            msg = decode_payload(msg_type, payload)
        except ProtocolError:
            st.bad_message += 1
            return
        st.frames += 1
        out.append(Frame(seq, msg))


# ---------------------------------------------------------------------------------------------
# Link


_POLL_S = 0.1


class Link:
    """Frames over a byte port with ``read(n)``, ``write(b)`` and a pyserial-style ``timeout``
    attribute (``read`` returns what arrived, possibly ``b""``, after at most ``timeout`` s).

    ``send`` numbers host frames from 0; ``recv`` returns the next received frame or None, never
    waiting longer than its timeout in total (given a port that honours ``timeout``)."""

    def __init__(self, port: Any, decoder: FrameDecoder | None = None):
        self.port = port
        self.decoder = decoder if decoder is not None else FrameDecoder()
        self.tx_seq = 0
        self._pending: deque[Frame] = deque()

    @property
    def stats(self) -> DecoderStats:
        return self.decoder.stats

    def send(self, msg: Message) -> int:
        """Writes ``msg`` as one frame; returns the seq it was sent with."""
        seq = self.tx_seq
        self.port.write(encode_frame(msg, seq))
        self.tx_seq = (seq + 1) & 0xFFFF
        return seq

    def recv(self, timeout: float) -> Frame | None:
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            waiting = getattr(self.port, "in_waiting", 0) or 0
            if not waiting:
                current = getattr(self.port, "timeout", None)
                if current is None or current <= 0 or current > remaining:
                    # Short polls keep pyserial from reconfiguring the port on every read.
                    self.port.timeout = min(remaining, _POLL_S)
            data = self.port.read(max(1, waiting))
            if data:
                self._pending.extend(self.decoder.feed(data))
        return self._pending.popleft()
