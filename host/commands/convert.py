"""``flashlm convert``: a checkpoint into a model directory (quantized flash image, tokenizer,
manifest, quality report)."""
from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path

from converter import expertuse, headcalib, qat
from converter import quantize as Q
from converter.blob import read_golden, write_blob
from converter.calibrate import POSITIONS as CAL_POSITIONS, input_moments, resolve as resolve_calibration
from converter.draft import attach
from converter.fidelity import quality_report
from converter.formats import StateTiers
from converter.load import load_model
from converter.tokenizer import tokenizer_bin_bytes
from converter.tokenizer_enc import device_section

from ..defaults import DEFAULT_BATCH, KV_DEFAULT
from ..errors import UserError
from ..files import atomic_write_bytes
from ..model_dir import BLOB_NAME, MANIFEST, ModelDir, checkpoint_of
from ..output.console import step
from ..output.model_tables import print_quality
from .pull import is_model_name, resolve_model
from .recipe import Recipe


def _write_tokenizer(ir, tokenizer_arg, outdir: Path) -> str | None:
    if tokenizer_arg:
        src = Path(tokenizer_arg)
        with src.open("rb") as f:
            is_json = src.suffix.lower() == ".json" or f.read(64).lstrip().startswith(b"{")
        name = "tokenizer.json" if is_json else "tokenizer.bin"
        if src.resolve() != (outdir / name).resolve():
            shutil.copyfile(src, outdir / name)
        return name
    tok = ir.tokenizer
    if tok is None:
        return None
    if tok.hf_json:
        atomic_write_bytes(outdir / "tokenizer.json", tok.hf_json.encode("utf-8"))
        return "tokenizer.json"
    atomic_write_bytes(outdir / "tokenizer.bin", tokenizer_bin_bytes(tok))   # llama2.c format
    return "tokenizer.bin"


def convert(console, checkpoint, outdir, recipe: Recipe = Recipe(), tokenizer=None, report=True, kv=KV_DEFAULT,
            context=None, batch=DEFAULT_BATCH, draft=None, head_index="auto", calibrate="auto") -> ModelDir:
    """Checkpoint (or a model name, host/commands/pull.py) -> OUTDIR/{model.flmb, tokenizer.*,
    manifest.json, quality.json}, quantized as
    ``recipe`` says. ``context``: the positions the converted model holds (default: the
    checkpoint's); ``batch``: the most tokens one forward pass runs (recorded in the blob);
    ``draft``: a small model carried for speculative decoding; ``head_index``: auto, on or off (the
    greedy head's tile index, see _head_index); ``calibrate``: auto (gptq for q8, none for q4), none, gptq
    (converter/calibrate.py) or qat (converter/qat.py)."""
    name = str(checkpoint) if is_model_name(checkpoint) else None
    tokenizer_given = tokenizer is not None
    checkpoint, tokenizer = resolve_model(console, checkpoint, tokenizer)
    ckpt = checkpoint_of(checkpoint)
    if not ckpt.exists():
        raise UserError(f"checkpoint {ckpt} does not exist")
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise UserError(f"tokenizer {tokenizer} does not exist")
    fmt, group_size, scales = recipe.fmt, recipe.group_size, recipe.scales
    overrides = Q.parse_overrides(list(recipe.quant))          # fail fast, before the slow part
    Q.check_group_size(group_size, scales or "row")
    rounding = resolve_calibration(calibrate, fmt, scales)
    if rounding == "qat" and scales not in (None, "row"):
        raise UserError(f"--calibrate qat trains against row scales, not --scales {scales}")

    outdir = Path(outdir)
    step(console, f"loading {ckpt}")
    with console.status(f"loading {ckpt.name}"):
        ir = load_model(str(ckpt), tokenizer_path=str(tokenizer) if tokenizer else None, context=context)
    c = ir.config
    split = c.param_split()
    console.print(f"  dim {c.dim}, {c.n_layers} layers, {c.n_heads}/{c.n_kv_heads} heads, hidden {c.hidden_dim}, "
                  f"vocab {c.vocab_size}" + (f" (predicts {c.n_out})" if c.n_out != c.vocab_size else "")
                  + (f", PLE dim {c.ple_dim}" if c.ple_dim else "")
                  + (f", {c.n_experts} experts a layer, {c.moe_top_k} read per token" if c.n_experts else "")
                  + f", context {c.max_seq_len}, "
                  f"{c.n_params():,} parameters" + (f" ({split['table']:,} in the PLE table)" if split["table"] else ""))
    step(console, f"quantizing to {fmt} (group {group_size}, {scales or 'row'} scales"
          + {"gptq": ", GPTQ rounding", "qat": ", quantization-aware training"}.get(rounding, "") + ")"
          + (f" with {len(overrides)} override(s)" if overrides else ""))
    moments = None
    if rounding == "gptq":
        with console.status(f"calibrating: fp32 on {CAL_POSITIONS} positions of its own sampled text"):
            moments = input_moments(ir)
    with console.status("quantizing"):
        qm = Q.quantize(ir, default_format=fmt, group_size=group_size, overrides=overrides, scales=scales,
                        moments=moments)
    if rounding == "qat":
        qm = _trained(console, ir, qm, fmt, group_size, overrides, scales)
    rep = None
    if report:
        step(console, f"measuring quality (quantized with the {kv} KV cache vs fp32 logits)")
        with console.status("running both models"):
            rep = quality_report(ir, qm, kv)
        print_quality(console, rep)
    index_report = _head_index(console, qm, head_index)
    experts_report = _expert_use(console, qm, ckpt) if c.n_experts else None
    if draft is not None:
        qm = attach_draft(console, qm, draft, recipe)
    outdir.mkdir(parents=True, exist_ok=True)
    step(console, f"writing {outdir / BLOB_NAME}")
    info = write_blob(qm, outdir / BLOB_NAME, state=StateTiers(kv=kv, batch=batch))
    tok_name = _write_tokenizer(ir, tokenizer, outdir)
    if tok_name is None:
        console.print("  [yellow]no tokenizer: runs of this model need --prompt-ids[/]")
    enc, enc_about = device_section(qm.tokenizer, c)     # the same call build_blob made
    console.print(f"  device tokenizer (text prompts encoded on the board): "
                  f"{enc_about if enc is not None else 'none, ' + enc_about}", markup=False, soft_wrap=True)
    console.print(f"  stop ids: {qm.stops.describe()}", markup=False, soft_wrap=True)
    g = read_golden((outdir / BLOB_NAME).read_bytes())
    console.print(f"  golden check (the board repeats the reference's steps): prompt {list(g.prompt)}, "
                  + ", ".join(f"{len(r)} steps with the {kv} KV cache" for kv, r in g.blocks.items())
                  + f"; {g.boot_steps} at boot", markup=False, soft_wrap=True)
    cfg = asdict(c)
    t = qm.tokenizer
    cfg["bos_id"] = t.bos_id if t is not None else None
    cfg["eos_id"] = t.eos_id if t is not None else None
    model = ModelDir.create(
        outdir, blob=info, tokenizer=tok_name, config=cfg, recipe=dict(qm.recipe),
        quantization={"default_format": fmt, "group_size": group_size, "overrides": list(recipe.quant),
                      "scales": scales},
        kv=kv,
        draft=None if qm.draft is None else {"source": str(qm.draft.qm.source), "kv": qm.draft.kv,
                                             "config": asdict(qm.draft.qm.config)},
        source=str(qm.source or ir.source or ckpt), quality=rep, device_tokenizer=enc_about,
        stop_ids=list(qm.stops.ids), stop_source=qm.stops.source, head_index=index_report,
        expert_use=experts_report,
        convert={"checkpoint": name or str(ckpt.resolve()), "named": name is not None,
                 "tokenizer_given": tokenizer_given, "format": fmt,
                 "group_size": group_size, "quant": list(recipe.quant), "scales": scales, "calibrate": calibrate,
                 "kv": kv, "ctx": context,
                 "batch": batch, "draft": str(checkpoint_of(draft).resolve()) if draft is not None else None,
                 "head_index": head_index})
    console.print(f"  {info.size:,} bytes, model {model.model_hash[:16]}, layout {info.layout_id}")
    console.print(f"[green]wrote[/] {outdir}/ ({BLOB_NAME}, {tok_name or 'no tokenizer'}, {MANIFEST}"
                  + (", quality.json)" if rep is not None else ")"))
    return model


class _TimeLeft:
    """The time left at ``done`` of ``total`` (", about N min left"), from the rate since the first call:
    the set-up before it does not repeat."""

    def __init__(self):
        self.first: tuple[int, float] | None = None

    def __call__(self, done: int, total: int) -> str:
        now = time.monotonic()
        if self.first is None:
            self.first = (done, now)
        d0, t1 = self.first
        if not d0 < done < total:
            return ""
        minutes = (now - t1) / (done - d0) * (total - done) / 60
        return f", about {minutes:.0f} min left" if minutes >= 0.5 else ", under a minute left"


def _trained(console, ir, nearest, fmt, group_size, overrides, scales):
    """The model quantized from weights qat.train distilled from fp32 against ``nearest``'s recipe."""
    t0 = time.monotonic()
    console.print("  quantization-aware training takes minutes (--calibrate gptq: seconds, at KL ~3x higher on q4)")
    with console.status(f"quantization-aware training: fp32 sampling {qat.POSITIONS:,} positions of its own text") as st:
        # a line every tenth of the text and every 50 steps too: a log without the live status sees it working
        text_left, steps_left, tenths = _TimeLeft(), _TimeLeft(), []

        def say_text(done, total):
            text = f"fp32 sampled {done:,} of {total:,} positions of its own text ({time.monotonic() - t0:.0f} s" \
                   f"{text_left(done, total)})"
            st.update(f"quantization-aware training: {text}")
            if 10 * done // total > len(tenths):
                tenths.append(done)
                console.print(f"  {text}")

        def say(i, n, loss):
            text = f"step {i}/{n}, KL to fp32 {loss:.4f} ({time.monotonic() - t0:.0f} s{steps_left(i, n)})"
            st.update(f"quantization-aware training: {text}")
            console.print(f"  {text}")
        trained, grids = qat.train(ir, nearest, say=say, say_text=say_text)
        qm = Q.quantize(trained, default_format=fmt, group_size=group_size, overrides=overrides, scales=scales,
                        grids=grids)
    console.print(f"  trained {qat.STEPS} steps on {qat.POSITIONS:,} positions in {time.monotonic() - t0:.0f} s")
    return qm


def _head_index(console, qm, mode: str) -> dict:
    """Give qm the greedy head's tile index as ``mode`` says: ``auto`` calibrates and keeps it when it
    pays (converter/headcalib.py), ``on`` keeps the best tiling whatever it costs, ``off`` none."""
    if mode == "off":
        console.print("  head index: none (--head-index off): greedy steps compute the whole head")
        return {"kept": False, "reason": "--head-index off"}
    step(console, "calibrating the greedy head's tile index")
    t0 = time.monotonic()
    with console.status("greedy steps through the reference, then each tile size"):
        index, rep = headcalib.calibrate(qm, force=mode == "on")
    rep["seconds"] = round(time.monotonic() - t0, 1)
    for size, r in rep["tile_sizes"].items():
        console.print(f"  tiles of {size:>2} ({r['n_tiles']} tiles): {r['rows_pct']:.1f} % of the rows visited; cost vs the "
                      f"whole head: " + ", ".join(f"{k} {v:.3f}" for k, v in r["cost_ratio"].items()),
                      markup=False, soft_wrap=True)
    qm.head_index = index
    console.print(f"  head index {'kept' if index is not None else 'left out'}: {rep['reason']} "
                  f"({rep['steps']} greedy steps, {rep['seconds']} s)", markup=False, soft_wrap=True)
    return rep


def _expert_use(console, qm, ckpt: Path) -> dict:
    """Calibrate how often each expert is chosen (converter/expertuse.py) on the held-out text beside the
    checkpoint (eval.txt), else on the model's own text; the blob carries it for the planner."""
    step(console, "calibrating the experts' use")
    t0 = time.monotonic()
    text = ckpt.parent / "eval.txt"
    with console.status("routing tokens through the reference"):
        qm.expert_use = use = expertuse.calibrate(qm, text if text.is_file() else None)
    shares = use.shares()
    for layer, row in enumerate(shares):
        console.print(f"  layer {layer}: " + ", ".join(f"expert {e} {100 * v:.1f} %" for e, v in enumerate(row)),
                      markup=False)
    console.print(f"  share of tokens reading each expert, on {use.source} ({time.monotonic() - t0:.1f} s)",
                  markup=False, soft_wrap=True)
    return {"tokens": use.tokens, "source": use.source, "share": shares}


def attach_draft(console, qm, draft, recipe: Recipe):
    """qm carrying the draft model at ``draft`` (a checkpoint, or a `flashlm train` folder),
    quantized like qm (its default format, group size and scales; no per-tensor overrides): what
    `flashlm run --speculate draft` proposes tokens with."""
    path = checkpoint_of(draft)
    if not path.is_file():
        raise UserError(f"draft model {draft} does not exist (a checkpoint, or a flashlm train folder)")
    step(console, f"adding the draft model {path}")
    d = Q.quantize(load_model(str(path)), default_format=recipe.fmt, group_size=recipe.group_size,
                   scales=recipe.scales)
    out = attach(qm, d)
    c = out.draft.qm.config
    console.print(f"  draft: dim {c.dim}, {c.n_layers} layers, {c.n_params():,} parameters, KV cache {out.draft.kv}")
    return out
