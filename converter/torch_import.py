"""PyTorch state dicts and flashlm ``.pt`` checkpoints to ``ModelIR``.

A flashlm checkpoint is a ``torch.save``'d dict (loadable with ``weights_only=True``)::

    {"format": "flashlm-checkpoint", "version": 1,
     "config": dataclasses.asdict(ModelConfig), "state_dict": {...},
     "tokenizer_json": str | None, "train": dict}

State-dict keys are the IR tensor names plus ``.weight`` (``layers.0.attn.wq.weight``,
``ple.table.weight``, ``layers.0.ple.gate.weight``); the head is tied when there is no
``output.weight``.  ``ple_dim`` and ``out_vocab`` come from the config.
"""
from __future__ import annotations

import dataclasses
import warnings
import zipfile
from typing import Mapping

import numpy as np
import torch

from .ir import ModelConfig, ModelError, ModelIR
from .tokenizer import from_hf_json
from .torch_model import Transformer

FORMAT = "flashlm-checkpoint"
VERSION = 1
_IGNORED = {"rope_cos", "rope_sin"}          # derived buffers, recomputed from the config
_PREFIXES = ("_orig_mod.", "module.")        # torch.compile / DataParallel wrappers


def _strip_prefixes(sd: Mapping) -> dict:
    sd = dict(sd)
    for p in _PREFIXES:
        if sd and all(isinstance(k, str) and k.startswith(p) for k in sd):
            sd = {k[len(p):]: v for k, v in sd.items()}
    return sd


def _show(k) -> str:
    s = str(k)
    s = s if s.isprintable() else repr(s)
    return s if len(s) <= 60 else s[:57] + "..."


def _names(keys, limit: int = 4) -> str:
    keys = sorted(map(_show, keys))
    return ", ".join(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def _to_numpy(key: str, v) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        if not (v.is_floating_point()):
            raise ModelError(f"state dict tensor {key} has dtype {v.dtype}, expected floating point")
        try:
            return v.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().copy()
        except (RuntimeError, NotImplementedError, TypeError) as e:
            raise ModelError(f"state dict tensor {key} cannot be read: {str(e).splitlines()[0]}") from None
    if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
        return np.array(v, dtype=np.float32)
    raise ModelError(f"state dict entry {key} is a {type(v).__name__}, expected a float tensor")


def state_dict_to_ir(state_dict: Mapping, config: ModelConfig, source: str = "") -> ModelIR:
    """Exact fp32 copy of a state dict of ``torch_model.Transformer`` for ``config``."""
    config.validate()
    sd = _strip_prefixes(state_dict)
    want = {name + ".weight": shape for name, shape in config.tensor_shapes().items()}
    have = set(sd) - _IGNORED
    missing, extra = set(want) - have, have - set(want)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_names(missing)}")
        if extra:
            parts.append(f"unexpected {_names(extra)}")
        hint = ""
        if config.tied and "output.weight" in extra:
            hint = " (the config has a tied head, so there should be no output.weight)"
        elif not config.tied and "output.weight" in missing:
            hint = " (the config has an untied head, which needs output.weight)"
        elif not config.ple_dim and "ple.table.weight" in extra:
            hint = " (the state dict has Per-Layer Embeddings but the config's ple_dim is 0)"
        raise ModelError(f"state dict does not match the config: {'; '.join(parts)}{hint}")
    tensors = {}
    for key, shape in want.items():
        arr = _to_numpy(key, sd[key])
        if tuple(arr.shape) != shape:
            raise ModelError(f"state dict tensor {key}: shape {tuple(arr.shape)}, expected {shape}")
        tensors[key[: -len(".weight")]] = arr
    ir = ModelIR(config, tensors, source=source, meta={"format": "state_dict"})
    ir.validate()
    return ir


def ir_to_state_dict(ir: ModelIR) -> dict:
    """The state dict of ``torch_model.Transformer`` holding ``ir``'s tensors (the inverse of
    ``state_dict_to_ir``; the tensors share the IR's memory)."""
    return {f"{n}.weight": torch.from_numpy(t) for n, t in ir.tensors.items()}


def ir_to_module(ir: ModelIR) -> Transformer:
    """A ``torch_model.Transformer`` in eval mode with ``ir``'s weights (strict: same names and shapes)."""
    model = Transformer(ir.config).eval()
    model.load_state_dict(ir_to_state_dict(ir))
    return model


def module_to_ir(model: Transformer) -> ModelIR:
    model = getattr(model, "_orig_mod", model)
    return state_dict_to_ir(model.state_dict(), model.cfg, source=type(model).__name__)


def save_checkpoint(path, model: Transformer, tokenizer_json: str | None = None,
                    train: dict | None = None) -> None:
    model = getattr(model, "_orig_mod", model)
    obj = {
        "format": FORMAT,
        "version": VERSION,
        "config": dataclasses.asdict(model.cfg),
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "tokenizer_json": tokenizer_json,
        "train": dict(train or {}),
    }
    try:
        torch.save(obj, path)
    except OSError as e:
        raise ModelError(f"{path}: cannot write: {e.strerror or e}") from None


def _config_from(path, cfg, tied: bool) -> ModelConfig:
    if not isinstance(cfg, dict):
        raise ModelError(f"{path}: checkpoint 'config' is a {type(cfg).__name__}, expected a dict")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(cfg) - fields
    if unknown:
        raise ModelError(f"{path}: checkpoint config has unknown keys: {_names(unknown)}")
    odd = [k for k, v in cfg.items() if isinstance(v, bool) != (k == "tied")
           or not isinstance(v, (int, float))]
    if odd:
        k = sorted(odd)[0]
        raise ModelError(f"{path}: checkpoint config {k} is {_show(repr(cfg[k]))}, expected a "
                         f"{'bool' if k == 'tied' else 'number'}")
    if "tied" in cfg and cfg["tied"] != tied:
        raise ModelError(f"{path}: checkpoint config says tied={_show(cfg['tied'])} but the state dict "
                         f"{'has no' if tied else 'has an'} output.weight")
    try:
        c = ModelConfig(**{**cfg, "tied": tied})
        c.validate()
        if not (float(c.norm_eps) > 0 and float(c.rope_theta) > 0):
            raise ModelError(f"config: norm_eps {c.norm_eps} and rope_theta {c.rope_theta} must be positive")
    except ModelError as e:          # (a ValueError, so it goes first)
        raise ModelError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ModelError(f"{path}: checkpoint config is incomplete or mistyped: {e}") from None
    return c


def _other_zip(path) -> bool:
    """A zip archive that torch.save did not write (no FOLDER/data.pkl): torch.load would fail on
    it with its C++ reader's internals ("[enforce fail at inline_container.cc...]"). Not a zip
    archive, or unreadable: False, and torch.load says why (it also reads its legacy pickle files)."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return not any(n.count("/") == 1 and n.endswith("/data.pkl") for n in names)


def load_checkpoint(path) -> ModelIR:
    if _other_zip(path):
        raise ModelError(f"not a llama2.c or flashlm checkpoint: {path}: a zip archive, but not a PyTorch "
                         f"checkpoint (no data.pkl in it)")
    try:
        with warnings.catch_warnings():   # a damaged file makes torch warn on stderr; we say why in one line
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ModelError(f"{path}: is a directory, expected a checkpoint file") from None
    except Exception as e:  # torch raises many kinds (pickle, zip, RuntimeError, ...)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ModelError(f"{path}: cannot load as a flashlm checkpoint: {first}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        what = (f"a dict with format {_show(repr(obj.get('format')))}" if isinstance(obj, dict)
                else f"a {type(obj).__name__}")
        raise ModelError(f"{path}: not a model checkpoint flashlm reads (a PyTorch file holding {what}; "
                         f"flashlm reads llama2.c .bin files and checkpoints saved by 'flashlm train')")
    if obj.get("version") != VERSION:
        raise ModelError(f"{path}: unsupported flashlm checkpoint version {_show(repr(obj.get('version')))} "
                         f"(supported: {VERSION})")
    sd = obj.get("state_dict")
    if not isinstance(sd, dict):
        raise ModelError(f"{path}: checkpoint has no state_dict")
    sd = _strip_prefixes(sd)
    cfg = _config_from(path, obj.get("config"), tied="output.weight" not in sd)
    try:
        ir = state_dict_to_ir(sd, cfg, source=str(path))
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    tj = obj.get("tokenizer_json")
    if tj is not None:
        if not isinstance(tj, str):
            raise ModelError(f"{path}: checkpoint tokenizer_json is a {type(tj).__name__}, expected str")
        try:
            ir.tokenizer = from_hf_json(tj)
            ir.validate()
        except ModelError as e:
            raise ModelError(f"{path}: {e}") from None
    train = obj.get("train")
    ir.meta = {"format": FORMAT, "version": VERSION, "train": train if isinstance(train, dict) else {}}
    return ir


__all__ = ["state_dict_to_ir", "module_to_ir", "save_checkpoint", "load_checkpoint"]
