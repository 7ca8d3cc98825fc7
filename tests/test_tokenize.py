"""The device tokenizer (docs/formats.md 1.1, 2.3): the tokenizer.enc section, the firmware's
encoder (firmware/engine/tokenize.c) giving exactly the host's ids — directly through
tests/c/tok_check.c for thousands of texts, and through GENERATE_TEXT on the native board and the
emulated RP2040 — its refusals, and the plain-text console over the native board's pty."""
from __future__ import annotations

import dataclasses
import json
import random
import re
import struct
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converter.blob import build_blob, parse_header, write_blob
from converter.ir import ModelError
from converter.quantize import quantize
from converter.tokenizer import encode, from_hf_json, load_tokenizer, parse_tokenizer_bin
from converter.tokenizer_enc import (CLASS_LETTER, CLASS_NUMBER, CLASS_OTHER, CLASS_SPACE, SECTION, class_runs,
                                     device_section, parse_section, unicode_classes, unicode_version)
from firmware.build_meta import ENGINE_DIR
from host.link import messages as P
from host.session.recovery import Policy
from host.link.messages import Done, Error, Generate, Hello, Log, Ping, Token
from host.link.cobs import encode_raw_frame
from host.link.codec import encode_frame
from host.link.faultproxy import BOOT_LOG
from host.link.port import Link
from host.session.errors import DeviceError
from host.session.session import Session
from modelzoo import random_model
from nativeboard import drain, native_link, recv_until
from test_import import tiny_bin, tiny_vocab

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOKENIZER = ROOT / "models" / "default" / "tokenizer.json"
EVAL_LINES = (ROOT / "models" / "default" / "eval.txt").read_text(encoding="utf-8").split("\n")
# a model with the default tokenizer, small enough to run fast, whose KV cache holds the encoder's scratch
BPE_CFG = dict(dim=32, n_heads=2, n_kv_heads=1, hidden_dim=40, vocab_size=1024, max_seq_len=128, n_layers=2)
SPECIAL = ["", " ", "  ", "   \n", "\t\t x", "a  b", "x \n\n y", "I'm don't we'll 'S 're ''''s", "12 345 ½ ٣ Ⅻ",
           "héllo wörld naïve café", "日本語のテキスト", "😀 🎉🎉 x😀y 👍🏽", "<|bos|>hi<|eos|> <|eos|><|bos|>",
           " !!! ?? .", "\u00a0 \u2003x\u3000y\u2028", "a\u0301e\u0308", "\x00\x01\x1f\x7f", "ǅ ʰ ᶜ", "\ufeffBOM",
           "ROMEO:\nWhat light through yonder window breaks?", "x" * 700, " " * 2000]
POOL = list(" \t\n\r'sStTreRvemldL0123456789!?.,;:-_()[]\"<|>") + [
    "<|bos|>", "<|eos|>", "\u00a0", "\u2003", "\u3000", "\x85", "é", "ß", "Ж", "中", "٣", "½", "Ⅻ", "😀", "\u0301",
    "\x00", "\x1f", "\x7f", "\ufeff", "\U00010400", "\U0001F3FB", "ǅ", "ʰ", "\u2028", "'re", "'ll", "  ", "   "]


def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        k = rng.randint(0, 40)
        t = "".join(rng.choice(POOL) if rng.random() < 0.8 else
                    chr(rng.choice([rng.randint(0, 0x2FFF), rng.randint(0x10000, 0x10FFFF)])) for _ in range(k))
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:       # a lone surrogate: not text
            continue
        out.append(t)
    return out


@pytest.fixture(scope="module")
def bpe():
    return load_tokenizer(DEFAULT_TOKENIZER)


@pytest.fixture(scope="module")
def l2c():
    return parse_tokenizer_bin(tiny_bin(tiny_vocab()))


def model_with(tok, **cfg):
    _, ir = random_model(**{**BPE_CFG, "vocab_size": len(tok.pieces), **cfg})
    return quantize(dataclasses.replace(ir, tokenizer=tok), "q8", 32)


@pytest.fixture(scope="module")
def tok_check(tmp_path_factory):
    exe = tmp_path_factory.mktemp("c") / "tok_check"
    subprocess.run(["cc", "-std=c99", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-Wall", "-Wextra", "-Werror", f"-I{ENGINE_DIR}", str(ROOT / "tests/c/tok_check.c"),
                    *(str(ENGINE_DIR / f) for f in ("tokenize.c", "blob.c", "crc32.c")), "-o", str(exe)],
                   check=True)
    return exe


def device_encode(exe, blob: Path, texts: list[bytes]) -> list[tuple[int, int, int, list[int]]]:
    """(status, n, offset, ids) per text from the firmware's encoder (status 0 ok, 1 not UTF-8,
    2 no piece, 3 too long)."""
    data = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    r = subprocess.run([str(exe), str(blob)], input=data, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    out = []
    for line in r.stdout.decode().splitlines():
        assert not line.startswith("open:"), line
        f = [int(x) for x in line.split()]
        out.append((f[0], f[1], f[2], f[4:]))
    assert len(out) == len(texts)
    return out


def assert_same_ids(exe, blob: Path, tok, texts: list[str], ctx: int) -> None:
    for text, (rc, n, _, ids) in zip(texts, device_encode(exe, blob, [t.encode() for t in texts])):
        want = encode(tok, text, bos=True)
        if len(want) <= ctx:
            assert (rc, n, ids) == (0, len(want), want), repr(text)
        else:   # too long: the exact count, or a lower bound when the text is longer than ctx * span bytes
            assert (rc == 0 and n == len(want)) or (rc == 3 and ctx < n <= len(want)), repr(text)


# ----------------------------------------------------------------------------- the section

def test_unicode_classes_are_the_pre_tokenizers():
    """The classes the converter reads off the tokenizers library's regex engine, checked against
    the library's GPT-2 pre-tokenizer itself: every letter continues a letter run, every number a
    number run, every "other" character an other run, every white-space character a white-space run
    — one piece each — and the four classes cover all of Unicode."""
    from tokenizers import pre_tokenizers
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    cls = unicode_classes()
    chars = {k: "".join(chr(c) for c in range(0x110000) if cls[c] == k and not 0xD800 <= c < 0xE000)
             for k in (CLASS_LETTER, CLASS_NUMBER, CLASS_OTHER, CLASS_SPACE)}
    for k, lead in ((CLASS_LETTER, "a"), (CLASS_NUMBER, "1"), (CLASS_OTHER, "!"), (CLASS_SPACE, "\t")):
        assert len(pre.pre_tokenize_str(lead + chars[k])) == 1, k
    assert sum(map(len, chars.values())) == 0x110000 - 0x800
    assert len(chars[CLASS_SPACE]) == 25                 # Unicode White_Space
    runs = class_runs()
    assert runs[0][0] == 0 and all(cls[c] == k for c, k in runs)
    assert unicode_version() is not None and unicode_version() >= (14, 0)


def test_section_for_the_default_tokenizer(bpe):
    d = json.loads(DEFAULT_TOKENIZER.read_text())
    qm = model_with(bpe)
    data, about = device_section(bpe, qm.config)
    info = parse_section(data)
    assert (info.kind, info.span, info.n_pairs, info.n_added) == (1, 16, len(d["model"]["merges"]), 2)
    assert info.n_ranges == len(class_runs()) and info.unicode == unicode_version()
    assert info.size == len(data) == 64 + 16 * info.n_pairs + 4 * info.n_ranges + 12 * 2 + 4 * 256 + 14 + 2
    assert "ByteLevel BPE" in about and f"{len(data):,} bytes" in about
    h = parse_header(build_blob(qm))
    e = next(e for e in h.entries if e.name == SECTION)
    assert (e.fmt, e.tier, e.length) == ("bytes", "flash", len(data))
    # the default model's context: 128 tokens of at most 16 bytes; scratch 8 * 2049 bytes of its 128 KiB KV cache
    assert info.text_capacity(128) == 2048 and info.scratch_bytes(128) == 16392


def bpe_variant(edit) -> str:
    d = json.loads(DEFAULT_TOKENIZER.read_text())
    edit(d)
    return json.dumps(d)


@pytest.mark.parametrize("edit,why", [
    (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "prefix space"),
    (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer"),
    (lambda d: d.update(truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}),
     "truncation"),
    (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [d["pre_tokenizer"]]}), "pre-tokenizer"),
    (lambda d: d["added_tokens"][1].update(lstrip=True), "strips"),
    (lambda d: d["added_tokens"][1].update(normalized=True), "mix"),
    (lambda d: d["model"].update(ignore_merges=True), "ignores merges"),
    (lambda d: d.update(post_processor={"type": "TemplateProcessing", "single": [], "pair": [],
                                        "special_tokens": {}}), "post-processor"),
])
def test_tokenizers_the_device_cannot_reproduce_get_no_section(bpe, edit, why):
    tok = from_hf_json(bpe_variant(edit))
    data, reason = device_section(tok, model_with(bpe).config)
    assert data is None and why in reason


def test_no_section_without_a_full_byte_alphabet_or_room(bpe):
    small = json.dumps({"version": "1.0", "added_tokens": [], "normalizer": None,
                        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                          "use_regex": True},
                        "post_processor": None, "decoder": json.loads(DEFAULT_TOKENIZER.read_text())["decoder"],
                        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})
    data, reason = device_section(from_hf_json(small), model_with(bpe).config)
    assert data is None and "lacks 254 byte symbol" in reason
    cfg = model_with(bpe, n_layers=1, max_seq_len=16, dim=16).config       # KV cache 1 KiB < 8 * (16 * 16 + 1)
    data, reason = device_section(bpe, cfg)
    assert data is None and "KV cache" in reason
    assert device_section(None, cfg) == (None, "the model has no tokenizer")


# ----------------------------------------------------------------------------- same ids as the host

@pytest.fixture(scope="module")
def bpe_blob(bpe, tmp_path_factory):
    p = tmp_path_factory.mktemp("bpe") / "model.flmb"
    write_blob(model_with(bpe), p)
    return p


@pytest.mark.native
def test_device_ids_equal_host_ids_for_the_eval_text(tok_check, bpe_blob, bpe):
    """Every line of the held-out Shakespeare text, and the whole of it in 2000-byte pieces."""
    text = "\n".join(EVAL_LINES)
    chunks = [text[i:i + 2000] for i in range(0, len(text), 2000)]
    assert_same_ids(tok_check, bpe_blob, bpe, EVAL_LINES + chunks, 128)


@pytest.mark.native
def test_device_ids_equal_host_ids_for_odd_texts(tok_check, bpe_blob, bpe):
    """White-space runs, contractions, digits, punctuation, letters and numbers of many scripts,
    combining marks, emoji, control characters, the added tokens inside text, texts too long."""
    assert_same_ids(tok_check, bpe_blob, bpe, SPECIAL + random_texts(6000, seed=1), 128)


@pytest.mark.native
@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=60), min_size=1, max_size=20))
def test_device_ids_equal_host_ids_hypothesis(tok_check, bpe_blob, bpe, texts):
    texts = [t for t in texts if all(not 0xD800 <= ord(c) < 0xE000 for c in t)]
    assert_same_ids(tok_check, bpe_blob, bpe, texts, 128)


@pytest.mark.native
def test_invalid_utf8_is_refused_where_python_finds_it(tok_check, bpe_blob):
    bad = [b"\xff", b"ab\x80", b"\xc0\xaf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8",
           b"ok\xe2\x82", "é".encode()[:1] + b"x", b"\xf0\x9f\x98"]
    for raw, (rc, _, at, _) in zip(bad, device_encode(tok_check, bpe_blob, bad)):
        with pytest.raises(UnicodeDecodeError) as e:
            raw.decode("utf-8")
        assert (rc, at) == (1, e.value.start), raw


@pytest.mark.native
def test_llama2c_device_ids_equal_host_ids(tok_check, l2c, tmp_path):
    """llama2.c's score-driven merging: dummy prefix, whole characters, byte fallback, leftmost of
    equal scores — the tiny vocabulary of tests/test_import.py."""
    qm = model_with(l2c, max_seq_len=32)
    write_blob(qm, tmp_path / "m.flmb")
    rng = random.Random(3)
    texts = ["", "abc", " abc", "cabc", "bc a", "a\n", "é", "ü", "ü é  ab", " leading"] + [
        "".join(rng.choice(["a", "b", "c", " ", "é", "ü", "\n", "ab", "bc", " a", "😀", "x", "日"])
                for _ in range(rng.randint(0, 14))) for _ in range(3000)]
    assert_same_ids(tok_check, tmp_path / "m.flmb", l2c, texts, 32)


@pytest.mark.native
def test_llama2c_without_byte_fallback_refuses_what_the_host_refuses(tok_check, tmp_path):
    pieces = [b"<unk>", b"<s>", b"</s>", b" ", b"a", b"b", b"ab", b" a", "é".encode()]
    tok = parse_tokenizer_bin(tiny_bin([(p, -float(i)) for i, p in enumerate(pieces)]))
    write_blob(model_with(tok, max_seq_len=32), tmp_path / "m.flmb")
    texts = ["ab a", "é ab", "abc", "a😀"]
    got = device_encode(tok_check, tmp_path / "m.flmb", [t.encode() for t in texts])
    for text, (rc, n, at, ids) in zip(texts, got):
        try:
            want = encode(tok, text)
        except ModelError as e:
            assert rc == 2 and f"0x{text.encode()[at]:02X}" in str(e)
            assert text.encode()[:at].decode() == text[:len(text.encode()[:at].decode())]
        else:
            assert (rc, ids) == (0, want)


# ----------------------------------------------------------------------------- GENERATE_TEXT on the board

@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fw")


def ids_on_board(sess: Session, text: str, ctx: int):
    res = sess.generate(Generate(text, 1))
    assert res.complete and res.prompt_text == text
    assert [t.in_id for t in res.tokens] == res.prompt_ids
    assert len(res.logs) == 1 and res.logs[0].startswith(f"text prompt: {len(text.encode())} bytes, "
                                                         f"{len(res.prompt_ids)} tokens, encoded in ")
    return res.prompt_ids


@pytest.mark.native
@pytest.mark.slow
def test_generate_text_on_the_native_board(bpe, tmp_path, build_root):
    qm = model_with(bpe)
    texts = SPECIAL[:-2] + [t for t in EVAL_LINES if t][::40] + random_texts(60, seed=5)
    with native_link(qm, tmp_path, build_root) as (link, boot):
        hello = boot[-1]
        assert hello.can_encode and hello.can_resend
        sess = Session(link)
        sess.handshake()
        for text in texts:
            want = encode(bpe, text, bos=True)
            if len(want) <= 128:
                assert ids_on_board(sess, text, 128) == want, repr(text)
        # the same generation from the host's ids: identical tokens
        text = "ROMEO:\nWhat light through yonder window breaks?"
        a, b = sess.generate(Generate(text, 12)), sess.generate(Generate(encode(bpe, text), 12))
        assert [(t.in_id, t.out_id, t.logits_crc) for t in a.tokens] == [(t.in_id, t.out_id, t.logits_crc)
                                                                         for t in b.tokens]
        # refusals, each one line with its code
        for text, code, what in (("word" * 300, 4, f"prompt of {len(encode(bpe, 'word' * 300))} tokens exceeds "
                                                   "the context of 128 tokens"),
                                 ("x" * 2060, 4, "prompt of at least 130 tokens exceeds the context of 128 tokens")):
            with pytest.raises(DeviceError) as e:
                sess.generate(Generate(text, 1))
            assert e.value.error.code == code and what in str(e.value)
        for payload, code, what in (
                (struct.pack("<IffQIBBBBH", 1, 0, 0, 0, 0, 0, 0, 0, 0, 3) + b"a\xffb", 2, "not UTF-8: bad byte at offset 1 of 3"),
                (struct.pack("<IffQIBBBBH", 1, 0, 0, 0, 0, 0, 0, 0, 0, 9) + b"abc", 2, "GENERATE_TEXT payload has the wrong length"),
                (b"\x01\x02", 2, "wrong length")):
            link.port.write(encode_raw_frame(P.MsgType.GENERATE_TEXT, 0, payload))
            err = recv_until(link, lambda m: isinstance(m, Error))[-1]
            assert err.code == code and what in err.text
        assert sess.generate(Generate("still fine", 2)).complete


@pytest.mark.native
@pytest.mark.slow
def test_generate_text_llama2c_on_the_native_board(l2c, tmp_path, build_root):
    with native_link(model_with(l2c, max_seq_len=32), tmp_path, build_root) as (link, boot):
        sess = Session(link)
        assert sess.handshake().can_encode
        for text in ("abc", "cabc", "bc a", "a\nb", "é ü", " x"):
            assert ids_on_board(sess, text, 32) == encode(l2c, text)


@pytest.mark.native
@pytest.mark.slow
def test_no_device_tokenizer_refuses_text(tmp_path, build_root):
    _, ir = random_model(**BPE_CFG)                       # no tokenizer: no tokenizer.enc section
    with native_link(quantize(ir, "q8", 32), tmp_path, build_root) as (link, boot):
        sess = Session(link)
        assert not sess.handshake().can_encode
        with pytest.raises(DeviceError) as e:
            sess.generate(Generate("hello", 1))
        assert e.value.error.name == "cannot_encode" and "no text encoder" in str(e.value)


@pytest.mark.native
@pytest.mark.slow
def test_cli_encode_on_device_gives_the_hosts_ids(tmp_path, capsys):
    from host.cli.main import main
    out = tmp_path / "model"
    torch = pytest.importorskip("torch")
    from converter.torch_import import save_checkpoint       # a flashlm checkpoint with the default tokenizer
    from converter.torch_model import Transformer
    from converter.ir import ModelConfig
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", Transformer(ModelConfig(**BPE_CFG, tied=True)),
                    tokenizer_json=DEFAULT_TOKENIZER.read_text())
    # the encoder works in the KV cache's memory: this small model's int8 cache (10 KB) is too small for it
    assert main(["convert", str(tmp_path / "m.pt"), "-o", str(out), "--no-report", "--kv", "f32"]) == 0
    assert "device tokenizer (text prompts encoded on the board): ByteLevel BPE" in capsys.readouterr().out
    runs = {}
    for where in ("host", "device"):
        rc = main(["run", "--board", "native", "--model", str(out), "--prompt", "Once upon a time, in Verona",
                   "--max-tokens", "5", "--encode-on", where, "--json", str(tmp_path / f"{where}.json")])
        assert rc == 0, capsys.readouterr().err
        runs[where] = json.loads((tmp_path / f"{where}.json").read_text())
    assert runs["host"]["params"]["prompt_ids"] == runs["device"]["params"]["prompt_ids"]
    assert runs["host"]["generated_ids"] == runs["device"]["generated_ids"]
    assert runs["device"]["params"]["prompt_text"] == "Once upon a time, in Verona"
    assert main(["run", "--board", "native", "--model", str(out), "--prompt-ids", "1,2", "--encode-on", "device"]) == 2
    assert "--prompt-ids are ids already" in capsys.readouterr().err
    assert main(["run", "--board", "native", "--model", str(out), "--prompt", "x" * 3000, "--encode-on", "device"]) == 2
    assert "prompt is 3000 bytes" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the console

def read_until(port, marker: bytes, timeout: float = 20.0) -> bytes:
    out, t0 = b"", time.monotonic()
    while marker not in out:
        assert time.monotonic() - t0 < timeout, out[-300:]
        out += port.read(4096)
    return out


def console_view(piece: bytes) -> bytes:
    """What the console shows of bytes: LF as CR LF, other control bytes left out."""
    return b"".join(b"\r\n" if c == 10 else bytes([c]) for c in piece if c >= 0x20 and c != 0x7F or c in (9, 10))


@pytest.mark.native
def test_console_answers_a_typed_line_in_plain_text(bpe, tmp_path, build_root):
    """A serial monitor's line (CR LF, with a typo corrected by backspace) gets the prompt, the greedy
    continuation — the same tokens a framed greedy run gives — and a summary line; no frames. The
    framed protocol then works as before and reports the line."""
    qm = model_with(bpe)
    with native_link(qm, tmp_path, build_root) as (link, boot):
        drain(link)                                          # the HELLO that answers native_link's PING
        port = link.port
        prompt = "ROMEO:\tBut soft"
        port.write(b"ROMEO:\tBut sofx\x7ft\r\n")
        out = read_until(port, b"]\r\n")
        assert b"\x00" not in out
        body, summary = out.rsplit(b"\r\n[", 1)
        sess = Session(Link(port))
        sess.handshake()
        assert any("text console: answered 1 line" in t for t in sess.logs)
        ref = sess.generate(Generate(prompt, 200))
        gen = [t.out_id for t in ref.generated_steps]
        pieces = b"".join(bpe.pieces[i] for i in gen if i != qm.tokenizer.eos_id)
        assert body == prompt.encode() + console_view(pieces)
        ended = "end of text" if gen[-1] == qm.tokenizer.eos_id else "context full"
        m = re.fullmatch(rb"(\d+) prompt \+ (\d+) generated tokens in \d+ ms, \d+\.\d tok/s \(host clock\); "
                         rb"text encoded in \d+ us; ([a-z ]+)\]\r\n", summary)
        assert m and (int(m[1]), int(m[2]), m[3].decode()) == (len(ref.prompt_ids), len(gen), ended)
        # a line the device cannot take is answered with one error line
        port.write(b"ok \xc3\r")                              # "ok " and a cut UTF-8 character
        assert b"ok \xc3\r\nflashlm: error: the text prompt is not UTF-8: bad byte at offset 3 of 4\r\n" \
            == read_until(port, b"of 4\r\n", 10)


@pytest.mark.native
def test_a_frame_after_console_line_ends_and_noise_lose_nothing(bpe, tmp_path, build_root):
    """A frame whose COBS code byte is LF (its first 0x00 nine bytes in), sent right after a
    terminal's CR LF, and again after a stray printable byte (line noise that completes a
    one-character console line with that LF): the device answers the frame both times; a key
    pressed during a story stops it."""
    qm = model_with(bpe)
    with native_link(qm, tmp_path, build_root) as (link, boot):
        seq, payload = 0x0101, struct.pack("<IffQIBBBBI", 0x01010101, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 1) + struct.pack("<I", 5)
        payload = bytearray(payload)
        struct.pack_into("<I", payload, 4, 0x3F000101)        # temperature bytes 01 01 00 3F: first 0x00 at 9
        frame = encode_raw_frame(P.MsgType.GENERATE, seq, bytes(payload))
        assert frame[0] == 0x0A
        runs = []
        for lead in (b"", b"hello\r\n", b"Z"):
            link.port.write(lead + frame)
            msgs = recv_until(link, lambda m: isinstance(m, (Done, Error)), timeout=60)
            assert isinstance(msgs[-1], Done), msgs[-3:]
            runs.append([(m.step, m.out_id, m.logits_crc) for m in msgs if isinstance(m, Token)])
        assert runs[0] == runs[1] == runs[2] and len(runs[0]) == msgs[-1].steps
        link.port.write(b"hi\r\n" + encode_frame(Ping(), 7))   # a code byte below LF after a held LF
        assert isinstance(recv_until(link, lambda m: isinstance(m, Hello))[-1], Hello)
        link.port.write(BOOT_LOG + encode_frame(Ping(), 8))      # the fault proxy's noise burst, host->device
        got = recv_until(link, lambda m: isinstance(m, Hello))
        lines = BOOT_LOG.count(b"\n")
        assert f"text console: answered {lines} line(s)" in " ".join(m.text for m in got if isinstance(m, Log))
        drain(link)
        link.port.write(b"Once upon a time\rq")              # "q": a key pressed as the story starts
        assert read_until(link.port, b"]\r\n").endswith(b"; stopped by a key]\r\n")
        link.port.write(b"\r")                               # the "q" began a line: its own story
        assert read_until(link.port, b"]\r\n").startswith(b"q")
        sess = Session(Link(link.port))
        sess.handshake()
        assert sess.generate(Generate("a framed run after it all", 2)).complete


@pytest.mark.native
@pytest.mark.cross
@pytest.mark.emulated
@pytest.mark.slow
def test_generate_text_on_the_emulated_rp2040(bpe, tmp_path_factory):
    """The encoder cross-compiled for the Cortex-M0+, reading the section from XIP flash and working
    in the KV cache's SRAM: the host's ids, and the same tokens as from the host's ids."""
    from emuboard import emu_link, require_emulator
    require_emulator()
    qm = model_with(bpe)
    texts = ["Once upon a time", "ROMEO:\nWhat light through yonder window breaks?", "héllo  wörld 😀 12'll",
             next(t for t in EVAL_LINES if len(t) > 60)]
    with emu_link(qm, tmp_path_factory.mktemp("emu"), tmp_path_factory.mktemp("emu-fw")) as (link, boot, board):
        sess = Session(link, frame_timeout=60)
        assert sess.handshake(timeout=30).can_encode
        for text in texts:
            assert ids_on_board(sess, text, 128) == encode(bpe, text), repr(text)
        a, b = sess.generate(Generate(texts[1], 3)), sess.generate(Generate(encode(bpe, texts[1]), 3))
        assert [(t.in_id, t.out_id, t.logits_crc) for t in a.tokens] == [(t.in_id, t.out_id, t.logits_crc)
                                                                         for t in b.tokens]


def test_prompt_of_reads_the_ids_from_token_frames():
    from host.session.result import prompt_of

    def tok(step, in_id, out):
        return Token(step, step, in_id, out, (0,) * 7, (0,) * 3, 0, 0, b"")
    assert prompt_of([tok(2, 7, 9), tok(0, 5, None), tok(1, 6, None), tok(3, 9, 4)]) == [5, 6, 7]
    assert prompt_of([tok(0, 5, None), tok(2, 7, 9)]) == []              # step 1 missing
    assert prompt_of([tok(0, 5, None), tok(1, 6, None)]) == []           # no generated step yet


@pytest.mark.native
def test_text_prompt_survives_a_lossy_link(bpe, tmp_path, build_root):
    """generate_with_recovery on a text prompt over the fault proxy: every step equals a clean run
    (steps lost beyond the device's ring are generated again, from the ids the device showed)."""
    from host.link.faultproxy import FaultProxy, Faults
    from host.link.port import open_port
    from host.boards.native import start_native_board
    from nativeboard import binary_for
    qm = model_with(bpe)
    blob = tmp_path / "model.flmb"
    write_blob(qm, blob)
    text = "ROMEO:\nWhat light through yonder window breaks? It is the east"
    with start_native_board(binary_for(blob, build_root), blob) as vb:
        ser = open_port(vb.port)
        clean = Session(Link(ser))
        clean.handshake()
        truth = clean.generate(Generate(text, 60))
        ser.close()
        with FaultProxy(vb.port, Faults(drop=4e-3, flip=2e-3), seed=4) as fp:
            ser = open_port(fp.port)
            s = Session(Link(ser))
            s.handshake(timeout=5, interval=0.2)
            # a loaded host reads late and finds more steps gone from the ring: a generous budget
            res = s.generate_with_recovery(Generate(text, 60), Policy(frame_timeout=5, retries=10))
            ser.close()
    assert truth.complete and res.complete and res.prompt_ids == truth.prompt_ids == encode(bpe, text)
    key = lambda t: (t.step, t.in_id, t.out_id, t.logits_crc)   # noqa: E731
    assert [key(t) for t in res.tokens] == [key(t) for t in truth.tokens]
