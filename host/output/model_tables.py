"""The tables of ``flashlm convert`` (quantization quality) and ``flashlm eval`` (loss, perplexity
and top-1 agreement of fp32, int8 and int4)."""
from __future__ import annotations

from rich.table import Table


def print_quality(console, rep: dict) -> None:
    t = Table(title="quantization quality (weights vs fp32)", title_justify="left")
    for col, just in (("tensor", "left"), ("format", "left"), ("group", "right"),
                      ("rel RMSE", "right"), ("max |err|", "right")):
        t.add_column(col, justify=just)
    for r in rep.get("tensors", []):
        t.add_row(r["name"], r["format"], str(r["group_size"]), f"{r['rel_rmse']:.4f}", f"{r['max_abs_err']:.4g}")
    console.print(t)
    if "top1_agreement" in rep:
        console.print(f"logits over {rep.get('positions', '?')} positions of fp32's own sampled text, device "
                      f"numerics ({rep.get('kv', '?')} KV cache): top-1 agreement "
                      f"[bold]{rep['top1_agreement'] * 100:.1f}%[/], mean KL(fp32 || quantized) "
                      f"[bold]{rep.get('kl_mean', float('nan')):.5f}[/] nats, extra cross-entropy "
                      f"[bold]{rep.get('delta_ce', float('nan')):+.4f}[/] nats/token")
    if "router_agreement" in rep:
        console.print(f"experts: the quantized model's routers choose the fp32 model's experts in "
                      f"[bold]{rep['router_agreement'] * 100:.1f}%[/] of (position, layer) choices")


def print_eval(console, rep: dict) -> None:
    split = rep["param_split"]
    console.print(f"{rep['checkpoint']}: {rep['n_params']:,} parameters"
                  + (f" (PLE table {split['table']:,}, core {split['core']:,})" if split["table"] else "")
                  + (f" ({split['experts']:,} in experts, {split['active']:,} read per token)" if "experts" in split
                     else ""),
                  soft_wrap=True)
    t = Table(title=f"held-out {rep['eval_text']}: the first {rep['targets_window']:,} of {rep['targets_available']:,} "
                    f"targets ({rep['chars']:,} characters)"
                    + (f", {rep['skipped_unpredictable']:,} targets the head cannot predict skipped"
                       if rep["skipped_unpredictable"] else ""), title_justify="left")
    for col, just in (("model", "left"), ("recipe", "left"), ("loss (nats)", "right"), ("perplexity", "right"),
                      ("bits/char", "right"), ("top-1 = fp32", "right")):
        t.add_column(col, justify=just)
    for r in rep["rows"]:
        agree = "-" if r["top1_agreement"] is None else f"{r['top1_agreement'] * 100:.2f}%"
        t.add_row(r["model"], r["recipe"], f"{r['loss']:.4f}", f"{r['ppl']:.2f}", f"{r['bits_per_char']:.4f}",
                  agree)
    console.print(t)
    console.print("fp32: the PyTorch model; int8/int4: the NumPy reference (what the device computes)")


def print_fidelity(console, rep: dict) -> None:
    t = Table(title=f"{rep.get('model', '')}: each recipe against fp32, device numerics; teacher-forced over "
                    f"{rep['positions']:,} positions of fp32's own sampled text, greedy over {rep['prompts']} prompts "
                    f"x {rep['tokens']} tokens", title_justify="left")
    for col, just in (("recipe", "left"), ("bits/weight", "right"), ("top-1", "right"), ("KL (nats)", "right"),
                      ("ΔCE (nats/token)", "right"), ("greedy = fp32 (median tokens)", "right")):
        t.add_column(col, justify=just)
    for r in rep["rows"]:
        g = r["greedy"]
        t.add_row(f"{r['label']} ({r['recipe']})", f"{r['bits_per_weight']:.2f}", f"{r['top1_agreement'] * 100:.1f}%",
                  f"{r['kl_mean']:.5f}", f"{r['delta_ce']:+.4f}",
                  f"{g['median']:.0f} of {g['tokens']}" if g["prompts"] else "-")
    console.print(t)
