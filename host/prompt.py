"""A prompt (--prompt text or --prompt-ids) turned into what the board is sent, checked against the
model before anything is sent."""
from __future__ import annotations

from pathlib import Path

from .errors import UserError
from .model_dir import load_model_tokenizer

DEFAULT_PROMPT = "Once upon a time"


def parse_ids(text: str) -> list[int]:
    parts = [p for p in text.replace(",", " ").split()]
    if not parts:
        raise UserError("--prompt-ids is empty; give token ids like 1,2,3")
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise UserError(f"--prompt-ids: {bad!r} is not an integer token id") from None
    return ids


def encode_prompt(args, model_dir: Path, manifest: dict) -> tuple[list[int], object]:
    """Token ids for --prompt / --prompt-ids, checked against the model before anything is sent."""
    cfg = manifest["config"]
    vocab, ctx = int(cfg["vocab_size"]), int(cfg["max_seq_len"])
    if args.prompt_ids is not None:
        ids = parse_ids(args.prompt_ids)
        tok = load_model_tokenizer(model_dir, manifest, required=False)
    else:
        if args.prompt == "":
            raise UserError("the prompt is empty")
        tok = load_model_tokenizer(model_dir, manifest, required=True)
        from converter.tokenizer import encode
        ids = list(encode(tok, args.prompt, bos=True))
        if not ids:
            raise UserError("the prompt encodes to no tokens")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the model's vocabulary of {vocab}")
    check_prompt_length(len(ids), ctx, "the model's")
    return ids, tok


def text_prompt(prompt, prompt_ids, model_dir: Path, manifest: dict) -> tuple[str, object]:
    """--prompt for the board to encode (--encode-on device): checked against what the model's
    blob says its device encoder can take before anything is sent."""
    if prompt_ids is not None:
        raise UserError("--encode-on device encodes a --prompt text; --prompt-ids are ids already")
    if prompt == "":
        raise UserError("the prompt is empty")
    from converter.blob import read_header
    from converter.tokenizer_enc import section_info
    blob = model_dir / manifest["blob"]
    info = section_info(blob, read_header(blob))
    if info is None:
        why = manifest.get("device_tokenizer") or "its blob has no tokenizer.enc section"
        raise UserError(f"the model in {model_dir} cannot be encoded on the board ({why}); "
                        f"use --encode-on host")
    ctx, n = int(manifest["config"]["max_seq_len"]), len(prompt.encode("utf-8"))
    if n > info.text_capacity(ctx):
        raise UserError(f"prompt is {n} bytes: more than the model's context of {ctx} tokens holds "
                        f"(a token covers at most {info.span} bytes); shorten the prompt")
    return prompt, load_model_tokenizer(model_dir, manifest, required=False)


def check_prompt_length(n: int, ctx: int, whose: str) -> None:
    if n > ctx:
        raise UserError(f"prompt is {n} tokens but {whose} context is {ctx} tokens; shorten the prompt")
