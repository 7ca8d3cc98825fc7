"""The MODEL argument of ``flashlm plan`` and ``flashlm compare``: a model directory written by
``flashlm convert``, a ``.flmb`` blob, a checkpoint (llama2.c / flashlm ``.pt`` / a Hugging Face
folder, or a model name: host/commands/pull.py), which is quantized in memory as ``convert`` would,
or ``shape:NAME``, a named shape from converter/shapes.py planned with its own recipe (``--quant``
applies on top)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from converter import headcalib
from converter import quantize as Q
from converter.blob import BlobHeader, read_header
from converter.costmodel import ModelSpec
from converter.hf_import import is_hf_dir
from converter.load import load_model
from converter.shapes import SHAPES, shape_spec

from ..defaults import KV_DEFAULT
from ..errors import UserError
from ..model_dir import MANIFEST, ModelDir, checkpoint_of
from .pull import resolve_model
from .recipe import Recipe

SHAPE_PREFIX = "shape:"


@dataclass
class Source:
    """What MODEL named: ``kind`` "dir" (``model``, ``blob``, ``header``), "blob" (``blob``,
    ``header``), "checkpoint" (``path``, ``qm``: quantized in memory) or "shape"."""
    kind: str
    model: ModelDir | None = None
    blob: Path | None = None
    header: BlobHeader | None = None
    qm: object = None
    path: Path | None = None

    def kv(self) -> str:
        """The blob's own KV cache format, else convert's default (k12)."""
        return self.header.state_tiers.kv if self.header is not None else KV_DEFAULT

    def batch(self) -> int:
        """The batch the blob's header names, else 1."""
        return self.header.state_tiers.batch if self.header is not None else 1


def load_spec(model, recipe: Recipe = Recipe(), tokenizer=None, context: int | None = None):
    """(ModelSpec, Source) for a model dir, a blob, a checkpoint (a Hugging Face folder too) or a
    named shape. ``context``: a checkpoint is loaded holding that many positions."""
    if str(model).startswith(SHAPE_PREFIX):
        spec = shape_spec(str(model)[len(SHAPE_PREFIX):])
        return (spec.with_formats(list(recipe.quant)) if recipe.quant else spec), Source("shape")
    model, tokenizer = resolve_model(None, model, tokenizer)
    p = checkpoint_of(model)
    if (p.is_dir() and not is_hf_dir(p)) or p.name == MANIFEST:
        md = ModelDir.open(p)
        h = read_header(md.blob)
        return ModelSpec.from_header(h, str(md.path)), Source("dir", model=md, blob=md.blob, header=h)
    if not p.exists():
        raise UserError(f"{p} does not exist (give a model directory from 'flashlm convert', a .flmb "
                        f"blob, a checkpoint or a shape: {', '.join(SHAPE_PREFIX + n for n in sorted(SHAPES))})")
    with (p / "config.json" if p.is_dir() else p).open("rb") as f:
        magic = f.read(4)
    if magic == b"FLMB":
        h = read_header(p)
        return ModelSpec.from_header(h, str(p)), Source("blob", blob=p, header=h)
    tok = tokenizer
    if tok is None and (p.parent / "tokenizer.json").is_file() and p.suffix == ".pt":
        tok = p.parent / "tokenizer.json"
    ir = load_model(str(p), tokenizer_path=str(tok) if tok else None, context=context)
    qm = Q.quantize(ir, default_format=recipe.fmt, group_size=recipe.group_size, overrides=list(recipe.quant),
                    scales=recipe.scales)
    qm.head_index = headcalib.calibrate(qm)[0]       # convert's decision (--head-index auto)
    return ModelSpec.from_quant(qm, str(p)), Source("checkpoint", qm=qm, path=p)
