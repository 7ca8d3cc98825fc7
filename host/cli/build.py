"""``flashlm build``'s options: firmware for a board, sized for a model."""
from __future__ import annotations

from ..errors import UserError
from .options import ALL_BOARDS, output_dir


def add_parser(sub) -> None:
    b = sub.add_parser("build", help="render and build the firmware for a board")
    b.add_argument("--board", default="native", help=f"the board the firmware is for: {ALL_BOARDS} "
                                                        f"(default %(default)s)")
    b.add_argument("--model", metavar="OUTDIR", help="model directory the firmware is sized for")
    b.add_argument("-o", "--output", metavar="BUILDDIR", type=output_dir,
                   help="where to build (default: OUTDIR/build/BOARD)")
    b.set_defaults(func=cmd_build)


def cmd_build(args, console) -> int:
    if not args.model:
        raise UserError("building firmware needs the model it is sized for: pass --model OUTDIR")
    from ..commands.build import build_firmware    # the builders (numpy, jinja2): not for --help
    return build_firmware(console, args.model, args.board, args.output)
