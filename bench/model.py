"""What every bench section shares: the shipped model (models/default) quantized once per format,
the prompt, and a handshaken session on a board's port."""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import numpy as np

from converter import headcalib
from converter.blob import write_blob
from converter.formats import KV_DEFAULT, StateTiers
from converter.ir import ModelConfig, ModelIR
from converter.llama2c import write_llama2c_v2
from converter.load import load_model
from converter.quantize import DEFAULT_GROUP, quantize
from converter.tokenizer import encode
from firmware.build import build_firmware
from host.link.port import Link, open_port
from host.session.session import Session

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "default"
PROMPT = "ROMEO:\nWhat light through yonder window breaks?"
FORMATS = ("q8", "q4")
GROUP = 32


@functools.cache
def default_ir():
    return load_model(MODEL / "model.pt")


def converted(ir, fmt: str, overrides=(), scales: str | None = None):
    """``ir`` quantized to ``fmt`` in convert's default groups (q8 32, q4 16) with ``overrides`` (and
    ``scales``, convert's --scales), and the greedy head's index if the calibration keeps it: what
    ``flashlm convert`` makes (--head-index auto)."""
    qm = quantize(ir, fmt, DEFAULT_GROUP[fmt], list(overrides), scales=scales)
    qm.head_index = headcalib.calibrate(qm)[0]
    return qm


@functools.cache
def default_quant(fmt: str, scales: str | None = None):
    """The default model as ``flashlm convert --format fmt [--scales scales]`` shapes it, rounded to
    nearest (speed does not depend on the rounding): q8 in groups of 32 (its head of 8), q4 in groups
    of 16 with its embedding and head q4 (until stop 30 the speed bench's q4 kept issue 21's shape:
    groups of 32, the embedding and head q8)."""
    return converted(default_ir(), fmt, scales=scales)


# The 15M-parameter llama2.c shape (stories15M: dim 288, 6 layers, 6 heads, vocab 32000, context 256)
SHAPE_15M = ModelConfig(dim=288, n_layers=6, n_heads=6, n_kv_heads=6, vocab_size=32000, hidden_dim=768,
                        max_seq_len=256, tied=True)


def random_ir(cfg: ModelConfig, seed: int = 0) -> ModelIR:
    """``cfg`` with seeded random weights (N(0, 0.02), norms 1)."""
    rng = np.random.default_rng(seed)
    tensors = {n: (np.ones(s, np.float32) if len(s) == 1 else rng.standard_normal(s, np.float32) * 0.02)
               for n, s in cfg.tensor_shapes().items()}
    return ModelIR(cfg, tensors)


@functools.cache
def random_15m_ir() -> ModelIR:
    """SHAPE_15M with random weights: the speed comparisons' big model."""
    return random_ir(SHAPE_15M)


def llama15m_v2(work: Path, group_size: int = 32) -> Path:
    """random_15m_ir written by our own llama2.c v2 (Q8_0) writer in groups of 32 (export.py halves its
    default 64 until it divides dim 288): the checkpoint llama2.c's runq.c reads."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"stories15M_random_q80_g{group_size}.bin"
    if not path.exists():
        write_llama2c_v2(random_15m_ir(), path, group_size)
    return path


def prompt_ids(qm) -> list[int]:
    return encode(qm.tokenizer, PROMPT)


def blob_and_firmware(qm, board: str, work: Path, kv: str = KV_DEFAULT, batch: int = 1):
    """Write the blob (KV cache format ``kv``: convert's default unless a figure says otherwise; passes of
    up to ``batch`` tokens) into ``work`` and build ``board``'s firmware for it: (blob path, BuildResult)."""
    work.mkdir(parents=True, exist_ok=True)
    blob = work / "model.flmb"
    write_blob(qm, blob, state=StateTiers(kv=kv, batch=batch))
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
