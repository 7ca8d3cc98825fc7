"""``python -m bench.ple_vs_dense``: does a Per-Layer-Embedding table buy quality at an equal core?

The shipped ``models/ple`` (most parameters in the PLE table) and ``models/ple-dense`` (the same
family without PLE, its FFN widened so the core -- every parameter outside the table -- matches
within 1%) were trained with the same recipe, steps, seed and tokenizer on the same corpus. This
recomputes, from the shipped checkpoints:

* eval loss, perplexity and bits/char of each over the whole held-out ``eval.txt`` in fp32
  (PyTorch; the same numbers ``converter.train.evaluate_dir`` gives);
* with ``--targets N``, also int8 and int4 over the first N targets through the NumPy reference
  (``flashlm eval``; tens of ms a token);
* what a token reads per memory tier and the predicted tok/s on the Raspberry Pi Pico profile
  (boards/pico.toml) with the convert defaults (q8, group 32, the table int4): planner
  PREDICTIONS from the board profile, not measurements.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"ple": ROOT / "models" / "ple", "ple-dense": ROOT / "models" / "ple-dense"}
BOARD = "pico"


def measure(targets: int = 0) -> dict:
    """Per model: parameters (table/core), fp32 eval over all of eval.txt, optionally the int8/int4
    rows of ``flashlm eval`` over the first ``targets`` targets, and the Pico plan's bytes per token."""
    import torch

    from converter.corpus import split_docs
    from converter.costmodel import ModelSpec
    from converter.evaluate import evaluate
    from converter.planner import plan
    from converter.quantize import quantize
    from converter.torch_import import load_checkpoint
    from converter.train import evaluate_dir

    torch.set_num_threads(2)
    out: dict = {"board": BOARD, "recipe": "q8 g32 (ple.table q4)", "models": {}}
    for name, d in MODELS.items():
        loss, n, ck = evaluate_dir(d)
        chars = sum(map(len, split_docs((d / "eval.txt").read_text(encoding="utf-8"))))
        ir = load_checkpoint(d / "model.pt")
        c = ir.config
        pl = plan(ModelSpec.from_quant(quantize(ir, "q8", 32), str(d)), BOARD, head="full")
        m = dict(params=c.n_params(), **c.param_split(), eval_loss=loss, eval_ppl=math.exp(loss),
                 eval_tokens=n, eval_bits_per_char=loss * n / (chars * math.log(2)),
                 train_steps=ck["train"]["steps"], train_tokens=ck["train"]["tokens_seen"],
                 blob_bytes=pl.spec.blob_bytes, flash_budget=pl.budget["flash"],
                 bytes_per_token_predicted=dict(pl.prediction.bytes_read),
                 tok_s_predicted=pl.prediction.tok_s, position=pl.pos,
                 in_sram=[t for t in pl.staged("sram")])
        if targets:
            m["quantized"] = evaluate(d, targets=targets)["rows"]
        out["models"][name] = m
    p, q = out["models"]["ple"], out["models"]["ple-dense"]
    out["core_ratio"] = p["core"] / q["core"]
    out["loss_gain_nats"] = q["eval_loss"] - p["eval_loss"]
    return out


def section(work: Path) -> dict:
    """make bench's ple_vs_dense section (fp32 eval only: the quantized rows take minutes)."""
    r = measure()
    p, q = r["models"]["ple"], r["models"]["ple-dense"]
    return {"ple_vs_dense": r, "ratios": {"PLE/dense eval perplexity at an equal core": p["eval_ppl"] / q["eval_ppl"],
                                          "PLE/dense predicted Pico flash bytes per token":
                                              p["bytes_per_token_predicted"]["flash"] / q["bytes_per_token_predicted"]["flash"]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ple_vs_dense", description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=0, metavar="N",
                    help="also score int8 and int4 through the reference over the first N targets (default: off)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    for name, d in MODELS.items():
        if not (d / "model.pt").is_file():
            print(f"python -m bench.ple_vs_dense: error: {d / 'model.pt'} is missing "
                  f"(train it: python -m converter.train --preset {name} --out {d})")
            return 2
    r = measure(args.targets)
    print("PLE vs dense at an equal core, trained alike on the same corpus; held-out eval.txt, fp32 (PyTorch)")
    print(f"{'model':<11}{'params':>11}{'table':>11}{'core':>9}{'eval loss':>11}{'ppl':>8}{'bits/char':>11}")
    for name, m in r["models"].items():
        print(f"{name:<11}{m['params']:>11,}{m['table']:>11,}{m['core']:>9,}{m['eval_loss']:>11.4f}"
              f"{m['eval_ppl']:>8.2f}{m['eval_bits_per_char']:>11.4f}")
    print(f"core ple/dense = {r['core_ratio']:.4f}; PLE lowers the eval loss by {r['loss_gain_nats']:.4f} nats "
          f"over {r['models']['ple']['eval_tokens']:,} tokens")
    if args.targets:
        print(f"quantized, first {args.targets:,} targets (NumPy reference; top-1 = agreement with fp32):")
        for name, m in r["models"].items():
            print("  " + name + ": " + "; ".join(f"{q['model']} loss {q['loss']:.4f} ppl {q['ppl']:.2f}"
                                                  + (f" top-1 {q['top1_agreement'] * 100:.1f}%"
                                                     if q["top1_agreement"] is not None else "")
                                                  for q in m["quantized"]))
    print(f"PREDICTED per token on {r['board']} (planner, board profile; {r['recipe']}, position "
          f"{r['models']['ple']['position']}, whole head):")
    for name, m in r["models"].items():
        b = m["bytes_per_token_predicted"]
        print(f"  {name:<10} blob {m['blob_bytes']:,} of {m['flash_budget']:,} B flash; reads "
              + ", ".join(f"{k} {v:,} B" for k, v in b.items()) + f"; {m['tok_s_predicted']:.2f} tok/s")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
