"""A model folder as ``flashlm convert`` writes it: the weights blob (model.flmb), the tokenizer,
quality.json and manifest.json. ``ModelDir`` is the one reader and writer of the manifest: no other
module knows its keys.

The blob is what the firmware reads; the manifest says what the host needs before it talks to a
board (the model hash, the vocabulary and context, the tokenizer, the stop ids) and how the model
was made. Each fact is written once: the batch a forward pass runs, for one, is in the blob only.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from converter.quantize import DEFAULT_GROUP
from converter.tokenizer import load_tokenizer

from .defaults import DEFAULT_BATCH, KV_DEFAULT
from .errors import UserError
from .files import write_json

MANIFEST = "manifest.json"
BLOB_NAME = "model.flmb"
QUALITY = "quality.json"
TRAIN_CHECKPOINT = "model.pt"     # what `flashlm train` writes in its folder (models/default holds one)


def _shown(path: str) -> str:
    """A recorded absolute path as a command typed here gives it: relative when under this folder."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def checkpoint_of(path) -> Path:
    """A `flashlm train` folder (a model.pt, no manifest.json, no Hugging Face config.json) stands for
    its checkpoint, so `flashlm convert models/default` and `flashlm plan models/default` work; any
    other path is itself."""
    p = Path(path)
    if (p.is_dir() and not (p / MANIFEST).exists() and not (p / "config.json").exists()
            and (p / TRAIN_CHECKPOINT).is_file()):
        return p / TRAIN_CHECKPOINT
    return p


@dataclass
class ModelDir:
    """A model folder and its manifest (``open`` checks it; ``create`` and ``record_layout`` write it)."""
    path: Path
    _manifest: dict
    _tokenizer: object = field(default=None, repr=False, compare=False)   # loaded once

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path) -> "ModelDir":
        """The folder (or its manifest.json) checked: a one-line UserError says what is wrong."""
        d = Path(path)
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
        return cls(d, m)

    @property
    def blob(self) -> Path:
        return self.path / self._manifest["blob"]

    @property
    def model_hash(self) -> str:
        """The blob's model hash, hex."""
        return self._manifest["model_hash"]

    @property
    def layout_id(self) -> int | None:
        return self._manifest.get("layout_id")

    @property
    def vocab_size(self) -> int:
        return int(self._manifest["config"]["vocab_size"])

    @property
    def out_vocab(self) -> int:
        """Rows of the output layer (the vocabulary unless the model predicts fewer)."""
        cfg = self._manifest["config"]
        return int(cfg.get("out_vocab") or cfg["vocab_size"])

    @property
    def max_seq_len(self) -> int:
        return int(self._manifest["config"]["max_seq_len"])

    @property
    def has_ple(self) -> bool:
        """Per-Layer Embeddings (a PLE phase in every step)."""
        return bool(self._manifest["config"].get("ple_dim"))

    @property
    def has_tokenizer(self) -> bool:
        return bool(self._manifest.get("tokenizer"))

    @property
    def stops(self) -> str:
        """The model's stop ids and where they come from, as one phrase."""
        return f"{self._manifest.get('stop_ids', '?')}, {self._manifest.get('stop_source', '?')}"

    @property
    def device_tokenizer(self) -> str | None:
        """Why the blob has a device tokenizer section or not, as convert said it."""
        return self._manifest.get("device_tokenizer")

    @property
    def planned_for(self) -> str | None:
        """The board whose plan ``flashlm plan --apply`` recorded in the blob, or None: convert's own
        layout (every tensor read from flash)."""
        return (self._manifest.get("layout") or {}).get("board")

    @property
    def source(self) -> str:
        """The checkpoint the model was converted from."""
        return str(self._manifest.get("source", ""))

    def tokenizer(self, required: bool):
        """The model's tokenizer, with BOS/EOS as convert chose them; None when there is none (or it
        cannot be loaded) and it is not required."""
        if self._tokenizer is not None:
            return self._tokenizer
        name = self._manifest.get("tokenizer")
        if not name:
            if required:
                raise UserError(f"the model in {self.path} has no tokenizer; pass --prompt-ids instead of --prompt")
            return None
        path = self.path / name
        if not path.is_file():
            if required:
                raise UserError(f"tokenizer {path} is missing; re-run 'flashlm convert'")
            return None
        try:
            tok = load_tokenizer(path)
        except Exception:
            if required:
                raise
            return None
        cfg = self._manifest.get("config") or {}      # BOS/EOS as convert chose them (also from tokenizer_config.json)
        for key in ("bos_id", "eos_id"):
            if key in cfg and (cfg[key] is None or isinstance(cfg[key], int)):
                setattr(tok, key, cfg[key])
        self._tokenizer = tok
        return tok

    # -- writing ---------------------------------------------------------------------------
    def convert_command(self, **changes) -> str | None:
        """The ``flashlm convert`` line that makes this folder again with ``changes`` (convert's
        options by their keyword names: ctx, batch, kv, quant, ...), from the options convert recorded;
        None for a folder convert did not record them in, or whose checkpoint is gone."""
        rec = self._manifest.get("convert")
        if not isinstance(rec, dict) or not rec.get("checkpoint"):
            return None
        ckpt = rec["checkpoint"]
        if not rec.get("named") and not Path(ckpt).exists():
            return None
        o = {**rec, **changes}
        args = ["flashlm", "convert", _shown(ckpt) if not rec.get("named") else ckpt, "-o", str(self.path)]
        if rec.get("tokenizer_given") and self._manifest.get("tokenizer"):    # the copy convert kept here
            args += ["--tokenizer", str(self.path / self._manifest["tokenizer"])]
        defaults = {"format": "q8", "group_size": DEFAULT_GROUP.get(o.get("format"), 32), "scales": None, "kv": KV_DEFAULT, "ctx": None,
                    "batch": DEFAULT_BATCH, "head_index": "auto", "calibrate": "auto"}
        for key, default in defaults.items():
            if o.get(key) != default and o.get(key) is not None:
                args += [f"--{key.replace('_', '-')}", str(o[key])]
        for q in o.get("quant") or []:
            args += ["--quant", q]
        if o.get("draft"):
            args += ["--draft", _shown(o["draft"])]
        return shlex.join(args)

    @classmethod
    def create(cls, path, *, blob, tokenizer: str | None, config: dict, recipe: dict, quantization: dict,
               kv: str, draft: dict | None, source: str, quality: dict | None, device_tokenizer: str,
               stop_ids: list[int], stop_source: str, head_index: dict, expert_use: dict | None,
               convert: dict | None = None) -> "ModelDir":
        """Write the manifest (and quality.json, the quality report, when there is one) of a model
        folder convert has filled with the blob (``blob``: its BlobInfo) and the tokenizer; ``convert``:
        the options it was called with (what ``convert_command`` repeats)."""
        d = Path(path)
        if quality is not None:
            write_json(d / QUALITY, quality)
        manifest = {
            "format": "flashlm-model", "version": 1,
            "blob": BLOB_NAME, "blob_size": blob.size, "blob_crc": blob.crc,
            "tokenizer": tokenizer,
            "model_hash": bytes(blob.model_hash).hex(), "layout_id": blob.layout_id,
            "config": config,
            "recipe": recipe,
            "quantization": quantization,
            "kv": kv,
            "draft": draft,
            "source": source,
            "quality": QUALITY if quality is not None else None,
            "device_tokenizer": device_tokenizer,
            "stop_ids": stop_ids, "stop_source": stop_source,
            "head_index": head_index,
            "expert_use": expert_use,
            "convert": convert,
        }
        write_json(d / MANIFEST, manifest)
        return cls(d, manifest)

    def record_layout(self, header, size: int, *, kv: str, board: str, regions: dict, overrides: list[str],
                      base: str) -> None:
        """The manifest after the blob was rewritten with a new placement (``header``: the new blob's
        header, ``size`` its bytes): the blob's identity, context and KV format, and the plan that
        placed it."""
        m = self._manifest
        m.update(blob_size=size, blob_crc=header.crc, model_hash=bytes(header.model_hash).hex(),
                 layout_id=header.layout_id, kv=kv)
        m["config"]["max_seq_len"] = header.config.max_seq_len
        m["layout"] = {"board": board, "regions": dict(regions), "overrides": list(overrides), "base": base}
        write_json(self.path / MANIFEST, m)
