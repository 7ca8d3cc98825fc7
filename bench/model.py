"""What every bench section shares: the shipped model (models/default) quantized once per format,
the prompt, and a handshaken session on a board's port."""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path

from converter.blob import write_blob
from converter.load import load_model
from converter.quantize import quantize
from converter.tokenizer import encode
from firmware.build import build_firmware
from host.protocol import Link
from host.session import Session, open_port

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "default"
PROMPT = "ROMEO:\nWhat light through yonder window breaks?"
FORMATS = ("q8", "q4")
GROUP = 32


@functools.cache
def default_ir():
    return load_model(MODEL / "model.pt")


@functools.cache
def default_quant(fmt: str):
    """The default model quantized to ``fmt`` (q8 / q4), group 32: what ``flashlm convert`` makes."""
    return quantize(default_ir(), fmt, GROUP)


def prompt_ids(qm) -> list[int]:
    return encode(qm.tokenizer, PROMPT)


def blob_and_firmware(qm, board: str, work: Path):
    """Write the blob into ``work`` and build ``board``'s firmware for it: (blob path, BuildResult)."""
    work.mkdir(parents=True, exist_ok=True)
    blob = work / "model.flmb"
    write_blob(qm, blob)
    return blob, build_firmware(board, work / f"fw-{board}", blob)


@contextlib.contextmanager
def session(port: str, frame_timeout: float = 60, handshake_timeout: float = 30):
    """A Session on ``port``, handshaken; the port is closed on leaving."""
    ser = open_port(port)
    try:
        s = Session(Link(ser), frame_timeout=frame_timeout)
        s.handshake(timeout=handshake_timeout)
        yield s
    finally:
        ser.close()
