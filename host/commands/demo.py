"""``flashlm demo``: the shipped model converted, built and run on a virtual board in one command."""
from __future__ import annotations

from pathlib import Path

from ..boards.builds import ensure_firmware
from ..boards.virtual import check_virtual_board
from ..errors import UserError
from ..link.messages import Generate
from ..output.export import Outputs
from ..session.recovery import Policy
from .convert import convert
from .prompt import encode_prompt
from .recipe import Recipe
from .run import Target, run

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "default" / "model.pt"


def demo(console, board: str, prompt: str, max_tokens: int, out, timeout: float = 10.0,
         xip_model: bool = True) -> int:
    check_virtual_board(board)
    model = DEFAULT_MODEL
    if not model.is_file():
        raise UserError(f"the default model {model} is not there (make it with "
                        f"'flashlm train --out {model.parent}')")
    tok = model.parent / "tokenizer.json"
    out = Path(out)
    console.rule("[bold]flashlm demo[/]: 1/3 convert")
    console.print(f"converting {model} (q8, group 32) into {out}/")
    converted = convert(console, model, out, Recipe("q8", 32), tokenizer=tok if tok.is_file() else None)
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
