"""The protocol's messages (docs/formats.md section 2): dataclasses, and their payloads both ways
(``encode_payload`` / ``decode_payload``; ``encode_frame`` wraps one in a frame)."""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .cobs import MAX_PAYLOAD, ProtocolError, encode_raw_frame

PROTO_VERSION = 3


class MsgType(enum.IntEnum):
    PING = 0x01
    GENERATE = 0x02
    LAYOUT = 0x03
    STOP = 0x04
    RESEND = 0x05
    GENERATE_TEXT = 0x06
    SELFTEST = 0x07
    HELLO = 0x81
    TOKEN = 0x82
    DONE = 0x83
    ERROR = 0x84
    LOGITS = 0x85
    LOG = 0x86
    RESENT = 0x87


PHASES = ("embed", "attention", "ffn", "ple", "output", "sampling", "draft")
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
CLOCKS = ("host clock", "chip timer", "emulated timer", "emulated instructions")   # 3: QEMU boards (tools/esp_qemu)

GENERATE_FLAG_LOGITS = 0x1      # a LOGITS frame after every step (implies ALL_LOGITS)
GENERATE_FLAG_SLIDE = 0x2       # a full context slides its window instead of ending the generation
GENERATE_FLAG_ALL_LOGITS = 0x4  # every step computes the whole output layer (never pruned or skipped)
HELLO_FLAG_IMAGE_OK = 0x1
HELLO_FLAG_RESEND = 0x2       # the device keeps recent TOKEN frames and answers RESEND
HELLO_FLAG_TEXT = 0x4         # the device encodes text prompts (GENERATE_TEXT, the text console)
HELLO_FLAG_DRAFT = 0x8        # the device holds a draft model it can speculate with (version 3)
RESEND_MAX = 32               # steps one RESEND may name
RESEND_DONE = 0xFFFFFFFF      # the step number that asks for the generation's DONE
RESENT_STATES = ("idle", "generating", "ended")
SPECULATE = ("none", "lookup", "draft")   # GENERATE speculate: no drafts, prompt lookup, the draft model
PASS_KINDS = ("one", "prefill", "verify")  # TOKEN kind: the forward pass a step came from
GOLDEN_STATES = ("none", "not_run", "exact", "differs")   # HELLO's golden check (docs/formats.md 1.3)
GOLDEN_NO_STEP = 0xFFFF


@dataclass(frozen=True)
class SelfTest:
    """Run every step of the image's golden check now; the device answers LOG and HELLO."""


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
    """``batch``: tokens per prefill pass (0: the device's batch); ``speculate``: where drafts come
    from (SPECULATE); ``draft_k``: drafts per verifying pass (0: the batch minus one)."""
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    send_logits: bool = False
    slide: bool = False
    all_logits: bool = False
    batch: int = 0
    speculate: str = "none"
    draft_k: int = 0


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
    batch: int = 0
    speculate: str = "none"
    draft_k: int = 0


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
    batch: int = 1            # the most tokens one forward pass runs (version 3)
    can_draft: bool = False   # HELLO flag bit3 (version 3)
    golden: str = "none"      # the golden check: one of GOLDEN_STATES (version 3)
    golden_checked: int = 0   # steps compared
    golden_total: int = 0     # steps the image's golden holds for the KV format in effect
    golden_first_diff: int | None = None   # the first step that differs

    @property
    def clock_name(self) -> str:
        return CLOCKS[self.clock] if 0 <= self.clock < len(CLOCKS) else f"clock {self.clock}"

    @property
    def bit_exact(self) -> str:
        """"yes", "no (first step that differs: N)", or why the board cannot say."""
        if self.golden == "exact":
            return f"yes ({self.golden_checked} of {self.golden_total} golden steps)"
        if self.golden == "differs":
            return f"no (first step that differs: {self.golden_first_diff})"
        if self.golden == "not_run":
            return f"not checked yet ({self.golden_total} golden steps; flashlm run --selftest runs them)"
        return "not checked (the image has no golden check for this KV format; re-run flashlm convert)"


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
    # the forward pass the step came from (version 3): us and bytes_read above are the whole pass's
    pass_index: int = 0        # the step's place in it (its first step: step - pass_index)
    chunk_len: int = 1         # tokens it ran
    chunk_used: int = 1        # steps it produced (a verifying pass: the accepted drafts + 1)
    kind: str = "one"          # PASS_KINDS

    @property
    def chunk(self) -> int:
        """The pass's first step."""
        return self.step - self.pass_index


@dataclass(frozen=True)
class Done:
    steps: int
    generated: int
    reason: str  # one of STOP_REASONS
    total_us: int
    phase_us: tuple[int, ...]  # per phase, PHASES order
    # version 3: forward passes, the verifying ones, drafts proposed and accepted, bytes per tier
    # (proposing drafts included), of which proposing drafts read
    passes: int = 0
    verify_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    bytes_read: tuple[int, ...] = (0, 0, 0)
    draft_bytes: tuple[int, ...] = (0, 0, 0)


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


def _gen_head(m: Generate | GenerateText) -> bytes:
    """The fields GENERATE and GENERATE_TEXT share (28 bytes)."""
    if m.speculate not in SPECULATE:
        raise ProtocolError(f"speculate {m.speculate!r} is not one of {SPECULATE}")
    return struct.pack("<IffQIBBBB", m.max_new_tokens, m.temperature, m.top_p, m.seed, generate_flags(m), m.batch,
                       SPECULATE.index(m.speculate), m.draft_k, 0)


def _enc_generate(m: Generate) -> bytes:
    ids = [int(i) for i in m.prompt_ids]
    return _gen_head(m) + struct.pack(f"<I{len(ids)}I", len(ids), *ids)


def _enc_generate_text(m: GenerateText) -> bytes:
    raw = m.text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ProtocolError(f"GENERATE_TEXT: text of {len(raw)} bytes does not fit in s16")
    return _gen_head(m) + struct.pack("<H", len(raw)) + raw


def _enc_hello(m: Hello) -> bytes:
    model_hash = bytes(m.model_hash)
    if len(model_hash) != 16:
        raise ProtocolError(f"HELLO model_hash must be 16 bytes, got {len(model_hash)}")
    flags = ((HELLO_FLAG_IMAGE_OK if m.image_ok else 0) | (HELLO_FLAG_RESEND if m.can_resend else 0)
             | (HELLO_FLAG_TEXT if m.can_encode else 0) | (HELLO_FLAG_DRAFT if m.can_draft else 0))
    if m.proto_version == 1:   # version 1 had no out_vocab (what an old board sends)
        if m.out_vocab != m.vocab_size:
            raise ProtocolError("HELLO version 1 cannot carry an out_vocab other than vocab_size")
        sizes = struct.pack("<IIIB", m.layout_id, m.vocab_size, m.max_seq_len, m.clock)
    else:
        sizes = struct.pack("<IIIIB", m.layout_id, m.vocab_size, m.out_vocab, m.max_seq_len, m.clock)
    golden = b""
    if m.proto_version >= 3:
        first = GOLDEN_NO_STEP if m.golden_first_diff is None else m.golden_first_diff
        golden = struct.pack("<BHHH", GOLDEN_STATES.index(m.golden), m.golden_checked, m.golden_total, first)
    return (
        struct.pack("<HH", m.proto_version, flags)
        + model_hash
        + sizes
        + _s8(m.fw_version)
        + _s8(m.board)
        + (struct.pack("<B", m.batch) if m.proto_version >= 3 else b"")
        + golden
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
        + struct.pack("<IIBBBBB", m.head_rows, m.logits_crc, m.pass_index, m.chunk_len, m.chunk_used,
                      PASS_KINDS.index(m.kind), len(piece))
        + piece
    )


def _enc_done(m: Done) -> bytes:
    if m.reason not in STOP_REASONS:
        raise ProtocolError(f"DONE reason {m.reason!r} is not one of {STOP_REASONS}")
    return (struct.pack("<IIBQ", m.steps, m.generated, STOP_REASONS.index(m.reason), m.total_us)
            + struct.pack(f"<{len(PHASES)}Q", *_fixed(m.phase_us, len(PHASES), "DONE phase_us"))
            + struct.pack("<4I", m.passes, m.verify_passes, m.drafted, m.accepted)
            + struct.pack("<3Q", *_fixed(m.bytes_read, len(TIERS), "DONE bytes_read"))
            + struct.pack("<3Q", *_fixed(m.draft_bytes, len(TIERS), "DONE draft_bytes")))


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
    SelfTest: (MsgType.SELFTEST, lambda m: b""),
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


def _dec_gen_head(name: str, r: _Reader) -> tuple:
    max_new, temp, top_p, seed, flags, batch, spec, draft_k, zero = r.unpack("IffQIBBBB")
    if spec >= len(SPECULATE) or zero:
        raise ProtocolError(f"{name}: speculate {spec} is unknown or its reserved byte is not 0")
    return (max_new, temp, top_p, seed, *_flag_fields(name, flags), batch, SPECULATE[spec], draft_k)


def _dec_generate(r: _Reader) -> Generate:
    head = _dec_gen_head("GENERATE", r)
    (n,) = r.unpack("I")
    if len(r.data) - r.pos != 4 * n:
        raise ProtocolError(
            f"GENERATE payload: n_prompt={n} needs {r.pos + 4 * n} bytes, got {len(r.data)}"
        )
    ids = list(r.unpack(f"{n}I"))
    r.end()
    return Generate(ids, *head)


def _dec_generate_text(r: _Reader) -> GenerateText:
    head = _dec_gen_head("GENERATE_TEXT", r)
    text = r.s16()
    r.end()
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"GENERATE_TEXT text is not UTF-8: {e}") from None
    return GenerateText(s, *head)


def _dec_hello(r: _Reader) -> Hello:
    version, flags = r.unpack("HH")
    model_hash = r.take(16)
    if version == 1:   # no out_vocab yet: decoded so the session can name the version it refuses
        layout_id, vocab, max_seq, clock = r.unpack("IIIB")
        out_vocab = vocab
    else:
        layout_id, vocab, out_vocab, max_seq, clock = r.unpack("IIIIB")
    fw, board = _text(r.s8()), _text(r.s8())
    batch, golden, checked, total, first = 1, 0, 0, 0, GOLDEN_NO_STEP
    if version >= 3:
        batch, golden, checked, total, first = r.unpack("BBHHH")
        if golden >= len(GOLDEN_STATES):
            raise ProtocolError(f"HELLO golden state {golden} is unknown")
    r.end()
    return Hello(version, bool(flags & HELLO_FLAG_IMAGE_OK), model_hash, layout_id, vocab, out_vocab,
                 max_seq, clock, fw, board, bool(flags & HELLO_FLAG_RESEND), bool(flags & HELLO_FLAG_TEXT), batch,
                 bool(flags & HELLO_FLAG_DRAFT), GOLDEN_STATES[golden], checked, total,
                 None if first == GOLDEN_NO_STEP else first)


def _dec_token(r: _Reader) -> Token:
    step, pos, in_id, out_id = r.unpack("4I")
    us = r.unpack(f"{len(PHASES)}I")
    bytes_read = r.unpack("3I")
    head_rows, logits_crc, index, chunk_len, chunk_used, kind = r.unpack("IIBBBB")
    piece = r.s8()
    r.end()
    if kind >= len(PASS_KINDS) or index > step:
        raise ProtocolError(f"TOKEN pass kind {kind} is unknown or its place {index} is past step {step}")
    return Token(step, pos, in_id, None if out_id == NO_TOKEN else out_id, us, bytes_read,
                 head_rows, logits_crc, piece, index, chunk_len, chunk_used, PASS_KINDS[kind])


def _dec_done(r: _Reader) -> Done:
    steps, generated, reason, total = r.unpack("IIBQ")
    phase_us = r.unpack(f"{len(PHASES)}Q")
    passes, verify, drafted, accepted = r.unpack("4I")
    bytes_read = r.unpack("3Q")
    draft_bytes = r.unpack("3Q")
    r.end()
    if reason >= len(STOP_REASONS):
        raise ProtocolError(f"DONE reason code {reason} is unknown")
    return Done(steps, generated, STOP_REASONS[reason], total, phase_us, passes, verify, drafted, accepted, bytes_read,
                draft_bytes)


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
    MsgType.SELFTEST: _dec_empty(SelfTest),
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
