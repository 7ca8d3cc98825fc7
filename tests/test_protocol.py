"""Serial protocol: host/link/, and firmware/app/protocol.c through tests/c/proto_echo.c."""
from __future__ import annotations

import random
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firmware.build_meta import APP_DIR, ENGINE_DIR
from host.link import messages as P
from host.link.cobs import FrameError, MAX_ENCODED, MAX_PAYLOAD, ProtocolError, cobs_decode, cobs_encode, cobs_max_encoded, decode_raw_frame, encode_raw_frame
from host.link.codec import decode_payload, encode_frame, encode_payload
from host.link.frames import DecoderStats, FrameDecoder
from host.link.messages import Done, Error, Frame, Generate, Hello, Layout, Log, Logits, MsgType, Ping, Resend, Resent, SelfTest, Stop, Token
from host.link.port import Link

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# strategies

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)
f32 = st.floats(width=32, allow_nan=False)
text = st.text(max_size=40)
# Payload bytes biased to zeros and to long zero-free runs, the interesting cases for COBS.
zero_heavy = st.binary(max_size=600).map(lambda b: bytes(x if x % 3 else 0 for x in b))
runs = st.lists(st.tuples(st.integers(0, 600), st.integers(0, 3)), max_size=6).map(
    lambda parts: b"".join(b"\x5a" * n + b"\x00" * z for n, z in parts)
)
payload_bytes = st.one_of(st.binary(max_size=300), zero_heavy, runs)

messages = st.one_of(
    st.just(Ping()),
    st.just(Stop()),
    st.builds(Layout, u32, u32, st.binary(max_size=40)),
    st.builds(Generate, st.lists(u32, max_size=40), u32, f32, f32, u64, st.booleans(), st.booleans(), st.booleans(),
              u8, st.sampled_from(P.SPECULATE), u8),
    st.builds(Generate, st.text(max_size=60), u32, f32, f32, u64, st.booleans(), st.booleans(), st.booleans(),
              u8, st.sampled_from(P.SPECULATE), u8),
    st.builds(Token, u32, u32, u32, st.one_of(st.none(), st.integers(0, 0xFFFFFFFE)),
              st.tuples(*[u32] * 7), st.tuples(*[u32] * 3), u32, u32, st.binary(max_size=255), st.just(0), u8, u8,
              st.sampled_from(P.PASS_KINDS)),
    st.builds(Done, u32, u32, st.sampled_from(P.STOP_REASONS), u64, st.tuples(*[u64] * 7), u32, u32, u32, u32,
              st.tuples(*[u64] * 3), st.tuples(*[u64] * 3)),
    st.builds(Error, u16, text),
    st.builds(Logits, u32, st.lists(st.one_of(st.just(0.0), f32), max_size=300).map(
        lambda v: np.array(v, dtype=np.float32))),
    st.builds(Log, st.text(max_size=300)),
    st.builds(Resend, u32, st.lists(u32, max_size=P.RESEND_MAX).map(tuple)),
    st.builds(Resent, st.sampled_from(P.RESENT_STATES), u32, u32, u32, st.lists(u32, max_size=40).map(tuple)),
    st.builds(Hello, st.sampled_from([0, 2]), st.booleans(), st.binary(min_size=16, max_size=16), u32, u32,
              u32, u32, u8, text, text, st.booleans(), st.booleans()),
    st.builds(Hello, st.integers(3, 0xFFFF), st.booleans(), st.binary(min_size=16, max_size=16), u32, u32,
              u32, u32, u8, text, text, st.booleans(), st.booleans(), u8, st.booleans(), st.sampled_from(P.GOLDEN_STATES), u16, u16,
              st.one_of(st.none(), st.integers(0, 0xFFFE))),
    st.just(SelfTest()),
)

EXAMPLES = [
    Ping(),
    Stop(),
    Layout(0xDEADBEEF, 0x21, b"\x00\x01\x02\x00"),
    Generate([1, 0, 258, 0xFFFFFFFF], 32, 0.75, 0.5, 2**63 + 5, True),
    Generate([], 0),
    Hello(3, True, bytes(range(16)), 7, 512, 400, 256, 1, "0.1.0", "esp32s3-devkit", batch=8),
    Hello(2, True, bytes(range(16)), 7, 512, 400, 256, 1, "0.1.0", "an older board"),
    Token(3, 3, 17, None, (1, 2, 3, 0, 4, 5, 0), (1000, 0, 64), 512, 0, b""),
    Token(4, 4, 17, 99, (10, 20, 30, 35, 40, 50, 0), (0, 2**32 - 1, 8), 0, 0xDEADBEEF, b" the\x00"),
    Token(9, 9, 17, 99, (10, 20, 30, 35, 40, 50, 300), (7, 0, 8), 512, 0xDEADBEEF, b"x", 1, 4, 2, "verify"),
    Generate([1, 2, 3], 5, batch=4, speculate="lookup", draft_k=3),
    Done(10, 6, "context_full", 2**40, (1, 2, 3, 4, 5, 2**35, 0)),
    Done(10, 6, "eos", 2**40, (1, 2, 3, 4, 5, 2**35, 77), 7, 2, 6, 3, (2**40, 0, 9), (1, 2, 3), 7420, 9468),
    Error(4, "prompt of 300 ids > max_seq_len 256"),
    Error(99, ""),
    Logits(5, np.array([0.0, -1.5, 3.25, 0.0, 0.0, 1e-30], dtype=np.float32)),
    Log("booted: heap 123456 free \u00b5s"),
    Resend(3, (4, 5, P.RESEND_DONE)),
    Resend(0xFFFFFFFF),
    Resent("generating", 3, 40, 8, (2, P.RESEND_DONE)),
    Hello(3, True, bytes(range(16)), 7, 512, 512, 256, 1, "0.1.0", "native", True),
    Hello(1, True, bytes(range(16)), 7, 512, 512, 256, 1, "0.0.9", "an old board"),
    Hello(3, True, bytes(range(16)), 7, 512, 512, 256, 1, "0.1.0", "native", True, True),
    Generate("Once upon a time é😀", 32, 0.75, 0.5, 9, True),
    Generate("", 1),
    SelfTest(),
    Hello(3, True, bytes(range(16)), 7, 512, 512, 256, 1, "0.1.0", "native", True, True, golden="exact", golden_checked=2, golden_total=4),
    Hello(3, True, bytes(range(16)), 7, 512, 512, 256, 2, "0.1.0", "rp2040-emu", True, False, batch=4, golden="differs", golden_checked=2,
          golden_total=4, golden_first_diff=1),
    Hello(3, True, bytes(range(16)), 7, 512, 512, 256, 1, "0.1.0", "pico", True, False, golden="none"),
]


def frames_of(data: bytes, decoder: FrameDecoder | None = None) -> list[Frame]:
    return (decoder or FrameDecoder()).feed(data)


def ref_cobs_encode(data: bytes) -> bytes:
    """Byte-at-a-time canonical COBS (a full block is closed when the next byte comes)."""
    out = bytearray([0])
    code_at, code = 0, 1
    for b in data:
        if code == 0xFF:
            out[code_at] = 0xFF
            code_at, code = len(out), 1
            out.append(0)
        if b == 0:
            out[code_at] = code
            code_at, code = len(out), 1
            out.append(0)
        else:
            out.append(b)
            code += 1
    out[code_at] = code
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# COBS


@FAST
@given(st.one_of(st.binary(max_size=2000), zero_heavy, runs))
def test_cobs_round_trip(data):
    enc = cobs_encode(data)
    assert 0 not in enc
    assert enc == ref_cobs_encode(data)
    assert len(enc) <= cobs_max_encoded(len(data))
    assert cobs_decode(enc) == data


@SLOW
@given(st.integers(4097, 20000), st.integers(0, 2**32 - 1))
def test_cobs_long(n, seed):
    data = random.Random(seed).randbytes(n)
    assert cobs_decode(cobs_encode(data)) == data


@pytest.mark.parametrize("data, enc", [
    (b"", b"\x01"),
    (b"\x00", b"\x01\x01"),
    (b"\x11\x00\x00\x22", b"\x02\x11\x01\x02\x22"),
    (b"\x01" * 253, b"\xfe" + b"\x01" * 253),
    (b"\x01" * 254, b"\xff" + b"\x01" * 254),  # canonical: no trailing 0x01 block
    (b"\x01" * 255, b"\xff" + b"\x01" * 254 + b"\x02\x01"),
    (b"\x01" * 254 + b"\x00", b"\xff" + b"\x01" * 254 + b"\x01\x01"),
])
def test_cobs_canonical(data, enc):
    assert cobs_encode(data) == enc
    assert cobs_decode(enc) == data


def test_cobs_decode_rejects_and_tolerates():
    assert cobs_decode(b"\xff" + b"\x01" * 254 + b"\x01") == b"\x01" * 254  # trailing 0x01
    for bad in (b"\x05ab", b"\x02a\x00", b"\x00"):
        with pytest.raises(FrameError) as e:
            cobs_decode(bad)
        assert e.value.kind == "cobs"


# ---------------------------------------------------------------------------------------------
# messages


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_message_examples(msg):
    msg_type, payload = encode_payload(msg)
    assert decode_payload(msg_type, payload) == msg
    (frame,) = frames_of(encode_frame(msg, 513))
    assert frame == Frame(513, msg)


def test_every_type_has_an_example():
    assert {encode_payload(m)[0] for m in EXAMPLES} == {int(t) for t in MsgType}


@FAST
@given(messages, u16)
def test_message_round_trip(msg, seq):
    msg_type, payload = encode_payload(msg)
    assert decode_payload(msg_type, payload) == msg
    assert frames_of(encode_frame(msg, seq)) == [Frame(seq, msg)]


def test_wire_layout():
    assert encode_payload(Generate([5, 6], 10, 0.5, 0.0, 3, True, batch=4, speculate="draft", draft_k=3)) == (
        2, struct.pack("<IffQIBBBBI2I", 10, 0.5, 0.0, 3, 1, 4, 2, 3, 0, 2, 5, 6))
    t, p = encode_payload(Token(1, 2, 3, None, (0,) * 7, (0,) * 3, 9, 7, b"ab", 1, 3, 2, "verify"))
    assert t == 0x82 and p[12:16] == b"\xff" * 4 and p[-6:] == b"\x02ab\x00\x00\x00" and len(p) == 74
    moe = encode_payload(Token(1, 2, 3, None, (0,) * 7, (0,) * 3, 9, 7, b"ab", 1, 3, 2, "verify", 4, ((1, 3), (2, 0)),
                               (0b1110, 0b0101)))[1]
    assert moe[-12:] == b"\x02ab" + bytes([2, 2, 4, 1, 3, 2, 0, 0x0e, 0x05])   # layers, k, E, choices, pass masks
    assert p[56:64] == struct.pack("<II", 9, 7)                       # head_rows, logits_crc
    assert p[64:68] == bytes([1, 3, 2, 2])                            # the pass: place, tokens, steps, kind
    d = encode_payload(Done(1, 2, "stopped", 3, (0,) * 7, 4, 1, 3, 2, (9, 0, 8), (6, 0, 0), 7420, 9468))[1]
    assert len(d) == 145 and d[73:145] == struct.pack("<4I3Q3Q2I", 4, 1, 3, 2, 9, 0, 8, 6, 0, 0, 7420, 9468)
    assert encode_payload(Done(1, 2, "stopped", 3, (0,) * 7))[1][8] == 3
    h = encode_payload(Hello(2, True, bytes(16), 5, 300, 200, 64, 1, "", ""))[1]
    assert h[20:37] == struct.pack("<IIIIB", 5, 300, 200, 64, 1)      # out_vocab after vocab_size
    old = encode_payload(Hello(1, True, bytes(16), 5, 300, 300, 64, 1, "", ""))[1]
    assert old[20:33] == struct.pack("<IIIB", 5, 300, 64, 1)          # version 1: no out_vocab
    assert encode_payload(Log("hi")) == (0x86, b"\x02\x00hi")
    assert encode_payload(Resend(7, (1, P.RESEND_DONE))) == (5, struct.pack("<4I", 7, 2, 1, 0xFFFFFFFF))
    assert encode_payload(Resent("ended", 7, 9, 1, (0,))) == (0x87, struct.pack("<B5I", 2, 7, 9, 1, 1, 0))
    assert encode_payload(Hello(2, True, bytes(16), 0, 0, 0, 0, 0, "", "", True))[1][2:4] == b"\x03\x00"
    assert encode_payload(Hello(2, True, bytes(16), 0, 0, 0, 0, 0, "", "", True, True))[1][2:4] == b"\x07\x00"
    v3 = encode_payload(Hello(3, True, bytes(16), 0, 0, 0, 0, 0, "a", "b", batch=8))[1]
    assert v3[-12:-7] == b"\x01a\x01b\x08"                          # version 3: the batch after board
    assert encode_payload(Generate("h\u00e9", 10, 0.5, 0.0, 3, True)) == (
        6, struct.pack("<IffQIBBBBH", 10, 0.5, 0.0, 3, 1, 0, 0, 0, 0, 3) + "h\u00e9".encode())
    v3 = encode_payload(Hello(3, True, bytes(16), 0, 0, 0, 0, 0, "", "b", False, False, 1, False, "differs", 3, 4, 2))[1]
    assert v3[-10:] == b"\x01b\x01" + struct.pack("<BHHH", 3, 3, 4, 2)   # batch, then golden: state, checked, total, first
    assert encode_payload(SelfTest()) == (7, b"")
    frame = encode_frame(Ping(), 0x0102)
    body = cobs_decode(frame[:-1])
    assert frame[-1] == 0 and body[:3] == b"\x01\x02\x01"
    assert body[3:] == struct.pack("<I", zlib.crc32(b"\x01\x02\x01"))


def test_decode_payload_errors():
    for msg in EXAMPLES:
        t, p = encode_payload(msg)
        bad = [p + b"\x00"]
        if p:
            bad.append(p[:-1])
        for payload in bad:
            with pytest.raises(ProtocolError) as e:
                decode_payload(t, payload)
            assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    for t in (0x00, 0x08, 0x80, 0x88, 0xFF):
        with pytest.raises(ProtocolError, match="unknown message type"):
            decode_payload(t, b"")
    bad_reason = bytearray(encode_payload(EXAMPLES[8])[1])
    bad_reason[8] = 9
    with pytest.raises(ProtocolError):
        decode_payload(MsgType.DONE, bytes(bad_reason))
    deeper = encode_payload(Done(1, 1, "eos", 0, (0,) * 7, stack_peak=9469, stack_size=9468))[1]
    with pytest.raises(ProtocolError, match="stack peak"):     # deeper than the stack: a corrupt frame
        decode_payload(MsgType.DONE, deeper)


@pytest.mark.parametrize("msg", [
    Hello(2, True, b"short", 0, 0, 0, 0, 0, "", ""),
    Hello(1, True, bytes(16), 0, 10, 9, 0, 0, "", ""),
    Token(0, 0, 0, 0, (1, 2, 3, 4, 5), (0, 0, 0), 0, 0, b""),
    Token(0, 0, 0, 0, (0,) * 7, (0,) * 3, 0, 0, b"x" * 256),
    Done(0, 0, "bored", 0, (0,) * 7),
    Done(0, 0, "eos", 0, (0,) * 5),
    Generate([-1], 1),
    Generate([1], 2**32),
    Generate([1], 1, speculate="oracle"),
    Generate([1], 1, batch=256),
    Token(0, 0, 0, 0, (0,) * 7, (0,) * 3, 0, 0, b"", kind="magic"),
    Token(0, 0, 0, 0, (0,) * 7, (0,) * 3, 0, 0, b"", pass_index=256),
    Generate("x" * 65536, 1),
    Error(70000, "x"),
    Resend(1, tuple(range(P.RESEND_MAX + 1))),
    Resent("asleep", 0, 0, 0, ()),
])
def test_encode_errors(msg):
    with pytest.raises(ProtocolError):
        encode_payload(msg)


HOST_MESSAGES = st.one_of(
    st.just(Ping()), st.just(Stop()),
    st.builds(Layout, u32, st.integers(0, 0xFFFFFF), st.binary(max_size=300)),
    st.builds(Generate, st.lists(u32, max_size=80), u32, f32, f32, u64, st.booleans(), st.booleans(), st.booleans(),
              u8, st.sampled_from(P.SPECULATE), u8),
    st.builds(Generate, st.text(max_size=200), u32, f32, f32, u64, st.booleans(), st.booleans(), st.booleans(),
              u8, st.sampled_from(P.SPECULATE), u8),
    st.builds(Resend, u32, st.lists(u32, max_size=P.RESEND_MAX).map(tuple)),
    st.just(SelfTest()),
)


@FAST
@given(HOST_MESSAGES, u16)
def test_host_frames_cannot_start_a_console_line(msg, seq):
    """docs/formats.md 2.3: every frame the host sends starts with a COBS code byte below 0x20 (a
    0x00 within its first 25 bytes) followed by its type, a control byte other than tab, backspace,
    CR or LF, so the device's console never takes one for a line of text."""
    frame = encode_frame(msg, seq)
    assert frame[0] < 0x20 and frame[0] <= 25
    assert frame[1] == encode_payload(msg)[0] and frame[1] < 0x20 and frame[1] not in (8, 9, 10, 13)


def test_text_is_cut_at_character_boundary():
    t, p = encode_payload(Hello(2, False, bytes(16), 0, 0, 0, 0, 2, "\u00e9" * 200, "b"))
    msg = decode_payload(t, p)
    assert msg.fw_version == "\u00e9" * 127 and msg.board == "b" and msg.clock_name == "emulated timer"
    with pytest.raises(ProtocolError):
        encode_raw_frame(0x86, 0, bytes(MAX_PAYLOAD + 1))
    assert len(encode_payload(Log("x" * 70000))[1]) == MAX_PAYLOAD


def test_error_name():
    assert Error(1, "").name == "bad_frame" and Error(7, "").name == "no_model"
    assert Error(42, "").name == "error_42"


# ---------------------------------------------------------------------------------------------
# stream decoder


@FAST
@given(st.lists(messages, max_size=8), u16, st.lists(st.integers(1, 400), max_size=10))
def test_stream_split_anywhere(msgs, seq0, cuts):
    stream = b"".join(encode_frame(m, seq0 + i) for i, m in enumerate(msgs))
    dec = FrameDecoder()
    got, pos = [], 0
    for c in cuts:
        got += dec.feed(stream[pos:pos + c])
        pos += c
    got += dec.feed(stream[pos:])
    assert got == [Frame((seq0 + i) & 0xFFFF, m) for i, m in enumerate(msgs)]
    assert dec.stats.frames == len(msgs) and dec.stats.gaps == [] and dec.stats.bad_frames == 0


@SLOW
@given(st.integers(255, 5000), st.floats(0, 1), st.integers(0, 2**32 - 1))
def test_long_frames(n_values, zero_share, seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n_values).astype(np.float32)
    values[rng.random(n_values) < zero_share] = 0.0
    msgs = [Logits(1, values), Log("x" * (n_values * 3)), Layout(7, 0, values.tobytes())]
    stream = b"".join(encode_frame(m, i) for i, m in enumerate(msgs))
    assert frames_of(stream) == [Frame(i, m) for i, m in enumerate(msgs)]


def test_max_size_frame():
    values = np.arange(MAX_PAYLOAD // 4 - 1, dtype=np.float32)
    frame = encode_frame(Logits(0, values), 0)
    assert len(frame) > 65536
    assert frames_of(frame) == [Frame(0, Logits(0, values))]


@FAST
@given(messages, st.data())
def test_bit_flip_rejected(msg, data):
    good_a, bad, good_c = (encode_frame(Log("a"), 0), encode_frame(msg, 1),
                           encode_frame(Log("c"), 2))
    pos = data.draw(st.integers(0, len(bad) - 2))
    bit = data.draw(st.integers(0, 7))
    corrupt = bytearray(bad)
    corrupt[pos] ^= 1 << bit
    dec = FrameDecoder()
    got = dec.feed(good_a + bytes(corrupt) + good_c)
    assert got == [Frame(0, Log("a")), Frame(2, Log("c"))]
    assert dec.stats.bad_crc + dec.stats.bad_cobs >= 1 and dec.stats.junk_bytes == 0
    assert dec.stats.gaps == [(1, 2)]


@FAST
@given(messages, st.data())
def test_truncation_rejected(msg, data):
    bad = encode_frame(msg, 1)
    keep = data.draw(st.integers(0, len(bad) - 2))
    dec = FrameDecoder()
    got = dec.feed(encode_frame(Ping(), 0) + bad[:keep] + b"\x00" + encode_frame(Stop(), 2))
    assert got == [Frame(0, Ping()), Frame(2, Stop())]
    assert dec.stats.bad_frames == (1 if keep else 0)  # keep == 0 is just an empty frame
    assert dec.stats.gaps == [(1, 2)]


def test_data_byte_flip_is_a_crc_error():
    dec = FrameDecoder()
    frame = bytearray(encode_frame(Log("a" * 100), 1))
    frame[60] ^= 0x01
    dec.feed(encode_frame(Ping(), 0) + bytes(frame))
    assert (dec.stats.bad_crc, dec.stats.bad_cobs) == (1, 0)
    dec.feed(b"\x02\x01\x00")  # decodes to one byte: too short
    assert (dec.stats.bad_crc, dec.stats.bad_cobs) == (1, 1)


BOOT_LOG = (b"ESP-ROM:esp32s3-20210327\r\nrst:0x1 (POWERON),boot:0x8 (SPI_FAST_FLASH_BOOT)\r\n"
            b"I (27) boot: ESP-IDF v5.1\r\n\xff\xfe garbage \x85\x81\r\n")


@pytest.mark.parametrize("sep", [b"", b"\x00", b"\x00\x00"])
def test_junk_before_first_frame(sep):
    hello = Hello(3, True, bytes(16), 1, 256, 256, 128, 1, "fw", "board")
    tail = encode_frame(Log("half a frame from before"), 77)[5:-1]  # partial frame at connect
    stream = tail + BOOT_LOG + sep + encode_frame(hello, 0) + encode_frame(Log("x"), 1)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(stream), 7):
        got += dec.feed(stream[i:i + 7])
    assert got == [Frame(0, hello), Frame(1, Log("x"))]
    st_ = dec.stats
    assert st_.junk_bytes == len(tail) + len(BOOT_LOG) and st_.bad_frames == 0
    assert st_.gaps == [] and st_.resets == 0


def test_empty_frames_ignored():
    dec = FrameDecoder()
    got = dec.feed(b"\x00\x00" + encode_frame(Ping(), 0) + b"\x00\x00\x00"
                   + encode_frame(Ping(), 1) + b"\x00")
    assert len(got) == 2 and dec.stats == DecoderStats(frames=2)


def test_gap_wrap_and_reset():
    dec = FrameDecoder()
    seqs = [65533, 65534, 65535, 0, 1, 3, 4]
    got = dec.feed(b"".join(encode_frame(Log(str(s)), s) for s in seqs))
    assert [f.seq for f in got] == seqs
    assert dec.stats.gaps == [(2, 3)] and dec.stats.resets == 0
    hello = Hello(3, False, bytes(16), 0, 0, 0, 0, 0, "", "")
    got = dec.feed(encode_frame(hello, 0) + encode_frame(Log("after"), 1)
                   + encode_frame(Log("not hello"), 0))
    assert [f.seq for f in got] == [0, 1, 0]
    assert dec.stats.resets == 1 and dec.stats.gaps == [(2, 3), (2, 0)]
    assert dec.last_seq == 0


def test_bad_message_counted_and_seq_tracked():
    dec = FrameDecoder()
    stream = (encode_frame(Ping(), 0) + encode_raw_frame(0x7F, 1, b"??")
              + encode_raw_frame(MsgType.TOKEN, 2, b"short") + encode_frame(Stop(), 3))
    assert dec.feed(stream) == [Frame(0, Ping()), Frame(3, Stop())]
    assert dec.stats.bad_message == 2 and dec.stats.gaps == [] and dec.stats.frames == 2


def test_oversize_candidate_dropped():
    dec = FrameDecoder()
    dec.feed(encode_frame(Ping(), 0))
    dec.feed(b"A" * (MAX_ENCODED + 1000))
    got = dec.feed(b"\x00" + encode_frame(Stop(), 1))
    assert got == [Frame(1, Stop())] and dec.stats.bad_cobs == 1


def test_resync_after_sync_counts_one_bad_frame():
    dec = FrameDecoder()
    dec.feed(encode_frame(Ping(), 0))
    lost = encode_frame(Log("lost its delimiter"), 1)[:-1]
    got = dec.feed(lost[:-2] + encode_frame(Stop(), 2))
    assert got == [Frame(2, Stop())]
    assert dec.stats.bad_cobs == 1 and dec.stats.gaps == [(1, 2)] and dec.stats.junk_bytes == 0


# ---------------------------------------------------------------------------------------------
# Link


class FakePort:
    """pyserial-like: read(n) returns what is buffered, else waits up to timeout for b""."""

    def __init__(self, incoming: bytes = b"", dribble: bytes | None = None):
        self.timeout = None
        self.incoming = bytearray(incoming)
        self.dribble = dribble  # bytes handed out one per read, forever
        self.written = bytearray()
        self.timeouts: list[float | None] = []

    def write(self, b):
        self.written += b
        return len(b)

    def read(self, n=1):
        self.timeouts.append(self.timeout)
        if self.dribble is not None:
            time.sleep(0.001)
            return self.dribble[:1]
        if not self.incoming:
            time.sleep(self.timeout if self.timeout is not None else 10.0)
            return b""
        out = bytes(self.incoming[:n])
        del self.incoming[:n]
        return out


def test_link_send_and_recv():
    frames = [encode_frame(Log(str(i)), 100 + i) for i in range(3)]
    port = FakePort(BOOT_LOG + b"".join(frames))
    link = Link(port)
    assert [link.send(Ping()), link.send(Stop())] == [0, 1]
    assert bytes(port.written) == encode_frame(Ping(), 0) + encode_frame(Stop(), 1)
    got = [link.recv(1.0) for _ in range(3)]
    assert got == [Frame(100 + i, Log(str(i))) for i in range(3)]
    assert link.stats.frames == 3 and link.stats.junk_bytes == len(BOOT_LOG)
    t0 = time.monotonic()
    assert link.recv(0.15) is None
    assert time.monotonic() - t0 < 0.3
    assert all(t is not None and 0 < t <= 0.15 for t in port.timeouts)


def test_link_recv_bounded_under_junk():
    link = Link(FakePort(dribble=b"x"))
    t0 = time.monotonic()
    assert link.recv(0.2) is None
    assert time.monotonic() - t0 < 0.4
    assert link.recv(0) is None
    link.tx_seq = 0xFFFF
    assert link.send(Ping()) == 0xFFFF and link.tx_seq == 0


# ---------------------------------------------------------------------------------------------
# Python <-> C (firmware/app/protocol.c through tests/c/proto_echo.c)


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("proto") / "proto_echo"
    subprocess.run(
        [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2",
         f"-I{APP_DIR}", f"-I{ENGINE_DIR}", str(ROOT / "tests/c/proto_echo.c"),
         str(APP_DIR / "protocol.c"), str(ENGINE_DIR / "crc32.c"),
         "-o", str(exe)],
        check=True, capture_output=True, timeout=60,
    )

    def run(data: bytes, cap: int | None = None) -> bytes:
        args = [str(exe)] + ([str(cap)] if cap else [])
        return subprocess.run(args, input=data, capture_output=True, check=True,
                              timeout=20).stdout

    return run


def expected_echo(goods: list[tuple[int, bytes]], bad: int) -> bytes:
    out = b"".join(encode_raw_frame(t, i, p) for i, (t, p) in enumerate(goods))
    report = f"good={len(goods)} bad={bad}"
    return out + encode_frame(Log(report), len(goods))


def corrupt_data_byte(frame: bytes) -> bytes | None:
    """A flip inside a zero-free run (not a COBS code byte): COBS stays valid, the CRC fails.
    None when the frame has no such byte in its second half."""
    enc = bytearray(frame)
    codes, i = set(), 0
    while i < len(enc) - 1:
        codes.add(i)
        i += enc[i]
    pos = next((j for j in range(len(enc) // 2, len(enc) - 1) if j not in codes and enc[j] != 1),
               None)
    if pos is None:
        return None
    enc[pos] ^= 0x01
    return bytes(enc)


@pytest.mark.native
def test_c_echo_mixed_stream(echo):
    goods: list[tuple[int, bytes]] = []
    stream = bytearray(b"\x00\x00")  # idle delimiters: ignored
    bad = 0

    def good(t, p, seq):
        goods.append((t, p))
        stream.extend(encode_raw_frame(t, seq, p))

    stream += BOOT_LOG + b"\x00"  # on the device a delimited junk run is a bad frame
    bad += 1
    for i, msg in enumerate(EXAMPLES):
        good(*encode_payload(msg), 1000 + i)
        if i % 3 == 0:
            stream += corrupt_data_byte(encode_frame(Log("b" * (40 + i)), 7))
            bad += 1
        if i % 4 == 1:
            stream += encode_frame(Log("truncated frame"), 8)[:-4] + b"\x00"
            bad += 1
        if i % 5 == 2:
            stream += b"\x02\x01\x00\x00"  # too short, then an empty frame
            bad += 1
    for payload in (b"\x00" * 300, b"\x7f" * 254, b"\x7f" * 600 + b"\x00" + b"\x01" * 5000,
                    bytes(range(256)) * 20):
        good(0x40, payload, 3)  # not a message type: the C side echoes any type
    out = echo(bytes(stream))
    assert out == expected_echo(goods, bad)
    dec = FrameDecoder()
    got = dec.feed(out)
    assert [f.seq for f in got] == list(range(len(EXAMPLES))) + [len(goods)]
    assert [f.msg for f in got] == EXAMPLES + [Log(f"good={len(goods)} bad={bad}")]
    assert dec.stats.bad_message == 4 and dec.stats.gaps == []


@pytest.mark.native
def test_c_encoder_block_boundaries(echo):
    """Frames whose zero-free runs end around 254-byte blocks, at the end and in the middle."""
    goods = []
    for k in list(range(240, 520)) + [1016, 1017, 4096, 9000]:
        goods.append((0x41, b"\x01" * k))  # one long run up to the CRC
        goods.append((0x42, b"\x01" * k + b"\x00"))
        goods.append((0x43, b"\x00" + b"\x02" * k + b"\x00\x00" + b"\x03" * (k // 2)))
    goods.append((0x44, random.Random(1).randbytes(MAX_PAYLOAD)))
    stream = b"".join(encode_raw_frame(t, 0, p) for t, p in goods)
    out = echo(stream)
    assert out == expected_echo(goods, 0)
    chunks = out.split(b"\x00")
    assert chunks[-1] == b""
    decoded = [decode_raw_frame(c) for c in chunks[:-1]]
    assert decoded[:-1] == [(t, i, p) for i, (t, p) in enumerate(goods)]


@SLOW
@given(st.lists(st.tuples(u8, payload_bytes, st.sampled_from(["good", "flip", "cut", "junk"])),
                min_size=1, max_size=12))
@pytest.mark.native
def test_c_echo_random(echo, items):
    goods, bad, stream = [], 0, bytearray()
    for t, payload, kind in items:
        frame = encode_raw_frame(t, 5, payload)
        if kind == "good":
            goods.append((t, payload))
            stream += frame
        elif kind == "flip":
            stream += corrupt_data_byte(frame) or b"\x03ab\x00"  # else: too short
            bad += 1
        elif kind == "cut":
            stream += frame[: max(1, len(frame) // 2)] + b"\x00"
            bad += 1
        else:
            stream += payload.replace(b"\x00", b"") + b"junk\x00"
            bad += 1
    assert echo(bytes(stream)) == expected_echo(goods, bad)


@pytest.mark.native
def test_c_rx_overflow(echo):
    small = encode_frame(Log("ok"), 0)
    big = encode_frame(Log("y" * 100), 1)
    out = echo(small + big + small + b"z" * 500 + b"\x00" + small, cap=64)
    t, p = encode_payload(Log("ok"))
    assert out == expected_echo([(t, p)] * 3, 2)
    # A frame that fills the buffer exactly and then goes on is discarded, not accepted.
    out = echo(small[:-1] + b"zzz\x00" + small, cap=len(small) - 1)
    assert out == expected_echo([(t, p)], 1)
