"""``flashlm eval``'s options: loss, perplexity and top-1 agreement of fp32, int8 and int4; with
--fidelity every recipe's distance from fp32 with the device's numerics."""
from __future__ import annotations

from .options import add_group_size, nonneg_int, output_file, positive_int


def add_parser(sub) -> None:
    e = sub.add_parser("eval", help="eval loss, perplexity and top-1 agreement of fp32, int8 and int4 on held-out text")
    e.add_argument("model", metavar="MODEL", help="a 'flashlm train' folder (model.pt, eval.txt) or a checkpoint; "
                                                  "with --fidelity any checkpoint convert takes, or a model name")
    e.add_argument("--targets", type=nonneg_int, default=4096, metavar="N",
                   help="score the first N predictions (default %(default)s; 0: all; the reference runs "
                        "~10-30 ms a token)")
    e.add_argument("--text", metavar="FILE", help="held-out text (default: eval.txt beside the checkpoint)")
    add_group_size(e)
    e.add_argument("--fidelity", action="store_true",
                   help="instead: each recipe against fp32 with the device's numerics (KV format and integer "
                        "attention included), teacher-forced on text fp32 samples itself (top-1 agreement, mean "
                        "KL, extra cross-entropy) and greedy from prompts (tokens equal to fp32's before the first "
                        "difference)")
    e.add_argument("--positions", type=positive_int, default=2000, metavar="N",
                   help="--fidelity: teacher-forced predictions (default %(default)s)")
    e.add_argument("--prompts", type=nonneg_int, default=16, metavar="N",
                   help="--fidelity: greedy prompts (default %(default)s)")
    e.add_argument("--tokens", type=positive_int, default=200, metavar="N",
                   help="--fidelity: greedy tokens a prompt (default %(default)s)")
    e.add_argument("--tokenizer", metavar="FILE", help="--fidelity: the checkpoint's tokenizer (for its BOS id)")
    e.add_argument("--json", metavar="FILE", type=output_file, help="also write the results as JSON")
    e.set_defaults(func=cmd_eval)


def cmd_eval(args, console) -> int:
    if args.fidelity:
        from ..commands.fidelity import run_fidelity    # numpy and the converter: not for --help
        return run_fidelity(console, args.model, args.tokenizer, args.positions, args.prompts, args.tokens, args.json)
    from ..commands.evaluate import run_eval    # the converter's evaluation (numpy, then torch): not for --help
    return run_eval(console, args.model, args.targets or None, args.group_size, args.text, args.json)
