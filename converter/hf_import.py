"""Hugging Face ``transformers`` checkpoints of the Llama family to ``ModelIR``.

A folder as ``save_pretrained`` writes it: ``config.json``; the weights as ``model.safetensors``,
sharded ``model-0000N-of-0000M.safetensors`` with ``model.safetensors.index.json``, or (the
fallback) ``pytorch_model.bin`` / its index; ``tokenizer.json`` (optional; with
``tokenizer_config.json``) and ``generation_config.json`` (optional: the stop ids).

``LlamaForCausalLM``, and ``MistralForCausalLM`` / ``Qwen2ForCausalLM`` where they are the same
network: RMSNorm, rotary attention with grouped KV heads, a SiLU-gated FFN, tied or untied head;
``MixtralForCausalLM``, the same network with a mixture of SiLU-gated experts in every FFN (a router,
the top ``num_experts_per_tok`` of ``num_local_experts``, their weights the softmax over the chosen
logits). Its experts arrive as one tensor each (``block_sparse_moe.experts.{e}.w1``/``w2``/``w3``, the
published checkpoints) or fused (``mlp.experts.gate_up_proj`` [E, 2 I, D], gate rows first, and
``mlp.experts.down_proj`` [E, D, I], as transformers 5 saves them); either becomes one IR tensor per
expert. Other mixture-of-experts architectures are refused by name with what they would need.
What the engine has no operator for is refused with the config field (or tensor) that asks for
it: another activation, RoPE scaling, a partial rotary dimension, biases that are not all zero
(``attention_bias``, ``mlp_bias``, Qwen2's q/k/v biases), a sliding window shorter than the
context, a ``head_dim`` other than hidden_size / num_attention_heads, pre-quantized weights.

Weight names map one to one (``model.layers.{i}.self_attn.q_proj.weight`` ->
``layers.{i}.attn.wq``, ...). Hugging Face's rotary embedding rotates the pairs (j, j + d/2) of a
head of d dimensions (``rotate_half``); ours rotates (2j, 2j+1) with the same frequency
``theta^(-2j/d)``. So the rows of wq and wk are permuted per head: our row 2j is their row j, our
row 2j+1 their row j + d/2. q.k dot products are sums over the same pairs in another order,
so attention is unchanged; wv and wo are untouched.

Tensors are read one at a time through ``safetensors.safe_open`` (memory-mapped) and widened to
fp32 (bf16, fp16 and fp32 are accepted): the fp32 IR is the only whole copy of the model.
"""
from __future__ import annotations

import contextlib
import json
import os
import re

import numpy as np

from .files import read_file
from .ir import ModelConfig, ModelError, ModelIR, StopIds
from .tokenizer import from_hf_json

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM")
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "mixtral": "MixtralForCausalLM"}
# mixtures of experts flashlm does not import, and what of theirs its MoE layer (Mixtral's) lacks
OTHER_MOE = {
    "Qwen2MoeForCausalLM": "a shared expert with a sigmoid gate beside the routed ones, routing weights not "
                           "renormalised over the top-k (norm_topk_prob), q/k/v biases",
    "Qwen3MoeForCausalLM": "RMSNorm of every query and key head (q_norm, k_norm), dense layers among the sparse "
                           "ones (mlp_only_layers, decoder_sparse_step), norm_topk_prob",
    "OlmoeForCausalLM": "RMSNorm of the queries and keys (q_norm, k_norm) and routing weights not renormalised "
                        "over the top-k (norm_topk_prob false)",
    "DeepseekV2ForCausalLM": "multi-head latent attention (compressed KV), shared experts, grouped top-k routing",
    "DeepseekV3ForCausalLM": "multi-head latent attention (compressed KV), shared experts, sigmoid routing scores "
                             "with a bias, grouped top-k",
    "PhimoeForCausalLM": "sparsemixer routing and LayerNorm with biases",
    "GraniteMoeForCausalLM": "embedding, residual, attention and logits multipliers",
    "GraniteMoeSharedForCausalLM": "a shared expert and embedding, residual, attention and logits multipliers",
    "JetMoeForCausalLM": "a mixture of attention heads beside the mixture of FFN experts, biases",
    "DbrxForCausalLM": "LayerNorm, clipped q/k/v, routing weights renormalised by a p-norm",
    "GptOssForCausalLM": "attention sinks, sliding-window layers, biased experts with a clamped SwiGLU",
    "Llama4ForCausalLM": "a shared expert, sigmoid routing, attention layers without RoPE",
    "MiniMaxForCausalLM": "linear (lightning) attention layers",
}
DTYPES = ("F32", "F16", "BF16")          # safetensors' names of the dtypes read (widened to fp32)
SILU = ("silu", "swish")
WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                "pytorch_model.bin")

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn.wq",
    "self_attn.k_proj.weight": "attn.wk",
    "self_attn.v_proj.weight": "attn.wv",
    "self_attn.o_proj.weight": "attn.wo",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn.w1",
    "mlp.down_proj.weight": "ffn.w2",
    "mlp.up_proj.weight": "ffn.w3",
}
_LEGACY_EXPERT = re.compile(r"block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight")
_MOE_NAMES = {"block_sparse_moe.gate.weight": "ffn.router", "mlp.gate.weight": "ffn.router"}
_FUSED = {"mlp.experts.gate_up_proj": "gate_up", "mlp.experts.down_proj": "down"}
_BIASES = {"self_attn.q_proj.bias": "attention_bias", "self_attn.k_proj.bias": "attention_bias",
           "self_attn.v_proj.bias": "attention_bias", "self_attn.o_proj.bias": "attention_bias",
           "mlp.gate_proj.bias": "mlp_bias", "mlp.up_proj.bias": "mlp_bias", "mlp.down_proj.bias": "mlp_bias"}
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")   # a derived buffer (older files)


def is_hf_dir(path) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def _json(path, what: str, required: bool = True) -> dict | None:
    if not required and not os.path.isfile(path):
        return None
    try:
        d = json.loads(read_file(path, what).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ModelError(f"{path}: expected a JSON object")
    return d


# ----------------------------------------------------------------------------- config

def _int(cfg: dict, key: str, default=None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ModelError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _rope_theta(cfg: dict) -> float:
    """rope_theta from transformers 5's ``rope_parameters`` or the older top-level fields; scaled
    or partial rotary embeddings are refused."""
    params = cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ModelError(f"config.json: rope_parameters {params!r} is not an object")
    params = params or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ModelError(f"config.json: rope_parameters.rope_type {kind!r} is not supported (flashlm's RoPE "
                         f"is unscaled: rope_type 'default')")
    scaling = cfg.get("rope_scaling")
    if scaling is not None and (not isinstance(scaling, dict)
                                or scaling.get("rope_type", scaling.get("type")) != "default"):
        raise ModelError(f"config.json: rope_scaling {json.dumps(scaling)[:80]} is not supported "
                         f"(flashlm's RoPE is unscaled)")
    for where in (cfg, params):
        f = where.get("partial_rotary_factor", 1.0)
        if f != 1.0:
            raise ModelError(f"config.json: partial_rotary_factor {f!r} is not supported (RoPE covers "
                             f"the whole head)")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ModelError(f"config.json: rope_theta must be a positive number, got {theta!r}")
    return float(theta)


def _sliding_window(cfg: dict) -> int | None:
    """The attention window a layer uses, or None when every layer attends to the whole context."""
    w = cfg.get("sliding_window")
    if w is None or cfg.get("use_sliding_window") is False:
        return None
    types = cfg.get("layer_types")
    if isinstance(types, list) and all(t == "full_attention" for t in types):
        return None
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        raise ModelError(f"config.json: sliding_window must be a positive integer or null, got {w!r}")
    return w


def read_config(cfg: dict, context: int | None = None) -> tuple[str, ModelConfig]:
    """(architecture, ModelConfig) from a config.json; ``context`` (default: max_position_embeddings)
    is the positions the converted model holds."""
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else MODEL_TYPES.get(cfg.get("model_type"))
    if arch in OTHER_MOE:
        raise ModelError(f"config.json: {arch} is a mixture of experts flashlm does not import: it needs "
                         f"{OTHER_MOE[arch]}; flashlm imports MixtralForCausalLM's (SwiGLU experts, the top-k "
                         f"router logits' softmax, no shared expert)")
    if arch not in ARCHITECTURES:
        what = arch or cfg.get("model_type") or "none given"
        raise ModelError(f"config.json: architecture {what!r} is not supported (flashlm imports "
                         f"{', '.join(ARCHITECTURES)})")
    if cfg.get("quantization_config") is not None:
        raise ModelError("config.json: quantization_config: a pre-quantized checkpoint (GPTQ, AWQ, bitsandbytes, "
                         "...) is not supported; import the unquantized weights")
    act = cfg.get("hidden_act", "silu")
    if act not in SILU:
        raise ModelError(f"config.json: hidden_act {act!r} is not supported (flashlm's FFN is gated by SiLU)")
    dim, n_heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    hd = cfg.get("head_dim")
    if hd is not None and (isinstance(hd, bool) or not isinstance(hd, int) or n_heads * hd != dim):
        raise ModelError(f"config.json: head_dim {hd!r} is not hidden_size / num_attention_heads = "
                         f"{dim} / {n_heads} (flashlm's heads split the hidden size)")
    positions = _int(cfg, "max_position_embeddings", 2048)
    ctx = positions if context is None else context
    if ctx > positions:
        raise ModelError(f"context {ctx} is longer than the model's max_position_embeddings {positions}")
    window = _sliding_window(cfg)
    if window is not None and window < ctx:
        raise ModelError(f"config.json: sliding_window {window} is shorter than the context {ctx}: flashlm's "
                         f"attention has no sliding-window mask; convert with --ctx {window} or less")
    eps = cfg.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ModelError(f"config.json: rms_norm_eps must be a positive number, got {eps!r}")
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ModelError(f"config.json: tie_word_embeddings must be true or false, got {tied!r}")
    experts = (_int(cfg, "num_local_experts"), _int(cfg, "num_experts_per_tok")) if arch == "MixtralForCausalLM" \
        else (0, 0)
    c = ModelConfig(dim=dim, n_layers=_int(cfg, "num_hidden_layers"), n_heads=n_heads,
                    n_kv_heads=_int(cfg, "num_key_value_heads", n_heads), vocab_size=_int(cfg, "vocab_size"),
                    hidden_dim=_int(cfg, "intermediate_size"), max_seq_len=ctx, tied=tied,
                    norm_eps=float(eps), rope_theta=_rope_theta(cfg), n_experts=experts[0], moe_top_k=experts[1])
    try:
        c.validate()
    except ModelError as e:
        raise ModelError(f"config.json: {e}") from None
    return arch, c


def stop_ids(folder, cfg: dict) -> StopIds | None:
    """eos_token_id (an int or a list) of generation_config.json, else of config.json; None when
    neither has one (then the tokenizer's EOS)."""
    gen = _json(os.path.join(folder, "generation_config.json"), "generation_config.json", required=False)
    for name, d in (("generation_config.json", gen), ("config.json", cfg)):
        v = (d or {}).get("eos_token_id")
        if v is None:
            continue
        ids = [v] if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ModelError(f"{name}: eos_token_id {v!r} is not an int or a list of ints")
        return StopIds(tuple(dict.fromkeys(ids)), f"eos_token_id of {name}")
    return None


# ----------------------------------------------------------------------------- weights

class _Weights(contextlib.ExitStack):
    """The folder's tensors by Hugging Face name, each read on request as an fp32 array (the files
    stay memory-mapped; only that tensor is copied)."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder
        self.files: dict[str, str] | None = {}   # tensor name -> file name
        self.handles: dict[str, object] = {}
        present = [f for f in WEIGHT_FILES if os.path.isfile(os.path.join(folder, f))]
        if not present:
            raise ModelError(f"{folder}: no weights ({', '.join(WEIGHT_FILES)})")
        first = present[0]
        if first.endswith(".index.json"):
            index = _json(os.path.join(folder, first), first)
            wm = index.get("weight_map")
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise ModelError(f"{first}: weight_map is not an object of file names")
            self.files = dict(wm)
        else:
            self.files = None           # every tensor in the one file, listed when it is opened
            self.single = first
        self.safetensors = first.startswith("model.safetensors")

    def _open(self, fname: str):
        if fname not in self.handles:
            path = os.path.join(self.folder, fname)
            if os.path.basename(fname) != fname or not os.path.isfile(path):
                raise ModelError(f"{self.folder}: weight file {fname} is missing")
            try:
                if self.safetensors:
                    from safetensors import safe_open
                    self.handles[fname] = self.enter_context(safe_open(path, framework="pt"))
                else:
                    import torch
                    self.handles[fname] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except ModelError:
                raise
            except Exception as e:     # the readers raise their own kinds on a damaged file
                raise ModelError(f"{path}: cannot read: {(str(e).splitlines() or [type(e).__name__])[0][:200]}") from None
            if not self.safetensors and not isinstance(self.handles[fname], dict):
                raise ModelError(f"{path}: not a state dict")
        return self.handles[fname]

    def names(self) -> list[str]:
        if self.files is None:
            h = self._open(self.single)
            self.files = dict.fromkeys(h.keys() if self.safetensors else h, self.single)
        return list(self.files)

    def _dtype(self, h, name: str) -> str:
        if self.safetensors:
            return h.get_slice(name).get_dtype()
        t = h[name]
        return {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16"}.get(str(t.dtype), str(t.dtype))

    def get(self, name: str) -> np.ndarray:
        import torch
        h = self._open(self.files[name])
        dt = self._dtype(h, name)
        if dt not in DTYPES:
            raise ModelError(f"tensor {name}: dtype {dt} is not supported (bf16, fp16 or fp32)")
        t = h.get_tensor(name) if self.safetensors else h[name]
        return t.to(torch.float32).numpy()


def _unrotate(w: np.ndarray, n_heads: int, hd: int) -> np.ndarray:
    """Rows of a q or k projection from Hugging Face's rotary layout (pairs j, j + hd/2 of a head)
    to ours (pairs 2j, 2j + 1)."""
    cols = w.shape[1]
    return np.ascontiguousarray(w.reshape(n_heads, 2, hd // 2, cols).transpose(0, 2, 1, 3).reshape(-1, cols))


def _ir_name(name: str, c: ModelConfig) -> str | None:
    if name == "model.embed_tokens.weight":
        return "tok_embeddings"
    if name == "model.norm.weight":
        return "norm"
    if name == "lm_head.weight":
        return None if c.tied else "output"      # a tied head is the embedding, as transformers ties it
    m = _LAYER.fullmatch(name)
    if not m or int(m.group(1)) >= c.n_layers:
        return None
    layer, rest = int(m.group(1)), m.group(2)
    if c.n_experts:   # the experts and router instead of the dense FFN
        e = _LEGACY_EXPERT.fullmatch(rest)
        if e and int(e.group(1)) < c.n_experts:
            return f"layers.{layer}.ffn.experts.{int(e.group(1))}.{e.group(2)}"
        if rest in _MOE_NAMES:
            return f"layers.{layer}.{_MOE_NAMES[rest]}"
        if rest.startswith("mlp."):
            return None
    return f"layers.{layer}.{_LAYER_NAMES[rest]}" if rest in _LAYER_NAMES else None


def _split_fused(name: str, layer: int, kind: str, t: np.ndarray, c: ModelConfig) -> dict[str, np.ndarray]:
    """One layer's fused experts (transformers 5's layout) as one tensor per expert: gate_up_proj
    [E, 2 I, D] gives w1 (its first I rows) and w3, down_proj [E, D, I] gives w2."""
    E, I, D = c.n_experts, c.hidden_dim, c.dim
    want = (E, 2 * I, D) if kind == "gate_up" else (E, D, I)
    if tuple(t.shape) != want:
        raise ModelError(f"tensor {name}: shape {tuple(t.shape)}, expected {want}")
    p = f"layers.{layer}.ffn.experts."
    if kind == "down":
        return {f"{p}{e}.w2": np.ascontiguousarray(t[e]) for e in range(E)}
    out = {}
    for e in range(E):
        out[f"{p}{e}.w1"] = np.ascontiguousarray(t[e, :I])
        out[f"{p}{e}.w3"] = np.ascontiguousarray(t[e, I:])
    return out


def read_weights(folder, arch: str, c: ModelConfig) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    with _Weights(folder) as w:
        for name in w.names():
            ir = _ir_name(name, c)
            m = _LAYER.fullmatch(name)
            if ir is None and c.n_experts and m and int(m.group(1)) < c.n_layers and m.group(2) in _FUSED:
                tensors.update(_split_fused(name, int(m.group(1)), _FUSED[m.group(2)], w.get(name), c))
                continue
            if ir is None:
                field = _BIASES.get(m.group(2)) if m else None
                if field is not None:
                    if np.any(w.get(name)):
                        what = "q/k/v biases" if arch == "Qwen2ForCausalLM" else f"config {field}"
                        raise ModelError(f"{name}: {field.replace('_', ' ')} ({what}) is not supported: the "
                                         f"tensor is not zero and flashlm's matmuls have no bias")
                    continue         # all zero: the same network without it
                if name == "lm_head.weight" or _IGNORED.fullmatch(name):
                    continue
                raise ModelError(f"{folder}: unexpected tensor {name} (not part of a {arch} with "
                                 f"{c.n_layers} layers)")
            t = w.get(name)
            if ir.rsplit(".", 1)[-1] in ("wq", "wk"):
                heads = c.n_heads if ir.endswith("wq") else c.n_kv_heads
                if t.ndim != 2 or t.shape[0] != heads * c.head_dim:
                    raise ModelError(f"tensor {name}: shape {tuple(t.shape)}, expected "
                                     f"({heads * c.head_dim}, {c.dim})")
                t = _unrotate(t, heads, c.head_dim)
            tensors[ir] = t
    missing = [n for n in c.tensor_shapes() if n not in tensors]
    if missing:
        hint = " (tie_word_embeddings is false, so the head needs lm_head.weight)" if missing[0] == "output" else ""
        raise ModelError(f"{folder}: missing tensor(s) for {', '.join(missing[:3])}{hint}")
    return tensors


# ----------------------------------------------------------------------------- the folder

def read_tokenizer(folder):
    """The folder's tokenizer.json (with tokenizer_config.json), or None when there is none."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(folder, "tokenizer.model")):
            raise ModelError(f"{folder}: only a SentencePiece tokenizer.model, no tokenizer.json; save the "
                             f"tokenizer with transformers' fast tokenizer (tokenizer.json) first")
        return None
    try:
        text = read_file(path, "tokenizer.json").decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelError(f"{path}: not UTF-8: {e}") from None
    conf = _json(os.path.join(folder, "tokenizer_config.json"), "tokenizer_config.json", required=False)
    try:
        return from_hf_json(text, conf)
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None


def read_hf_dir(folder, context: int | None = None) -> ModelIR:
    """A ModelIR (with its tokenizer and stop ids) from a transformers Llama-family folder; every
    error names the folder."""
    folder = os.fspath(folder)
    try:
        return _read_hf_dir(folder, context)
    except ModelError as e:
        msg = str(e)
        raise ModelError(msg if msg.startswith(folder) else f"{folder}: {msg}") from None


def _read_hf_dir(folder: str, context: int | None) -> ModelIR:
    cfg = _json(os.path.join(folder, "config.json"), "config.json")
    arch, c = read_config(cfg, context)
    tensors = read_weights(folder, arch, c)
    tok = read_tokenizer(folder)
    if tok is not None and len(tok) < c.vocab_size:
        # embedding rows past the tokenizer (vocabularies padded to a round size): no text maps to
        # them and they decode to nothing
        tok.pieces += [b""] * (c.vocab_size - len(tok))
        tok.scores += [min(tok.scores, default=0.0)] * (c.vocab_size - len(tok.scores))
    ir = ModelIR(c, tensors, tokenizer=tok, source=folder, stops=stop_ids(folder, cfg),
                 meta={"format": "transformers", "architecture": arch,
                       "max_position_embeddings": cfg.get("max_position_embeddings")})
    ir.validate()
    return ir


__all__ = ["is_hf_dir", "read_hf_dir", "read_config", "read_weights", "read_tokenizer", "stop_ids"]
