"""``flashlm plan``'s options (and the model options ``flashlm compare`` shares): where a model's
tensors go on a board, what a token is predicted to cost there, and with ``--roofline`` what passes
of several tokens are predicted to cost."""
from __future__ import annotations

from pathlib import Path

from ..commands.plan_options import Passes, PlanQuery
from ..defaults import KV_DEFAULT, KV_FORMATS, MAX_DRAFTS
from ..errors import UserError
from .options import ALL_BOARDS, add_recipe, nonneg_int, output_file, positive_int, recipe_of


def add_model_options(p) -> None:
    """The MODEL and what the plan is for: context, KV format, batch, position, cache line; how a
    checkpoint is quantized; the files written."""
    p.add_argument("model", metavar="MODEL",
                   help="model dir from 'flashlm convert', a .flmb blob, a checkpoint, a model name (flashlm pull), "
                        "or shape:NAME (e.g. shape:ple-28m)")
    p.add_argument("--ctx", type=positive_int, metavar="N", help="plan for a shorter context than the model's")
    p.add_argument("--kv", choices=KV_FORMATS,
                   help=f"KV cache format (default: the blob's, or for a checkpoint or shape {KV_DEFAULT} as convert "
                        "writes; k12: 12-bit K codes and int8 V codes per row, int8: int8 codes per row; --apply "
                        "records it)")
    p.add_argument("--batch", type=positive_int, metavar="T",
                   help="the most tokens one forward pass runs (batched prefill, speculative verification); "
                        "scratch RAM grows with it (default: the model's own, else 1; --apply records it)")
    p.add_argument("--pos", type=nonneg_int, metavar="P", help="position to quote per-token figures at (default: mid-context)")
    p.add_argument("--line", type=positive_int, metavar="BYTES", help="cache line size (boards with seq_read_MBps_by_line)")
    add_recipe(p, "a checkpoint is quantized in memory as convert would")
    p.add_argument("--png", metavar="FILE", type=output_file, help="write a PNG (plan: the memory map, with "
                   "--roofline the roofline; compare: the layouts side by side)")
    p.add_argument("--json", metavar="FILE", type=output_file)


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="place a model's tensors on a board's memory tiers; predict per-token cost")
    add_model_options(p)
    p.add_argument("--board", required=True, help=f"the board profile: {ALL_BOARDS}")
    p.add_argument("--place", action="append", default=[], metavar="PATTERN=TIER",
                   help="pin tensors or buffers: 'head=psram', 'layers.*.ffn=sram', 'kv=psram' (repeatable)")
    p.add_argument("--flash-only", action="store_true", help="leave every tensor not --place'd in flash")
    p.add_argument("--all", action="store_true", help="one table row per tensor (no grouping of layers)")
    p.add_argument("--apply", action="store_true", help="record the placement in the model dir's blob header")
    add_roofline_args(p)
    p.set_defaults(func=cmd_plan)


def add_roofline_args(p) -> None:
    """The options of --roofline (check_args refuses them without it)."""
    g = p.add_argument_group("passes of several tokens (with --roofline)")
    g.add_argument("--roofline", action="store_true",
                   help="predict batched prefill per batch T, speculative decoding and each phase on a roofline; "
                        "write a PNG (--png, default roofline-BOARD.png)")
    g.add_argument("--measured", metavar="RUN.json",
                   help="a 'flashlm run --json' report of this model on this board: its passes, measured, beside "
                        "their predictions")
    g.add_argument("--speculate", choices=("lookup", "draft"), action="append", metavar="lookup|draft",
                   help="the proposer(s) to predict (default: prompt lookup, and the draft model when the image has one)")
    g.add_argument("--acceptance", metavar="P[,P2...]",
                   help="acceptance per draft position instead of a calibration (e.g. 0.6, or 0.8,0.6,0.5)")
    g.add_argument("--calibration", metavar="TEXT",
                   help="text whose greedy decoding by the reference measures acceptance (default: eval.txt beside "
                        "the model's checkpoint)")
    g.add_argument("--draft-k", type=positive_int, metavar="K",
                   help=f"the most drafts a verification is quoted for (default {MAX_DRAFTS}, within the batch)")


def check_args(args) -> None:
    if args.roofline:
        return
    for flag, v in (("--measured", args.measured), ("--speculate", args.speculate), ("--acceptance", args.acceptance),
                    ("--calibration", args.calibration), ("--draft-k", args.draft_k)):
        if v:
            raise UserError(f"{flag} belongs to --roofline (flashlm plan MODEL --board B --roofline {flag} ...)")


def query_of(args) -> PlanQuery:
    """What the plan is for, from --ctx, --kv, --batch, --pos and --line."""
    return PlanQuery(args.ctx, args.kv, args.batch, args.pos, args.line)


def cmd_plan(args, console) -> int:
    check_args(args)
    from ..commands.plan import plan_model    # the converter and planner (numpy): not for --help
    passes = (Passes(args.measured and Path(args.measured), tuple(args.speculate or ()), args.acceptance,
                     args.calibration and Path(args.calibration), args.draft_k) if args.roofline else None)
    plan_model(console, args.model, args.board, recipe_of(args), args.tokenizer, query_of(args), tuple(args.place),
               args.flash_only, args.all, passes, args.png, args.json, args.apply)
    return 0
