"""The wire form of the protocol's messages (docs/formats.md section 2): ``encode_payload`` /
``decode_payload`` turn a message (host/link/messages.py) into (type, payload bytes) and back;
``encode_frame`` wraps one in a frame. All integers are little-endian, floats IEEE-754 binary32."""
from __future__ import annotations

import struct
from typing import Any, Callable

import numpy as np

from .cobs import MAX_PAYLOAD, ProtocolError, encode_raw_frame
from .messages import (GENERATE_FLAG_ALL_LOGITS, GENERATE_FLAG_LOGITS, GENERATE_FLAG_SLIDE, GENERATE_FLAGS,
                       GOLDEN_NO_STEP, GOLDEN_STATES, HELLO_FLAG_DRAFT, HELLO_FLAG_IMAGE_OK, HELLO_FLAG_RESEND,
                       HELLO_FLAG_TEXT, NO_TOKEN, PASS_KINDS, PHASES, RESEND_MAX, RESENT_STATES, SPECULATE,
                       STOP_REASONS, TIERS, Done, Error, Generate, Hello, Layout, Log, Logits, Message, MsgType, Ping,
                       Resend, Resent, SelfTest, Stop, Token)


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


def _flags(m: Generate) -> int:
    """The u32 flags of a GENERATE or GENERATE_TEXT."""
    return ((GENERATE_FLAG_LOGITS if m.send_logits else 0) | (GENERATE_FLAG_SLIDE if m.slide else 0)
            | (GENERATE_FLAG_ALL_LOGITS if m.all_logits else 0))


def _enc_generate(m: Generate) -> bytes:
    """GENERATE (the prompt as ids) or GENERATE_TEXT (as text): the fields both share (28 bytes),
    then the prompt."""
    if m.speculate not in SPECULATE:
        raise ProtocolError(f"speculate {m.speculate!r} is not one of {SPECULATE}")
    head = struct.pack("<IffQIBBBB", m.max_new_tokens, m.temperature, m.top_p, m.seed, _flags(m), m.batch,
                       SPECULATE.index(m.speculate), m.draft_k, 0)
    if m.is_text:
        raw = m.prompt.encode("utf-8")
        if len(raw) > 0xFFFF:
            raise ProtocolError(f"GENERATE_TEXT: text of {len(raw)} bytes does not fit in s16")
        return head + struct.pack("<H", len(raw)) + raw
    ids = [int(i) for i in m.prompt]
    return head + struct.pack(f"<I{len(ids)}I", len(ids), *ids)


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
        + _enc_experts(m)
    )


def _enc_experts(m: Token) -> bytes:
    """u8 layers (0: no experts), u8 top_k, u8 n_experts, the step's experts per layer, then per layer the
    pass's bitmask in (n_experts + 7) / 8 bytes."""
    L = len(m.experts) if m.n_experts else 0
    if L != len(m.pass_experts) or len({len(c) for c in m.experts}) > 1:
        raise ProtocolError("TOKEN experts: one choice of equal length and one mask per layer")
    k, mb = (len(m.experts[0]) if L else 0), (m.n_experts + 7) // 8
    return (struct.pack("<3B", L, k, m.n_experts) + bytes(e for c in m.experts for e in c)
            + b"".join(mask.to_bytes(mb, "little") for mask in m.pass_experts))


def _enc_done(m: Done) -> bytes:
    if m.reason not in STOP_REASONS:
        raise ProtocolError(f"DONE reason {m.reason!r} is not one of {STOP_REASONS}")
    return (struct.pack("<IIBQ", m.steps, m.generated, STOP_REASONS.index(m.reason), m.total_us)
            + struct.pack(f"<{len(PHASES)}Q", *_fixed(m.phase_us, len(PHASES), "DONE phase_us"))
            + struct.pack("<4I", m.passes, m.verify_passes, m.drafted, m.accepted)
            + struct.pack("<3Q", *_fixed(m.bytes_read, len(TIERS), "DONE bytes_read"))
            + struct.pack("<3Q", *_fixed(m.draft_bytes, len(TIERS), "DONE draft_bytes"))
            + struct.pack("<2I", m.stack_peak, m.stack_size))


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
    if isinstance(msg, Generate) and msg.is_text:
        msg_type = MsgType.GENERATE_TEXT      # one request, sent as the type its prompt's kind has
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


def _flag_fields(name: str, flags: int) -> tuple[bool, bool, bool]:
    """(send_logits, slide, all_logits) of a flags field; unknown bits are a ProtocolError."""
    if flags & ~GENERATE_FLAGS:
        raise ProtocolError(f"{name} flags 0x{flags:x} has unknown bits (known: 0x{GENERATE_FLAGS:x})")
    return (bool(flags & GENERATE_FLAG_LOGITS), bool(flags & GENERATE_FLAG_SLIDE),
            bool(flags & GENERATE_FLAG_ALL_LOGITS))


def _dec_generate(r: _Reader) -> Generate:
    """GENERATE or GENERATE_TEXT (``r.name`` says which): the one request class either way."""
    max_new, temp, top_p, seed, flags, batch, spec, draft_k, zero = r.unpack("IffQIBBBB")
    if spec >= len(SPECULATE) or zero:
        raise ProtocolError(f"{r.name}: speculate {spec} is unknown or its reserved byte is not 0")
    head = (max_new, temp, top_p, seed, *_flag_fields(r.name, flags), batch, SPECULATE[spec], draft_k)
    if r.name == "GENERATE_TEXT":
        text = r.s16()
        r.end()
        try:
            return Generate(text.decode("utf-8"), *head)
        except UnicodeDecodeError as e:
            raise ProtocolError(f"GENERATE_TEXT text is not UTF-8: {e}") from None
    (n,) = r.unpack("I")
    if len(r.data) - r.pos != 4 * n:
        raise ProtocolError(
            f"GENERATE payload: n_prompt={n} needs {r.pos + 4 * n} bytes, got {len(r.data)}"
        )
    ids = list(r.unpack(f"{n}I"))
    r.end()
    return Generate(ids, *head)


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
    L, k, n_experts = r.unpack("3B")
    chosen = r.take(L * k)
    masks = tuple(int.from_bytes(r.take((n_experts + 7) // 8), "little") for _ in range(L))
    r.end()
    if kind >= len(PASS_KINDS) or index > step:
        raise ProtocolError(f"TOKEN pass kind {kind} is unknown or its place {index} is past step {step}")
    experts = tuple(tuple(chosen[i * k:(i + 1) * k]) for i in range(L))
    if (L and not 1 <= k <= n_experts) or any(not masks[i] >> e & 1 for i, c in enumerate(experts) for e in c) \
            or any(m >> n_experts for m in masks):
        raise ProtocolError(f"TOKEN experts: {L} layers of top {k} of {n_experts} experts, a step's expert not "
                            f"among its pass's, or a pass's outside the {n_experts}")
    return Token(step, pos, in_id, None if out_id == NO_TOKEN else out_id, us, bytes_read,
                 head_rows, logits_crc, piece, index, chunk_len, chunk_used, PASS_KINDS[kind],
                 n_experts if L else 0, experts, masks)


def _dec_done(r: _Reader) -> Done:
    steps, generated, reason, total = r.unpack("IIBQ")
    phase_us = r.unpack(f"{len(PHASES)}Q")
    passes, verify, drafted, accepted = r.unpack("4I")
    bytes_read = r.unpack("3Q")
    draft_bytes = r.unpack("3Q")
    stack_peak, stack_size = r.unpack("2I")
    r.end()
    if reason >= len(STOP_REASONS):
        raise ProtocolError(f"DONE reason code {reason} is unknown")
    if stack_peak > stack_size:
        raise ProtocolError(f"DONE stack peak {stack_peak} B is past the stack's {stack_size} B")
    return Done(steps, generated, STOP_REASONS[reason], total, phase_us, passes, verify, drafted, accepted, bytes_read,
                draft_bytes, stack_peak, stack_size)


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
    MsgType.GENERATE_TEXT: _dec_generate,
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
