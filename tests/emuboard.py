"""Run a QuantModel on the emulated RP2040 (rp2040js): blob, Cortex-M0+ build (cached per model
shape), harness on a pty, Link — the same path `flashlm run --board rp2040-emu` takes."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
import serial

from converter.blob import read_header, write_blob
from converter.formats import StateTiers
from converter.tokenizer_enc import section_info
from firmware.baremetal import rebuilt_with
from firmware.build import build_firmware
from host.link.messages import Hello, Ping
from host.link.port import Link
from host.boards.emulated import rp2040js_missing, start_emulated_board
from nativeboard import recv_until

BOARD = "rp2040-emu"
_builds: dict = {}


def require_emulator() -> None:
    """Skip when this machine lacks the cross compiler or rp2040js (`make emu-deps` installs both)."""
    if shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("arm-none-eabi-gcc is not installed (make emu-deps)")
    why = rp2040js_missing()
    if why:
        pytest.skip(why)


def image_for(blob: Path, build_root: Path, cores: int = 2) -> Path:
    """The board's firmware for blob's shape; cores=1: the same project rebuilt with
    FLM_RP2040_CORES=1 (core 1 stays in the boot ROM, core 0 computes every row)."""
    h = read_header(blob)
    enc = section_info(blob, h)     # its text capacity sizes the receive buffer
    key = (h.config, min(e.group_size for e in h.entries if e.group_size), enc.span if enc else 0)
    if key not in _builds:
        _builds[key] = build_firmware(BOARD, build_root / f"emu{len(_builds)}", blob).binary
    if cores == 2:
        return _builds[key]
    if (key, cores) not in _builds:
        _builds[key, cores] = rebuilt_with(_builds[key], build_root / f"emu{len(_builds)}-one-core",
                                           {"FLM_RP2040_CORES": "1"})
    return _builds[key, cores]


@contextlib.contextmanager
def emu_link(qm, tmp: Path, build_root: Path, blob_bytes: bytes | None = None, kv: str = "f32", batch: int = 1,
             xip_model: bool = True, profile: tuple[str, ...] = (), watch: tuple[str, ...] = (), cores: int = 2):
    """Yields (link, boot_frames, board) for an emulated RP2040 running qm (or raw blob_bytes), with
    the harness's XIP model on or off, its call profile of the functions ``profile`` and its count of
    the flash reads in the tensors ``watch`` (each step's ``watched``), on both cores or (cores=1)
    core 0 alone; the image reserves the chip's whole SRAM budget, whatever the blob's batch."""
    require_emulator()
    blob = tmp / "model.flmb"
    write_blob(qm, blob, state=StateTiers(kv=kv, batch=batch))
    ranges = tuple((e.offset, e.offset + e.length) for e in read_header(blob).entries if e.name in watch)
    image = image_for(blob, build_root, cores)
    if blob_bytes is not None:
        blob.write_bytes(blob_bytes)
    with start_emulated_board(image, blob, BOARD, xip_model=xip_model, profile=profile, watch=ranges) as board:
        port = serial.Serial(board.port, 115200, timeout=0.05)
        try:
            link = Link(port)
            link.send(Ping())
            boot = recv_until(link, lambda m: isinstance(m, Hello))
            yield link, boot, board
        finally:
            port.close()
