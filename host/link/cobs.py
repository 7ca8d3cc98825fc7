"""COBS framing of the serial protocol (docs/formats.md section 2): canonical COBS, byte-identical
to the firmware's streaming encoder, and one frame ``COBS(u8 type | u16 seq | payload | u32 crc32)``
followed by a ``0x00`` delimiter."""
from __future__ import annotations

import struct
import zlib

from converter.errors import FlashlmError

MAX_FRAME = 65536  # bytes of type|seq|payload|crc before COBS
FRAME_OVERHEAD = 7  # type + seq + crc
MAX_PAYLOAD = MAX_FRAME - FRAME_OVERHEAD


def cobs_max_encoded(n: int) -> int:
    """Upper bound on the COBS encoding of ``n`` bytes (delimiter not included)."""
    return n + n // 254 + 1


MAX_ENCODED = cobs_max_encoded(MAX_FRAME)


class ProtocolError(FlashlmError, ValueError):
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
