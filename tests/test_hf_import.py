"""Hugging Face Llama-family folders (converter/hf_import.py) and stop ids: small random models
made here with ``transformers`` (no download), compared with transformers' own logits, and run on
the native board against the reference."""
import copy
import json
import shutil

import numpy as np
import pytest
import torch

from converter import hf_import
from converter.blob import build_blob, read_blob
from converter.ir import ModelError
from converter.llama2c import write_llama2c
from converter.load import load_model
from converter.quantize import quantize, rope_tables
from converter.fidelity import Fp32Model
from converter.reference import FLAG_LOGITS, generate
from converter.tokenizer import decode, encode
from converter.tokenizer_enc import device_section
from host.cli.main import main
from modelzoo import random_model
from nativeboard import assert_matches_reference, native_link, run
from test_tokenize import assert_same_ids, random_texts, tok_check  # noqa: F401 (tok_check: a fixture)

transformers = pytest.importorskip("transformers")
transformers.utils.logging.disable_progress_bar()       # save_pretrained's bar would mix with the CLI's stderr

SHAPES = {   # tied + GQA; untied, multi-query, a hidden size that is no multiple of the group size
    "tied-gqa": dict(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                     tie_word_embeddings=True),
    "untied-odd": dict(hidden_size=44, intermediate_size=70, num_attention_heads=2, num_key_value_heads=1,
                       tie_word_embeddings=False),
}


def hf_model(shape="tied-gqa", seed=0, arch="llama", **over):
    """A random transformers model (CPU, eval), weights scaled so attention and logits are far from uniform."""
    Config, Model = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                     "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
                     "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]
    kw = dict(vocab_size=300, num_hidden_layers=2, max_position_embeddings=64, rope_theta=500.0,
              rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, **SHAPES[shape])
    kw.update(over)
    torch.manual_seed(seed)
    model = Model(Config(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else p * 5)
    return model


def save(model, path, **kw):
    model.save_pretrained(path, **kw)
    return path


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model.float()(torch.tensor([ids])).logits[0].numpy()


def fp32_logits(ir, ids) -> np.ndarray:
    fp = Fp32Model(ir, *rope_tables(ir.config))
    return np.stack([fp.forward(t, p) for p, t in enumerate(ids)])


IDS = [int(i) for i in np.random.default_rng(5).integers(0, 300, 40)]


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("builds")


# ----------------------------------------------------------------------------- the network

@pytest.mark.native
@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_fp32_reference_matches_transformers_and_int8_runs_bit_exact(shape, tmp_path, build_root):
    model = hf_model(shape)
    ir = load_model(save(model, tmp_path / "hf"))
    c = ir.config
    assert (c.tied, c.n_kv_heads, c.dim, c.norm_eps, c.rope_theta) == (
        model.config.tie_word_embeddings, model.config.num_key_value_heads, model.config.hidden_size, 1e-5, 500.0)
    want = hf_logits(model, IDS)
    got = fp32_logits(ir, IDS)
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=0)
    qm = quantize(ir, "q8", 32)
    with native_link(qm, tmp_path, build_root) as (link, _):
        ref = generate(qm, IDS[:3], 32, flags=FLAG_LOGITS)
        toks, logits, done = run(link, IDS[:3], 32)
        assert_matches_reference(toks, logits, ref)


def test_without_undoing_the_rotary_permutation_the_logits_differ(tmp_path, monkeypatch):
    """The logits test can fail: q/k rows left in transformers' rotate_half order give other logits."""
    model = hf_model()
    path = save(model, tmp_path / "hf")
    monkeypatch.setattr(hf_import, "_unrotate", lambda w, n_heads, hd: w)
    want, got = hf_logits(model, IDS), fp32_logits(load_model(path), IDS)
    assert np.abs(got - want).max() > 100 * 2e-5 * np.abs(want).max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_widen_exactly(dtype, tmp_path):
    model = hf_model()
    with torch.no_grad():             # the weights rounded to dtype, the model (and its RoPE) in float32
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
    ir = load_model(save(copy.deepcopy(model).to(dtype), tmp_path / "hf"))
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == str(dtype).split(".")[1]
    emb = model.model.embed_tokens.weight.detach().numpy()
    assert np.array_equal(ir.tensors["tok_embeddings"], emb)          # widened exactly, no rounding
    want = hf_logits(model, IDS)
    np.testing.assert_allclose(fp32_logits(ir, IDS), want, atol=2e-5 * np.abs(want).max(), rtol=0)


def test_sharded_safetensors_and_pytorch_bin_load_the_same(tmp_path):
    model = hf_model("untied-odd")
    one = load_model(save(model, tmp_path / "one"))
    sharded = save(model, tmp_path / "sharded", max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("*.safetensors"))) > 2
    binary = tmp_path / "bin"
    binary.mkdir()
    shutil.copy(sharded / "config.json", binary / "config.json")
    torch.save(model.state_dict(), binary / "pytorch_model.bin")
    for other in (load_model(sharded), load_model(binary)):
        assert other.tensors.keys() == one.tensors.keys()
        assert all(np.array_equal(other.tensors[n], one.tensors[n]) for n in one.tensors)
    (sharded / next(p.name for p in sharded.glob("*-of-*.safetensors"))).unlink()
    with pytest.raises(ModelError, match="is missing"):
        load_model(sharded)


def test_qwen2_and_mistral_map_where_they_are_the_same_network(tmp_path):
    """Zero q/k/v biases (Qwen2) and a window no shorter than the context (Mistral) change nothing;
    a real bias, or a shorter window, is refused naming it."""
    for arch in ("qwen2", "mistral"):
        model = hf_model(arch=arch, sliding_window=64)
        path = save(model, tmp_path / arch)
        want = hf_logits(model, IDS)
        np.testing.assert_allclose(fp32_logits(load_model(path), IDS), want, atol=2e-5 * np.abs(want).max(), rtol=0)
    cfg = json.loads((tmp_path / "mistral" / "config.json").read_text())
    cfg["sliding_window"] = 16
    (tmp_path / "mistral" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="sliding_window 16 is shorter than the context 64.*--ctx 16"):
        load_model(tmp_path / "mistral")
    assert load_model(tmp_path / "mistral", context=16).config.max_seq_len == 16
    model = hf_model(arch="qwen2")
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.bias.fill_(0.5)
    with pytest.raises(ModelError, match=r"k_proj.bias: attention bias \(q/k/v biases\)"):
        load_model(save(model, tmp_path / "qwen2-bias"))


@pytest.mark.parametrize("edit,field", [
    (lambda c: c.update(hidden_act="gelu"), "hidden_act 'gelu'"),
    (lambda c: c.update(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "rope_type 'linear'"),
    (lambda c: c.update(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling"),
    (lambda c: c.update(head_dim=16), "head_dim 16"),
    (lambda c: c.update(architectures=["GPT2LMHeadModel"]), "architecture 'GPT2LMHeadModel'"),
    (lambda c: c.update(quantization_config={"quant_method": "gptq"}), "quantization_config"),
    (lambda c: c.update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (lambda c: c.update(tie_word_embeddings=False), "lm_head.weight"),
    (lambda c: c.update(num_hidden_layers=1), "unexpected tensor model.layers.1"),
])
def test_unsupported_configs_are_one_line_errors_naming_the_field(tmp_path, capsys, edit, field):
    path = save(hf_model(), tmp_path / "hf")
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    assert main(["convert", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashlm: error: ") and err.count("\n") == 1 and field in err, err


def test_attention_bias_in_a_llama_is_refused(tmp_path):
    model = hf_model(attention_bias=True)
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.bias.fill_(0.25)
    with pytest.raises(ModelError, match="o_proj.bias: attention bias \\(config attention_bias\\)"):
        load_model(save(model, tmp_path / "hf"))


# ----------------------------------------------------------------------------- tokenizers

TEXTS = ["Once upon a time", "  two  spaces and\ttab\n", "naïve café 日本語 🙂 ∑", "<s> is not special here?",
         "a", "Hello, World! 12345", ""]


def spm_tokenizer_json(flavour="legacy", vocab_size=300) -> str:
    """A Llama-style SentencePiece BPE: <unk> <s> </s>, 256 byte-fallback pieces, then merges
    learned on a little text (pieces like "▁time"), BOS from a template. ``legacy``: normalizer
    Prepend("▁") + Replace(" ", "▁") and a Replace/ByteFallback/Fuse/Strip decoder (Llama 2's
    file); ``metaspace``: a Metaspace pre-tokenizer and decoder (prepend_scheme "first")."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    learner.train_from_iterator(["Once upon a time there was a little girl.", "She liked the sun and the time."] * 20,
                                trainers.BpeTrainer(vocab_size=vocab_size - 259, show_progress=False))
    learned = json.loads(learner.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for tok, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(tok, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in learned["merges"]], byte_fallback=True,
                               fuse_unk=True, unk_token="<unk>"))
    if flavour == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok.to_str()


def bytelevel_tokenizer_json() -> str:
    """A GPT-2-style ByteLevel BPE with an <|endoftext|> token and no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["Once upon a time there was a little girl."] * 10,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok.to_str()


@pytest.mark.parametrize("flavour", ["legacy", "metaspace"])
def test_sentencepiece_style_tokenizer_encodes_as_tokenizers_and_decodes_to_bytes(tmp_path, flavour):
    from tokenizers import Tokenizer as HF
    js = spm_tokenizer_json(flavour)
    path = save(hf_model(), tmp_path / "hf")
    (path / "tokenizer.json").write_text(js)
    ir = load_model(path)
    tok, hf = ir.tokenizer, HF.from_str(js)
    assert (tok.bos_id, len(tok)) == (1, 300)
    assert tok.pieces[3 + 0x0A] == b"\n" and tok.pieces[3 + 0xE2] == b"\xe2" and tok.pieces[1] == b"<s>"
    assert tok.pieces[hf.token_to_id("\u2581time")] == b" time"
    for text in TEXTS:
        ids = encode(tok, text)
        assert ids == hf.encode(text).ids                 # BOS as the template puts it, then the library's ids
        if "<s>" not in text:                             # (a special token in the text decodes to nothing)
            assert decode(tok, ids) == hf.decode(ids).encode()
            # Metaspace "first" prepends no "▁" to a text that starts with a space, yet drops one
            assert decode(tok, ids) == text.encode() or (flavour == "metaspace" and text.startswith(" "))
    assert any(3 <= i < 259 for i in encode(tok, "日本語"))   # byte fallback in use


@pytest.mark.native
@pytest.mark.parametrize("flavour", ["legacy", "metaspace", "metaspace-always"])
def test_device_encodes_sentencepiece_style_text_as_the_host(tmp_path, tok_check, flavour):
    """The firmware's encoder (tokenizer.enc kind 2, with added tokens and the JSON's prefix rule)
    gives the library's ids, BOS first, for odd and random texts (special tokens inside them too)."""
    d = json.loads(spm_tokenizer_json(flavour.split("-")[0]))
    if flavour == "metaspace-always":
        d["pre_tokenizer"]["prepend_scheme"] = "always"
    path = save(hf_model(), tmp_path / "hf")
    (path / "tokenizer.json").write_text(json.dumps(d))
    qm = quantize(load_model(path), "q8", 32)
    data, about = device_section(qm.tokenizer, qm.config)
    assert data is not None and "SentencePiece" in about, about
    (tmp_path / "m.flmb").write_bytes(build_blob(qm))
    odd = ["<s>", "a<s>", "<s>a", "<s> a", "x <s>  y</s>z", " ", "\u2581a", "a\u2581", "  lead", "</s></s>", "<s",
           "time time time", "She liked\nthe\tsun."]
    assert_same_ids(tok_check, tmp_path / "m.flmb", qm.tokenizer, TEXTS + odd + random_texts(1500, seed=3), 64)


def test_sentencepiece_tokenizers_the_device_cannot_reproduce_get_no_section(tmp_path):
    for edit, why in ((lambda d: d["pre_tokenizer"].update(split=True), "splits words"),
                      (lambda d: d["model"].update(byte_fallback=False), "no byte fallback"),
                      (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer"),
                      (lambda d: d["added_tokens"][1].update(lstrip=True), "strips spaces")):
        d = json.loads(spm_tokenizer_json("metaspace"))
        edit(d)
        from converter.tokenizer import from_hf_json
        data, reason = device_section(from_hf_json(json.dumps(d)), hf_import.read_config(
            json.loads((save(hf_model(), tmp_path / "hf") / "config.json").read_text()))[1])
        assert data is None and why in reason, reason


def test_bytelevel_tokenizer_without_bos_and_its_device_section(tmp_path):
    from tokenizers import Tokenizer as HF
    js = bytelevel_tokenizer_json()
    path = save(hf_model(), tmp_path / "hf")
    (path / "tokenizer.json").write_text(js)
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "add_bos_token": False}))
    tok = load_model(path).tokenizer
    hf = HF.from_str(js)
    assert tok.bos_id is None and tok.eos_id == hf.token_to_id("<|endoftext|>")
    for text in TEXTS:
        assert encode(tok, text) == hf.encode(text).ids
        assert decode(tok, encode(tok, text)) == text.encode()
    data, about = device_section(tok, load_model(path).config)
    assert data is not None and "ByteLevel BPE" in about


@pytest.mark.native
@pytest.mark.parametrize("bos", [None, "<|endoftext|>"])
def test_device_encodes_a_tokenizer_transformers_saved_as_the_host(tmp_path, tok_check, bos):
    """transformers 5's save_pretrained writes a TemplateProcessing post-processor of the text alone (or
    with its BOS first): nothing the device encoder cannot do, so the blob gets its section."""
    from tokenizers import Tokenizer as HF
    from transformers import PreTrainedTokenizerFast
    saved = PreTrainedTokenizerFast(tokenizer_object=HF.from_str(bytelevel_tokenizer_json()), bos_token=bos,
                                    eos_token="<|endoftext|>", add_bos_token=bos is not None)
    path = save(hf_model(), tmp_path / "hf")
    saved.save_pretrained(path)
    post = json.loads((path / "tokenizer.json").read_text())["post_processor"]
    assert post["type"] == "TemplateProcessing"
    qm = quantize(load_model(path), "q8", 32)
    data, about = device_section(qm.tokenizer, qm.config)
    assert data is not None and "ByteLevel BPE" in about, about
    (tmp_path / "m.flmb").write_bytes(build_blob(qm))
    assert_same_ids(tok_check, tmp_path / "m.flmb", qm.tokenizer, TEXTS + random_texts(300, seed=5), 64)


def test_missing_or_unreadable_tokenizers(tmp_path, capsys):
    path = save(hf_model(), tmp_path / "hf")
    assert load_model(path).tokenizer is None               # converts; runs need --prompt-ids
    assert main(["convert", str(path), "-o", str(tmp_path / "out"), "--no-report"]) == 0
    assert "no tokenizer: runs of this model need --prompt-ids" in capsys.readouterr().out
    (path / "tokenizer.model").write_bytes(b"\x0a\x00")
    with pytest.raises(ModelError, match="only a SentencePiece tokenizer.model, no tokenizer.json"):
        load_model(path)
    (path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    with pytest.raises(ModelError, match="tokenizer.json: tokenizer JSON is not a BPE"):
        load_model(path)


# ----------------------------------------------------------------------------- stop ids

def greedy_without_stops(qm, prompt, n):
    from dataclasses import replace
    from converter.ir import StopIds
    return [r["out_id"] for r in generate(replace(qm, stops=StopIds((), "none")), prompt, n)][len(prompt) - 1:]


@pytest.mark.native
def test_hf_model_with_two_eos_ids_stops_at_either(tmp_path, build_root):
    path = save(hf_model(), tmp_path / "hf")
    prompt = IDS[1:4]          # a greedy run that meets new tokens at least three times in 12 steps
    base = quantize(load_model(path), "q8", 32)
    seq = greedy_without_stops(base, prompt, 12)
    k1, k2 = [k for k, t in enumerate(seq) if t not in seq[:k]][1:3]       # where two new tokens first appear
    never = next(t for t in range(300) if t not in seq)
    for ids, stop_at in (([seq[k2], seq[k1]], k1), ([seq[k1], never], k1), ([never, seq[k2]], k2)):
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
        ir = load_model(path)
        assert ir.stop_ids().ids == tuple(ids) and "generation_config.json" in ir.stop_ids().source
        qm = quantize(ir, "q8", 32)
        assert read_blob(build_blob(qm)).stops.ids == tuple(ids)
        ref = generate(qm, prompt, 12, flags=FLAG_LOGITS)
        assert ref[-1]["out_id"] == seq[stop_at] and len(ref) == len(prompt) + stop_at
        with native_link(qm, tmp_path, build_root) as (link, _):
            toks, logits, done = run(link, prompt, 12)
        assert done.reason == "eos"
        assert_matches_reference(toks, logits, ref)
    (path / "generation_config.json").unlink()
    assert load_model(path).stop_ids().ids == (2,)        # config.json's eos_token_id


@pytest.mark.native
def test_llama2c_model_stops_at_bos_like_run_c(tmp_path, build_root):
    _, ir = random_model(seed=4, vocab_size=40, tied=False)
    ir.tensors["output"][1] *= 2.5                         # token 1 likely, but not at once
    write_llama2c(ir, tmp_path / "m.bin", version=1)
    qm = quantize(load_model(tmp_path / "m.bin"), "q8", 32)
    assert qm.stops.ids == (1,) and "run.c" in qm.stops.source
    prompt = next(p for p in ([2, a, b] for a in range(3, 40) for b in range(3, 40))
                  if 1 in greedy_without_stops(qm, p, 20)[2:])
    ref = generate(qm, prompt, 20, flags=FLAG_LOGITS)
    assert ref[-1]["out_id"] == 1 and len(ref) > len(prompt) + 1
    with native_link(qm, tmp_path, build_root) as (link, _):
        toks, logits, done = run(link, prompt, 20)
    assert done.reason == "eos" and toks[-1].out_id == 1
    assert_matches_reference(toks, logits, ref)


def test_bad_stop_ids_are_refused(tmp_path):
    path = save(hf_model(), tmp_path / "hf")
    for ids, why in ((300, "stop id 300"), ("x", "not an int or a list"), (list(range(17)), "at most 16")):
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
        with pytest.raises(ModelError, match=why):
            load_model(path)


# ----------------------------------------------------------------------------- the CLI

@pytest.mark.native
@pytest.mark.slow
def test_cli_convert_plan_and_run_an_hf_folder(tmp_path, capsys):
    path = save(hf_model("untied-odd"), tmp_path / "hf", max_shard_size="40KB")
    (path / "tokenizer.json").write_text(spm_tokenizer_json())
    out = tmp_path / "out"
    assert main(["convert", str(path), "-o", str(out), "--context", "24", "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "context 24" in printed and "stop ids: 2 (eos_token_id of generation_config.json)" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stop_ids"] == [2] and manifest["config"]["max_seq_len"] == 24
    assert manifest["config"]["bos_id"] == 1 and manifest["tokenizer"] == "tokenizer.json"
    assert main(["plan", str(path), "--board", "pico", "--ctx", "24", "--png", str(tmp_path / "p.png")]) == 0
    assert "context 24" in capsys.readouterr().out
    assert main(["plan", str(path), "--board", "pico", "--ctx", "65", "--png", str(tmp_path / "p.png")]) == 2
    assert "longer than the model's max_position_embeddings 64" in capsys.readouterr().err
    # a stop id the model reaches: the third new token of its greedy text
    prompt = encode(load_model(path).tokenizer, "Once upon")
    seq = greedy_without_stops(read_blob(out / "model.flmb"), prompt, 12)
    stop = [t for k, t in enumerate(seq) if t not in seq[:k]][2]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop, 2]}))
    assert main(["convert", str(path), "-o", str(out), "--ctx", "24", "--no-report"]) == 0
    assert main(["run", "--board", "native", "--model", str(out), "--prompt", "Once upon", "--max-tokens", "40",
                 "--json", str(tmp_path / "run.json")]) == 0
    printed = capsys.readouterr().out
    piece = read_blob(out / "model.flmb").tokenizer.pieces[stop]
    assert f"ended by stop id {stop} {piece!r} (the model's stop ids: [{stop}, 2], eos_token_id of " \
           f"generation_config.json)" in printed
    run_json = json.loads((tmp_path / "run.json").read_text())
    assert run_json["summary"]["reason"] == "eos"
