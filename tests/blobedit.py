"""Editing a blob's bytes in tests that make it inconsistent on purpose: where a tensor's table entry
sits, and the CRC written again so only the edit is wrong (docs/formats.md section 1)."""
from __future__ import annotations

import struct
import zlib


def entry(blob: bytes, name: str) -> int:
    """The offset of the table entry of tensor ``name``."""
    n, table = struct.unpack_from("<II", blob, 36)
    return next(table + 64 * i for i in range(n) if blob[table + 64 * i:table + 64 * i + 32].rstrip(b"\0") == name.encode())


def recrc(b: bytearray) -> bytes:
    """``b`` with its CRC over bytes [16, end) rewritten."""
    struct.pack_into("<I", b, 12, zlib.crc32(memoryview(b)[16:]))
    return bytes(b)
