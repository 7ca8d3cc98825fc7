"""``flashlm compare``'s options: layouts side by side, predicted, and with ``--run`` measured on a
board."""
from __future__ import annotations

from .options import add_generation_args, recipe_of
from .plan import add_model_options, query_of


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="layouts side by side: predicted, and with --run measured on a board")
    add_model_options(c)
    c.add_argument("--board", action="append", metavar="B", help="board profile (repeatable; default native)")
    c.add_argument("--layout", action="append", metavar="L",
                   help="auto | flash | PATTERN=TIER[,...] (repeatable; default: flash and auto)")
    c.add_argument("--run", action="store_true", help="also measure each layout on the board (LAYOUT, no reflash)")
    c.add_argument("--port", metavar="PATH", help="serial port of a flashed board (default: start the native board)")
    add_generation_args(c, max_tokens=16)
    c.set_defaults(func=cmd_compare)


def cmd_compare(args, console) -> int:
    # the planner and the session (numpy, pyserial): not for --help
    from ..commands.compare import Measure, compare
    from ..commands.run import Target
    measure = (Measure(Target(port=args.port, baud=args.baud, xip_model=args.xip_model == "on"), args.prompt,
                       args.prompt_ids, args.max_tokens, args.temperature, args.top_p, args.seed, args.timeout)
               if args.run else None)
    compare(console, args.model, tuple(args.board or ["native"]), tuple(args.layout or ["flash", "auto"]),
            recipe_of(args), args.tokenizer, query_of(args), measure, args.png, args.json)
    return 0
