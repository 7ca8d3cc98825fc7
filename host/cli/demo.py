"""``flashlm demo``'s options: the shipped model converted, built and run in one command."""
from __future__ import annotations

from ..defaults import DEFAULT_PROMPT
from .options import VIRTUAL_BOARDS, add_board_wait, add_max_tokens, output_dir


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="convert the shipped model (or --model), build, run, write out/demo/run.*")
    d.add_argument("--board", default="native",
                   help=f"the virtual board to run on: {VIRTUAL_BOARDS} (default %(default)s)")
    d.add_argument("--model", metavar="MODEL",
                   help="a catalogue name (e.g. stories260K, downloaded once: flashlm pull), hf:OWNER/NAME[@REV] "
                        "or a checkpoint (default: the shipped model); converted with the longest context that "
                        "fits the board")
    d.add_argument("--tokenizer", metavar="PATH", help="the tokenizer of a --model checkpoint that has none in it "
                                                        "(llama2.c's tokenizer.bin, or a tokenizer.json)")
    d.add_argument("--prompt", default=DEFAULT_PROMPT)
    add_max_tokens(d, 48)
    d.add_argument("-o", "--output", default="out/demo", metavar="OUTDIR", type=output_dir)
    add_board_wait(d)
    d.set_defaults(func=cmd_demo)


def cmd_demo(args, console) -> int:
    from ..commands.demo import demo    # converter, boards, session (numpy, pyserial): not for --help
    return demo(console, args.board, args.prompt, args.max_tokens, args.output, args.timeout,
                args.xip_model == "on", args.model, args.tokenizer)
