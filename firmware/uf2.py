"""UF2 images (Microsoft's USB Flashing Format, as the RP2040/RP2350 boot ROMs read it): 512-byte
blocks, each carrying 256 bytes for one flash address.

Block layout (little-endian u32s): magic 0x0A324655, magic 0x9E5D5157, flags, target address,
payload size, block number, number of blocks, family id; 476 data bytes (payload first, zero
padded); magic 0x0AB16F30. Flag 0x2000 says the family id field is present.
"""
from __future__ import annotations

import struct
from pathlib import Path

from converter.errors import FlashlmError

MAGIC0, MAGIC1, MAGIC_END = 0x0A324655, 0x9E5D5157, 0x0AB16F30
FLAG_FAMILY = 0x00002000
BLOCK = 512
PAYLOAD = 256
XIP_BASE = 0x10000000          # flash as the RP2040 / RP2350 see it (XIP window)

FAMILY_RP2040 = 0xE48BFF56
FAMILY_ABSOLUTE = 0xE48BFF57   # RP2350: written at its absolute address, whatever the partitions
FAMILY_RP2350_ARM_S = 0xE48BFF59
FAMILIES = {"RP2040": FAMILY_RP2040, "RP2350": FAMILY_ABSOLUTE}   # for a data (non-code) image


class UF2Error(FlashlmError, ValueError):
    pass


def family_for(chip: str) -> int:
    try:
        return FAMILIES[chip]
    except KeyError:
        raise UF2Error(f"no UF2 family for chip {chip!r}; known: {', '.join(FAMILIES)}") from None


def _block(addr: int, payload: bytes, n: int, total: int, family: int) -> bytes:
    head = struct.pack("<8I", MAGIC0, MAGIC1, FLAG_FAMILY, addr, len(payload), n, total, family)
    return head + payload.ljust(476, b"\0") + struct.pack("<I", MAGIC_END)


def bin_to_uf2(data: bytes, addr: int, family: int) -> bytes:
    """``data`` to be written at flash address ``addr`` (XIP address, 256-aligned); the last block
    is padded with 0xFF (erased flash) so every block writes one whole 256-byte page."""
    if addr % PAYLOAD:
        raise UF2Error(f"UF2 target address {addr:#x} is not 256-byte aligned")
    n = -(-len(data) // PAYLOAD)
    out = bytearray()
    for i in range(n):
        chunk = data[i * PAYLOAD:(i + 1) * PAYLOAD].ljust(PAYLOAD, b"\xff")
        out += _block(addr + i * PAYLOAD, chunk, i, n, family)
    return bytes(out)


def parse_uf2(buf: bytes) -> list[dict]:
    """Blocks of a UF2 file as dicts (addr, size, n, total, family, flags, payload); checks magics."""
    if len(buf) % BLOCK:
        raise UF2Error(f"a UF2 file is a whole number of 512-byte blocks; this one is {len(buf)} bytes")
    blocks = []
    for off in range(0, len(buf), BLOCK):
        b = buf[off:off + BLOCK]
        m0, m1, flags, addr, size, n, total, fam = struct.unpack_from("<8I", b)
        (mend,) = struct.unpack_from("<I", b, BLOCK - 4)
        if (m0, m1, mend) != (MAGIC0, MAGIC1, MAGIC_END):
            raise UF2Error(f"block {off // BLOCK} of the UF2 file has bad magic numbers")
        if size > 476:
            raise UF2Error(f"block {off // BLOCK} of the UF2 file claims {size} payload bytes")
        blocks.append(dict(addr=addr, size=size, n=n, total=total, family=fam, flags=flags,
                           payload=bytes(b[32:32 + size])))
    return blocks


def combine(firmware_uf2: bytes, data: bytes, addr: int, family: int) -> bytes:
    """One UF2 holding the firmware's blocks and ``data`` at ``addr`` (a single drag-and-drop).

    When every firmware block has the data's family (the RP2040), all blocks are renumbered as
    one sequence: the boot ROM counts the blocks of a download to know when it is complete.
    Otherwise (the RP2350: its firmware UF2 carries its own numbering, and an extra block of
    another family) the firmware's blocks are kept as they are and the data's are numbered on
    their own."""
    fw = parse_uf2(firmware_uf2)
    lo, hi = addr, addr + len(data)
    for b in fw:
        if b["addr"] < hi and b["addr"] + b["size"] > lo:
            raise UF2Error(f"the firmware image reaches {b['addr']:#x}, inside the blob region "
                           f"{lo:#x}..{hi:#x}")
    data_uf2 = bin_to_uf2(data, addr, family)
    if not fw or any(b["family"] != family for b in fw):
        return bytes(firmware_uf2) + data_uf2
    blocks = fw + parse_uf2(data_uf2)
    return b"".join(_block(b["addr"], b["payload"], i, len(blocks), family) for i, b in enumerate(blocks))


def write_uf2(path, data: bytes, addr: int, family: int) -> Path:
    p = Path(path)
    p.write_bytes(bin_to_uf2(data, addr, family))
    return p
