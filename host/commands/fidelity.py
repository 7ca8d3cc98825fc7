"""``flashlm eval --fidelity``: every recipe against fp32 with the device's numerics (converter/fidelity.py)."""
from __future__ import annotations

from pathlib import Path

from converter.fidelity_recipes import measure
from converter.load import load_model

from ..files import write_json
from ..output.console import step
from ..output.model_tables import print_fidelity
from .pull import resolve_model


def run_fidelity(console, model, tokenizer, positions: int, prompts: int, tokens: int,
                 json_path: Path | None = None) -> int:
    ckpt, tokenizer = resolve_model(console, model, tokenizer)
    step(console, f"loading {ckpt}")
    ir = load_model(str(ckpt), tokenizer_path=str(tokenizer) if tokenizer else None)
    with console.status("measuring") as status:
        rep = measure(ir, positions=positions, prompts=prompts, tokens=tokens, say=status.update)
    rep["model"] = str(model)
    print_fidelity(console, rep)
    if json_path:
        write_json(json_path, rep)
    return 0
