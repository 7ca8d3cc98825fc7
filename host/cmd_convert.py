"""``flashlm convert``: a checkpoint into a model directory (quantized flash image, tokenizer,
manifest, quality report)."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from .console import step
from .errors import UserError
from .model_dir import BLOB_NAME, MANIFEST, checkpoint_of


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
    from converter.tokenizer import tokenizer_bin_bytes

    from .report import atomic_write_bytes
    if tok.hf_json:
        atomic_write_bytes(outdir / "tokenizer.json", tok.hf_json.encode("utf-8"))
        return "tokenizer.json"
    atomic_write_bytes(outdir / "tokenizer.bin", tokenizer_bin_bytes(tok))   # llama2.c format
    return "tokenizer.bin"


def _print_quality(console, rep: dict) -> None:
    from rich.table import Table
    t = Table(title="quantization quality (weights vs fp32)", title_justify="left")
    for col, just in (("tensor", "left"), ("format", "left"), ("group", "right"),
                      ("rel RMSE", "right"), ("max |err|", "right")):
        t.add_column(col, justify=just)
    for r in rep.get("tensors", []):
        t.add_row(r["name"], r["format"], str(r["group_size"]), f"{r['rel_rmse']:.4f}", f"{r['max_abs_err']:.4g}")
    console.print(t)
    if "top1_agreement" in rep:
        console.print(f"logits over {rep.get('positions', '?')} positions: top-1 agreement "
                      f"[bold]{rep['top1_agreement'] * 100:.1f}%[/], mean KL(fp32 || quantized) "
                      f"[bold]{rep.get('kl_mean', float('nan')):.5f}[/] nats")


DEFAULT_BATCH = 4   # tokens per forward pass convert records: prefill chunks, speculative verification


def convert(console, checkpoint, outdir, tokenizer=None, fmt="q8", group_size=32, quant=(),
            report=True, scales=None, kv="int8", context=None, batch=DEFAULT_BATCH, draft=None,
            head_index="auto") -> dict:
    """Checkpoint -> OUTDIR/{model.flmb, tokenizer.*, manifest.json, quality.json}; returns the manifest.
    ``context``: the positions the converted model holds (default: the checkpoint's); ``head_index``:
    auto, on or off (the greedy head's tile index, see _head_index)."""
    from dataclasses import asdict

    ckpt = checkpoint_of(checkpoint)
    if not ckpt.exists():
        raise UserError(f"checkpoint {ckpt} does not exist")
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise UserError(f"tokenizer {tokenizer} does not exist")
    from converter import quantize as Q
    overrides = Q.parse_overrides(list(quant or ()))          # fail fast, before the slow part
    Q.check_group_size(group_size, scales or "row")
    from converter.blob import write_blob
    from converter.fidelity import quality_report
    from converter.formats import StateTiers
    from converter.load import load_model

    from .report import atomic_write_bytes

    outdir = Path(outdir)
    step(console, f"loading {ckpt}")
    with console.status(f"loading {ckpt.name}"):
        ir = load_model(str(ckpt), tokenizer_path=str(tokenizer) if tokenizer else None, context=context)
    c = ir.config
    split = c.param_split()
    console.print(f"  dim {c.dim}, {c.n_layers} layers, {c.n_heads}/{c.n_kv_heads} heads, hidden {c.hidden_dim}, "
                  f"vocab {c.vocab_size}" + (f" (predicts {c.n_out})" if c.n_out != c.vocab_size else "")
                  + (f", PLE dim {c.ple_dim}" if c.ple_dim else "") + f", context {c.max_seq_len}, "
                  f"{c.n_params():,} parameters" + (f" ({split['table']:,} in the PLE table)" if split["table"] else ""))
    step(console, f"quantizing to {fmt} (group {group_size}, {scales or 'row'} scales)"
          + (f" with {len(overrides)} override(s)" if overrides else ""))
    with console.status("quantizing"):
        qm = Q.quantize(ir, default_format=fmt, group_size=group_size, overrides=overrides, scales=scales)
    rep = None
    if report:
        step(console, "measuring quality (quantized vs fp32 logits)")
        with console.status("running both models"):
            rep = quality_report(ir, qm)
        _print_quality(console, rep)
    index_report = _head_index(console, qm, head_index)
    if draft is not None:
        qm = attach_draft(console, qm, draft, fmt, group_size, scales)
    outdir.mkdir(parents=True, exist_ok=True)
    step(console, f"writing {outdir / BLOB_NAME}")
    info = write_blob(qm, outdir / BLOB_NAME, state=StateTiers(kv=kv, batch=batch))
    tok_name = _write_tokenizer(ir, tokenizer, outdir)
    if tok_name is None:
        console.print("  [yellow]no tokenizer: runs of this model need --prompt-ids[/]")
    from converter.tokenizer_enc import device_section
    enc, enc_about = device_section(qm.tokenizer, c)     # the same call build_blob made
    console.print(f"  device tokenizer (text prompts encoded on the board): "
                  f"{enc_about if enc is not None else 'none, ' + enc_about}", markup=False, soft_wrap=True)
    console.print(f"  stop ids: {qm.stops.describe()}", markup=False, soft_wrap=True)
    from converter.blob import read_golden
    g = read_golden((outdir / BLOB_NAME).read_bytes())
    console.print(f"  golden check (the board repeats the reference's steps): prompt {list(g.prompt)}, "
                  + ", ".join(f"{len(r)} steps with the {kv} KV cache" for kv, r in g.blocks.items())
                  + f"; {g.boot_steps} at boot", markup=False, soft_wrap=True)
    cfg = asdict(c)
    t = qm.tokenizer
    cfg["bos_id"] = t.bos_id if t is not None else None
    cfg["eos_id"] = t.eos_id if t is not None else None
    manifest = {
        "format": "flashlm-model", "version": 1,
        "blob": BLOB_NAME, "blob_size": info.size, "blob_crc": info.crc,
        "tokenizer": tok_name,
        "model_hash": bytes(info.model_hash).hex(), "layout_id": info.layout_id,
        "config": cfg,
        "recipe": dict(qm.recipe),
        "quantization": {"default_format": fmt, "group_size": group_size, "overrides": list(quant or ()),
                         "scales": scales},
        "kv": kv,
        "batch": batch,
        "draft": None if qm.draft is None else {"source": str(qm.draft.qm.source), "kv": qm.draft.kv,
                                                "config": asdict(qm.draft.qm.config)},
        "source": str(qm.source or ir.source or ckpt),
        "quality": "quality.json" if rep is not None else None,
        "device_tokenizer": enc_about,
        "stop_ids": list(qm.stops.ids), "stop_source": qm.stops.source,
        "head_index": index_report,
    }
    if rep is not None:
        atomic_write_bytes(outdir / "quality.json", (json.dumps(rep, indent=1) + "\n").encode())
    atomic_write_bytes(outdir / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    console.print(f"  {info.size:,} bytes, model {manifest['model_hash'][:16]}, layout {info.layout_id}")
    console.print(f"[green]wrote[/] {outdir}/ ({BLOB_NAME}, {tok_name or 'no tokenizer'}, {MANIFEST}"
                  + (", quality.json)" if rep is not None else ")"))
    return manifest


def _head_index(console, qm, mode: str) -> dict:
    """Give qm the greedy head's tile index as ``mode`` says: ``auto`` calibrates and keeps it when it
    pays (converter/headcalib.py), ``on`` keeps the best tiling whatever it costs, ``off`` none."""
    if mode == "off":
        console.print("  head index: none (--head-index off): greedy steps compute the whole head")
        return {"kept": False, "reason": "--head-index off"}
    from converter import headcalib
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


def cmd_convert(args, console) -> int:
    convert(console, args.checkpoint, args.output, tokenizer=args.tokenizer, fmt=args.format,
            group_size=args.group_size, quant=args.quant, scales=args.scales, report=not args.no_report,
            kv=args.kv, context=args.ctx, batch=args.batch, draft=args.draft, head_index=args.head_index)
    return 0


def attach_draft(console, qm, draft, fmt, group_size, scales):
    """qm carrying the draft model at ``draft`` (a checkpoint, or a `flashlm train` folder),
    quantized like qm: what `flashlm run --speculate draft` proposes tokens with."""
    from converter.draft import attach
    from converter.load import load_model
    from converter.quantize import quantize
    path = checkpoint_of(draft)
    if not path.is_file():
        raise UserError(f"draft model {draft} does not exist (a checkpoint, or a flashlm train folder)")
    step(console, f"adding the draft model {path}")
    d = quantize(load_model(str(path)), default_format=fmt, group_size=group_size, scales=scales)
    out = attach(qm, d)
    c = out.draft.qm.config
    console.print(f"  draft: dim {c.dim}, {c.n_layers} layers, {c.n_params():,} parameters, KV cache {out.draft.kv}")
    return out
