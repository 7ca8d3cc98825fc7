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


def image_for(blob: Path, build_root: Path) -> Path:
    h = read_header(blob)
    enc = section_info(blob, h)     # its text capacity sizes the receive buffer
    key = (h.config, min(e.group_size for e in h.entries if e.group_size), enc.span if enc else 0)
    if key not in _builds:
        _builds[key] = build_firmware(BOARD, build_root / f"emu{len(_builds)}", blob).binary
    return _builds[key]


@contextlib.contextmanager
def emu_link(qm, tmp: Path, build_root: Path, blob_bytes: bytes | None = None, kv: str = "f32", batch: int = 1,
             xip_model: bool = True, profile: tuple[str, ...] = (), watch: tuple[str, ...] = ()):
    """Yields (link, boot_frames, board) for an emulated RP2040 running qm (or raw blob_bytes), with
    the harness's XIP model on or off, its call profile of the functions ``profile`` and its count of
    the flash reads in the tensors ``watch`` (each step's ``watched``); the image reserves the chip's
    whole SRAM budget, whatever the blob's batch."""
    require_emulator()
    blob = tmp / "model.flmb"
    write_blob(qm, blob, state=StateTiers(kv=kv, batch=batch))
    ranges = tuple((e.offset, e.offset + e.length) for e in read_header(blob).entries if e.name in watch)
    image = image_for(blob, build_root)
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
