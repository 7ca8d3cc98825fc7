"""Read and write llama2.c model checkpoints (``export.py`` layouts v0, v1, v2).

All three are little-endian and store matrices row-major as ``[out, in]``, which is the IR's
orientation, so tensors map one-to-one onto IR names.

v0 (legacy, ``run.c``)   7 x i32 header (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
                         vocab_size, seq_len; vocab_size < 0 = untied head), then f32:
                         tok_embeddings, attn_norm*, wq*, wk*, wv*, wo*, ffn_norm*, w1*, w2*, w3*,
                         norm, freq_cis_real [seq_len, head_dim/2], freq_cis_imag, [output]
v1 (fp32)                u32 magic "ak42", i32 version 1, the 7 params, u8 shared_classifier,
                         zeros to 256 bytes; then f32: attn_norm*, ffn_norm*, norm,
                         tok_embeddings, wq*, wk*, wv*, wo*, w1*, w2*, w3*, [output]
v2 (Q8_0)                as v1 with version 2 and an i32 group_size after shared_classifier;
                         f32 attn_norm*, ffn_norm*, norm; then per matrix (same order as v1)
                         int8 codes of the whole tensor, then f32 scales, one per group_size
                         consecutive elements of the flattened tensor.

(``*`` = one tensor per layer, all layers in a row.)  Every size is computed from the header
before anything is allocated and the file must match it to the byte.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .files import regular_file_size
from .formats import MAX_GROUP
from .ir import ModelConfig, ModelError, ModelIR, QTensor, StopIds
from .quantize import quantize_matrix, rope_tables

MAGIC = 0x616B3432          # b"24ka" on disk, "ak42" as a little-endian u32
V0_HEADER = 28
V12_HEADER = 256
NORM_EPS = 1e-5             # what llama2.c's run.c hard-codes
ROPE_THETA = 10000.0
# run.c ends a story when the model emits token 1 (BOS: its stories start with it) and never
# looks at EOS; an import follows it
STOPS = StopIds((1,), "llama2.c: run.c stops at token 1, BOS")


class FormatMismatch(ModelError):
    """The file has no llama2.c magic and its first 28 bytes do not describe a v0 file of its size."""


# ----------------------------------------------------------------------------- layout

@dataclass
class _Item:
    kind: str                   # "f32" (a stack of same-shaped tensors) or "q8" (one matrix)
    names: list[str]
    shape: tuple[int, ...]
    offset: int
    group_size: int = 0


class _Layout:
    def __init__(self, start: int):
        self.pos = start
        self.items: list[_Item] = []

    def f32(self, names: list[str], shape: tuple[int, ...]) -> None:
        self.items.append(_Item("f32", names, shape, self.pos))
        self.pos += 4 * len(names) * int(np.prod(shape))

    def q8(self, name: str, shape: tuple[int, int], gs: int) -> None:
        self.items.append(_Item("q8", [name], shape, self.pos, gs))
        n = shape[0] * shape[1]
        self.pos += n + 4 * (n // gs)


def _per_layer(cfg: ModelConfig, suffix: str) -> list[str]:
    return [f"layers.{i}.{suffix}" for i in range(cfg.n_layers)]


MATRICES = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w1", "ffn.w2", "ffn.w3")


def _layout_v0(cfg: ModelConfig) -> _Layout:
    sh = cfg.tensor_shapes()
    lay = _Layout(V0_HEADER)
    lay.f32(["tok_embeddings"], sh["tok_embeddings"])
    lay.f32(_per_layer(cfg, "attn_norm"), (cfg.dim,))
    for m in MATRICES[:4]:
        lay.f32(_per_layer(cfg, m), sh[f"layers.0.{m}"])
    lay.f32(_per_layer(cfg, "ffn_norm"), (cfg.dim,))
    for m in MATRICES[4:]:
        lay.f32(_per_layer(cfg, m), sh[f"layers.0.{m}"])
    lay.f32(["norm"], (cfg.dim,))
    lay.f32(["rope.cos"], (cfg.max_seq_len, cfg.head_dim // 2))
    lay.f32(["rope.sin"], (cfg.max_seq_len, cfg.head_dim // 2))
    if not cfg.tied:
        lay.f32(["output"], sh["output"])
    return lay


def _norms_v12(cfg: ModelConfig, lay: _Layout) -> None:
    lay.f32(_per_layer(cfg, "attn_norm"), (cfg.dim,))
    lay.f32(_per_layer(cfg, "ffn_norm"), (cfg.dim,))
    lay.f32(["norm"], (cfg.dim,))


def _matrix_names(cfg: ModelConfig) -> list[str]:
    names = ["tok_embeddings"] + [n for m in MATRICES for n in _per_layer(cfg, m)]
    return names + ([] if cfg.tied else ["output"])


def _layout_v1(cfg: ModelConfig) -> _Layout:
    sh = cfg.tensor_shapes()
    lay = _Layout(V12_HEADER)
    _norms_v12(cfg, lay)
    lay.f32(["tok_embeddings"], sh["tok_embeddings"])
    for m in MATRICES:
        lay.f32(_per_layer(cfg, m), sh[f"layers.0.{m}"])
    if not cfg.tied:
        lay.f32(["output"], sh["output"])
    return lay


def _layout_v2(cfg: ModelConfig, gs: int) -> _Layout:
    sh = cfg.tensor_shapes()
    lay = _Layout(V12_HEADER)
    _norms_v12(cfg, lay)
    for name in _matrix_names(cfg):
        lay.q8(name, sh[name], gs)  # type: ignore[arg-type]
    return lay


# ----------------------------------------------------------------------------- reading

def _config(path, params: tuple[int, ...], tied: bool, cls=ModelError) -> ModelConfig:
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = params
    cfg = ModelConfig(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                      vocab_size=vocab, hidden_dim=hidden, max_seq_len=seq, tied=tied,
                      norm_eps=NORM_EPS, rope_theta=ROPE_THETA)
    try:
        cfg.validate()
    except ModelError as e:
        raise cls(f"{path}: bad header: {e}") from None
    return cfg


def _check_size(path, expected: int, found: int, cls=ModelError) -> None:
    if found < expected:
        raise cls(f"{path}: truncated: expected {expected} bytes, found {found}")
    if found > expected:
        n = found - expected
        raise cls(f"{path}: {n} trailing byte{'s' if n != 1 else ''} (expected {expected} bytes, found {found})")


def _read_head(path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror or e}") from None


def _load(path, lay: _Layout) -> dict[str, np.ndarray | QTensor]:
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot map file: {e}") from None
    if mm.size < lay.pos:   # the file changed since the size check
        raise ModelError(f"{path}: truncated: expected {lay.pos} bytes, found {mm.size}")
    out: dict[str, np.ndarray | QTensor] = {}
    try:
        for it in lay.items:
            if it.kind == "f32":
                count = len(it.names) * int(np.prod(it.shape))
                block = np.frombuffer(mm, "<f4", count, it.offset).reshape(len(it.names), *it.shape)
                for name, t in zip(it.names, block):
                    arr = np.array(t, dtype=np.float32)
                    if not np.isfinite(arr).all():
                        raise ModelError(f"{path}: tensor {name} holds NaN or infinite values")
                    out[name] = arr
            else:
                (name,), (rows, cols), gs = it.names, it.shape, it.group_size
                n = rows * cols
                codes = np.array(np.frombuffer(mm, np.int8, n, it.offset).reshape(rows, cols))
                scales = np.array(np.frombuffer(mm, "<f4", n // gs, it.offset + n)
                                  .reshape(rows, cols // gs), dtype=np.float32)
                if not np.isfinite(scales).all():
                    raise ModelError(f"{path}: tensor {name} has NaN or infinite scales")
                if (codes == -128).any():
                    raise ModelError(f"{path}: tensor {name} has int8 code -128, outside Q8_0's [-127, 127]")
                out[name] = QTensor("q8", codes, scales, gs)
    finally:
        del mm
    return out


def _finish(path, cfg: ModelConfig, tensors: dict, version: int, **meta) -> ModelIR:
    cos = tensors.pop("rope.cos", None)
    sin = tensors.pop("rope.sin", None)
    order = cfg.tensor_shapes()
    ir = ModelIR(cfg, {k: tensors[k] for k in order}, rope_cos=cos, rope_sin=sin, source=str(path),
                 meta={"format": "llama2c", "version": version, **meta},
                 stops=STOPS if cfg.vocab_size > 1 else StopIds((), "llama2.c, a vocabulary without token 1"))
    try:
        ir.validate()
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    return ir


def read_v0(path) -> ModelIR:
    """Legacy llama2.c file.  Header or size mismatches raise ``FormatMismatch``."""
    size = regular_file_size(path)
    head = _read_head(path, V0_HEADER)
    if len(head) < V0_HEADER:
        raise FormatMismatch(f"{path}: {len(head)} bytes is too short for a llama2.c v0 header "
                             f"({V0_HEADER} bytes)")
    params = list(struct.unpack("<7i", head))
    tied = params[5] > 0
    params[5] = abs(params[5])
    cfg = _config(path, tuple(params), tied, FormatMismatch)
    lay = _layout_v0(cfg)
    _check_size(path, lay.pos, size, FormatMismatch)
    return _finish(path, cfg, _load(path, lay), 0)


def read_llama2c(path) -> ModelIR:
    """Any llama2.c checkpoint: v1/v2 by their magic, otherwise legacy v0."""
    size = regular_file_size(path)
    head = _read_head(path, V12_HEADER)
    if len(head) < 4 or struct.unpack_from("<I", head)[0] != MAGIC:
        return read_v0(path)
    if len(head) < V12_HEADER:
        raise ModelError(f"{path}: truncated: expected a {V12_HEADER}-byte header, found {len(head)} bytes")
    (version,) = struct.unpack_from("<i", head, 4)
    if version not in (1, 2):
        raise ModelError(f"{path}: unsupported llama2.c file version {version} (supported: 0, 1, 2)")
    params = struct.unpack_from("<7i", head, 8)
    shared = head[36]
    if shared not in (0, 1):
        raise ModelError(f"{path}: bad header: shared_classifier byte is {shared}, expected 0 or 1")
    cfg = _config(path, params, bool(shared))
    if version == 1:
        lay = _layout_v1(cfg)
        _check_size(path, lay.pos, size)
        return _finish(path, cfg, _load(path, lay), 1)
    (gs,) = struct.unpack_from("<i", head, 37)
    if not 1 <= gs <= MAX_GROUP:
        raise ModelError(f"{path}: bad header: group_size {gs} out of range 1..{MAX_GROUP}")
    for what, cols in (("dim", cfg.dim), ("hidden_dim", cfg.hidden_dim)):
        if cols % gs:
            raise ModelError(f"{path}: group_size {gs} does not divide {what} {cols}: Q8_0 groups would "
                             f"span matrix rows, which flashlm does not support")
    lay = _layout_v2(cfg, gs)
    _check_size(path, lay.pos, size)
    return _finish(path, cfg, _load(path, lay), 2, group_size=gs)


# ----------------------------------------------------------------------------- writing

def _f32(t) -> np.ndarray:
    return t.dequantize() if isinstance(t, QTensor) else np.asarray(t, np.float32)


def _check_writable(ir: ModelIR, path, version: int) -> ModelConfig:
    try:
        ir.validate()
    except ModelError as e:
        raise ModelError(f"{path}: cannot write: {e}") from None
    cfg = ir.config
    if cfg.ple_dim or cfg.n_out != cfg.vocab_size:
        raise ModelError(f"{path}: llama2.c files cannot hold Per-Layer Embeddings or an out_vocab "
                         f"below the vocabulary; keep this model as a flashlm checkpoint")
    if cfg.norm_eps != NORM_EPS:
        raise ModelError(f"{path}: llama2.c files cannot record norm_eps {cfg.norm_eps} (always {NORM_EPS})")
    if version != 0 and cfg.rope_theta != ROPE_THETA:
        raise ModelError(f"{path}: llama2.c v{version} files cannot record rope_theta {cfg.rope_theta} "
                         f"(always {ROPE_THETA:g}); write v0, which stores the RoPE tables")
    return cfg


def _params(cfg: ModelConfig, vocab: int) -> bytes:
    return struct.pack("<7i", cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                       vocab, cfg.max_seq_len)


def _write(path, chunks) -> None:
    try:
        with open(path, "wb") as f:
            for c in chunks:
                f.write(c if isinstance(c, bytes) else np.ascontiguousarray(c).tobytes())
    except OSError as e:
        raise ModelError(f"{path}: cannot write: {e.strerror or e}") from None


def _f32_chunks(ir: ModelIR, lay: _Layout, extra: dict[str, np.ndarray] | None = None):
    src = {**ir.tensors, **(extra or {})}
    for it in lay.items:
        for name in it.names:
            yield _f32(src[name]).astype("<f4")


def write_llama2c(ir: ModelIR, path, version: int, group_size: int = 64) -> None:
    """Write ``ir`` as a llama2.c v0 or v1 file (``version=2`` forwards to ``write_llama2c_v2``)."""
    if version == 2:
        return write_llama2c_v2(ir, path, group_size)
    if version not in (0, 1):
        raise ModelError(f"{path}: cannot write llama2.c version {version} (0, 1 or 2)")
    cfg = _check_writable(ir, path, version)
    if version == 1:
        header = struct.pack("<Ii", MAGIC, 1) + _params(cfg, cfg.vocab_size) + bytes([int(cfg.tied)])
        header += bytes(V12_HEADER - len(header))
        _write(path, [header, *_f32_chunks(ir, _layout_v1(cfg))])
        return
    want = (cfg.max_seq_len, cfg.head_dim // 2)
    if ir.rope_cos is not None and ir.rope_sin is not None:
        cos, sin = np.asarray(ir.rope_cos, np.float32), np.asarray(ir.rope_sin, np.float32)
        if cos.shape != want or sin.shape != want:
            raise ModelError(f"{path}: RoPE tables have shape {cos.shape}/{sin.shape}, expected {want}")
    else:
        cos, sin = rope_tables(cfg)
    header = _params(cfg, cfg.vocab_size if cfg.tied else -cfg.vocab_size)
    _write(path, [header, *_f32_chunks(ir, _layout_v0(cfg), {"rope.cos": cos, "rope.sin": sin})])


def write_llama2c_v2(ir: ModelIR, path, group_size: int = 64) -> None:
    """Write a Q8_0 (v2) file: scale = max|w| / 127 per group, code = round(w / scale).

    A tensor that already is a q8 ``QTensor`` with this group size is written as it is."""
    cfg = _check_writable(ir, path, 2)
    if not 1 <= group_size <= MAX_GROUP:
        raise ModelError(f"{path}: group_size {group_size} out of range 1..{MAX_GROUP}")
    if cfg.dim % group_size or cfg.hidden_dim % group_size:
        raise ModelError(f"{path}: group_size {group_size} must divide dim {cfg.dim} and "
                         f"hidden_dim {cfg.hidden_dim}")
    header = (struct.pack("<Ii", MAGIC, 2) + _params(cfg, cfg.vocab_size) + bytes([int(cfg.tied)])
              + struct.pack("<i", group_size))
    header += bytes(V12_HEADER - len(header))

    def chunks():
        yield header
        norms = _Layout(V12_HEADER)
        _norms_v12(cfg, norms)
        yield from _f32_chunks(ir, norms)
        for name in _matrix_names(cfg):
            t = ir.tensors[name]
            if not (isinstance(t, QTensor) and t.fmt == "q8" and t.group_size == group_size and not t.rowscale
                    and not t.scale16):
                t = quantize_matrix(_f32(t), "q8", group_size)
            yield np.asarray(t.codes, np.int8)
            yield np.asarray(t.scales, "<f4")

    _write(path, chunks())


def is_llama2c_magic(head: bytes) -> bool:
    return len(head) >= 4 and struct.unpack_from("<I", head)[0] == MAGIC


__all__ = ["read_llama2c", "read_v0", "write_llama2c", "write_llama2c_v2", "FormatMismatch",
           "is_llama2c_magic", "MAGIC"]
