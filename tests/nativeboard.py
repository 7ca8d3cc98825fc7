"""Run a QuantModel on the native virtual board: blob, build (cached per model shape), pty, Link;
and a board (native or emulated) whose firmware is built wrong on purpose."""
from __future__ import annotations

import contextlib
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np
import serial

from converter.blob import build_blob, write_blob
from converter.formats import StateTiers
from converter.reference import NO_TOKEN
from firmware.build import build_firmware
from host.link.messages import Done, Error, Generate, Hello, Logits, Ping, Token
from host.link.port import Link
from host.boards.native import start_native_board
from host.boards.virtual import start_virtual_board

_builds: dict = {}


def binary_for(blob: Path, build_root: Path) -> Path:
    from converter.blob import read_header
    from converter.tokenizer_enc import section_info
    h = read_header(blob)
    enc = section_info(blob, h)     # its text capacity sizes the receive buffer
    d = h.draft                     # the arena grows with the batch and holds a draft model's state
    key = (h.config, min(e.group_size for e in h.entries if e.group_size), enc.span if enc else 0,
           h.state_tiers.batch, (d.config, d.state_tiers) if d else None)
    if key not in _builds:
        _builds[key] = build_firmware("native", build_root / f"fw{len(_builds)}", blob).binary
    return _builds[key]


@contextlib.contextmanager
def native_link(qm, tmp: Path, build_root: Path, blob_bytes: bytes | None = None, kv: str = "f32", batch: int = 1):
    """Yields (link, hello_frames) for a board running qm (or raw blob_bytes sized like qm)."""
    blob = tmp / "model.flmb"
    write_blob(qm, blob, state=StateTiers(kv=kv, batch=batch))
    binary = binary_for(blob, build_root)
    if blob_bytes is not None:
        blob.write_bytes(blob_bytes)
    with start_native_board(binary, blob) as board:
        port = serial.Serial(board.port, 115200, timeout=0.05)
        try:
            link = Link(port)
            link.send(Ping())
            boot = recv_until(link, lambda m: isinstance(m, Hello))
            yield link, boot
        finally:
            port.close()


@contextlib.contextmanager
def rebuilt_board(qm, tmp_path, board="native", define=None, make_args=()):
    """A board running qm with a firmware build changed on purpose (a #define appended to its
    config header, or make variables); yields (link, boot HELLO, blob bytes)."""
    blob = tmp_path / "model.flmb"
    blob.write_bytes(build_blob(qm))
    fw = build_firmware(board, tmp_path / "fw", blob)
    if define:
        cfg = fw.project_dir / "flm_config.h"
        cfg.write_text(cfg.read_text() + f"#define {define}\n")
    subprocess.run(["make", "-s", "-B", "-C", str(fw.project_dir), *make_args], check=True, capture_output=True)
    with start_virtual_board(board, fw.binary, blob, timeout=10) as b:
        port = serial.Serial(b.port, 115200, timeout=0.05)
        try:
            link = Link(port)
            link.send(Ping())
            yield link, recv_until(link, lambda m: isinstance(m, Hello), timeout=120)[-1], blob.read_bytes()
        finally:
            port.close()


def recv_until(link, done, timeout: float = 30.0) -> list:
    # the timeout counts from the last frame, not from the start: a long emulated run on a loaded
    # machine keeps talking and is not a hang
    out, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        f = link.recv(0.5)
        if f is not None:
            out.append(f.msg)
            t0 = time.monotonic()
            if done(f.msg):
                return out
    raise AssertionError(f"the board sent nothing for {timeout}s; got {out[-3:]}")


def run(link, prompt, n, temperature=0.0, top_p=0.0, seed=0, logits=True, slide=False, all_logits=False, batch=0,
        speculate="none", draft_k=0):
    """One GENERATE; logits=True sets the LOGITS flag (every step's whole head, sent as LOGITS)."""
    link.send(Generate(list(prompt), n, temperature, top_p, seed, send_logits=logits, slide=slide,
                       all_logits=all_logits, batch=batch, speculate=speculate, draft_k=draft_k))
    msgs = recv_until(link, lambda m: isinstance(m, (Done, Error)))
    return ([m for m in msgs if isinstance(m, Token)], [m for m in msgs if isinstance(m, Logits)],
            msgs[-1])


def drain(link, quiet: float = 0.3) -> list:
    """Collect frames until the link has been quiet for ``quiet`` seconds."""
    out = []
    while (f := link.recv(quiet)) is not None:
        out.append(f.msg)
    return out


def assert_steps_match(toks, ref) -> None:
    """TOKEN frames of one generation equal reference.generate(...) with the same flags: ids, cache
    positions, head rows computed, logits CRC-32 (0 where the step computed no whole head) and the
    forward pass each step came from."""
    assert len(toks) == len(ref)
    assert [t.step for t in toks] == list(range(len(ref)))
    assert [t.in_id for t in toks] == [r["in_id"] for r in ref]
    assert [NO_TOKEN if t.out_id is None else t.out_id for t in toks] == [r["out_id"] for r in ref]
    assert [t.pos for t in toks] == [r["pos"] for r in ref]
    assert [t.head_rows for t in toks] == [r["head_rows"] for r in ref]
    assert [t.logits_crc for t in toks] == [r["logits_crc"] for r in ref]
    assert ([(t.chunk, t.chunk_len, t.chunk_used, t.kind) for t in toks]
            == [(r["chunk"], r["chunk_len"], r["chunk_used"], r["kind"]) for r in ref])
    assert [t.experts for t in toks] == [tuple(map(tuple, r.get("experts", ()))) for r in ref]
    assert [t.pass_experts for t in toks] == [tuple(r.get("pass_experts", ())) for r in ref]


def assert_matches_reference(toks, logits, ref) -> None:
    """TOKEN and LOGITS frames of one generation equal reference.generate(..., flags=FLAG_LOGITS):
    the same ids, and every step's logits bit for bit (and their CRC-32)."""
    assert_steps_match(toks, ref)
    assert len(logits) == len(ref)
    for t, lg, r in zip(toks, logits, ref):
        assert lg.step == t.step
        assert np.array_equal(lg.values.view(np.uint32), r["logits"].view(np.uint32)), f"step {t.step}"
        assert t.logits_crc == zlib.crc32(r["logits"].tobytes())


def expected_bytes_read(qm, pos: int, head_rows: int | None = None, greedy: bool = False) -> tuple[int, int, int]:
    """(flash, psram, sram) one step at pos reads with everything in flash and the KV cache in SRAM:
    each matrix once, one embedding row, one PLE table row, every norm call (ple.norm once per
    layer), this position's RoPE rows, and per head the K and V rows 0..pos; then the final norm and
    the head: all out_vocab rows (head_rows None; a tied head is the embedding's first out_vocab
    rows), none (head_rows 0: a prompt step that skips it), or a greedy step's head_rows rows. With a
    head index (converter/headprune.py) the whole head also reads every row's map entry (the scatter
    into token order), a greedy step reads every centre row and tile record and its rows' map
    entries, and a tied head's embedding row costs one map entry; without one a greedy step reads
    the whole head."""
    from converter.blob import build_blob, parse_header
    c = qm.config
    h = parse_header(build_blob(qm))
    by = {e.name: e for e in h.entries}
    idx = qm.head_index
    mb = idx.map_bytes if idx is not None else 0
    emb = by["tok_embeddings"]
    head = by["output"] if not c.tied else emb
    gathered = ("tok_embeddings", "ple.table", "output", "head.centroids")
    mats = sum(e.length for e in h.entries if e.fmt in ("q8", "q4") and e.name not in gathered)
    norms = 2 * c.n_layers * c.dim * 4 + c.n_layers * (c.ple_dim + c.dim) * 4 * bool(c.ple_dim)
    rows = c.n_out if head_rows is None else head_rows
    if rows == 0:
        out = 0
    elif greedy and idx is not None:       # the tile scan
        out = by["head.centroids"].length + 8 * idx.n_tiles + rows * (head.row_stride + mb)
    else:                                  # the whole head (a greedy step's without an index)
        assert rows == c.n_out
        out = rows * (head.row_stride + mb)
    out += c.dim * 4 if rows else 0
    embed = emb.row_stride + (mb if c.tied else 0)
    flash = (mats + embed + (by["ple.table"].row_stride if c.ple_dim else 0) + norms + c.head_dim * 4 + out)
    return flash, 0, c.n_layers * c.n_heads * 2 * (pos + 1) * c.head_dim * 4


def token_bytes_read(qm, t) -> tuple[int, int, int]:
    """expected_bytes_read for a TOKEN frame: its head mode from head_rows and the CRC (a greedy
    step reports no CRC; a whole head computed for its logits always one)."""
    return expected_bytes_read(qm, t.pos, t.head_rows, greedy=t.head_rows > 0 and t.logits_crc == 0)
