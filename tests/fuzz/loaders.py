"""Fuzz every file loader flashlm has with hypothesis: llama2.c checkpoints (v0, v1, v2), flashlm
``.pt`` checkpoints, Hugging Face folders (config.json, model.safetensors, tokenizer.json,
generation_config.json: one damaged at a time, the others valid), tokenizer.bin, tokenizer.json
and weights blobs.

Each example takes a small valid file and damages it — truncation, flipped bytes, a header field
set to an extreme value, a deleted / repeated / inserted slice, and format-aware mutations (a
mutated member inside a still-valid zip, a mutated value inside still-valid JSON, a blob mutated
and then given a correct CRC so the table and section checks run) — and loads it. The loader
must either accept the file (and the result must validate) or raise ModelError (BlobError is
one) with a one-line message naming the file. Anything else fails the run: another exception (a
traceback for the user), an example slower than ``--per-example`` seconds (a hang), or an
allocation beyond ``--mem-mb`` MB: the run lowers its own RLIMIT_DATA to that much above what it
uses after start-up, so a loader that believes a size field and allocates it fails loudly.

    python tests/fuzz/loaders.py --examples 300           # tests/test_fuzz.py runs this
    python tests/fuzz/loaders.py --examples 20000 --json build/fuzz/loaders.json   # make fuzz

Prints one JSON line: examples per kind, accepted / refused counts, the slowest example."""
from __future__ import annotations

import argparse
import io
import json
import resource
import signal
import struct
import sys
import tempfile
import time
import warnings
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed as hseed, settings, strategies as st  # noqa: E402

from converter import headprune  # noqa: E402
from converter.blob import build_blob, read_blob, read_header  # noqa: E402
from converter.ir import ModelConfig, ModelError, ModelIR  # noqa: E402
from converter.llama2c import write_llama2c  # noqa: E402
from converter.load import load_model  # noqa: E402
from converter.quantize import quantize  # noqa: E402
from converter.tokenizer import load_tokenizer  # noqa: E402

EXTREMES = [0, 1, 2, 3, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
            0xFFFFFFFE, 1 << 20, 1 << 24, 1 << 30]


class Hang(Exception):
    pass


def _tiny_ir(tied=False) -> ModelIR:
    cfg = ModelConfig(dim=8, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=6, hidden_dim=8, max_seq_len=4,
                      tied=tied)
    rng = np.random.default_rng(0)
    return ModelIR(cfg, {n: rng.standard_normal(s).astype(np.float32) for n, s in cfg.tensor_shapes().items()})


def _bpe_json() -> str:
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers, trainers
    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=262, special_tokens=["<|bos|>", "<|eos|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(["a small model on a small chip", "the the fox"] * 3, trainer=trainer)
    return hf.to_str()


def _tokenizer_bin() -> bytes:
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)] + [b" ", b"a", b"ab"]
    out = [struct.pack("<i", max(map(len, pieces)))]
    for i, p in enumerate(pieces):
        out.append(struct.pack("<fi", -float(i % 7), len(p)) + p)
    return b"".join(out)


def make_seeds(d: Path) -> dict[str, tuple[str, bytes]]:
    """{kind: (file name, bytes)}: one small valid file of each kind."""
    import torch  # noqa: F401  (the .pt writer)

    from converter.torch_import import save_checkpoint
    from converter.torch_model import Transformer
    seeds = {}
    ir = _tiny_ir()
    for v in (0, 1, 2):
        p = d / f"seed_v{v}.bin"
        write_llama2c(ir, p, v, group_size=4)
        seeds[f"llama2c_v{v}"] = (f"model_v{v}.bin", p.read_bytes())
    bpe = _bpe_json()
    n_vocab = len(json.loads(bpe)["model"]["vocab"]) + 0
    from converter.tokenizer import from_hf_json
    n_vocab = len(from_hf_json(bpe))
    cfg = ModelConfig(dim=8, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=n_vocab, hidden_dim=8, max_seq_len=4)
    import torch as T
    T.manual_seed(0)
    p = d / "seed.pt"
    save_checkpoint(p, Transformer(cfg), tokenizer_json=bpe, train={"steps": 1})
    seeds["pt"] = ("model.pt", p.read_bytes())
    seeds["tokenizer_bin"] = ("tokenizer.bin", _tokenizer_bin())
    seeds["tokenizer_json"] = ("tokenizer.json", bpe.encode())
    qm = quantize(_tiny_ir(tied=True), "q8", 4)
    qm.head_index = headprune.build(qm.head(), qm.config.n_out, 2)      # its tiles, maps and radii fuzzed too
    seeds["blob"] = ("model.flmb", build_blob(qm))
    HF_FILES.update(_hf_folder(bpe, n_vocab))
    seeds["hf"] = (HF_DIR, b"")           # one of HF_FILES damaged per example, the others as they are
    return seeds


HF_DIR = "hf"
HF_FILES: dict[str, bytes] = {}           # a Hugging Face folder: file name -> bytes


def _hf_folder(bpe: str, vocab: int) -> dict[str, bytes]:
    """{file name: bytes} of a tiny transformers-layout Llama folder (bf16 weights)."""
    import torch
    from safetensors.torch import save
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": vocab,
           "max_position_embeddings": 4, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default",
           "rope_theta": 10000.0}, "tie_word_embeddings": False, "hidden_act": "silu", "eos_token_id": 1}
    shapes = {"model.embed_tokens.weight": (vocab, 8), "model.norm.weight": (8,), "lm_head.weight": (vocab, 8),
              "model.layers.0.input_layernorm.weight": (8,), "model.layers.0.post_attention_layernorm.weight": (8,),
              "model.layers.0.self_attn.q_proj.weight": (8, 8), "model.layers.0.self_attn.k_proj.weight": (4, 8),
              "model.layers.0.self_attn.v_proj.weight": (4, 8), "model.layers.0.self_attn.o_proj.weight": (8, 8),
              "model.layers.0.mlp.gate_proj.weight": (8, 8), "model.layers.0.mlp.up_proj.weight": (8, 8),
              "model.layers.0.mlp.down_proj.weight": (8, 8)}
    g = torch.Generator().manual_seed(0)
    weights = save({k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()})
    return {"config.json": json.dumps(cfg).encode(), "model.safetensors": weights, "tokenizer.json": bpe.encode(),
            "generation_config.json": json.dumps({"eos_token_id": [1, 0]}).encode()}


# ---- mutations ---------------------------------------------------------------------------

def _u32_field(raw: bytearray, data) -> None:
    if len(raw) < 4:
        return
    off = 4 * data.draw(st.integers(0, min(len(raw), 256) // 4 - 1), label="field")
    struct.pack_into("<I", raw, off, data.draw(st.sampled_from(EXTREMES), label="value"))


def _bytes_mutation(raw: bytearray, data) -> bytearray:
    kind = data.draw(st.sampled_from(["truncate", "flip", "field", "delete", "repeat", "insert"]), label="how")
    n = len(raw)
    if kind == "truncate":
        return raw[:data.draw(st.integers(0, max(n - 1, 0)), label="len")]
    if kind == "flip" and n:
        for _ in range(data.draw(st.integers(1, 6), label="flips")):
            i = data.draw(st.integers(0, n - 1), label="pos")
            raw[i] ^= data.draw(st.integers(1, 255), label="xor")
    elif kind == "field":
        for _ in range(data.draw(st.integers(1, 3), label="fields")):
            _u32_field(raw, data)
    elif kind in ("delete", "repeat") and n > 2:
        a = data.draw(st.integers(0, n - 2), label="start")
        b = data.draw(st.integers(a + 1, min(n, a + 4096)), label="end")
        raw = raw[:a] + raw[b:] if kind == "delete" else raw[:b] + raw[a:b] + raw[b:]
    elif kind == "insert":
        i = data.draw(st.integers(0, n), label="at")
        raw = raw[:i] + bytearray(data.draw(st.binary(min_size=1, max_size=64), label="bytes")) + raw[i:]
    return raw


def _zip_mutation(raw: bytes, data) -> bytes:
    """A valid zip again, one member damaged (the pickle, a tensor, the version record...)."""
    zin = zipfile.ZipFile(io.BytesIO(raw))
    names = zin.namelist()
    target = data.draw(st.sampled_from(names), label="member")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for name in names:
            body = zin.read(name)
            if name == target:
                body = bytes(_bytes_mutation(bytearray(body), data))
            zout.writestr(name, body)
    return out.getvalue()


def _json_mutation(raw: bytes, data) -> bytes:
    obj = json.loads(raw)
    paths = []

    def walk(o, path, depth):
        paths.append(path)
        if depth > 4:
            return
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for i, (k, v) in enumerate(items):
            if i > 40:
                break
            walk(v, path + [k], depth + 1)

    walk(obj, [], 0)
    path = data.draw(st.sampled_from(paths[1:]), label="path")
    value = data.draw(st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.sampled_from(EXTREMES),
                                st.text(max_size=20), st.just([]), st.just({}),
                                st.lists(st.integers(-5, 300), max_size=4)), label="value")
    o = obj
    for k in path[:-1]:
        o = o[k]
    o[path[-1]] = value
    return json.dumps(obj).encode()


def mutate(kind: str, raw: bytes, data) -> bytes:
    how = data.draw(st.sampled_from(["bytes", "bytes", "format"]), label="mutation")
    if how == "format":
        if kind == "pt":
            return _zip_mutation(raw, data)
        if kind in ("tokenizer_json", "hf_json"):
            return _json_mutation(raw, data)
        if kind == "blob":
            b = _bytes_mutation(bytearray(raw), data)
            if len(b) >= 16:
                import zlib
                struct.pack_into("<I", b, 8, len(b))
                struct.pack_into("<I", b, 12, zlib.crc32(memoryview(b)[16:]))
            return bytes(b)
    return bytes(_bytes_mutation(bytearray(raw), data))


def load(kind: str, path: Path):
    if kind.startswith("llama2c") or kind == "pt":
        load_model(path).validate()
    elif kind == "hf":
        load_model(path.parent).validate()
    elif kind.startswith("tokenizer"):
        tok = load_tokenizer(path)
        assert len(tok) > 0
    else:
        read_header(path)
        read_blob(path)


# ---- the run -----------------------------------------------------------------------------

FAILURES = ROOT / "build" / "fuzz" / "loader-failures"


def _keep(kind: str, name: str, data: bytes) -> None:
    """Keep a failing input (build/fuzz/loader-failures/) to reproduce it and to add as a test."""
    import hashlib
    FAILURES.mkdir(parents=True, exist_ok=True)
    (FAILURES / f"{kind}-{hashlib.sha1(data).hexdigest()[:10]}-{name}").write_bytes(data)


def _limit_memory(mem_mb: int) -> None:
    vmdata = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                vmdata = int(line.split()[1]) * 1024
    lim = vmdata + mem_mb * (1 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        lim = min(lim, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (lim, hard))


def run(examples: int, seed: int, mem_mb: int, per_example: float, workdir: Path) -> dict:
    seeds = make_seeds(workdir)
    kinds = sorted(seeds)
    counts = {k: {"examples": 0, "accepted": 0, "refused": 0} for k in kinds}
    slowest = [0.0, ""]
    _limit_memory(mem_mb)

    def on_alarm(*_):
        raise Hang()

    signal.signal(signal.SIGALRM, on_alarm)

    def check(kind, name, path, mutated) -> str:
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, per_example)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                load(kind, path)
            outcome = "accepted"
        except ModelError as e:
            msg = str(e)
            assert "\n" not in msg, f"{kind}: a multi-line error: {msg!r}"
            assert name in msg, f"{kind}: the error does not name the file: {msg!r}"
            low = msg.lower()
            assert "allocate" not in low and "memoryerror" not in low, f"{kind}: a huge allocation: {msg}"
            outcome = "refused"
        except Hang:
            raise AssertionError(f"{kind}: loading took over {per_example:g} s") from None
        except MemoryError:
            raise AssertionError(f"{kind}: a huge allocation (MemoryError, over {mem_mb} MB)") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        assert not caught, f"{kind}: loading printed a warning: {caught[0].category.__name__}: {caught[0].message}"
        dt = time.monotonic() - t0
        if dt > slowest[0]:
            slowest[:] = [dt, kind]
        return outcome

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(kinds), data=st.data())
    def one(kind, data):
        name, raw = seeds[kind]
        path = workdir / name
        if kind == "hf":                    # one file damaged, the others as they were; errors name the folder
            path = path / data.draw(st.sampled_from(sorted(HF_FILES)), label="file")
            raw = HF_FILES[path.name]
            path.parent.mkdir(exist_ok=True)
            for n, r in HF_FILES.items():
                (path.parent / n).write_bytes(r)
        mutated = mutate("hf_json" if kind == "hf" and path.suffix == ".json" else kind, raw, data)
        path.write_bytes(mutated)
        try:
            outcome = check(kind, name, path, mutated)
        except BaseException as e:
            if not isinstance(e, KeyboardInterrupt):
                _keep(kind, path.name, mutated)
            raise
        c = counts[kind]
        c["examples"] += 1
        c[outcome] += 1

    t0 = time.monotonic()
    one()
    return {"examples": sum(c["examples"] for c in counts.values()), "kinds": counts,
            "failures": 0, "slowest_s": round(slowest[0], 3), "slowest_kind": slowest[1],
            "seconds": round(time.monotonic() - t0, 1), "mem_limit_mb": mem_mb}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Fuzz flashlm's file loaders (hypothesis).")
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mem-mb", type=int, default=512, help="allowed allocation above start-up")
    ap.add_argument("--per-example", type=float, default=10.0, help="seconds before an example is a hang")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flashlm-loader-fuzz-") as d:
        try:
            res = run(args.examples, args.seed, args.mem_mb, args.per_example, Path(d))
        except Exception as e:   # an AssertionError, or hypothesis's group of several
            errs = getattr(e, "exceptions", None) or [e]
            print(json.dumps({"failures": len(errs), "errors": [str(x).splitlines()[0][:500] for x in errs]}))
            import traceback
            traceback.print_exception(e, file=sys.stderr)
            return 1
    print(json.dumps(res))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
