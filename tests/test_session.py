"""host/session/, host/output/ and `flashlm run --port` against a fake device on a pty."""
from __future__ import annotations

import csv
import dataclasses
import json
import time

import pytest

pytest.importorskip("host.link.messages")
pytest.importorskip("serial")

from fakeboard import FakeBoard, expected_run, piece  # noqa: E402
from host.link import messages as P  # noqa: E402
from host.link.messages import Generate  # noqa: E402
from host.output import export, figure, live, stats, summary  # noqa: E402
from host.cli.main import main  # noqa: E402
from host.link.port import Link, open_port  # noqa: E402
from host.errors import BoardError  # noqa: E402
from host.session.errors import DeviceError, LinkTimeout, ModelMismatch  # noqa: E402
from host.session.session import Session  # noqa: E402

PROMPT = [1, 4, 9, 2]


@pytest.fixture
def connect():
    """connect(board) -> Session on the board's pty; everything is closed at teardown."""
    opened = []

    def _connect(board, **kw):
        ser = open_port(board.path)
        opened.append(ser)
        return Session(Link(ser), name=board.path, **kw)

    yield _connect
    for ser in opened:
        ser.close()


def _expect(prompt, n, board):
    return expected_run(prompt, n, board.vocab, board.max_seq_len)


def test_handshake_past_boot_junk_and_ignored_ping(connect):
    junk = b"ets Jun  8 2016 00:22:57\r\nrst:0x1 (POWERON_RESET)\r\nboot: loading\r\n\xff\xfe"
    with FakeBoard(boot_junk=junk, ignore_pings=1) as fb:
        s = connect(fb)
        t0 = time.monotonic()
        hello = s.handshake(timeout=5, interval=0.3)
        assert time.monotonic() - t0 < 4
        assert hello.board == "fakeboard" and hello.image_ok and hello.max_seq_len == 24
        assert hello.model_hash == bytes(range(16)) and hello.layout_id == 7
        assert fb.types_received().count(0x01) >= 2            # it had to PING again
        assert s.check_model(hello, bytes(range(16))) is None
        assert s.check_model(hello, bytes(range(16)).hex()) is None


def test_full_generate(connect):
    with FakeBoard() as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        seen = []
        res = s.generate(Generate(PROMPT, 6, temperature=0.0), on_token=seen.append, frame_timeout=3)
    want = _expect(PROMPT, 6, fb)
    assert [(t.step, t.pos, t.in_id, t.out_id) for t in res.tokens] == want
    assert seen == res.tokens
    assert res.done is not None and res.done.reason == "max_tokens"
    assert res.done.steps == len(want) == len(PROMPT) + 6 - 1
    assert res.missing_steps == [] and res.frame_gaps == 0 and res.bad_frames == 0
    assert res.generated_ids == [o for *_, o in want if o is not None]
    assert res.text_bytes == b"".join(piece(o) for *_, o in want if o is not None)
    assert len(res.prompt_steps) == len(PROMPT) - 1 and len(res.generated_steps) == 6
    assert res.tokens[0].us == (10, 100, 200, 0, 50, 0, 0) and res.tokens[0].head_rows == 40
    assert res.logs and "generate" in res.logs[0]
    assert res.clock == "emulated timer" and res.board == "fakeboard"
    # the GENERATE the device got carries what we asked for
    gen = [p for t, _, p in fb.received if t == 0x02][-1]
    import struct
    assert struct.unpack_from("<I", gen)[0] == 6 and list(struct.unpack_from("<4I", gen, 32)) == PROMPT


def test_dropped_token_reported_by_step(connect):
    with FakeBoard(drop_steps={4}) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        res = s.generate(Generate(PROMPT, 5), frame_timeout=3)
    assert res.missing_steps == [4]
    assert 4 not in [t.step for t in res.tokens]
    assert len(res.tokens) == res.done.steps - 1
    assert res.frame_gaps == 1 and res.gap_pairs


def test_dropped_last_token_found_from_done(connect):
    n = len(PROMPT) + 3 - 1
    with FakeBoard(drop_steps={n - 1}) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        res = s.generate(Generate(PROMPT, 3), frame_timeout=3)
    assert res.missing_steps == [n - 1]


def test_corrupted_frame_counted(connect):
    with FakeBoard(corrupt_steps={2}) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        res = s.generate(Generate(PROMPT, 4), frame_timeout=3)
    assert res.bad_frames == 1
    assert res.missing_steps == [2]
    assert res.done is not None and len(res.tokens) == res.done.steps - 1


def test_hash_mismatch_refused(connect):
    with FakeBoard(model_hash=b"\xaa" * 16) as fb:
        s = connect(fb)
        hello = s.handshake(timeout=5, interval=0.3)
        with pytest.raises(ModelMismatch) as e:
            s.check_model(hello, bytes(range(16)))
    msg = str(e.value)
    assert "aaaaaaaa" in msg and "00010203" in msg and "\n" not in msg


def test_bad_image_surfaces_device_error(connect):
    with FakeBoard(image_ok=False, image_error="blob CRC mismatch") as fb:
        s = connect(fb)
        with pytest.raises(DeviceError) as e:
            s.handshake(timeout=5, interval=0.3)
    assert "blob CRC mismatch" in str(e.value) and "bad_image" in str(e.value)


def test_device_error_on_generate(connect):
    with FakeBoard(generate_error=(6, "busy generating")) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        with pytest.raises(DeviceError) as e:
            s.generate(Generate(PROMPT, 3), frame_timeout=3)
    assert "busy generating" in str(e.value) and e.value.partial is not None


def test_silent_device_mid_run_times_out(connect):
    with FakeBoard(silent_after=3) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        t0 = time.monotonic()
        with pytest.raises(LinkTimeout) as e:
            s.generate(Generate(PROMPT, 6), frame_timeout=0.6)
        took = time.monotonic() - t0
    assert took < 3
    assert "silent" in str(e.value) and "after step 2" in str(e.value)
    assert [t.step for t in e.value.partial.tokens] == [0, 1, 2]


def test_mute_device_handshake_times_out(connect):
    with FakeBoard(ignore_pings=10**6) as fb:
        s = connect(fb)
        t0 = time.monotonic()
        with pytest.raises(LinkTimeout) as e:
            s.handshake(timeout=1.0, interval=0.25)
        assert time.monotonic() - t0 < 2.5
    assert "no HELLO" in str(e.value) and "PINGs" in str(e.value)


def test_ctrl_c_sends_stop_and_keeps_tokens(connect):
    with FakeBoard(step_delay=0.02) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)

        def on_token(t):
            if t.step == 3:
                raise KeyboardInterrupt

        res = s.generate(Generate(PROMPT, 15), on_token=on_token, frame_timeout=3)
        assert 0x04 in fb.types_received()
    assert res.interrupted
    assert res.done is not None and res.done.reason == "stopped"
    assert [t.step for t in res.tokens][:4] == [0, 1, 2, 3]
    assert res.missing_steps == []


def test_open_port_errors(tmp_path):
    with pytest.raises(BoardError, match="does not exist"):
        open_port(tmp_path / "ttyNOPE")
    f = tmp_path / "plain"
    f.write_text("x")
    with pytest.raises(BoardError, match="not a serial port"):
        open_port(f)
    with pytest.raises(BoardError, match="not a tty"):
        open_port("/dev/null")


# ---------------------------------------------------------------------------------------------
# report files

@pytest.fixture
def result(connect):
    with FakeBoard(drop_steps={5}) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        return s.generate(Generate(PROMPT, 7), frame_timeout=3)


def test_summary_numbers_from_device_clock(result):
    sm = stats.summarize(result)
    gen = result.generated_steps
    assert sm["generated_tokens"] == len(gen)
    us = sum(sum(t.us) for t in gen)
    assert sm["tokens_per_s"] == pytest.approx(len(gen) / (us / 1e6))
    assert sm["clock"] == "emulated timer" and sm["board"] == "fakeboard"
    assert sm["prefill"]["steps"] == len(PROMPT) - 1
    assert sm["decode"]["phases"]["ffn"]["p50"] == stats.percentile([t.us[2] for t in gen], 50)
    assert sm["bytes_per_token"]["psram"] == 0
    assert sm["missing_steps"] == [5]
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5 and stats.percentile([], 50) is None


def test_json_csv_png_written(result, tmp_path):
    j = export.write_json(result, tmp_path / "out" / "run.json")
    data = json.loads(j.read_text())
    assert data["hello"]["board"] == "fakeboard" and data["hello"]["clock_name"] == "emulated timer"
    assert [t["step"] for t in data["tokens"]] == [t.step for t in result.tokens]
    assert data["missing_steps"] == [5] and data["summary"]["tokens_per_s"] > 0

    c = export.write_csv(result, tmp_path / "run.csv")
    rows = list(csv.DictReader(c.open(newline="")))
    assert len(rows) == result.done.steps                     # one row per step, the lost one too
    assert [r["kind"] for r in rows].count("missing") == 1 and rows[5]["kind"] == "missing"
    r0 = rows[0]
    assert r0["kind"] == "prefill" and int(r0["total_us"]) == sum(result.tokens[0].us)
    assert rows[-1]["clock"] == "emulated timer"
    nl = next(r for r in rows if r["out_id"] == "3") if any(r["out_id"] == "3" for r in rows) else None
    if nl is not None:
        assert nl["piece"] == "\\n\\t"

    p = figure.plot_png(result, tmp_path / "run.png")
    raw = p.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 2000
    import matplotlib.image
    assert matplotlib.image.imread(str(p)).ndim == 3
    assert not list(tmp_path.glob(".*.tmp")) and not list((tmp_path / "out").glob(".*.tmp"))


@pytest.mark.parametrize("board", ["fakeboard", "a-board-with-a-much-longer-name-than-any-shipped-one"])
def test_png_title_and_legend_inside_the_figure(result, board):
    """A short run's figure is 7 in wide: its title, speeds included, once ran past both edges."""
    result.hello = dataclasses.replace(result.hello, board=board)
    fig = figure.run_figure(result)
    fig.canvas.draw()                       # lays the legend out
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = [ax.title] + fig.legends[0].get_texts()
    assert "tok/s" in ax.title.get_text()
    for t in texts:
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y0 >= 0 and box.y1 <= fig.bbox.y1, t.get_text()


def test_live_view_plain_and_terminal(result):
    import io

    from rich.console import Console
    buf = io.StringIO()
    con = Console(file=buf, width=200)
    with live.LiveView(con, result.hello) as v:
        for t in result.tokens:
            v.on_token(t)
    out = buf.getvalue()
    assert "embed µs" in out and "emulated timer" in out and "fakeboard" in out
    assert "PLE µs" not in out                          # a model without PLE: no all-zero column
    assert len([ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]) == len(result.tokens)

    buf = io.StringIO()
    con = Console(file=buf, width=200, force_terminal=True, height=40)
    with live.LiveView(con, result.hello, piece_of=lambda i: b"<%d>" % i) as v:
        for t in result.tokens:
            v.on_token(t)
    assert "embed µs" in buf.getvalue() and "PLE µs" not in buf.getvalue()
    # the text is shown with the sampled control characters escaped, as flashlm train's sample
    buf = io.StringIO()
    with live.LiveView(Console(file=buf, width=200), result.hello) as v:
        v.on_token(dataclasses.replace(result.tokens[-1], piece=b"a\x1b[2Jb\x13\n"))
    assert "text: a\\x1b[2Jb\\x13\n" in buf.getvalue() and "\x1b" not in buf.getvalue()
    summary.print_summary(Console(file=(b2 := io.StringIO()), width=200), result)
    s = b2.getvalue()
    assert "tok/s" in s and "emulated timer" in s and "fakeboard" in s and "lost" in s
    assert "PLE" not in s and "draft µs" not in s       # nothing drafted: no drafting column
    d = export.result_dict(result)                           # JSON keeps all seven phases
    assert list(d["tokens"][0]["us"]) == ["embed", "attention", "ffn", "ple", "output", "sampling", "draft"]


def test_ple_phase_shown_for_a_ple_model(connect):
    import io

    from rich.console import Console
    with FakeBoard(ple=True, out_vocab=30) as fb:
        s = connect(fb)
        hello = s.handshake(timeout=5, interval=0.3)
        res = s.generate(Generate(PROMPT, 3), frame_timeout=3)
    assert hello.out_vocab == 30 and hello.vocab_size == 40
    assert [t.us[3] for t in res.tokens] == [30 + t.step for t in res.tokens]
    assert all(t.head_rows == 30 for t in res.tokens)
    buf = io.StringIO()
    con = Console(file=buf, width=220)
    with live.LiveView(con, hello, ple=True) as v:
        for t in res.tokens:
            v.on_token(t)
    lines = [ln.split() for ln in buf.getvalue().splitlines() if ln.strip()[:1].isdigit()]
    assert "PLE µs" in buf.getvalue() and [int(ln[-8]) for ln in lines] == [30 + t.step for t in res.tokens]
    assert [int(ln[-1]) for ln in lines] == [t.head_rows for t in res.tokens]         # the head rows column
    summary.print_summary(Console(file=(b2 := io.StringIO()), width=200), res)
    assert "PLE µs" in b2.getvalue()
    assert stats.summarize(res)["decode"]["phases"]["ple"]["sum"] == sum(t.us[3] for t in res.generated_steps)


@pytest.mark.parametrize("proto", [1, 2])
def test_older_protocol_board_is_refused_with_the_fix(connect, proto):
    with FakeBoard(proto=proto) as fb:
        s = connect(fb)
        with pytest.raises(BoardError) as e:
            s.handshake(timeout=5, interval=0.3)
    msg = str(e.value)
    assert f"protocol version {proto}" in msg and f"version {P.PROTO_VERSION}" in msg and "flashlm flash" in msg
    assert "\n" not in msg


# ---------------------------------------------------------------------------------------------
# the CLI, end to end over the fake board's pty

def _model_dir(tmp_path, model_hash=bytes(range(16)), max_seq_len=24, vocab=40):
    d = tmp_path / "model"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({
        "blob": "model.flmb", "tokenizer": None, "model_hash": model_hash.hex(), "layout_id": 7,
        "config": {"max_seq_len": max_seq_len, "vocab_size": vocab}}))
    return d


def test_cli_run_over_port(tmp_path, capsys):
    d = _model_dir(tmp_path)
    with FakeBoard() as fb:
        rc = main(["run", "--port", fb.path, "--model", str(d), "--prompt-ids", "1,4,9,2", "--max-tokens", "5",
                   "--timeout", "3", "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
                   "--png", str(tmp_path / "r.png")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "tok/s" in out.out and "emulated timer" in out.out
    data = json.loads((tmp_path / "r.json").read_text())
    assert len(data["generated_ids"]) == 5
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 1 + len(PROMPT) + 5 - 1


def test_cli_run_says_whether_the_board_is_bit_exact(tmp_path, capsys):
    """Every run prints the board's golden check; --selftest runs all its steps first (SELFTEST); a
    board that is not bit-exact still generates, and the JSON report records the check."""
    d = _model_dir(tmp_path)
    with FakeBoard() as fb:
        assert main(["run", "--port", fb.path, "--model", str(d), "--prompt-ids", "1,4", "--max-tokens", "2",
                     "--timeout", "3"]) == 0
        assert 0x07 not in fb.types_received()
    assert "bit-exact with the reference: yes (2 of 4 golden steps)" in capsys.readouterr().out
    with FakeBoard(selftest_golden=(3, 4, 4, 3)) as fb:
        rc = main(["run", "--port", fb.path, "--model", str(d), "--prompt-ids", "1,4", "--max-tokens", "2",
                   "--timeout", "3", "--selftest", "--json", str(tmp_path / "r.json")])
        assert 0x07 in fb.types_received()
    out = capsys.readouterr().out
    assert rc == 0 and out.count("bit-exact with the reference: no (first step that differs: 3)") == 2
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["hello"]["golden"] == {"state": "differs", "checked_steps": 4, "total_steps": 4,
                                       "first_diff_step": 3, "bit_exact": "no (first step that differs: 3)"}
    assert data["summary"]["bit_exact"] == "no (first step that differs: 3)"
    with FakeBoard(golden=(0, 0, 0, 0xFFFF)) as fb:
        assert main(["run", "--port", fb.path, "--model", str(d), "--prompt-ids", "1,4", "--max-tokens", "1",
                     "--timeout", "3"]) == 0
    assert "bit-exact with the reference: not checked (the image has no golden check" in capsys.readouterr().out


def test_selftest_answer_is_the_hello_after_the_checks_log(connect):
    with FakeBoard(selftest_golden=(2, 4, 4, 0xFFFF)) as fb:
        s = connect(fb)
        s.handshake(timeout=5, interval=0.3)
        s._send(P.Ping())                    # a HELLO that answers a PING arrives first
        h = s.selftest(timeout=3)
    assert (h.golden, h.golden_checked, h.bit_exact) == ("exact", 4, "yes (4 of 4 golden steps)")
    assert s.hello is h and any("golden check" in t for t in s.logs)


def test_cli_run_hash_mismatch(tmp_path, capsys):
    d = _model_dir(tmp_path, model_hash=b"\x11" * 16)
    with FakeBoard() as fb:
        rc = main(["run", "--port", fb.path, "--model", str(d), "--prompt-ids", "1,2", "--timeout", "3"])
        assert 0x02 not in fb.types_received()                 # nothing generated
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("flashlm: error: ") and "11111111" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_run_refuses_a_board_with_another_output_vocabulary(tmp_path, capsys):
    d = _model_dir(tmp_path)                                  # the model predicts all 40 tokens
    with FakeBoard(out_vocab=30) as fb:
        rc = main(["run", "--port", fb.path, "--model", str(d), "--prompt-ids", "1,2", "--timeout", "3"])
        assert 0x02 not in fb.types_received()
    err = capsys.readouterr().err
    assert rc == 2 and "output 30" in err and "output 40" in err and len(err.strip().splitlines()) == 1


def test_cli_missing_port(tmp_path, capsys):
    d = _model_dir(tmp_path)
    rc = main(["run", "--port", "/dev/ttyNOPE-flashlm", "--model", str(d), "--prompt-ids", "1,2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == "flashlm: error: serial port /dev/ttyNOPE-flashlm does not exist"


def test_cli_board_prompt_too_long_for_board(tmp_path, capsys):
    d = _model_dir(tmp_path, max_seq_len=64)                  # manifest says 64, the board says 24
    with FakeBoard() as fb:
        rc = main(["run", "--port", fb.path, "--model", str(d), "--prompt-ids", ",".join(["1"] * 30),
                   "--timeout", "3"])
        assert 0x02 not in fb.types_received()
    err = capsys.readouterr().err
    assert rc == 2 and "30 tokens" in err and "24 tokens" in err


# ---------------------------------------------------------------------------------------------
# the virtual board wrapper, with a stand-in "native binary" that serves the fake board

def _fake_native(tmp_path, **board_kw):
    import stat
    import sys
    from pathlib import Path
    p = tmp_path / "fake-native"
    p.write_text(f"#!{sys.executable}\n"
                 "import signal, sys\n"
                 f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
                 "from fakeboard import FakeBoard\n"
                 f"with FakeBoard(**{board_kw!r}) as fb:\n"
                 "    print('pty', fb.path, flush=True)\n"
                 "    signal.pause()\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def test_start_native_board_and_stop(tmp_path, connect):
    from host.boards.native import start_native_board
    blob = tmp_path / "m.flmb"
    blob.write_bytes(b"FLMB")
    with start_native_board(_fake_native(tmp_path), blob, timeout=10) as vb:
        assert vb.port.startswith("/dev/") and vb.alive
        ser = open_port(vb.port)
        try:
            hello = Session(Link(ser)).handshake(timeout=5, interval=0.3)
        finally:
            ser.close()
        assert hello.board == "fakeboard"
    assert not vb.alive and vb.proc.returncode is not None
    assert vb.stop() == vb.proc.returncode                   # idempotent


def test_cli_run_native_board(tmp_path, capsys, monkeypatch):
    from host.commands import run as run_command
    d = _model_dir(tmp_path)
    (d / "model.flmb").write_bytes(b"FLMB")
    fw = _fake_native(tmp_path)
    monkeypatch.setattr(run_command, "ensure_firmware", lambda console, model, board="native": fw)
    rc = main(["run", "--board", "native", "--model", str(d), "--prompt-ids", "3,1", "--max-tokens", "4",
               "--timeout", "5", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["generated_tokens"] == 4


@pytest.mark.native
@pytest.mark.slow
def test_demo_end_to_end(tmp_path, capsys, monkeypatch):
    """convert + build (real native firmware) + run through `flashlm demo`, on a tiny random model."""
    import shutil
    if not (shutil.which("cc") and shutil.which("make")):
        pytest.skip("no C toolchain for the native board")
    pytest.importorskip("firmware.build")
    pytest.importorskip("converter.load")
    train = pytest.importorskip("converter.train")
    ti = pytest.importorskip("converter.torch_import")
    from modelzoo import random_model

    from host.commands import demo as demo_command
    tok = train.train_tokenizer(["once upon a time there was a tiny model"] * 20, 300)
    model, _ = random_model(0, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=48,
                            vocab_size=tok.get_vocab_size(), max_seq_len=32)
    mdir = tmp_path / "models" / "default"
    mdir.mkdir(parents=True)
    ti.save_checkpoint(mdir / "model.pt", model, tok.to_str())
    (mdir / "tokenizer.json").write_text(tok.to_str())
    monkeypatch.setattr(demo_command, "DEFAULT_MODEL", mdir / "model.pt")
    out = tmp_path / "out" / "demo"
    rc = main(["demo", "-o", str(out), "--max-tokens", "6", "--prompt", "once upon"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "convert" in cap.out and "build" in cap.out and "tok/s" in cap.out
    man = json.loads((out / "manifest.json").read_text())
    assert man["tokenizer"] == "tokenizer.json" and len(man["model_hash"]) == 32
    run = json.loads((out / "run.json").read_text())
    assert run["hello"]["board"] == "native" and run["summary"]["generated_tokens"] >= 1
    assert run["hello"]["model_hash"] == man["model_hash"]
    assert (out / "run.png").read_bytes()[:4] == b"\x89PNG" and (out / "run.csv").is_file()
    assert (out / "quality.json").is_file()
