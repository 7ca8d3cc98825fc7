"""``flashlm pull`` and the model names commands take where they take a path: a catalogue name
(host/catalogue.py) or ``hf:REPO[@REVISION]`` (any Hugging Face Llama-family folder), fetched into the
Hugging Face cache and checked (host/hub.py). A path that exists is always the path."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..catalogue import CATALOGUE
from ..errors import UserError
from ..hub import download, download_folder

HF_PREFIX = "hf:"


@dataclass(frozen=True)
class Pulled:
    name: str
    checkpoint: Path            # a llama2.c checkpoint, or a Hugging Face folder
    tokenizer: Path | None      # the llama2.c checkpoint's tokenizer


def is_model_name(model) -> bool:
    s = str(model)
    return not Path(s).exists() and (s in CATALOGUE or s.startswith(HF_PREFIX))


def _say(console, text: str) -> None:
    if console is not None:
        console.print(text)


def pull(console, name: str) -> Pulled:
    """The local files of a catalogue name or ``hf:REPO[@REVISION]``, downloaded once (``console``:
    where to say so, or None)."""
    if name.startswith(HF_PREFIX):
        repo, _, revision = name[len(HF_PREFIX):].partition("@")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise UserError(f"{name!r}: a Hugging Face repository is hf:OWNER/NAME or hf:OWNER/NAME@REVISION")
        _say(console, f"pulling {repo}@{revision or 'main'} (config, safetensors, tokenizer)")
        return Pulled(name, download_folder(repo, revision or "main"), None)
    entry = CATALOGUE.get(name)
    if entry is None:
        raise UserError(f"no model {name!r} in the catalogue ({', '.join(CATALOGUE)}); any Hugging Face "
                        f"repository is hf:OWNER/NAME[@REVISION]")
    _say(console, f"pulling {name}: " + ", ".join(f"{f.label}@{f.revision[:12]}" for f in entry.files))
    paths = [download(f) for f in entry.files]
    if entry.kind == "hf":
        return Pulled(name, paths[0].parent, None)
    return Pulled(name, paths[0], paths[1])


def resolve_model(console, model, tokenizer=None):
    """(checkpoint, tokenizer) for a path as given, or for a name: its pulled files (an explicit
    ``tokenizer`` wins over the entry's)."""
    if not is_model_name(model):
        return model, tokenizer
    p = pull(console, str(model))
    return p.checkpoint, tokenizer if tokenizer is not None else p.tokenizer
