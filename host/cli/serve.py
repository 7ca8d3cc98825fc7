"""``flashlm serve``'s options: start a virtual board and print its port."""
from __future__ import annotations

from .options import VIRTUAL_BOARDS, add_board_wait, output_file


def add_parser(sub) -> None:
    sv = sub.add_parser("serve", help="start a virtual board (native, rp2040-emu) and print its port")
    sv.add_argument("--board", default="native",
                    help=f"the virtual board: {VIRTUAL_BOARDS} (default %(default)s; rp2040-emu needs 'make emu-deps')")
    sv.add_argument("--model", metavar="OUTDIR", required=True)
    sv.add_argument("--counts", metavar="FILE", type=output_file, help="rp2040-emu: write the harness's per-step read counts here")
    add_board_wait(sv)
    sv.set_defaults(func=cmd_serve)


def cmd_serve(args, console) -> int:
    from ..commands.serve import serve    # the boards and the converter (numpy): not for --help
    return serve(console, args.model, args.board, args.timeout, args.counts, args.xip_model == "on")
