"""``flashlm plan``: where a model's tensors go on a board and what a token is predicted to cost
there; ``--apply`` records the placement in the model folder's blob and manifest, ``--roofline``
predicts passes of several tokens (roofline.py). ``plan_model`` takes typed options (plan_options.py):
the command line builds them (host/cli/plan.py) and scripts call it directly."""
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
from .plan_options import Passes, PlanQuery
from .recipe import Recipe
from .roofline import roofline


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


def load_for_plan(model, recipe: Recipe, tokenizer, query: PlanQuery):
    """(ModelSpec, Source) of MODEL, at the query's shorter context if it names one."""
    spec, source = load_spec(model, recipe, tokenizer, query.ctx)
    return (spec.with_context(query.ctx) if query.ctx else spec), source


def plan_model(console, model, board: str, recipe: Recipe = Recipe(), tokenizer=None, query: PlanQuery = PlanQuery(),
               place: tuple[str, ...] = (), flash_only: bool = False, show_all: bool = False,
               passes: Passes | None = None, png: Path | None = None, json: Path | None = None,
               apply: bool = False) -> dict:
    """Plan MODEL (see load_spec) on ``board``: ``place``, PATTERN=TIER pins on top of the planner's
    choice (``flash_only``: everything else in flash); print the table (``show_all``: a row per
    tensor); ``passes``: also predict passes of several tokens (the roofline, whose PNG ``png`` then
    is); else ``png`` is the memory map. ``apply`` records the placement in the model folder.
    Returns what ``json`` is written with."""
    spec, source = load_for_plan(model, recipe, tokenizer, query)
    base, places = parse_layout(",".join(["flash" if flash_only else "auto"] + list(place)))
    plan_kw = dict(overrides=places, base=base, kv=query.kv_for(source), pos=query.pos, line=query.line)
    try:
        pl = plan(spec, board, batch=query.batch_for(source), **plan_kw)
    except NoFit as e:
        print_no_fit(console, e)
        raise UserError(str(e)) from None
    print_plan(console, pl, collapse=not show_all)
    out = pl.to_dict()
    if passes is not None:
        out["roofline"] = roofline(console, board, spec, source, query, plan_kw,
                                   png or Path(f"roofline-{pl.board}.png"), passes)
    elif png:
        memory_map_png(pl, png)
        console.print(f"[green]wrote[/] memory map {png}")
    if json:
        write_json(json, out)
        console.print(f"[green]wrote[/] JSON {json}")
    if apply:
        apply_plan(console, source, pl)
    return out
