"""``flashlm train`` (delegated to converter.train) and ``flashlm eval`` (loss, perplexity and top-1
agreement of fp32, int8 and int4 on held-out text)."""
from __future__ import annotations

import json
from pathlib import Path

from .args import Parser


def cmd_eval(args, console) -> int:
    from converter.evaluate import evaluate
    from rich.table import Table

    from .report import atomic_write_bytes
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("predictions"),
                  TimeRemainingColumn(), console=console) as bar:
        def progress(what: str, total: int):
            task = bar.add_task(f"scoring {what}", total=total)
            return lambda done: bar.update(task, completed=done)
        rep = evaluate(args.model, targets=args.targets or None, group_size=args.group_size, text=args.text,
                       progress=progress)
    split = rep["param_split"]
    console.print(f"{rep['checkpoint']}: {rep['n_params']:,} parameters"
                  + (f" (PLE table {split['table']:,}, core {split['core']:,})" if split["table"] else ""),
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
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps(rep, indent=1) + "\n").encode())
    return 0


def cmd_train(args, console, extra) -> int:
    from converter import train
    p = Parser(prog="flashlm train", description="Train a small model (converter.train).")
    train.add_arguments(p)
    return train.main_train(p.parse_args(extra))
