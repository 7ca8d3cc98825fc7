"""``flashlm eval``'s options: loss, perplexity and top-1 agreement of fp32, int8 and int4."""
from __future__ import annotations

from .options import add_group_size, nonneg_int, output_file


def add_parser(sub) -> None:
    e = sub.add_parser("eval", help="eval loss, perplexity and top-1 agreement of fp32, int8 and int4 on held-out text")
    e.add_argument("model", metavar="MODEL", help="a 'flashlm train' folder (model.pt, eval.txt) or a checkpoint")
    e.add_argument("--targets", type=nonneg_int, default=4096, metavar="N",
                   help="score the first N predictions (default %(default)s; 0: all; the reference runs "
                        "~10-30 ms a token)")
    e.add_argument("--text", metavar="FILE", help="held-out text (default: eval.txt beside the checkpoint)")
    add_group_size(e)
    e.add_argument("--json", metavar="FILE", type=output_file, help="also write the results as JSON")
    e.set_defaults(func=cmd_eval)


def cmd_eval(args, console) -> int:
    from ..commands.evaluate import run_eval    # the converter's evaluation (numpy, then torch): not for --help
    return run_eval(console, args.model, args.targets or None, args.group_size, args.text, args.json)
