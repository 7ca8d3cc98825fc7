"""``flashlm demo``: the shipped model converted, built and run on a virtual board in one command."""
from __future__ import annotations

from pathlib import Path

from .cmd_build import ensure_native_binary
from .cmd_convert import convert
from .cmd_run import check_virtual_board, run
from .errors import UserError
from .model_dir import load_manifest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "default" / "model.pt"


def cmd_demo(args, console) -> int:
    check_virtual_board(args.board)
    model = DEFAULT_MODEL
    if not model.is_file():
        raise UserError(f"the default model {model} is not there (make it with "
                        f"'flashlm train --out {model.parent}')")
    tok = model.parent / "tokenizer.json"
    out = Path(args.output)
    console.rule("[bold]flashlm demo[/]: 1/3 convert")
    console.print(f"converting {model} (q8, group 32) into {out}/")
    convert(console, model, out, tokenizer=tok if tok.is_file() else None, fmt="q8", group_size=32)
    console.rule("[bold]flashlm demo[/]: 2/3 build")
    _, manifest = load_manifest(out)
    ensure_native_binary(console, out, manifest, board=args.board)
    console.rule("[bold]flashlm demo[/]: 3/3 run")
    console.print(f"prompt {args.prompt!r}, up to {args.max_tokens} tokens, greedy, on {args.board}")
    rc = run(console, out, prompt=args.prompt, board=args.board, max_tokens=args.max_tokens,
             json_path=out / "run.json", csv_path=out / "run.csv", png_path=out / "run.png",
             timeout=args.timeout, xip_model=args.xip_model == "on")
    if rc == 0:
        console.print(f"[green]demo done[/]: {out}/run.json, run.csv, run.png")
    return rc
