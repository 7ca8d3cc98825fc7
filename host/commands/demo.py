"""``flashlm demo``: a model converted, built and run on a virtual board in one command: the shipped
model, or one by name (``stories260K``: pulled once) or path. On a board whose RAM does not hold the
model's whole context, the model is converted with the longest context that fits (the planner's)."""
from __future__ import annotations

from pathlib import Path

from converter.planner import NoFit, plan

from ..boards.builds import ensure_firmware
from ..boards.virtual import check_virtual_board
from ..defaults import DEFAULT_BATCH, KV_DEFAULT
from ..errors import UserError
from ..link.messages import Generate
from ..output.export import Outputs
from ..session.recovery import Policy
from .convert import convert
from .model_source import load_spec
from .prompt import encode_prompt
from .pull import resolve_model
from .recipe import Recipe
from .run import Target, run

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "default" / "model.pt"
RECIPE = Recipe("q8", 32)


def _default_model() -> tuple[Path, Path | None]:
    if not DEFAULT_MODEL.is_file():
        raise UserError(f"the default model {DEFAULT_MODEL} is not there (make it with "
                        f"'flashlm train --out {DEFAULT_MODEL.parent}')")
    tok = DEFAULT_MODEL.parent / "tokenizer.json"
    return DEFAULT_MODEL, tok if tok.is_file() else None


def fitting_context(console, checkpoint, tokenizer, board: str) -> int | None:
    """None when the model fits ``board`` as convert writes it (its default KV cache, convert's batch);
    else the longest context that does, said on the console."""
    if board == "native":
        return None
    spec, _ = load_spec(checkpoint, RECIPE, tokenizer=tokenizer)
    try:
        plan(spec, board, kv=KV_DEFAULT, batch=DEFAULT_BATCH)
        return None
    except NoFit as e:
        ctx = next((fix["ctx"] for fix in e.fixes if set(fix) == {"ctx"}), None)
        if ctx is None:
            raise
    console.print(f"context {ctx} of the model's {spec.config.max_seq_len} tokens: the longest that fits "
                  f"{board}'s RAM with a {KV_DEFAULT} KV cache and batches of {DEFAULT_BATCH} (planned)")
    return ctx


def demo(console, board: str, prompt: str, max_tokens: int, out, timeout: float = 10.0,
         xip_model: bool = True, model=None, tokenizer=None) -> int:
    """``model``: None (the shipped model), a catalogue name, hf:REPO[@REV] or a checkpoint path;
    ``tokenizer``: a checkpoint's tokenizer file."""
    check_virtual_board(board)
    ckpt, tok = _default_model() if model is None else resolve_model(console, model, tokenizer)
    out = Path(out)
    console.rule("[bold]flashlm demo[/]: 1/3 convert")
    context = fitting_context(console, ckpt, tok, board)
    console.print(f"converting {model or ckpt} (q8, group 32) into {out}/")
    converted = convert(console, ckpt, out, RECIPE, tokenizer=tok, context=context)
    console.rule("[bold]flashlm demo[/]: 2/3 build")
    ensure_firmware(console, converted, board)
    console.rule("[bold]flashlm demo[/]: 3/3 run")
    console.print(f"prompt {prompt!r}, up to {max_tokens} tokens, greedy, on {board}")
    ids, _ = encode_prompt(converted, prompt, None)
    rc = run(console, converted, Generate(ids, max_tokens), Target(board=board, xip_model=xip_model),
             Outputs(out / "run.json", out / "run.csv", out / "run.png"),
             Policy(frame_timeout=timeout, handshake_timeout=timeout))
    if rc == 0:
        console.print(f"[green]demo done[/]: {out}/run.json, run.csv, run.png")
    return rc
