"""``flashlm run``'s options, and the one place they become a request (``Generate``), a target,
the files to write and a recovery policy."""
from __future__ import annotations

import argparse

from ..defaults import KV_FORMATS
from ..errors import UserError
from .options import VIRTUAL_BOARDS, add_generation_args, output_file


def _tokens(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {s!r}") from None
    if not 1 <= v <= 255:
        raise argparse.ArgumentTypeError(f"must be 1..255 tokens, got {v}")
    return v


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="generate on a board and show per-token timing")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--board", help=f"start a virtual board: {VIRTUAL_BOARDS}")
    where.add_argument("--port", metavar="PATH", help="serial port of a flashed board")
    r.add_argument("--model", metavar="OUTDIR", required=True)
    add_generation_args(r, max_tokens=32)
    r.add_argument("--json", metavar="FILE", type=output_file)
    r.add_argument("--csv", metavar="FILE", type=output_file)
    r.add_argument("--png", metavar="FILE", type=output_file)
    r.add_argument("--encode-on", choices=("host", "device"), default="host",
                   help="who turns --prompt into token ids: the host (default) or the board (its image's "
                        "device tokenizer; the same ids)")
    r.add_argument("--retries", type=int, default=3, metavar="N",
                   help="times to reconnect or regenerate after a lost link, a board reset or lost steps (default 3)")
    r.add_argument("--slide", action="store_true",
                   help="when the context fills, keep position 0, drop the older half and go on (no context_full)")
    r.add_argument("--all-logits", action="store_true",
                   help="verification mode: every step computes the whole output layer (no prefill skip, no pruning)")
    r.add_argument("--kv", choices=KV_FORMATS,
                   help="switch the board's KV cache format first (a LAYOUT; default: the blob's)")
    # the forward-pass options (docs/formats.md section 2.4), checked against the board's HELLO
    r.add_argument("--batch", type=_tokens, metavar="T",
                   help="tokens per prefill pass, at most the board's batch (HELLO; flashlm convert/plan --batch); "
                        "default: the board's")
    r.add_argument("--speculate", choices=("lookup", "draft"),
                   help="speculative decoding, greedy-exact: drafts from prompt lookup (n-gram matches in the "
                        "context) or from the image's draft model (flashlm convert --draft), verified several at a "
                        "time by one forward pass")
    r.add_argument("--draft-k", type=_tokens, metavar="K",
                   help="drafts per verifying pass (default: the board's batch minus one)")
    r.add_argument("--selftest", action="store_true",
                   help="run every step of the image's golden check first (SELFTEST; the boot check runs a few)")
    r.set_defaults(func=cmd_run)


def cmd_run(args, console) -> int:
    if args.prompt is None and args.prompt_ids is None:
        raise UserError("give a prompt: --prompt TEXT or --prompt-ids 1,2,3")
    # the session, the boards and the tokenizer (numpy, pyserial, rich): not for --help
    from ..commands.prompt import encode_prompt, text_prompt
    from ..commands.run import Target, run
    from ..link.messages import Generate
    from ..model_dir import ModelDir
    from ..output.export import Outputs
    from ..session.recovery import Policy

    model = ModelDir.open(args.model)
    if args.encode_on == "device":   # the text itself: the board encodes it and shows the ids in its TOKEN frames
        prompt, _ = text_prompt(model, args.prompt, args.prompt_ids)
    else:
        prompt, _ = encode_prompt(model, args.prompt, args.prompt_ids)
    request = Generate(prompt, args.max_tokens, args.temperature, args.top_p, args.seed, slide=args.slide,
                       all_logits=args.all_logits, batch=args.batch or 0, speculate=args.speculate or "none",
                       draft_k=args.draft_k or 0)
    return run(console, model, request, Target(args.board, args.port, args.baud, args.xip_model == "on"),
               Outputs(args.json, args.csv, args.png),
               Policy(retries=max(0, args.retries), frame_timeout=args.timeout, handshake_timeout=args.timeout),
               kv=args.kv, selftest=args.selftest)
