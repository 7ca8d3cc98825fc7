"""``flashlm plan``: where a model's tensors go on a board and what a token is predicted to cost
there; ``--apply`` records the placement in the model folder's blob and manifest, ``--roofline``
predicts passes of several tokens (roofline.py). Takes the plan command's parsed options
(host/cli/plan.py) and the recipe they name."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from converter import blob as B
from converter.planner import NoFit, parse_layout, plan

from ..errors import UserError
from ..files import atomic_write_bytes, write_json
from ..output.plan_figures import memory_map_png
from ..output.plan_tables import print_no_fit, print_plan
from .model_source import Source, load_spec
from .recipe import Recipe
from .roofline import roofline


def kv_of(args, source: Source) -> str:
    """--kv, else the blob's own KV cache format, else convert's default (int8)."""
    return args.kv or source.kv()


def plan_batch(args, source: Source) -> int:
    """--batch, else the batch the model's blob header names, else 1."""
    return args.batch or source.batch()


def apply_plan(console, source: Source, pl) -> None:
    """Record the placement in the model dir's blob header (and a shorter context, if planned)."""
    if source.kind != "dir":
        raise UserError("--apply rewrites a model directory; convert the checkpoint first "
                        "('flashlm convert CHECKPOINT -o DIR') and plan DIR")
    blob_path = source.blob
    data = blob_path.read_bytes()
    h = source.header
    if pl.config.max_seq_len != h.config.max_seq_len:
        qm = B.read_blob(data)
        ctx = pl.config.max_seq_len
        qm = replace(qm, config=replace(qm.config, max_seq_len=ctx), rope_cos=qm.rope_cos[:ctx].copy(),
                     rope_sin=qm.rope_sin[:ctx].copy())
        new = B.build_blob(qm, pl.tiers, pl.state_tiers)
    else:
        new = B.retier_blob(data, pl.tiers, pl.state_tiers)
    atomic_write_bytes(blob_path, new)
    nh = B.parse_header(new, str(blob_path))
    source.model.record_layout(nh, len(new), kv=pl.kv, board=pl.board, regions=pl.regions,
                               overrides=[o.text for o in pl.overrides], base=pl.base)
    console.print(f"[green]applied[/] layout {nh.layout_id} to {blob_path} (model {source.model.model_hash[:16]})")


def run_plan(console, args, recipe: Recipe) -> int:
    spec, source = load_spec(args.model, recipe, args.tokenizer, args.ctx)
    if args.ctx:
        spec = spec.with_context(args.ctx)
    base, places = parse_layout(",".join(["auto" if not args.flash_only else "flash"] + list(args.place)))
    plan_kw = dict(overrides=places, base=base, kv=kv_of(args, source), pos=args.pos, line=args.line)
    try:
        pl = plan(spec, args.board, batch=plan_batch(args, source), **plan_kw)
    except NoFit as e:
        print_no_fit(console, e)
        cmd = source.model.convert_command(**e.fixes[0]) if source.kind == "dir" and e.fixes and e.fixes[0] else None
        raise UserError(str(e) + (f"; to convert it so: {cmd}" if cmd else "")) from None
    print_plan(console, pl, collapse=not args.all)
    out = pl.to_dict()
    if args.roofline:       # --png is the roofline's
        out["roofline"] = roofline(console, args, spec, source, plan_kw, args.png or Path(f"roofline-{pl.board}.png"))
    elif args.png:
        memory_map_png(pl, args.png)
        console.print(f"[green]wrote[/] memory map {args.png}")
    if args.json:
        write_json(args.json, out)
        console.print(f"[green]wrote[/] JSON {args.json}")
    if args.apply:
        apply_plan(console, source, pl)
    return 0
