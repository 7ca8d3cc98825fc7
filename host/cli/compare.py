"""``flashlm compare``'s options: layouts side by side, predicted, and with ``--run`` measured on a
board."""
from __future__ import annotations

from .options import ALL_BOARDS, add_generation_args, recipe_of
from .plan import add_model_options


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="layouts side by side: predicted, and with --run measured on a board")
    add_model_options(c)
    c.add_argument("--board", action="append", metavar="B",
                   help=f"board profile (repeatable; default native): {ALL_BOARDS}")
    c.add_argument("--layout", action="append", metavar="L",
                   help="auto | flash | PATTERN=TIER[,...] (repeatable; default: flash and auto)")
    c.add_argument("--run", action="store_true", help="also measure each layout on the board (LAYOUT, no reflash)")
    c.add_argument("--port", metavar="PATH", help="serial port of a flashed board (default: start the native board)")
    add_generation_args(c, max_tokens=16)
    c.set_defaults(func=cmd_compare)


def cmd_compare(args, console) -> int:
    from ..commands.compare import run_compare    # the planner and the session (numpy, pyserial): not for --help
    return run_compare(console, args, recipe_of(args))
