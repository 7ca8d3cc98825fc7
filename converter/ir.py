"""The one internal model representation every step after import reads.

A ``ModelIR`` is a config plus named tensors.  Tensor names and shapes (``[out, in]``
for matrices, like ``torch.nn.Linear.weight``):

    tok_embeddings            [vocab, dim]
    layers.{i}.attn_norm      [dim]
    layers.{i}.attn.wq        [n_heads * head_dim, dim]
    layers.{i}.attn.wk        [n_kv_heads * head_dim, dim]
    layers.{i}.attn.wv        [n_kv_heads * head_dim, dim]
    layers.{i}.attn.wo        [dim, n_heads * head_dim]
    layers.{i}.ffn_norm       [dim]
    layers.{i}.ffn.w1         [hidden_dim, dim]      gate (SiLU branch)
    layers.{i}.ffn.w2         [dim, hidden_dim]      down
    layers.{i}.ffn.w3         [hidden_dim, dim]      up
    norm                      [dim]
    output                    [out_vocab, dim]       only when the head is untied

With Per-Layer Embeddings (Gemma-3n style, ``ple_dim`` P > 0; the forward pass is specified in
docs/numerics.md), L = n_layers:

    ple.table                 [vocab, L * P]         the flash-resident gather (after tok_embeddings)
    ple.proj                  [L * P, dim]
    ple.norm                  [P]                    one gain shared by the L per-layer norms
    layers.{i}.ple.gate       [P, dim]               (after layers.{i}.ffn.w3)
    layers.{i}.ple.proj       [dim, P]
    layers.{i}.ple.norm       [dim]

With a mixture of experts (``n_experts`` E > 0, ``moe_top_k`` k of them per token; the forward
pass is specified in docs/numerics.md), each layer's FFN is E SwiGLU experts of ``hidden_dim`` and a
router instead of ``ffn.w1``/``w2``/``w3``:

    layers.{i}.ffn.router          [E, dim]          the router's logits (kept fp32)
    layers.{i}.ffn.experts.{e}.w1  [hidden_dim, dim] expert e's gate (after the router, e = 0..E-1)
    layers.{i}.ffn.experts.{e}.w2  [dim, hidden_dim]
    layers.{i}.ffn.experts.{e}.w3  [hidden_dim, dim]

``out_vocab`` (0 = vocab) rows of the output layer: a tied head is the first out_vocab rows of
tok_embeddings; tokens >= out_vocab can be inputs but are never predicted.

RoPE rotates adjacent pairs (x[2i], x[2i+1]) of each head, as llama2.c does.

A model's **stop ids** (``StopIds``) are the tokens whose generation ends a text; they follow
the convention of the checkpoint's origin (llama2.c: token 1, BOS, where run.c stops; Hugging
Face: ``eos_token_id`` of generation_config.json; ours: the tokenizer's EOS).
A tensor value is fp32 ``np.ndarray`` or, for files that arrive quantized (llama2.c v2),
a ``QTensor`` that the quantizer passes through unchanged. A ``QuantModel`` is the model after
quantization (converter/quantize.py) or as a blob holds it: what the reference runs and the blob
writer serializes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import FlashlmError

MAX_STOP_IDS = 16        # the firmware keeps the stop ids in a fixed array (blob section tokenizer.stop)
MAX_EXPERTS = 64         # experts per layer: the planner's and the engine's per-expert counts stay small
MAX_TOP_K = 8            # experts a token reads per layer: the engine keeps its choices in a fixed array


class ModelError(FlashlmError, ValueError):
    """A model file or model description that cannot be used; the message is for the user."""


@dataclass(frozen=True)
class ModelConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    hidden_dim: int
    max_seq_len: int
    tied: bool = True
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    ple_dim: int = 0          # P: Per-Layer Embedding width (0: a dense model without PLE)
    out_vocab: int = 0        # rows of the output layer (0: vocab_size); read it as n_out
    n_experts: int = 0        # E: experts per FFN layer (0: a dense FFN)
    moe_top_k: int = 0        # k: experts each token reads per layer (0 when dense)

    @property
    def n_out(self) -> int:
        """Rows of the output layer: the tokens the model can predict."""
        return self.out_vocab or self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def validate(self) -> None:
        ints = dict(dim=self.dim, n_layers=self.n_layers, n_heads=self.n_heads,
                    n_kv_heads=self.n_kv_heads, vocab_size=self.vocab_size,
                    hidden_dim=self.hidden_dim, max_seq_len=self.max_seq_len)
        for name, v in ints.items():
            if not isinstance(v, (int, np.integer)) or v <= 0:
                raise ModelError(f"config: {name} must be a positive integer, got {v!r}")
        if self.dim % self.n_heads:
            raise ModelError(f"config: dim {self.dim} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ModelError(f"config: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ModelError(f"config: head_dim {self.head_dim} must be even for RoPE")
        limits = dict(dim=1 << 16, hidden_dim=1 << 18, vocab_size=1 << 20,
                      max_seq_len=1 << 16, n_layers=1 << 10, n_heads=1 << 10)
        for name, lim in limits.items():
            if ints[name] > lim:
                raise ModelError(f"config: {name} {ints[name]} is implausibly large (limit {lim})")
        for name, v in dict(ple_dim=self.ple_dim, out_vocab=self.out_vocab).items():
            if not isinstance(v, (int, np.integer)) or v < 0:
                raise ModelError(f"config: {name} must be a non-negative integer (0: off), got {v!r}")
        if self.out_vocab > self.vocab_size:
            raise ModelError(f"config: out_vocab {self.out_vocab} exceeds vocab_size {self.vocab_size} "
                             f"(the output layer predicts a prefix of the vocabulary)")
        for name, v in dict(n_experts=self.n_experts, moe_top_k=self.moe_top_k).items():
            if not isinstance(v, (int, np.integer)) or v < 0:
                raise ModelError(f"config: {name} must be a non-negative integer (0: a dense FFN), got {v!r}")
        if self.n_experts > MAX_EXPERTS:
            raise ModelError(f"config: n_experts {self.n_experts} is more than flashlm's {MAX_EXPERTS} experts a layer")
        if self.n_experts and not 1 <= self.moe_top_k <= min(self.n_experts, MAX_TOP_K):
            raise ModelError(f"config: moe_top_k {self.moe_top_k} must be 1..{min(self.n_experts, MAX_TOP_K)} "
                             f"(experts a token reads, of {self.n_experts}; at most {MAX_TOP_K})")
        if not self.n_experts and self.moe_top_k:
            raise ModelError(f"config: moe_top_k {self.moe_top_k} without experts (n_experts 0: a dense FFN)")
        if self.ple_dim > 1 << 16 or self.n_layers * self.ple_dim > 1 << 18:
            raise ModelError(f"config: ple_dim {self.ple_dim} x {self.n_layers} layers is implausibly large "
                             f"(limits 65536 and 262144 in all)")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a model of this config has, in canonical order."""
        d, hd, P, L = self.dim, self.head_dim, self.ple_dim, self.n_layers
        shapes: dict[str, tuple[int, ...]] = {"tok_embeddings": (self.vocab_size, d)}
        if P:
            shapes["ple.table"] = (self.vocab_size, L * P)
            shapes["ple.proj"] = (L * P, d)
            shapes["ple.norm"] = (P,)
        for i in range(self.n_layers):
            p = f"layers.{i}."
            shapes[p + "attn_norm"] = (d,)
            shapes[p + "attn.wq"] = (self.n_heads * hd, d)
            shapes[p + "attn.wk"] = (self.kv_dim, d)
            shapes[p + "attn.wv"] = (self.kv_dim, d)
            shapes[p + "attn.wo"] = (d, self.n_heads * hd)
            shapes[p + "ffn_norm"] = (d,)
            if self.n_experts:
                shapes[p + "ffn.router"] = (self.n_experts, d)
            for f in self.ffn_prefixes(i):
                shapes[f + "w1"] = (self.hidden_dim, d)
                shapes[f + "w2"] = (d, self.hidden_dim)
                shapes[f + "w3"] = (self.hidden_dim, d)
            if P:
                shapes[p + "ple.gate"] = (P, d)
                shapes[p + "ple.proj"] = (d, P)
                shapes[p + "ple.norm"] = (d,)
        shapes["norm"] = (d,)
        if not self.tied:
            shapes["output"] = (self.n_out, d)
        return shapes

    def ffn_prefixes(self, layer: int) -> list[str]:
        """The name prefixes of layer ``layer``'s FFN matrices (w1, w2, w3 follow): the dense FFN's, or
        each expert's in index order."""
        p = f"layers.{layer}.ffn."
        return [f"{p}experts.{e}." for e in range(self.n_experts)] if self.n_experts else [p]

    def n_params(self) -> int:
        return int(sum(np.prod(s) for s in self.tensor_shapes().values()))

    def param_split(self) -> dict[str, int]:
        """Parameters in the PLE table (``table``: read one row per token, lives in flash) and in
        everything else (``core``), which sum to n_params(); with experts also those in the experts
        (``experts``, part of core) and those a token reads (``active``: all but the experts it does
        not choose)."""
        table = int(np.prod(self.tensor_shapes().get("ple.table", (0,))))
        out = {"table": table, "core": self.n_params() - table}
        if self.n_experts:
            one = 3 * self.dim * self.hidden_dim * self.n_layers      # one expert in every layer
            out["experts"] = one * self.n_experts
            out["active"] = self.n_params() - one * (self.n_experts - self.moe_top_k)
        return out


@dataclass
class QTensor:
    """Symmetric group-wise quantized matrix.

    Groups run along a row; the last group of a row is ragged when ``cols % group_size``.
    ``codes`` is int8 in [-qmax, qmax] (int4 codes are stored unpacked here; packing is
    converter/formats.py's job).
    Two ways to scale a group (docs/formats.md section 1):

    * a float scale per group (``mult`` None): ``w[r, c] ~= codes[r, c] * scales[r, c // group_size]``,
      ``scales`` float32 [rows, n_groups]; ``scale16``: every scale is an fp16 value (the quantizer
      rounded it before choosing the codes) and the blob stores it as fp16 (format bit 8);
    * row-scaled (``mult`` given, format bit 9): an integer multiplier per group under one float
      scale per row, ``w[r, c] ~= (codes[r, c] * mult[r, c // group_size]) * scales[r, 0]``,
      ``mult`` uint8 [rows, n_groups] in 0..255, ``scales`` float32 [rows, 1]. A matvec row is then
      integer work up to one conversion and one multiply (converter/numerics.py).
    """
    fmt: str
    codes: np.ndarray       # int8 [rows, cols]
    scales: np.ndarray      # float32 [rows, n_groups], or [rows, 1] when row-scaled
    group_size: int
    scale16: bool = False
    mult: np.ndarray | None = None   # uint8 [rows, n_groups]: row-scaled groups' multipliers

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    @property
    def n_groups(self) -> int:
        return -(-self.codes.shape[1] // self.group_size)

    @property
    def rowscale(self) -> bool:
        return self.mult is not None

    def group_scales64(self) -> np.ndarray:
        """float64 [rows, n_groups]: each group's scale, exact (mult * row scale needs 32 bits)."""
        if self.mult is None:
            return self.scales.astype(np.float64)
        return self.mult.astype(np.float64) * self.scales.astype(np.float64)

    def exact64(self, rows: int | None = None) -> np.ndarray:
        """float64 [rows, cols]: the dequantized values, exact (a code times a group scale)."""
        g = np.arange(self.codes.shape[1]) // self.group_size
        return self.codes[:rows].astype(np.float64) * self.group_scales64()[:rows][:, g]

    def dequantize(self, rows=slice(None)) -> np.ndarray:
        """float32 values of ``rows`` (default all) as the engine dequantizes a row: code * scale,
        or with a row scale float(code * mult) * scale (one rounding either way)."""
        g = np.arange(self.codes.shape[1]) // self.group_size
        codes, scales = self.codes[rows], self.scales[rows]
        if self.mult is None:
            return (codes.astype(np.float32) * scales[..., g]).astype(np.float32)
        cm = (codes.astype(np.int32) * self.mult[rows][..., g].astype(np.int32)).astype(np.float32)
        return (cm * scales[..., :1]).astype(np.float32)

    def take_rows(self, rows) -> "QTensor":
        """The tensor of ``rows`` (a slice or an index array): a tied head's first out_vocab rows,
        a head stored in tile order."""
        return QTensor(self.fmt, self.codes[rows], self.scales[rows], self.group_size, self.scale16,
                       None if self.mult is None else self.mult[rows])


@dataclass
class Tokenizer:
    """Token pieces as the raw bytes they decode to, plus what the host needs to encode text.

    ``kind`` is ``"llama2c"`` (score-driven pair merging over ``pieces``, as llama2.c's
    tokenizer.bin) or ``"bpe"`` (a ``tokenizers`` BPE, ByteLevel or SentencePiece style, whose JSON is ``hf_json``).
    """
    pieces: list[bytes]
    scores: list[float]
    kind: str = "llama2c"
    bos_id: int | None = None
    eos_id: int | None = None
    hf_json: str | None = None
    # the pieces exactly as the source file spelled them (llama2.c tokenizer.bin: "<0x0A>", "\n<s>\n"),
    # for a lossless write-back; None when ``pieces`` is the only spelling
    raw_pieces: list[bytes] | None = None

    def __len__(self) -> int:
        return len(self.pieces)


@dataclass(frozen=True)
class StopIds:
    """The token ids that end a generation (any one of them), and where that list came from."""
    ids: tuple[int, ...]
    source: str

    def check(self, vocab_size: int) -> None:
        if len(self.ids) > MAX_STOP_IDS:
            raise ModelError(f"{len(self.ids)} stop ids ({self.source}): at most {MAX_STOP_IDS} are supported")
        bad = [i for i in self.ids if not (isinstance(i, (int, np.integer)) and 0 <= i < vocab_size)]
        if bad:
            raise ModelError(f"stop id {bad[0]!r} ({self.source}) is outside the vocabulary of {vocab_size}")
        if len(set(self.ids)) != len(self.ids):
            raise ModelError(f"stop ids {list(self.ids)} ({self.source}) repeat an id")

    def describe(self) -> str:
        return (", ".join(map(str, self.ids)) or "none") + f" ({self.source})"


@dataclass
class ModelIR:
    config: ModelConfig
    tensors: dict[str, np.ndarray | QTensor]
    tokenizer: Tokenizer | None = None
    # RoPE tables [max_seq_len, head_dim // 2] when the source file carries them (llama2.c v0);
    # otherwise the quantizer computes them from the config.
    rope_cos: np.ndarray | None = None
    rope_sin: np.ndarray | None = None
    source: str = ""
    meta: dict = field(default_factory=dict)
    # None: the tokenizer's EOS (flashlm's own checkpoints); importers of other origins set them
    stops: StopIds | None = None

    def stop_ids(self) -> StopIds:
        """The stop ids generation follows: the importer's, else the tokenizer's EOS, else none."""
        if self.stops is not None:
            return self.stops
        eos = self.tokenizer.eos_id if self.tokenizer is not None else None
        if eos is None:
            return StopIds((), "the tokenizer has no EOS" if self.tokenizer is not None else "no tokenizer")
        return StopIds((eos,), "the tokenizer's EOS")

    def validate(self) -> None:
        self.config.validate()
        want = self.config.tensor_shapes()
        missing = [n for n in want if n not in self.tensors]
        if missing:
            raise ModelError(f"model is missing tensors: {', '.join(missing[:4])}"
                             + (" ..." if len(missing) > 4 else ""))
        extra = [n for n in self.tensors if n not in want]
        if extra:
            raise ModelError(f"model has unexpected tensors: {', '.join(extra[:4])}")
        for name, shape in want.items():
            t = self.tensors[name]
            if tuple(t.shape) != shape:
                raise ModelError(f"tensor {name}: shape {tuple(t.shape)}, expected {shape}")
            if isinstance(t, np.ndarray) and not np.all(np.isfinite(t)):
                raise ModelError(f"tensor {name} holds NaN or infinite values")
        if self.tokenizer is not None and len(self.tokenizer) != self.config.vocab_size:
            raise ModelError(f"tokenizer has {len(self.tokenizer)} pieces but the model's vocab is "
                             f"{self.config.vocab_size}")
        self.stop_ids().check(self.config.vocab_size)


@dataclass
class QuantModel:
    """A model quantized by a recipe (converter/quantize.py), or read back from a blob: what the
    reference runs and the blob writer serializes."""
    config: ModelConfig
    tensors: dict[str, QTensor | np.ndarray]
    rope_cos: np.ndarray
    rope_sin: np.ndarray
    tokenizer: Tokenizer | None
    recipe: dict[str, str] = field(default_factory=dict)   # name -> "q8:32" / "q4:128:f16" / "f32"
    source: str = ""
    stops: StopIds = StopIds((), "none")                   # generation ends at any of these ids
    draft: object = None        # converter.draft.Draft: a small model proposing tokens for speculative decoding
    head_index: object = None   # converter.headprune.HeadIndex: the greedy head's tiles (headcalib.py decides)
    expert_use: object = None   # converter.expertuse.ExpertUse: how often each expert is chosen (calibrated)

    def head(self) -> QTensor:
        return self.tensors["tok_embeddings" if self.config.tied else "output"]  # type: ignore
