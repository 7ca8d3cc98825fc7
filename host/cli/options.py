"""argparse pieces the commands share: the parser class whose errors are one line, the value types,
and the option groups declared once: the quantization recipe, the prompt, sampling and the link of
one generation on a board, the emulated RP2040's XIP model."""
from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

from ..commands.recipe import DEFAULT_GROUP, Recipe


# placeholders an option's help may hold, filled with the board profiles' names when help is shown
ALL_BOARDS, VIRTUAL_BOARDS = "{all boards}", "{virtual boards}"


class _Formatter(argparse.HelpFormatter):
    def _split_lines(self, text, width):    # a board's name (pico-plus-2) is never broken at its hyphens
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse's own errors, in the same one-line shape as ours
        sys.stderr.write(f"flashlm: error: {self.prog.removeprefix('flashlm').strip() + ': ' if self.prog != 'flashlm' else ''}"
                         f"{message} (see '{self.prog} --help')\n")
        raise SystemExit(2)

    def format_help(self) -> str:
        marked = [a for a in self._actions
                  if isinstance(a.help, str) and (ALL_BOARDS in a.help or VIRTUAL_BOARDS in a.help)]
        if marked:
            # the profiles (and numpy under the board module) are read only when help is shown
            from converter.boards import board_names

            from ..boards.virtual import emulated_boards
            names = {ALL_BOARDS: ", ".join(board_names()), VIRTUAL_BOARDS: ", ".join(["native", *emulated_boards()])}
            for a in marked:
                for mark, text in names.items():
                    a.help = a.help.replace(mark, text)
        return super().format_help()


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


def add_recipe(p: argparse.ArgumentParser, title: str | None = None) -> None:
    """--format, --group-size, --quant, --scales and --tokenizer: how a checkpoint is quantized
    (``title``: under a heading of that name)."""
    g = p.add_argument_group(title) if title else p
    g.add_argument("--format", choices=("q8", "q4"), default="q8",
                   help="weight format of the tensors no --quant names (default %(default)s)")
    g.add_argument("--group-size", type=positive_int, default=None, metavar="N",
                   help="quantization group size (default 32 for q8, 16 for q4)")
    g.add_argument("--quant", action="append", default=[], metavar="PATTERN=FMT[:G]",
                   help="per-tensor override, e.g. 'layers.*.ffn=q4:32', 'head=q4' (repeatable)")
    g.add_argument("--scales", choices=("row", "f32", "f16"), default=None,
                   help="row (default): a power-of-two scale per row and an integer multiplier per group "
                        "(a matvec row in integers, one float multiply); f32 or fp16: a float scale per group "
                        "(the only form of llama2.c v2 Q8_0, which is imported as it is unless --scales is given)")
    g.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or llama2.c tokenizer.bin")


def add_group_size(p) -> None:
    p.add_argument("--group-size", type=positive_int, default=32, metavar="N",
                   help="quantization group size (default %(default)s)")


def recipe_of(args) -> Recipe:
    """The Recipe the --format/--group-size/--quant/--scales options name."""
    return Recipe(args.format, args.group_size or DEFAULT_GROUP[args.format], tuple(args.quant), args.scales)


def add_generation_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """What one generation on a board takes: prompt, sampling, and the serial link's settings."""
    pr = p.add_mutually_exclusive_group()
    pr.add_argument("--prompt", metavar="TEXT")
    pr.add_argument("--prompt-ids", metavar="1,2,3")
    add_max_tokens(p, max_tokens)
    p.add_argument("--temperature", type=nonneg_float, default=0.0, metavar="T")
    p.add_argument("--top-p", type=top_p_value, default=0.0, metavar="P")
    p.add_argument("--seed", type=nonneg_int, default=0, metavar="S")
    p.add_argument("--baud", type=positive_int, default=115200, metavar="B")
    add_board_wait(p)


def add_max_tokens(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument("--max-tokens", type=positive_int, default=default, metavar="N")


def add_board_wait(p: argparse.ArgumentParser) -> None:
    """--timeout and --xip-model: how a board is waited for, and the emulated board's XIP model."""
    p.add_argument("--timeout", type=seconds, default=10.0, metavar="S",
                   help="seconds to wait for the board and for each frame (default 10)")
    p.add_argument("--xip-model", choices=("on", "off"), default="on",
                   help="rp2040-emu: time flash reads through the XIP cache + QSPI model (on, the default), "
                        "or charge them like SRAM reads (off, rp2040js as is)")
