"""Writes the seed corpora of the fuzz targets (committed under tests/fuzz/corpus/):

* ``app/`` — host byte streams for fuzz_app (input format in fuzz_app.c): every host message,
  well-formed and not, in record mode, and real wire streams with junk in raw mode;
* ``blob/`` — images for fuzz_blob: the models of make_blob.py with each mode byte.

Run ``python tests/fuzz/make_seeds.py`` after a change to the protocol or the blob format."""
from __future__ import annotations

import hashlib
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_blob import FUZZ_MODEL, models  # noqa: E402

from host.link import messages as P  # noqa: E402
from host.link.cobs import encode_raw_frame  # noqa: E402
from host.link.codec import encode_frame  # noqa: E402

REC, RAW_KIND, LAYOUT_AUTO = 1, 0xFF, 0xFE
N_ENTRIES = 20     # table entries of FUZZ_MODEL's blob: head index, draft and golden included (checked in app_seeds)
PSRAM_ALL = bytes([1] * (N_ENTRIES - 2) + [0, 0])   # every entry in PSRAM but the draft and golden (last two: flash only)


def rec(kind: int, payload: bytes = b"") -> bytes:
    assert len(payload) <= 255
    return bytes([kind, len(payload)]) + payload


def gen(prompt, max_new, temp=0.0, top_p=0.0, seed=0, flags=0, batch=0, spec=0, k=0) -> bytes:
    return struct.pack(f"<IffQIBBBBI{len(prompt)}I", max_new, temp, top_p, seed, flags, batch, spec, k, 0, len(prompt),
                       *prompt)


def gen_text(text: bytes, max_new, temp=0.0, top_p=0.0, seed=0, flags=0, batch=0, spec=0, k=0) -> bytes:
    return struct.pack("<IffQIBBBBH", max_new, temp, top_p, seed, flags, batch, spec, k, 0, len(text)) + text


def lf_frame() -> bytes:
    """A GENERATE whose COBS code byte is LF (first 0x00 nine bytes in): what a console line end
    held back must not swallow."""
    payload = struct.pack("<IIfQIBBBBI", 0x01010101, 0x3F000101, 0.0, 0, 0, 0, 0, 0, 0, 1) + struct.pack("<I", 5)
    frame = encode_raw_frame(P.MsgType.GENERATE, 0x0101, payload)
    assert frame[0] == 0x0A
    return frame


def resend(generation, steps) -> bytes:
    return struct.pack(f"<II{len(steps)}I", generation, len(steps), *steps)


def app_seeds() -> dict[str, bytes]:
    from converter.blob import parse_header
    assert len(parse_header(models()["app_q8"]).entries) == N_ENTRIES, "update N_ENTRIES (LAYOUT seeds)"
    V, C = FUZZ_MODEL["vocab_size"], FUZZ_MODEL["max_seq_len"]
    s = {}
    s["ping"] = bytes([REC]) + rec(1)
    s["generate_greedy"] = bytes([REC]) + rec(2, gen([1, 2, 3], 4))
    s["generate_sampled_logits"] = bytes([REC]) + rec(2, gen([5], 6, 0.9, 0.8, 12345, 1))
    s["generate_to_context"] = bytes([REC]) + rec(2, gen([1] * (C - 1), 0xFFFFFFFF, 1.5, 0.0, 9))
    s["generate_then_stop"] = bytes([REC]) + rec(2, gen([1, 2], 8)) + rec(4) + rec(1)
    s["generate_busy"] = bytes([REC]) + rec(2, gen([3], 5)) + rec(2, gen([3], 5)) + rec(3, b"")
    s["generate_bad"] = bytes([REC]) + b"".join(rec(2, p) for p in (
        b"", gen([], 3), gen([V], 3), gen([1] * (C + 1), 3), gen([1, 2], 3)[:-2], gen([0], 0),
        struct.pack("<IffQIBBBBI", 3, float("nan"), float("inf"), 0, 0, 0, 0, 0, 0, 1) + b"\x01\0\0\0",
        gen([1, 2], 3, batch=200), gen([1, 2], 3, spec=7), gen([1, 2], 3)[:28] + b"\x01" + gen([1, 2], 3)[29:]))
    # speculative decoding: prompt lookup (k 3, the default k), the draft model, with logits, refused ones
    rep = [1, 2, 3, 1, 2, 3, 1, 2]
    for name, g in (("lookup", gen(rep, 6, spec=1, k=3)), ("lookup_default_k", gen(rep, 5, spec=1)),
                    ("draft", gen(rep, 6, spec=2, k=2)), ("draft_logits", gen(rep, 4, flags=1, spec=2)),
                    ("slide", gen(rep, 9, flags=2, spec=2))):
        s[f"generate_speculate_{name}"] = bytes([REC]) + rec(2, g) + rec(1)     # one generation, then a PING
    s["generate_speculate_refused"] = bytes([REC]) + rec(2, gen(rep, 3, 0.7, spec=1)) + rec(2, gen(rep, 3, spec=1, k=4)) \
        + rec(2, gen(rep, 3, spec=3))
    # batched prefill: the board's batch, passes of 2 and of 1, a prompt longer than the batch with logits
    s["generate_batched"] = bytes([REC]) + rec(2, gen([1, 2, 3, 4, 5, 6], 3, batch=2)) + rec(2, gen([1] * 7, 2)) \
        + rec(2, gen([2, 3, 4], 2, flags=1, batch=1)) + rec(2, gen([5, 6, 7, 8, 9], 2, 0.8, 0.9, 3, flags=4))
    s["resend_status"] = bytes([REC]) + rec(5, resend(0, [0xFFFE0001]))
    s["generate_resend"] = (bytes([REC]) + rec(2, gen([1, 2, 3], 9)) + rec(5, resend(1, [0, 2, 5, 0xFFFFFFFF]))
                            + rec(5, resend(1, list(range(32)))) + rec(5, resend(7, [1])) + rec(5, b"\x01\0\0\0\x40\0\0\0"))
    s["resend_during"] = bytes([REC]) + rec(2, gen([4], 10)) + rec(5, resend(1, [0, 0xFFFFFFFF])) + rec(4)
    s["layout_ok"] = bytes([REC]) + rec(LAYOUT_AUTO, struct.pack("<I", 0) + bytes([0, 0, 0, 0, 1] + [2] * 10))
    s["layout_state"] = bytes([REC]) + rec(LAYOUT_AUTO, struct.pack("<I", 0x211) + PSRAM_ALL) \
        + rec(2, gen([1, 2], 3))
    s["layout_bad"] = bytes([REC]) + b"".join(rec(3, p) for p in (
        b"", struct.pack("<III", 0, 0, 3) + b"\0\0\0", struct.pack("<III", 1, 0, N_ENTRIES) + bytes(N_ENTRIES),
        struct.pack("<III", 0, 0, N_ENTRIES) + bytes([7] * N_ENTRIES))) \
        + rec(LAYOUT_AUTO, struct.pack("<I", 0xF0000) + bytes(N_ENTRIES))
    # GENERATE flags: slide (past the context of 12), all logits, both, logits + slide, an unknown bit
    s["generate_slide"] = bytes([REC]) + rec(2, gen([1, 2, 3], 30, flags=2)) + rec(1)
    s["generate_slide_sampled_all"] = bytes([REC]) + rec(2, gen([4, 5], 0xFFFFFFFF, 0.7, 0.9, 5, flags=6)) + rec(4)
    s["generate_all_logits"] = bytes([REC]) + rec(2, gen([1, 2, 3], 5, flags=4)) + rec(2, gen([6], 3, flags=7))
    s["generate_bad_flags"] = bytes([REC]) + rec(2, gen([1], 2, flags=8)) + rec(2, gen([1], 2, flags=0xFFFFFFFF))
    # the KV cache format through LAYOUT: int8, int8 with the state in PSRAM, an unknown format
    s["layout_kv_int8"] = bytes([REC]) + rec(LAYOUT_AUTO, struct.pack("<I", 0x1000) + bytes(N_ENTRIES)) \
        + rec(2, gen([1, 2], 20, flags=2))
    s["layout_kv_int8_psram"] = bytes([REC]) + rec(LAYOUT_AUTO, struct.pack("<I", 0x1111) + PSRAM_ALL) \
        + rec(2, gen([3], 4, 0.5, 0.0, 1, 1))
    s["layout_kv_bad"] = bytes([REC]) + rec(LAYOUT_AUTO, struct.pack("<I", 0x2000) + bytes(N_ENTRIES)) + rec(1)
    # SELFTEST: the golden check idle, with a payload, while generating, after a LAYOUT to the int8 cache
    s["selftest"] = bytes([REC]) + rec(7) + rec(7, b"x") + rec(2, gen([1, 2], 6)) + rec(7) + rec(4) \
        + rec(LAYOUT_AUTO, struct.pack("<I", 0x1000) + bytes(N_ENTRIES)) + rec(7) + rec(2, gen([1], 2))
    s["unknown_types"] = bytes([REC]) + rec(0x00) + rec(0x81, b"hello?") + rec(0x7F, b"x" * 40) + rec(1)
    s["raw_junk_then_frames"] = bytes([REC]) + rec(RAW_KIND, b"\xff\xfe junk\r\n\x00\x05\x00") + rec(1) \
        + rec(RAW_KIND, b"\x02\x02\x00") + rec(2, gen([2], 2))
    # raw mode: real wire bytes, read 1, 3 and 64 bytes at a time
    wire = (b"boot noise\r\n" + encode_frame(P.Ping(), 0)
            + encode_frame(P.Generate([1, 2, 3], 3, 0.0, 0.0, 0, True), 1)
            + encode_frame(P.Resend(1, (0, 1, P.RESEND_DONE)), 2) + encode_frame(P.Stop(), 3)
            + bytes(encode_frame(P.Ping(), 4))[:-3] + b"\x00" + encode_frame(P.Ping(), 5))
    for chunk_mode in (0x00, 0x08, 0xFC):
        s[f"raw_wire_{chunk_mode:02x}"] = bytes([chunk_mode]) + wire
    s["raw_wire_bad_image"] = bytes([0x02]) + wire
    s["record_bad_image"] = bytes([REC | 2]) + rec(1) + rec(2, gen([1], 2)) + rec(5, resend(0, [0]))
    s["raw_overflow"] = bytes([0xFC]) + b"\x01" * 9000 + b"\x00" + encode_frame(P.Ping(), 0)
    # text prompts: GENERATE_TEXT, good and refused (no piece for "q", too long, not UTF-8, bad lengths)
    s["generate_text"] = bytes([REC]) + rec(6, gen_text(b"ab c", 3)) + rec(6, gen_text("\u00e9 x\n12!".encode(), 2, 0.9, 0.9, 5, 1)) \
        + rec(6, gen_text(b"", 2))
    s["generate_text_bad"] = bytes([REC]) + b"".join(rec(6, p) for p in (
        b"", gen_text(b"ab", 2)[:-1], gen_text(b"a\xffb", 2), gen_text(b"q", 2), gen_text(b"ab" * 40, 2),
        gen_text(b"abc " * 10, 2), gen_text(b"ab", 2, float("nan"))))
    # the console: lines (CR, LF, CR LF, backspace, a cut character, no piece), frames after held line ends,
    # line noise before a frame whose code byte is LF, an overlong line, a line while a GENERATE runs
    ping = encode_frame(P.Ping(), 9)
    s["console_lines"] = bytes([0x08]) + b"abc\r\nx\x7fy\r\xc3\r\nq!\n" + ping + b"hi\r\n" + ping + b"\n\r" + ping
    s["console_noise"] = bytes([0x00]) + b"Z" + lf_frame() + b"hello\r\n" + lf_frame() + lf_frame()
    s["console_overflow"] = bytes([0xFC]) + b"a" * 9000 + b"\r\n" + ping
    s["console_during_generate"] = bytes([REC]) + rec(2, gen([1], 8)) + rec(RAW_KIND, b"abc\r\n") + rec(1)
    return s


def blob_seeds() -> dict[str, bytes]:
    s = {}
    for name, blob in models().items():
        for mode in (0, 3, 7, 15, 31, 39, 71):
            s[f"{name}_m{mode}"] = bytes([mode]) + blob
    return s


def write(out: Path, seeds: dict[str, bytes]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        (out / f"{name}-{hashlib.sha1(data).hexdigest()[:8]}").write_bytes(data)
    return len(seeds)


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "corpus"
    print(write(root / "app", app_seeds()), "app seeds,", write(root / "blob", blob_seeds()), "blob seeds in", root)
