"""argparse pieces every command shares: the parser class whose errors are one line, the value
types, and the options one generation on a board takes."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors, in the same one-line shape as ours
        sys.stderr.write(f"flashlm: error: {self.prog.removeprefix('flashlm').strip() + ': ' if self.prog != 'flashlm' else ''}"
                         f"{message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s} must be at least 1")
    return v


def nonneg_int(s: str) -> int:
    try:
        v = int(s, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= v < 1 << 64:
        raise argparse.ArgumentTypeError(f"{s} must be in [0, 2^64)")
    return v


def nonneg_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{s} must be a finite number >= 0")
    return v


def top_p_value(s: str) -> float:
    v = nonneg_float(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{s} must be in [0, 1] (0 or 1 turns top-p off)")
    return v


def seconds(s: str) -> float:
    v = nonneg_float(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{s} must be more than 0 seconds")
    return v


def _check_writable(s: str, folder: Path) -> None:
    """Refuse the output s unless the existing directory ``folder`` takes new files. Tried, not
    guessed from permission bits: root passes those, and /proc or a read-only mount still refuse.
    The reason is what creating s would meet; it is said of s, since "folder /proc: No such file or
    directory" (the kernel's answer to a new file in /proc) read as if /proc were missing."""
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {s}: {folder} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {s}: {e.strerror or e}; {folder} takes no new files") from None


def output_file(s: str) -> Path:
    """A file flashlm will write (--json, --csv, --png): its folder must exist and take files, so a
    mistake is caught before any work, and no folder is created that the user did not ask for."""
    p = Path(s)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{s} is a directory; give a file name")
    if not parent.exists():
        raise argparse.ArgumentTypeError(f"cannot write {s}: folder {parent} does not exist")
    _check_writable(s, parent)
    return p


def output_dir(s: str) -> Path:
    """A folder flashlm will create or fill (-o): a file there, or an ancestor that takes no new
    folders, is refused before any work."""
    p = Path(s)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{s} is a file; give a folder")
    base = p
    while not base.exists() and base != base.parent:
        base = base.parent
    _check_writable(s, base)
    return p


def add_generation_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """What one generation on a board takes: prompt, sampling, and the serial link's settings."""
    pr = p.add_mutually_exclusive_group()
    pr.add_argument("--prompt", metavar="TEXT")
    pr.add_argument("--prompt-ids", metavar="1,2,3")
    p.add_argument("--max-tokens", type=positive_int, default=max_tokens, metavar="N")
    p.add_argument("--temperature", type=nonneg_float, default=0.0, metavar="T")
    p.add_argument("--top-p", type=top_p_value, default=0.0, metavar="P")
    p.add_argument("--seed", type=nonneg_int, default=0, metavar="S")
    p.add_argument("--baud", type=positive_int, default=115200, metavar="B")
    p.add_argument("--timeout", type=seconds, default=10.0, metavar="S",
                   help="seconds to wait for the board and for each frame (default 10)")
    add_xip_arg(p)


def add_xip_arg(p: argparse.ArgumentParser) -> None:
    """--xip-model for the commands that start an emulated board."""
    p.add_argument("--xip-model", choices=("on", "off"), default="on",
                   help="rp2040-emu: time flash reads through the XIP cache + QSPI model (on, the default), "
                        "or charge them like SRAM reads (off, rp2040js as is)")
