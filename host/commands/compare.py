"""``flashlm compare``: layouts side by side, predicted from the board profiles and (``--run``)
measured on one board switched with LAYOUT frames instead of reflashing. ``compare`` takes typed
options: the command line builds them (host/cli/compare.py) and scripts call it directly."""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import mean

from converter.boards import load_board
from converter.planner import PlanError, plan_layout

from ..boards.builds import ensure_firmware
from ..boards.virtual import check_virtual_board, start_virtual_board
from ..defaults import DEFAULT_PROMPT
from ..errors import UserError
from ..files import write_json
from ..interrupts import interrupts
from ..link.messages import PHASES, Generate
from ..link.port import Link, open_port
from ..output.labels import unit
from ..output.plan_figures import compare_png
from ..output.plan_tables import column, side_by_side
from ..session.errors import DeviceError
from ..session.session import Session
from .model_source import Source
from .plan import load_for_plan
from .plan_options import PlanQuery
from .prompt import encode_prompt
from .recipe import Recipe
from .run import Target


@dataclass(frozen=True)
class Measure:
    """``compare --run``: the generation each layout runs on the one board (a virtual board flashlm
    starts, or ``target.port``'s flashed board), waiting ``timeout`` seconds for the board and each
    frame. No prompt: the default text (ids "1" for a model without a tokenizer)."""
    target: Target = Target()
    prompt: str | None = None
    prompt_ids: str | None = None
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    timeout: float = 10.0


def compare(console, model, boards: tuple[str, ...] = ("native",), layouts: tuple[str, ...] = ("flash", "auto"),
            recipe: Recipe = Recipe(), tokenizer=None, query: PlanQuery = PlanQuery(), measure: Measure | None = None,
            png: Path | None = None, json: Path | None = None) -> dict:
    """Plan MODEL with each of ``layouts`` on each of ``boards`` and print them side by side;
    ``measure``: also run each layout on the one board (LAYOUT frames, no reflash). Returns what
    ``json`` is written with."""
    spec, info = load_for_plan(model, recipe, tokenizer, query)
    names = {lay: f"L{i + 1}" for i, lay in enumerate(layouts)}
    for lay in layouts:
        console.print(f"  {names[lay]} = {lay}", soft_wrap=True)
    plans, entries = {}, []
    for b in boards:
        cols, un = [], unit(load_board(b).get("timer"))
        for lay in layouts:
            try:
                pl = plan_layout(spec, b, lay, kv=query.kv_for(info), pos=query.pos, line=query.line, suggest=False,
                                 batch=query.batch_for(info))
            except PlanError as e:   # does not fit, or an override this board cannot honour
                console.print(f"  {b} {names[lay]}: refused: {e}", soft_wrap=True)
                continue
            plans[(b, lay)] = pl
            cols.append((names[lay], column(pl.prediction.phase_us, pl.prediction.bytes_read, un)))
            entries.append(dict(label=f"{b}\n{names[lay]}", predicted=dict(pl.prediction.phase_us), measured=None))
        if cols:
            pos = next(pl.pos for (bb, _), pl in plans.items() if bb == b)
            side_by_side(console, f"{b}: predicted per token at position {pos} (from the board profile; "
                                   f"a prediction, not a measurement)", cols, un)
    results = {}
    if measure is not None:
        if len(boards) != 1:
            raise UserError("--run measures on one board: give a single --board (and --port for a real one)")
        results = run_layouts(console, measure, spec, info, boards[0], layouts, plans, names)
        entries = []
        for lay in layouts:
            pl = plans.get((boards[0], lay))
            if pl is None:
                continue
            r = results.get(lay)
            ok = r is not None and "error" not in r
            entries.append(dict(label=f"{boards[0]}\n{names[lay]}",
                                predicted=r["predicted"] if ok else dict(pl.prediction.phase_us),
                                measured=r["measured"] if ok else None))
    if entries and png:
        compare_png(entries, png, key={short: lay for lay, short in names.items()})
        console.print(f"[green]wrote[/] {png}")
    out = {"layouts": names, "predicted": {f"{b}/{lay}": pl.to_dict() for (b, lay), pl in plans.items()},
           "runs": results}
    if json:
        write_json(json, out, default=str)
        console.print(f"[green]wrote[/] JSON {json}")
    return out


def measure_layouts(sess, plans: dict, request: Generate, on_layout=None) -> dict:
    """For each (name, Plan): LAYOUT, then the same request (in one-token passes: what the planner
    predicts step by step). Returns name -> dict(hello, result, measured per-phase mean µs over
    generated steps, predicted per-phase mean µs at the same positions, bytes_match steps). A refused
    layout gives dict(error=...); a generation stopped by Ctrl-C is the last one measured."""
    request = replace(request, batch=1)
    out = {}
    for name, pl in plans.items():
        try:
            hello = sess.set_layout(pl.layout_id, pl.state_tiers.to_u32(), pl.tier_codes)
        except DeviceError as e:
            out[name] = dict(error=str(e))
            continue
        res = sess.generate(request)
        sampling = "greedy" if request.temperature <= 0 else "temperature"
        gen = res.generated_steps
        # a mixture of experts: each step's prediction for the experts its TOKEN says it read
        preds = {t.step: pl.predict_at(t.pos, sampling, step_head(t, sampling), t.pass_experts or None)
                 for t in res.tokens}
        measured = {ph: mean(t.us[i] for t in gen) for i, ph in enumerate(PHASES)} if gen else {}
        predicted = {ph: mean(preds[t.step].phase_us.get(ph, 0.0) for t in gen) for ph in PHASES} if gen else {}  # (draft: not predicted, 0)
        tiers = ("flash", "psram", "sram")
        mbytes = {k: mean(t.bytes_read[i] for t in gen) for i, k in enumerate(tiers)} if gen else {}
        pbytes = {k: mean(preds[t.step].bytes_read[k] for t in gen) for k in tiers} if gen else {}
        match = sum(1 for t in res.tokens
                    if tuple(t.bytes_read) == tuple(preds[t.step].bytes_read[k] for k in ("flash", "psram", "sram")))
        out[name] = dict(layout_id=hello.layout_id, result=res, measured=measured, predicted=predicted,
                         measured_bytes=mbytes, predicted_bytes=pbytes,
                         bytes_match=match, steps=len(res.tokens), tokens=res.generated_ids,
                         crcs=[t.logits_crc for t in res.tokens])
        if on_layout is not None:
            on_layout(name, out[name])
        if res.interrupted:
            break
    return out


def step_head(t, sampling: str) -> str | int:
    """The output layer a TOKEN's step computed (a generation without ALL_LOGITS): skipped on a
    prompt step (head_rows 0), whole when sampling, else the rows of the greedy step."""
    if t.head_rows == 0:
        return "skip"
    return "full" if sampling != "greedy" else int(t.head_rows)


def run_layouts(console, measure: Measure, spec, info: Source, board, layouts, plans, names) -> dict:
    if info.kind != "dir":
        raise UserError("--run needs a model directory from 'flashlm convert' (the board must hold its blob)")
    model = info.model
    if spec.config.max_seq_len != info.header.config.max_seq_len:
        raise UserError("--run with --ctx: apply the shorter context first ('flashlm plan --ctx N --apply')")
    prompt, prompt_ids = measure.prompt, measure.prompt_ids
    if prompt is None and prompt_ids is None:
        if model.has_tokenizer:
            prompt = DEFAULT_PROMPT
        else:
            prompt_ids = "1"
    ids, _ = encode_prompt(model, prompt, prompt_ids)
    request = Generate(ids, measure.max_tokens, measure.temperature, measure.top_p, measure.seed)
    todo = {lay: plans[(board, lay)] for lay in layouts if (board, lay) in plans}
    emulated = None
    with interrupts() as ctrl_c, ExitStack() as stack:
        try:
            target = measure.target
            if target.port is None:
                emulated = check_virtual_board(board)   # a real board: flash it and pass --port
                image = ensure_firmware(console, model, board)
                vb = stack.enter_context(start_virtual_board(board, image, model.blob, measure.timeout,
                                                             target.xip_model))
                port = vb.port
            else:
                port = target.port
            ser = open_port(port, target.baud)
            stack.callback(ser.close)
            sess = Session(Link(ser), name=port, frame_timeout=measure.timeout)
            hello = sess.handshake(timeout=measure.timeout)
            sess.check_model(hello, model.model_hash)
            memory = f", XIP model {'on' if target.xip_model else 'off'}" if emulated == "rp2040js" else ""
            console.print(f"measuring {len(todo)} layout(s) on {hello.board} ({hello.clock_name}{memory}), "
                          f"{len(ids)}-token prompt, {measure.max_tokens} tokens, seed {measure.seed}")
            res = measure_layouts(sess, todo, request)
        finally:    # from here on Ctrl-C is ignored: the board is stopped before anything else
            ctrl_c.hold()
    cols, first, un = [], None, unit(hello.clock_name)
    for lay, r in res.items():
        if "error" in r:
            console.print(f"  {names[lay]}: refused by the board: {r['error']}", soft_wrap=True)
            continue
        cols.append((f"{names[lay]} meas.", column(r["measured"], r["measured_bytes"], un)))
        cols.append((f"{names[lay]} pred.", column(r["predicted"], r["predicted_bytes"], un)))
        console.print(f"  {names[lay]}: bytes per tier equal the plan's on {r['bytes_match']}/{r['steps']} steps",
                      soft_wrap=True)
        if first is None:
            first = r
        elif r["tokens"] != first["tokens"] or r["crcs"] != first["crcs"]:
            console.print(f"[red]layout {names[lay]} produced different tokens/logits from the first layout[/]")
    if cols:
        side_by_side(console, f"measured ({hello.clock_name}) vs predicted ({board} profile): mean per "
                               f"generated token", cols, un)
    if first is not None and all("error" not in r and r["crcs"] == first["crcs"] for r in res.values()):
        console.print("every layout produced bit-identical logits (crc32 per step) and the same tokens")
    return {lay: {k: v for k, v in r.items() if k != "result"} for lay, r in res.items()}
