"""The emulated RP2040: the firmware image in rp2040js (host/emu/harness.mjs), UART0 bridged to a
pty, with the harness's per-step read counts beside it."""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import tty
from pathlib import Path

from converter.boards import load_board
from converter.formats import padding_per_step

from ..errors import BoardError
from ..link.messages import TIERS
from .native import VirtualBoard, drain, exit_how


EMU_DIR = Path(__file__).resolve().parent.parent / "emu"
EMU_HARNESS = EMU_DIR / "harness.mjs"


class EmulatedBoard(VirtualBoard):
    """A running rp2040js harness and the pty its UART0 is bridged to.

    The harness writes one JSON line per forward step to ``counts_path`` (bytes the core read per
    tier, cycles, emulated µs, host ms, with the XIP model on the step's XIP cache hits, misses and
    stall cycles, with a profile its functions' cycles and calls); ``read_counts()`` returns the
    lines written since the previous call."""

    def __init__(self, proc, port, image: Path, blob_path: Path, stderr_tail, slave_fd: int,
                 counts_path: Path, own_counts: bool, board: str, xip_model: bool):
        super().__init__(proc, port, image, blob_path, stderr_tail, collections.deque(maxlen=1))
        self.name = board
        self.xip_model = xip_model
        self.counts_path = counts_path
        self._own_counts = own_counts
        self._slave = slave_fd
        self._counts_off = 0

    def read_counts(self) -> list[dict]:
        try:
            with open(self.counts_path, "rb") as f:
                f.seek(self._counts_off)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1        # a line being written is left for the next call
        self._counts_off += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def describe_exit(self) -> str | None:
        rc = self.proc.poll()
        if rc is None:
            return None
        tail = [ln for ln in self.stderr_tail(50) if not ln.startswith("rp2040-emu: ready")]
        ours = [ln for ln in tail if ln.startswith("rp2040-emu:") or "Error" in ln]
        why = (ours or tail)[-1] if tail else ""
        return f"emulated board {self.name} (rp2040js) {exit_how(rc)}" + (f": {why}" if why else "")

    def stop(self, timeout: float = 3.0) -> int | None:
        rc = super().stop(timeout)
        if self._own_counts:
            try:
                os.unlink(self.counts_path)
            except OSError:
                pass
        return rc

    def __repr__(self) -> str:
        return f"EmulatedBoard(port={self.port!r}, pid={self.proc.pid}, alive={self.alive})"


def unloaded_padding(header, tokens, greedy: bool, drafted: bool,
                     stream_stride: int = 0) -> dict[int, list[list[int]]] | None:
    """Per forward pass of ``tokens`` (the TOKEN frames, by the pass's first step), the row padding
    the engine counts (whole row strides) and no kernel loads, per tier: what the harness's counts
    of the bytes the core loaded lack (formats.padding_per_step). A pass's head ran for one token
    when one of its steps shows head rows (else for all of them, or none); a greedy one (``greedy``:
    no sampling, no whole-head flags) reads the head index's centre rows when it runs the tile scan,
    and a step computing every head row may have scanned every tile or not: it gets both candidates.
    None when the run ``drafted`` with a draft model whose rows are padded: which of its rows each
    pass read is not in the frames. stream_stride: the board's [flash].stream_chunk_bytes (the
    products whose rows it streams whole, padding and all)."""
    draft = header.draft
    if drafted and draft is not None and any(padding_per_step(draft, draft.config.tied, draft.config.n_out,
                                                                 stream_stride=stream_stride).values()):
        return None
    index = any(e.name == "head.centroids" for e in header.entries)
    passes: dict[int, list] = {}
    for t in tokens:
        passes.setdefault(t.chunk, []).append(t)
    out = {}
    for first, steps in passes.items():
        heads = [t.head_rows for t in steps if t.head_rows]
        rows = heads[0] if len(heads) == 1 else 0
        scans = [False]
        if index and greedy and rows and steps[0].kind != "verify":
            scans = [True] if rows < header.config.n_out else [True, False]
        out[first] = [[padding_per_step(header, header.config.tied, rows, steps[0].chunk_len, scan,
                                        steps[0].pass_experts, stream_stride).get(tier, 0)
                       for tier in TIERS] for scan in scans]
    return out


def rp2040js_missing() -> str | None:
    """Why the emulated board cannot start here (one line), or None when it can."""
    if shutil.which("node") is None:
        return ("the emulated RP2040 needs Node.js: apt-get install nodejs npm, then 'make emu-deps' "
                "(installs rp2040js into host/emu)")
    if not (EMU_DIR / "node_modules" / "rp2040js" / "package.json").is_file():
        return "rp2040js is not installed: run 'make emu-deps' (npm ci in host/emu)"
    return None


def _entries(image: Path, names, prof: dict) -> dict[str, int]:
    """Name -> entry address of the functions ``names`` in the ELF beside ``image``."""
    from firmware.baremetal import symbols    # it loads jinja2 and the builders: only a profiled start needs it
    elf = image.with_suffix(".elf")
    found = symbols(elf, prof) if elf.is_file() else {}
    missing = [n for n in names if n not in found]
    if missing:
        raise BoardError(f"cannot profile {', '.join(missing)}: not in {elf}")
    return {n: found[n] for n in names}


def start_emulated_board(image, blob_path, board: str = "rp2040-emu", timeout: float = 10,
                         counts_path=None, xip_model: bool = True, profile: tuple[str, ...] = (),
                         watch: tuple[tuple[int, int], ...] = ()) -> EmulatedBoard:
    """Start the harness on ``image`` (firmware.bin) with the blob at the board's flash offset;
    UART0 is the pty the returned board's ``port`` names. ``xip_model``: flash reads go through the
    harness's XIP cache and QSPI timing model (host/emu/xip.mjs), whose stalls the emulated clock
    counts; False runs rp2040js as is (a flash read costs what an SRAM read costs). ``profile``:
    names of the image's functions (found in the firmware.elf beside it); each step's counts then
    hold ``calls``: name -> [cycles inside its calls, calls] (the harness's call profile). ``watch``:
    byte ranges [lo, hi) of the blob (some of its tensors); each step's counts then hold ``watched``,
    the bytes of the core's flash reads that fell in them. Problems are one-line BoardErrors."""
    image, blob_path = Path(image).resolve(), Path(blob_path).resolve()   # the harness runs in EMU_DIR
    why = rp2040js_missing()
    if why:
        raise BoardError(why)
    if not image.is_file():
        raise BoardError(f"firmware image {image} does not exist (run 'flashlm build --board {board}')")
    if not blob_path.is_file():
        raise BoardError(f"model image {blob_path} does not exist")
    prof = load_board(board)
    off = int(prof["flash"]["blob_offset"])
    flash = int(prof["tiers"]["flash"]["capacity"])
    if blob_path.stat().st_size > flash - off:
        raise BoardError(f"model image {blob_path} is {blob_path.stat().st_size:,} bytes; {board}'s flash "
                         f"holds {flash - off:,} after the firmware")
    entries = _entries(image, profile, prof) if profile else {}
    own = counts_path is None
    if own:
        fd, name = tempfile.mkstemp(prefix="flashlm-emu-", suffix=".jsonl")
        os.close(fd)
        counts_path = Path(name)
    else:
        counts_path = Path(counts_path).resolve()
        counts_path.write_bytes(b"")
    master, slave = os.openpty()
    tty.setraw(slave)          # binary frames: no echo, no newline translation
    try:
        # the harness runs in host/emu (where rp2040js is installed): every path it gets is absolute
        proc = subprocess.Popen(["node", str(EMU_HARNESS), "--firmware", str(image.resolve()),
                                 "--blob", str(blob_path.resolve()),
                                 "--blob-offset", str(off), "--flash-size", str(flash),
                                 "--counts", str(counts_path), "--xip-model", "on" if xip_model else "off",
                                 *(["--profile", ",".join(f"{n}={a:#x}" for n, a in entries.items())] if entries else []),
                                 *(["--watch", ",".join(f"{off + lo}-{off + hi}" for lo, hi in watch)] if watch else [])],
                                stdin=master, stdout=master, stderr=subprocess.PIPE, cwd=str(EMU_DIR),
                                start_new_session=True, close_fds=True)
    except OSError as e:
        os.close(master)
        os.close(slave)
        raise BoardError(f"cannot start the emulated board: {e.strerror or e}") from None
    os.close(master)           # the harness holds it; we hold the slave so the pty never hangs up
    stderr_tail: collections.deque = collections.deque(maxlen=50)
    threading.Thread(target=drain, args=(proc.stderr, stderr_tail), daemon=True,
                     name="emulated-board-stderr").start()
    vb = EmulatedBoard(proc, os.ttyname(slave), image, blob_path, stderr_tail, slave, counts_path, own, board,
                       xip_model)
    deadline = time.monotonic() + timeout
    try:
        while not any(ln.startswith("rp2040-emu: ready") for ln in list(stderr_tail)):
            if proc.poll() is not None:
                time.sleep(0.05)
                raise BoardError(vb.describe_exit())
            if time.monotonic() > deadline:
                raise BoardError(f"emulated board {board} did not start within {timeout:g} s")
            time.sleep(0.02)
    except BaseException:       # Ctrl-C too: no harness or counts file is left behind
        vb.stop()
        raise
    return vb
