"""A model directory as ``flashlm convert`` writes it (manifest.json, model.flmb, tokenizer):
loading and checking its manifest, and its tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError

MANIFEST = "manifest.json"
BLOB_NAME = "model.flmb"
TRAIN_CHECKPOINT = "model.pt"     # what `flashlm train` writes in its folder (models/default holds one)


def checkpoint_of(path) -> Path:
    """A `flashlm train` folder (a model.pt, no manifest.json, no Hugging Face config.json) stands for
    its checkpoint, so `flashlm convert models/default` and `flashlm plan models/default` work; any
    other path is itself."""
    p = Path(path)
    if (p.is_dir() and not (p / MANIFEST).exists() and not (p / "config.json").exists()
            and (p / TRAIN_CHECKPOINT).is_file()):
        return p / TRAIN_CHECKPOINT
    return p


def load_manifest(model_dir) -> tuple[Path, dict]:
    d = Path(model_dir)
    if d.is_file() and d.name == MANIFEST:
        d = d.parent
    if not d.exists():
        raise UserError(f"model directory {d} does not exist (create it with 'flashlm convert CHECKPOINT -o {d}')")
    if not d.is_dir():
        raise UserError(f"--model {d} is a file; pass the directory 'flashlm convert' wrote")
    mp = d / MANIFEST
    if not mp.is_file():
        raise UserError(f"no {MANIFEST} in {d} (create it with 'flashlm convert CHECKPOINT -o {d}')")
    try:
        m = json.loads(mp.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{mp} is not valid JSON: {e}") from None
    if not isinstance(m, dict):
        raise UserError(f"{mp} is not a flashlm manifest")
    cfg = m.get("config")
    missing = [k for k in ("blob", "model_hash", "config") if k not in m]
    if not missing and isinstance(cfg, dict):
        missing = [f"config.{k}" for k in ("max_seq_len", "vocab_size") if not isinstance(cfg.get(k), int)]
    if missing or not isinstance(cfg, dict):
        raise UserError(f"{mp} lacks {', '.join(missing) or 'config'}; re-run 'flashlm convert'")
    try:
        bytes.fromhex(m["model_hash"])
    except (TypeError, ValueError):
        raise UserError(f"{mp}: model_hash {m['model_hash']!r} is not hex") from None
    return d, m


def load_model_tokenizer(model_dir: Path, manifest: dict, required: bool):
    name = manifest.get("tokenizer")
    if not name:
        if required:
            raise UserError(f"the model in {model_dir} has no tokenizer; pass --prompt-ids instead of --prompt")
        return None
    path = model_dir / name
    if not path.is_file():
        if required:
            raise UserError(f"tokenizer {path} is missing; re-run 'flashlm convert'")
        return None
    from converter.tokenizer import load_tokenizer
    try:
        tok = load_tokenizer(path)
    except Exception:
        if required:
            raise
        return None
    cfg = manifest.get("config") or {}      # BOS/EOS as convert chose them (also from tokenizer_config.json)
    for key in ("bos_id", "eos_id"):
        if key in cfg and (cfg[key] is None or isinstance(cfg[key], int)):
            setattr(tok, key, cfg[key])
    return tok
