"""``flashlm``: convert a checkpoint, build firmware, run it on a board (or the native virtual
board) and show where each token's time goes.

Every user error prints ``flashlm: error: <one line>`` on stderr and exits 2; Ctrl-C exits 130.
Set ``FLASHLM_DEBUG=1`` to get the traceback instead. Each command's module in host/cli/ declares
its options and imports what runs it (host/commands/, numpy, torch, matplotlib) only once the
command is chosen, so ``flashlm --help`` loads none of it.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import is_user_error, one_line
from ..output.console import make_console
from . import build, compare, convert, demo, eval, faultproxy, flash, plan, pull, run, serve, train
from .options import Parser

COMMANDS = (pull, convert, build, run, flash, plan, compare, serve, faultproxy, demo, eval, train)   # in --help's order


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="flashlm", description="Small transformer LMs on microcontrollers, with per-token timing.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if getattr(args, "train", False):
            pass
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        elif args.command is None:
            parser.error("choose a command: pull, convert, build, flash, run, serve, plan, compare, demo, eval, train")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    debug = bool(os.environ.get("FLASHLM_DEBUG"))
    console = make_console()
    try:
        try:
            if getattr(args, "train", False):
                return train.cmd_train(console, extra)
            return int(args.func(args, console) or 0)
        except SystemExit as e:     # the train parser's own argparse errors / --help
            return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("flashlm: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug or not is_user_error(e):
            raise
        print(f"flashlm: error: {one_line(e)}", file=sys.stderr)
        return 2
