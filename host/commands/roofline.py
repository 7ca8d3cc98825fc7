"""``flashlm plan MODEL --board B --roofline``: what forward passes of several tokens are predicted to
cost on a board — batched prefill per prompt token at each batch T and the best T its RAM allows;
speculative decoding per proposer and number of drafts against plain greedy decoding; each phase
on a roofline (converter/roofline.py) — printed as tables and drawn as a PNG. With ``--measured
RUN.json`` (a ``flashlm run --json`` report of this model on this board) the run's forward passes
are predicted at their own positions and shown beside what the device measured.

Every figure without "measured" is a prediction from the board profile (boards/*.toml) and the cost
model, and is labelled so."""
from __future__ import annotations

import json
from pathlib import Path

from converter import passcost as P
from converter import roofline as R
from converter import speculation as S
from converter.blob import read_blob
from converter.boards import load_board
from converter.costmodel import ModelSpec
from converter.ir import ModelError
from converter.passcost import HEAD_ALL, HEAD_SKIP, draft_placement
from converter.planner import NoFit, default_pos, plan
from converter.speculation import PassRecord, predict_run
from converter.tokenizer import encode

from ..defaults import MAX_DRAFTS
from ..errors import UserError
from ..output.roofline_figure import roofline_png
from ..output.roofline_tables import (PHASE_LABEL, print_batches, print_measured, print_roofline,
                                      print_speculation)
from .model_source import Source
from .plan_options import Passes, PlanQuery

CAL_PROMPTS = 6            # calibration: prompts cut from the text,
CAL_PROMPT_TOKENS = 32     # of at most this many tokens (a quarter of the context at most),
CAL_NEW_TOKENS = 64        # each decoded greedily for at most this many tokens
PAYS = 1.05                # a predicted speed-up below this is "does not pay"
MAX_GROUPS = 5             # measured: the kinds of pass drawn (the most frequent; the tables have all)


# ---------------------------------------------------------------------------------------------
# inputs: the quantized model, the calibration text, a measured run

def quant_model(info: Source):
    """The quantized model behind the MODEL argument (None for a shape: no weights)."""
    if info.kind in ("dir", "blob"):
        return read_blob(info.blob)
    return info.qm


def calibration_text(asked: Passes, info: Source) -> Path | None:
    if asked.calibration:
        p = Path(asked.calibration)
        if not p.is_file():
            raise UserError(f"--calibration {p}: no such file")
        return p
    src = None
    if info.kind == "dir":
        src = Path(info.model.source)
    elif info.kind == "checkpoint":
        src = Path(info.path)
    if src is not None:
        for folder in (src.parent, src) if src.is_dir() else (src.parent,):
            if (folder / "eval.txt").is_file():
                return folder / "eval.txt"
    return None


def _tokenizer(info: Source, qm):
    if info.kind == "dir":
        return info.model.tokenizer(required=False)
    return qm.tokenizer if qm is not None and qm.tokenizer is not None and qm.tokenizer.kind != "blob" else None


def acceptances(console, passes: Passes, info: Source, k_max: int) -> tuple[list, list[str]]:
    """[(proposer, Acceptance)] and notes on what was not predicted and why."""
    asked = list(dict.fromkeys(passes.speculate))
    if passes.acceptance:
        try:
            a = S.parse_acceptance(passes.acceptance)
        except ModelError as e:
            raise UserError(str(e)) from None
        return [(m, a) for m in asked or ["lookup"]], []
    qm = quant_model(info)
    if qm is None:
        msg = "a shape has no weights to measure acceptance on: give --acceptance to predict speculation"
        if asked:
            raise UserError(msg)
        return [], [msg]
    modes = asked or (["lookup"] + (["draft"] if qm.draft is not None else []))
    if "draft" in modes and qm.draft is None:
        raise UserError("--speculate draft: the model carries no draft model (flashlm convert --draft DIR)")
    text, tok = calibration_text(passes, info), _tokenizer(info, qm)
    if text is None or tok is None:
        msg = ("no calibration text (eval.txt beside the checkpoint, or --calibration FILE)" if text is None else
               "no tokenizer to encode the calibration text with") + ": speculation not predicted (or give --acceptance)"
        if asked:
            raise UserError(msg)
        return [], [msg]
    ctx = qm.config.max_seq_len
    n_prompt = max(2, min(CAL_PROMPT_TOKENS, ctx // 4))
    new = max(2, min(CAL_NEW_TOKENS, ctx - n_prompt - 1))
    try:
        ids = list(encode(tok, text.read_text(encoding="utf-8", errors="replace")[:200_000], bos=False))
        prompts = S.prompt_windows(ids, CAL_PROMPTS, n_prompt, tok.bos_id)
    except ModelError as e:
        raise UserError(f"calibration text {text}: {e}") from None
    out = []
    for m in modes:
        with console.status(f"calibrating acceptance: the reference decodes {len(prompts)} prompts of {text.name} "
                            f"with {m} speculation ..."):
            src = (f"measured: the reference's greedy decoding of {len(prompts)} prompts of {n_prompt} tokens from "
                   f"{text.name}, {new} tokens each, {m}, up to {k_max} drafts")
            out.append((m, S.calibrate(qm, m, k_max, prompts, new, src)))
    return out, []


def load_run(path, board: str, info: Source) -> dict:
    """A ``flashlm run --json`` report, checked to be of this model and board."""
    p = Path(path)
    try:
        run = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--measured {p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"--measured {p} is not a flashlm run report: {e}") from None
    if not isinstance(run, dict) or run.get("format") != "flashlm-run" or not isinstance(run.get("tokens"), list):
        raise UserError(f"--measured {p} is not a 'flashlm run --json' report")
    hello = run.get("hello") or {}
    if hello.get("board") != board:
        raise UserError(f"--measured {p} ran on board {hello.get('board')!r}, not {board!r}: plan with --board "
                        f"{hello.get('board')}")
    h = info.header
    if h is None:
        raise UserError("--measured compares a run with the model it ran: give the model directory (or .flmb) it ran")
    if hello.get("model_hash") != bytes(h.model_hash).hex():
        raise UserError(f"--measured {p} ran another model (hash {str(hello.get('model_hash'))[:16]}, this one "
                        f"{bytes(h.model_hash).hex()[:16]})")
    if hello.get("layout_id") != h.layout_id:
        raise UserError(f"--measured {p} ran layout {hello.get('layout_id')}, the blob holds {h.layout_id} "
                        f"(a run with --kv switches it): compare a run of the blob's own layout")
    if not run["tokens"]:
        raise UserError(f"--measured {p} holds no steps")
    return run


def run_passes(run: dict) -> list[dict]:
    """The forward passes of a run report, in order: first step, position, tokens, steps produced,
    kind, its prompt steps (outputs unused), its last step (its head rows), µs per phase and bytes
    per tier (the pass's, drafting included)."""
    out: dict = {}
    for t in sorted(run["tokens"], key=lambda t: t["step"]):
        ps = t["pass"]
        d = out.setdefault(ps["first"], dict(first=ps["first"], pos=t["pos"] - (t["step"] - ps["first"]),
                                             tokens=ps["tokens"], steps=ps["steps"], kind=ps["kind"],
                                             us=dict(t["us"]), bytes=dict(t["bytes_read"]), last=None,
                                             prompt_steps=0))
        d["prompt_steps"] += t["kind"] == "prefill"
        if t["step"] == ps["first"] + ps["steps"] - 1:
            d["last"] = t
    return [d for _, d in sorted(out.items()) if d["last"] is not None]


def pass_head(p: dict, run: dict):
    """The output layer a measured pass computed, in passcost's terms."""
    prm = run.get("params") or {}
    if p["kind"] == "verify" or prm.get("all_logits"):
        return HEAD_ALL
    last = p["last"]
    if last["kind"] == "prefill":
        return HEAD_SKIP
    return "full" if float(prm.get("temperature") or 0) > 0 else int(last["head_rows"])


def record(p: dict, run: dict):
    """A measured pass as speculation.predict_run takes it."""
    return PassRecord(p["pos"], p["tokens"], p["steps"], p["kind"], pass_head(p, run))


def category(p: dict) -> str:
    """A measured pass's kind and size: prefill (its outputs unused), prefill + head (the prompt's last
    token, its head computed), decode, verify."""
    if p["kind"] == "verify":
        return f"verify ×{p['tokens']}"
    if p["kind"] == "prefill":
        return f"prefill ×{p['tokens']}" + (" + head" if p["last"]["kind"] != "prefill" else "")
    return "prefill ×1" if p["last"]["kind"] == "prefill" else "decode ×1"


# ---------------------------------------------------------------------------------------------
# the report

def roofline(console, board: str, spec, info: Source, query: PlanQuery, plan_kw: dict, png_path,
             passes: Passes = Passes()) -> dict:
    """Predict, print, draw; returns the figures for --json."""
    prof = load_board(board)
    board = prof["name"]
    run = load_run(passes.measured, board, info) if passes.measured else None     # refused before any work
    quotes = P.batch_quotes(spec, prof, plan_kw=plan_kw)
    best = P.best_batch(quotes)
    if best is None:
        raise UserError(f"the model does not fit on {board} even one token a pass")
    fit = max(q.batch for q in quotes if q.fits)
    t_spec = query.batch or min(fit, (passes.draft_k or MAX_DRAFTS) + 1)     # speculation: the drafts RAM allows
    T = query.batch or (best.batch if best.batch > 1 else t_spec)           # the roofline's pass of several tokens
    placements: dict = {}

    def placement(t: int):
        if t not in placements:
            try:
                placements[t] = P.Placement.of(plan(spec, prof, batch=t, suggest=False, **plan_kw))
            except NoFit as e:
                raise UserError(f"--batch {t}: {e}") from None
        return placements[t]
    print_batches(console, board, quotes, best, T, t_spec, P.prompt_tokens(spec))
    ctx = spec.config.max_seq_len
    at = min(query.pos if query.pos is not None else default_pos(ctx), ctx - 1)

    k_max = min(passes.draft_k or MAX_DRAFTS, t_spec - 1, ctx - 1 - at)
    spec_out, notes = [], []
    if k_max >= 1:
        accs, notes = acceptances(console, passes, info, k_max)
        place = placement(t_spec)
        h = info.header
        dpl = draft_of(h, place) if h is not None else None
        if any(m == "draft" for m, _ in accs) and dpl is None:
            raise UserError("--speculate draft: the model carries no draft model to cost (flashlm convert --draft)")
        for mode, acc in accs:
            qs = [S.predict_speculation(place, acc, k, at, dpl if mode == "draft" else None)
                  for k in range(1, k_max + 1)]
            spec_out.append((mode, qs))
        print_speculation(console, board, spec_out, at, t_spec)
    else:
        notes.append(f"speculation not predicted: a batch of {t_spec} at position {at} leaves no room for a draft "
                     f"(--batch 2 or more, --pos earlier)")
    for n in notes:
        console.print(f"[dim]{n}[/]", soft_wrap=True)

    decode = P.predict_pass(placement(T), at, 1, None)
    groups = [("1 token (a decoding step)", R.pass_points(decode, "1 token"))]
    if T > 1:
        wide = P.predict_pass(placement(T), min(at, ctx - T), T, P.HEAD_ALL)
        groups.append((f"{T} tokens (verifying {T - 1} drafts)", R.pass_points(wide, f"{T} tokens")))
    measured = None
    if run is not None:
        measured = measured_groups(console, run, info, prof)
        groups = measured["groups"]
    roofs = R.roofs(prof, query.line)
    print_roofline(console, board, roofs, groups)
    title = (f"{board} roofline, {Path(spec.source).name or 'model'}: "
             + ("predicted from the board profile (filled) and measured on the device (hollow)" if measured
                else "predicted from the board profile (nothing measured)"))
    note = ("op: an int8 multiply-accumulate (q4: 1.5, its unpacking) or a float operation; a point's x is its ops over "
            "the bytes it moves from the tier that takes it longest to read. The cost model adds memory and compute "
            "time, so a point sits below both roofs. " + verdict(spec_out, decode))
    out = Path(png_path)
    roofline_png(roofs, groups, out, title, note, label_passes=measured is None)
    console.print(f"[green]wrote[/] roofline {out}")
    console.print(verdict(spec_out, decode), soft_wrap=True)
    return to_dict(quotes, best, T, spec_out, roofs, groups, measured, notes)


def verdict(spec_out, decode) -> str:
    """Where speculation pays on this board, in a few words, from the predictions (``decode``: a
    decoding step's prediction)."""
    pts = R.pass_points(decode, "1 token")
    whole = next(p for p in pts if p.phase == "pass")
    mem = [f"{PHASE_LABEL[p.phase]} ({p.tier})" for p in pts
           if p.phase != "pass" and p.bound == "memory" and p.us > 0.05 * whole.us]
    out = (f"A decoding step here is {whole.bound}-bound ({whole.memory_us:,.0f} µs reading, "
           f"{whole.compute_us:,.0f} µs computing; predicted)"
           + (f"; bound by their bytes: {', '.join(mem)}." if mem else "."))
    parts = []
    for mode, qs in spec_out:
        b = max(qs, key=lambda q: q.speedup)
        last = qs[-1]
        if b.speedup >= PAYS:
            parts.append(f"{mode} pays: x{b.speedup:.2f} emitted tok/s with {b.k} draft(s) "
                         f"({b.tokens_per_verify:.2f} tokens per verification)")
        else:
            parts.append(f"{mode} does not pay (best x{b.speedup:.2f}): a verification of {last.k + 1} tokens costs "
                         f"{last.pass_cost_ratio:.2f} plain steps and emits {last.tokens_per_verify:.2f}")
    return out + (" Speculation: " + "; ".join(parts) + "." if parts else "")


def measured_groups(console, run: dict, info: Source, prof: dict) -> dict:
    """The run's passes grouped by kind and size, each predicted at its own positions on the blob's
    own placement (the drafting before each verification too), with the measured µs per phase."""
    h = info.header
    place = P.Placement.of_header(h, prof, str(info.blob or ""))
    prm = run.get("params") or {}
    sampling = "sampled" if float(prm.get("temperature") or 0) > 0 else "greedy"
    dpl = draft_of(h, place) if prm.get("speculate") == "draft" else None
    passes = run_passes(run)
    cats: dict = {}
    for p, (pred, draft) in zip(passes, predict_run(place, [record(p, run) for p in passes], dpl, sampling)):
        label = category(p)
        c = cats.setdefault(label, dict(label=label, passes=0, tokens=0, steps=0, pred=None, draft=None,
                                        us={}, bytes={}))
        c["passes"] += 1
        c["tokens"] += p["tokens"]
        c["steps"] += p["steps"]
        c["pred"] = pred if c["pred"] is None else c["pred"] + pred
        if draft is not None:
            c["draft"] = draft if c["draft"] is None else c["draft"] + draft
        for k, v in p["us"].items():
            c["us"][k] = c["us"].get(k, 0) + v
        for k, v in p["bytes"].items():
            c["bytes"][k] = c["bytes"].get(k, 0) + v
    ordered = sorted(cats.values(), key=lambda c: -c["passes"])
    groups = []
    for c in ordered:
        n = c["passes"]
        label = f"{c['label']} ({n} pass{'es' * (n > 1)})"
        pts = R.pass_points(c["pred"], label, c["tokens"] // n)
        main_us = {ph: v for ph, v in c["us"].items() if ph != "draft"}
        meas = [pt.with_time(sum(main_us.values()) if pt.phase == "pass" else main_us.get(pt.phase, 0))
                for pt in pts]
        groups.append((label, pts + [m for m in meas if m.us > 0]))
        want = {t: c["pred"].bytes_read[t] + (c["draft"].bytes_read[t] if c["draft"] is not None else 0)
                for t in c["pred"].bytes_read}
        c["bytes_equal"] = all(int(round(want[t])) == int(c["bytes"].get(t, 0)) for t in want)
        c["predicted_bytes"] = want
    print_measured(console, run, ordered)
    return dict(groups=groups[:MAX_GROUPS], categories=ordered)


def draft_of(h, place):
    """The draft model's placement beside ``place`` (None when the blob carries none)."""
    if h.draft is None:
        return None
    return draft_placement(ModelSpec.from_header(h.draft), place, h.draft.state_tiers.kv)


# ---------------------------------------------------------------------------------------------
# tables

# ---------------------------------------------------------------------------------------------
# JSON

def _point(p) -> dict:
    return {"pass": p.label, "phase": p.phase, "tokens": p.tokens, "ops": p.ops, "macs": p.macs, "flops": p.flops,
            "tier": p.tier, "tier_bytes": p.tier_bytes, "bytes": dict(p.bytes), "intensity": p.intensity,
            "memory_us": p.memory_us, "compute_us": p.compute_us, "us": p.us, "ops_per_s": p.ops_per_s,
            "bound": p.bound, "measured": p.measured}


def to_dict(quotes, best, T, spec_out, roofs, groups, measured, notes) -> dict:
    return {
        "label": "predicted from the board profile and the cost model (not measured) unless a point says measured",
        "prefill": [{"batch": q.batch, "fits": q.fits, "us_per_prompt_token": q.us_per_token,
                     "bytes_per_prompt_token": q.bytes_per_token, "ram": q.ram} for q in quotes],
        "best_batch": best.batch, "batch": T,
        "speculation": {mode: {"acceptance": {"rates": list(qs[0].acceptance.rates),
                                              "proposed": qs[0].acceptance.proposed,
                                              "source": qs[0].acceptance.source,
                                              "reached": list(qs[0].acceptance.reached)},
                               "by_drafts": [{"k": q.k, "tokens_per_verify": q.tokens_per_verify,
                                              "tokens_per_pass": q.tokens_per_pass, "us_per_token": q.us_per_token,
                                              "plain_us_per_token": q.plain_us_per_token,
                                              "draft_us_per_token": q.draft_us_per_token, "speedup": q.speedup,
                                              "verify_over_plain": q.pass_cost_ratio,
                                              "bytes_per_token": q.bytes_per_token()} for q in qs]}
                        for mode, qs in spec_out},
        "roofs": {"mac_per_s": roofs.mac_per_s, "flop_per_s": roofs.flop_per_s, "bandwidth": roofs.bandwidth},
        "points": [_point(p) for _, ps in groups for p in ps],
        "measured": None if measured is None else [
            {"pass": c["label"], "passes": c["passes"], "tokens": c["tokens"], "steps": c["steps"],
             "measured_us": c["us"], "predicted_us": c["pred"].phase_us,
             "predicted_draft_us": c["draft"].total_us if c["draft"] is not None else None,
             "measured_bytes": c["bytes"], "predicted_bytes": c["predicted_bytes"], "bytes_equal": c["bytes_equal"]}
            for c in measured["categories"]],
        "notes": notes,
    }
