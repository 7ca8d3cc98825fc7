"""A prompt (--prompt text or --prompt-ids) turned into what the board is sent, checked against the
model before anything is sent."""
from __future__ import annotations

from converter.tokenizer import encode

from ..errors import UserError
from ..model_dir import ModelDir


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


def encode_prompt(model: ModelDir, prompt: str | None, prompt_ids: str | None) -> tuple[list[int], object]:
    """Token ids for --prompt / --prompt-ids, checked against the model before anything is sent;
    and the model's tokenizer (None where there is none and ids were given)."""
    if prompt_ids is not None:
        ids = parse_ids(prompt_ids)
        tok = model.tokenizer(required=False)
    else:
        if prompt == "":
            raise UserError("the prompt is empty")
        tok = model.tokenizer(required=True)
        ids = list(encode(tok, prompt, bos=True))
        if not ids:
            raise UserError("the prompt encodes to no tokens")
    bad = [i for i in ids if not 0 <= i < model.vocab_size]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the model's vocabulary of {model.vocab_size}")
    check_prompt_length(len(ids), model.max_seq_len, "the model's")
    return ids, tok


def text_prompt(model: ModelDir, prompt: str | None, prompt_ids: str | None) -> tuple[str, object]:
    """--prompt for the board to encode (--encode-on device): checked against what the model's
    blob says its device encoder can take before anything is sent; and the model's tokenizer."""
    if prompt_ids is not None:
        raise UserError("--encode-on device encodes a --prompt text; --prompt-ids are ids already")
    if prompt == "":
        raise UserError("the prompt is empty")
    # the blob reader and the encoder's Unicode tables: only --encode-on device needs them
    from converter.blob import read_header
    from converter.tokenizer_enc import section_info
    info = section_info(model.blob, read_header(model.blob))
    if info is None:
        why = model.device_tokenizer or "its blob has no tokenizer.enc section"
        raise UserError(f"the model in {model.path} cannot be encoded on the board ({why}); "
                        f"use --encode-on host")
    ctx, n = model.max_seq_len, len(prompt.encode("utf-8"))
    if n > info.text_capacity(ctx):
        raise UserError(f"prompt is {n} bytes: more than the model's context of {ctx} tokens holds "
                        f"(a token covers at most {info.span} bytes); shorten the prompt")
    return prompt, model.tokenizer(required=False)


def check_prompt_length(n: int, ctx: int, whose: str) -> None:
    if n > ctx:
        raise UserError(f"prompt is {n} tokens but {whose} context is {ctx} tokens; shorten the prompt")
