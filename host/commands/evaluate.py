"""``flashlm eval``: loss, perplexity and top-1 agreement of fp32, int8 and int4 on held-out text."""
from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from converter.evaluate import evaluate

from ..files import write_json
from ..output.model_tables import print_eval


def run_eval(console, model, targets: int | None, group_size: int, text=None, json_path: Path | None = None) -> int:
    """Score ``model`` (a `flashlm train` folder or a checkpoint) on its first ``targets``
    predictions (None: all) of ``text`` (default: eval.txt beside the checkpoint)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("predictions"),
                  TimeRemainingColumn(), console=console) as bar:
        def progress(what: str, total: int):
            task = bar.add_task(f"scoring {what}", total=total)
            return lambda done: bar.update(task, completed=done)
        rep = evaluate(model, targets=targets, group_size=group_size, text=text, progress=progress)
    print_eval(console, rep)
    if json_path:
        write_json(json_path, rep)
    return 0
