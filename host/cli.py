"""``flashlm``: convert a checkpoint, build firmware, run it on a board (or the native virtual
board) and show where each token's time goes.

Every user error prints ``flashlm: error: <one line>`` on stderr and exits 2; Ctrl-C exits 130.
Set ``FLASHLM_DEBUG=1`` to get the traceback instead.  Heavy modules (torch, matplotlib, the
converter) are imported inside the command that needs them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "default" / "model.pt"
DEFAULT_PROMPT = "Once upon a time"
MANIFEST = "manifest.json"
BLOB_NAME = "model.flmb"
BUILD_STAMP = ".flashlm-build.json"   # in a build dir: which model/firmware its binary was built from


class UserError(Exception):
    """A mistake in how flashlm was called; the message is one line for the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors, in the same one-line shape as ours
        sys.stderr.write(f"flashlm: error: {self.prog.removeprefix('flashlm').strip() + ': ' if self.prog != 'flashlm' else ''}"
                         f"{message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def _console():
    from rich.console import Console
    return Console(highlight=False)


def _step(console, text: str) -> None:
    console.print(f"[bold cyan]→[/] {text}", soft_wrap=True)


# ---------------------------------------------------------------------------------------------
# argument types

def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s} must be at least 1")
    return v


def _nonneg_int(s: str) -> int:
    try:
        v = int(s, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= v < 1 << 64:
        raise argparse.ArgumentTypeError(f"{s} must be in [0, 2^64)")
    return v


def _nonneg_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{s} must be a finite number >= 0")
    return v


def _top_p(s: str) -> float:
    v = _nonneg_float(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{s} must be in [0, 1] (0 or 1 turns top-p off)")
    return v


def _seconds(s: str) -> float:
    v = _nonneg_float(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{s} must be more than 0 seconds")
    return v


def parse_ids(text: str) -> list[int]:
    parts = [p for p in text.replace(",", " ").split()]
    if not parts:
        raise UserError("--prompt-ids is empty; give token ids like 1,2,3")
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise UserError(f"--prompt-ids: {bad!r} is not an integer token id") from None
    return ids


# ---------------------------------------------------------------------------------------------
# model directory (what `convert` writes)

def load_manifest(model_dir) -> tuple[Path, dict]:
    d = Path(model_dir)
    if d.is_file() and d.name == MANIFEST:
        d = d.parent
    if not d.exists():
        raise UserError(f"model directory {d} does not exist (create it with 'flashlm convert CHECKPOINT -o {d}')")
    if not d.is_dir():
        raise UserError(f"--model {d} is a file; pass the directory 'flashlm convert' wrote")
    mp = d / MANIFEST
    if not mp.is_file():
        raise UserError(f"no {MANIFEST} in {d} (create it with 'flashlm convert CHECKPOINT -o {d}')")
    try:
        m = json.loads(mp.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{mp} is not valid JSON: {e}") from None
    if not isinstance(m, dict):
        raise UserError(f"{mp} is not a flashlm manifest")
    cfg = m.get("config")
    missing = [k for k in ("blob", "model_hash", "config") if k not in m]
    if not missing and isinstance(cfg, dict):
        missing = [f"config.{k}" for k in ("max_seq_len", "vocab_size") if not isinstance(cfg.get(k), int)]
    if missing or not isinstance(cfg, dict):
        raise UserError(f"{mp} lacks {', '.join(missing) or 'config'}; re-run 'flashlm convert'")
    try:
        bytes.fromhex(m["model_hash"])
    except (TypeError, ValueError):
        raise UserError(f"{mp}: model_hash {m['model_hash']!r} is not hex") from None
    return d, m


def _load_model_tokenizer(model_dir: Path, manifest: dict, required: bool):
    name = manifest.get("tokenizer")
    if not name:
        if required:
            raise UserError(f"the model in {model_dir} has no tokenizer; pass --prompt-ids instead of --prompt")
        return None
    path = model_dir / name
    if not path.is_file():
        if required:
            raise UserError(f"tokenizer {path} is missing; re-run 'flashlm convert'")
        return None
    from converter.tokenizer import load_tokenizer
    if not required:
        try:
            return load_tokenizer(path)
        except Exception:
            return None
    return load_tokenizer(path)


def encode_prompt(args, model_dir: Path, manifest: dict) -> tuple[list[int], object]:
    """Token ids for --prompt / --prompt-ids, checked against the model before anything is sent."""
    cfg = manifest["config"]
    vocab, ctx = int(cfg["vocab_size"]), int(cfg["max_seq_len"])
    if args.prompt_ids is not None:
        ids = parse_ids(args.prompt_ids)
        tok = _load_model_tokenizer(model_dir, manifest, required=False)
    else:
        if args.prompt == "":
            raise UserError("the prompt is empty")
        tok = _load_model_tokenizer(model_dir, manifest, required=True)
        from converter.tokenizer import encode
        ids = list(encode(tok, args.prompt, bos=True))
        if not ids:
            raise UserError("the prompt encodes to no tokens")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the model's vocabulary of {vocab}")
    check_prompt_length(len(ids), ctx, "the model's")
    return ids, tok


def text_prompt(prompt, prompt_ids, model_dir: Path, manifest: dict) -> tuple[str, object]:
    """--prompt for the board to encode (--encode-on device): checked against what the model's
    blob says its device encoder can take before anything is sent."""
    if prompt_ids is not None:
        raise UserError("--encode-on device encodes a --prompt text; --prompt-ids are ids already")
    if prompt == "":
        raise UserError("the prompt is empty")
    from converter.tokenizer_enc import section_info
    info = section_info(model_dir / manifest["blob"])
    if info is None:
        why = manifest.get("device_tokenizer") or "its blob has no tokenizer.enc section"
        raise UserError(f"the model in {model_dir} cannot be encoded on the board ({why}); "
                        f"use --encode-on host")
    ctx, n = int(manifest["config"]["max_seq_len"]), len(prompt.encode("utf-8"))
    if n > info.text_capacity(ctx):
        raise UserError(f"prompt is {n} bytes: more than the model's context of {ctx} tokens holds "
                        f"(a token covers at most {info.span} bytes); shorten the prompt")
    return prompt, _load_model_tokenizer(model_dir, manifest, required=False)


def check_prompt_length(n: int, ctx: int, whose: str) -> None:
    if n > ctx:
        raise UserError(f"prompt is {n} tokens but {whose} context is {ctx} tokens; shorten the prompt")


# ---------------------------------------------------------------------------------------------
# convert

def _write_tokenizer(ir, tokenizer_arg, outdir: Path) -> str | None:
    if tokenizer_arg:
        src = Path(tokenizer_arg)
        with src.open("rb") as f:
            is_json = src.suffix.lower() == ".json" or f.read(64).lstrip().startswith(b"{")
        name = "tokenizer.json" if is_json else "tokenizer.bin"
        if src.resolve() != (outdir / name).resolve():
            shutil.copyfile(src, outdir / name)
        return name
    tok = ir.tokenizer
    if tok is None:
        return None
    from converter.tokenizer import tokenizer_bin_bytes

    from .report import atomic_write_bytes
    if tok.hf_json:
        atomic_write_bytes(outdir / "tokenizer.json", tok.hf_json.encode("utf-8"))
        return "tokenizer.json"
    atomic_write_bytes(outdir / "tokenizer.bin", tokenizer_bin_bytes(tok))   # llama2.c format
    return "tokenizer.bin"


def _print_quality(console, rep: dict) -> None:
    from rich.table import Table
    t = Table(title="quantization quality (weights vs fp32)", title_justify="left")
    for col, just in (("tensor", "left"), ("format", "left"), ("group", "right"),
                      ("rel RMSE", "right"), ("max |err|", "right")):
        t.add_column(col, justify=just)
    for r in rep.get("tensors", []):
        t.add_row(r["name"], r["format"], str(r["group_size"]), f"{r['rel_rmse']:.4f}", f"{r['max_abs_err']:.4g}")
    console.print(t)
    if "top1_agreement" in rep:
        console.print(f"logits over {rep.get('positions', '?')} positions: top-1 agreement "
                      f"[bold]{rep['top1_agreement'] * 100:.1f}%[/], mean KL(fp32 || quantized) "
                      f"[bold]{rep.get('kl_mean', float('nan')):.5f}[/] nats")


DEFAULT_BATCH = 4   # tokens per forward pass convert records: prefill chunks, speculative verification


def convert(console, checkpoint, outdir, tokenizer=None, fmt="q8", group_size=32, quant=(),
            report=True, scales="f32", kv="f32", batch=DEFAULT_BATCH, draft=None) -> dict:
    """Checkpoint -> OUTDIR/{model.flmb, tokenizer.*, manifest.json, quality.json}; returns the manifest."""
    from dataclasses import asdict

    ckpt = Path(checkpoint)
    if not ckpt.exists():
        raise UserError(f"checkpoint {ckpt} does not exist")
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise UserError(f"tokenizer {tokenizer} does not exist")
    from converter import quantize as Q
    overrides = Q.parse_overrides(list(quant or ()))          # fail fast, before the slow part
    Q.check_group_size(group_size)
    from converter.blob import write_blob
    from converter.load import load_model

    from .report import atomic_write_bytes

    outdir = Path(outdir)
    _step(console, f"loading {ckpt}")
    with console.status(f"loading {ckpt.name}"):
        ir = load_model(str(ckpt), tokenizer_path=str(tokenizer) if tokenizer else None)
    c = ir.config
    split = c.param_split()
    console.print(f"  dim {c.dim}, {c.n_layers} layers, {c.n_heads}/{c.n_kv_heads} heads, hidden {c.hidden_dim}, "
                  f"vocab {c.vocab_size}" + (f" (predicts {c.n_out})" if c.n_out != c.vocab_size else "")
                  + (f", PLE dim {c.ple_dim}" if c.ple_dim else "") + f", context {c.max_seq_len}, "
                  f"{c.n_params():,} parameters" + (f" ({split['table']:,} in the PLE table)" if split["table"] else ""))
    _step(console, f"quantizing to {fmt} (group {group_size}, {scales} scales)"
          + (f" with {len(overrides)} override(s)" if overrides else ""))
    with console.status("quantizing"):
        qm = Q.quantize(ir, default_format=fmt, group_size=group_size, overrides=overrides, scales=scales)
    rep = None
    if report:
        _step(console, "measuring quality (quantized vs fp32 logits)")
        with console.status("running both models"):
            rep = Q.quality_report(ir, qm)
        _print_quality(console, rep)
    if draft is not None:
        qm = attach_draft(console, qm, draft, fmt, group_size, scales)
    outdir.mkdir(parents=True, exist_ok=True)
    _step(console, f"writing {outdir / BLOB_NAME}")
    info = write_blob(qm, outdir / BLOB_NAME, kv=kv, batch=batch)
    tok_name = _write_tokenizer(ir, tokenizer, outdir)
    if tok_name is None:
        console.print("  [yellow]no tokenizer: runs of this model need --prompt-ids[/]")
    from converter.tokenizer_enc import device_section
    enc, enc_about = device_section(qm.tokenizer, c)     # the same call build_blob made
    console.print(f"  device tokenizer (text prompts encoded on the board): "
                  f"{enc_about if enc is not None else 'none, ' + enc_about}", markup=False, soft_wrap=True)
    cfg = asdict(c)
    t = qm.tokenizer
    cfg["bos_id"] = t.bos_id if t is not None else None
    cfg["eos_id"] = t.eos_id if t is not None else None
    manifest = {
        "format": "flashlm-model", "version": 1,
        "blob": BLOB_NAME, "blob_size": info.size, "blob_crc": info.crc,
        "tokenizer": tok_name,
        "model_hash": bytes(info.model_hash).hex(), "layout_id": info.layout_id,
        "config": cfg,
        "recipe": dict(qm.recipe),
        "quantization": {"default_format": fmt, "group_size": group_size, "overrides": list(quant or ()),
                         "scales": scales},
        "kv": kv,
        "batch": batch,
        "draft": None if qm.draft is None else {"source": str(qm.draft.qm.source), "kv": qm.draft.kv,
                                                "config": asdict(qm.draft.qm.config)},
        "source": str(qm.source or ir.source or ckpt),
        "quality": "quality.json" if rep is not None else None,
        "device_tokenizer": enc_about,
    }
    if rep is not None:
        atomic_write_bytes(outdir / "quality.json", (json.dumps(rep, indent=1) + "\n").encode())
    atomic_write_bytes(outdir / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    console.print(f"  {info.size:,} bytes, model {manifest['model_hash'][:16]}, layout {info.layout_id}")
    console.print(f"[green]wrote[/] {outdir}/ ({BLOB_NAME}, {tok_name or 'no tokenizer'}, {MANIFEST}"
                  + (", quality.json)" if rep is not None else ")"))
    return manifest


def cmd_convert(args, console) -> int:
    convert(console, args.checkpoint, args.output, tokenizer=args.tokenizer, fmt=args.format,
            group_size=args.group_size, quant=args.quant, scales=args.scales, report=not args.no_report,
            kv=args.kv, batch=args.batch, draft=args.draft)
    return 0


def attach_draft(console, qm, draft, fmt, group_size, scales):
    """qm carrying the draft model at ``draft`` (a checkpoint, or a `flashlm train` folder),
    quantized like qm: what `flashlm run --speculate draft` proposes tokens with."""
    from converter.draft import attach
    from converter.load import load_model
    from converter.quantize import quantize
    path = Path(draft)
    if path.is_dir():
        path = path / "model.pt"
    if not path.exists():
        raise UserError(f"draft model {draft} does not exist (a checkpoint, or a flashlm train folder)")
    _step(console, f"adding the draft model {path}")
    d = quantize(load_model(str(path)), default_format=fmt, group_size=group_size, scales=scales)
    out = attach(qm, d)
    c = out.draft.qm.config
    console.print(f"  draft: dim {c.dim}, {c.n_layers} layers, {c.n_params():,} parameters, KV cache {out.draft.kv}")
    return out


# ---------------------------------------------------------------------------------------------
# build

def _firmware_digest() -> str:
    import firmware
    fw = Path(firmware.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(fw.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".c", ".h", ".j2", ".py", ".ld", ".txt"):
            st = p.stat()
            h.update(f"{p.relative_to(fw)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _build_key(board: str, manifest: dict) -> str:
    """What a recorded build must match to be reused: board, model, layout and firmware sources."""
    return hashlib.sha256(f"{board}|{manifest['model_hash']}|{manifest.get('layout_id')}|{_firmware_digest()}"
                          .encode()).hexdigest()


def _write_build_stamp(out: Path, key: str, binary) -> None:
    from .report import atomic_write_bytes
    atomic_write_bytes(out / BUILD_STAMP, json.dumps({"key": key, "binary": str(Path(binary).resolve())}).encode())


def _build(console, board: str, out_dir: Path, blob: Path):
    from firmware.build import build_firmware
    with console.status(f"building firmware for {board}"):
        return build_firmware(board, out_dir, blob)


def _build_dir_for(model_dir: Path, board: str) -> Path:
    base = model_dir.resolve().parent / "build"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base / board
    except OSError:
        pass
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashlm" / "build"
    return cache / board


def ensure_native_binary(console, model_dir: Path, manifest: dict, board: str = "native") -> Path:
    """Build the native firmware for this model unless an up-to-date build is recorded."""
    out = _build_dir_for(model_dir, board)
    key = _build_key(board, manifest)
    try:
        rec = json.loads((out / BUILD_STAMP).read_text())
        if rec.get("key") == key and Path(rec["binary"]).is_file():
            console.print(f"  firmware up to date: {rec['binary']}")
            return Path(rec["binary"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    _step(console, f"building {board} firmware into {out}")
    out.mkdir(parents=True, exist_ok=True)
    res = _build(console, board, out, model_dir / manifest["blob"])
    if res.binary is None:
        raise UserError(f"board {board} has no host-runnable binary; flash {res.project_dir} and use --port")
    _write_build_stamp(out, key, res.binary)
    if res.size_text:
        console.print(res.size_text, markup=False)
    return Path(res.binary)


def cmd_build(args, console) -> int:
    if not args.model:
        raise UserError("building firmware needs the model it is sized for: pass --model OUTDIR")
    model_dir, manifest = load_manifest(args.model)
    out = Path(args.output) if args.output else _build_dir_for(model_dir, args.board)
    out.mkdir(parents=True, exist_ok=True)
    _step(console, f"building firmware for {args.board} into {out}")
    res = _build(console, args.board, out, model_dir / manifest["blob"])
    if res.size_text:
        console.print(res.size_text, markup=False, soft_wrap=True)
    if res.binary is not None:
        console.print(f"[green]binary[/] {res.binary}")
        if not args.output:
            _write_build_stamp(out, _build_key(args.board, manifest), res.binary)
    elif (res.project_dir / "platformio.ini").is_file():
        console.print(f"[green]project[/] {res.project_dir} (PlatformIO; build and flash it with "
                      f"'flashlm flash {res.project_dir}')", soft_wrap=True)
    else:
        console.print(f"[green]project[/] {res.project_dir} (build and flash it with the board's toolchain)")
    return 0


# ---------------------------------------------------------------------------------------------
# flash

def cmd_flash(args, console) -> int:
    from .flash import flash
    return flash(args.project, port=args.port, dry_run=args.dry_run,
                 echo=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))


# ---------------------------------------------------------------------------------------------
# run

def _write_outputs(console, result, json_path=None, csv_path=None, png_path=None) -> None:
    from . import report as R
    for path, fn, what in ((json_path, R.write_json, "JSON"), (csv_path, R.write_csv, "CSV"),
                           (png_path, R.plot_png, "plot")):
        if path:
            fn(result, path)
            console.print(f"[green]wrote[/] {what} {path}")


def kv_layout(blob: Path, kv: str) -> tuple[int, int, bytes]:
    """(layout_id, state_tiers, tiers) of the blob's own placement with the KV cache format kv: the
    LAYOUT that switches a board holding this blob to it."""
    from converter.blob import TIER_CODE, layout_id_of, read_header, with_kv
    h = read_header(blob)
    st = with_kv(h.state_tiers, kv)
    tiers = bytes(TIER_CODE[e.tier] for e in h.entries)
    return layout_id_of(tiers, st), st, tiers


def run(console, model, prompt=None, prompt_ids=None, board=None, port=None, max_tokens=32,
        temperature=0.0, top_p=0.0, seed=0, json_path=None, csv_path=None, png_path=None,
        baud=115200, timeout=10.0, retries=3, encode_on="host", slide=False, all_logits=False, kv=None,
        batch=None, speculate=None, draft_k=None) -> int:
    from contextlib import ExitStack

    from . import report as R
    from .protocol import Link
    from .session import BoardError, Session, open_port

    model_dir, manifest = load_manifest(model)
    on_device = encode_on == "device"
    if on_device:    # ids: the text itself; the board encodes it and shows the ids in its TOKEN frames
        ids, tok = text_prompt(prompt, prompt_ids, model_dir, manifest)
    else:
        ids, tok = encode_prompt(argparse.Namespace(prompt=prompt, prompt_ids=prompt_ids), model_dir, manifest)
    emulated = emulated_board(board)
    if board is not None and board != "native" and not emulated:
        raise UserError(f"--board {board}: flashlm can only start the virtual boards (native, "
                        f"{', '.join(emulated_boards())}); flash a real board with 'flashlm build --board {board}' "
                        f"and pass --port")

    prompt_text, piece_of = "", None
    if tok is not None:
        pieces = tok.pieces
        piece_of = lambda i: pieces[i] if 0 <= i < len(pieces) else None  # noqa: E731
        from converter.tokenizer import decode
        try:
            prompt_text = ids if on_device else bytes(decode(tok, ids)).decode("utf-8", "replace")
        except Exception:   # the echoed prompt is a display nicety; it must never stop a run
            prompt_text = ""

    vb = None
    with ExitStack() as stack:
        if board == "native":
            binary = ensure_native_binary(console, model_dir, manifest)
            blob = model_dir / manifest["blob"]
            _step(console, "starting the native virtual board")
            from .virtual import start_native_board
            vb = stack.enter_context(start_native_board(binary, blob, timeout=timeout))
            port = vb.port
            console.print(f"  pid {vb.proc.pid} on {port}")
        elif emulated:
            image = ensure_native_binary(console, model_dir, manifest, board=board)
            blob = model_dir / manifest["blob"]
            _step(console, f"starting the emulated board {board} ({emulated})")
            from .virtual import start_emulated_board
            vb = stack.enter_context(start_emulated_board(image, blob, board=board, timeout=timeout))
            port = vb.port
            console.print(f"  pid {vb.proc.pid}, UART0 on {port}")
        ser = open_port(port, baud)
        stack.callback(ser.close)
        sess = Session(Link(ser), name=port, frame_timeout=timeout)
        live = {"ser": ser, "vb": vb, "port": port}

        def reconnect():
            """A new link after the old one failed: our own native board is started again if it died;
            a serial port that vanished (a USB board resetting) is waited for."""
            import os
            import time
            try:
                live["ser"].close()
            except Exception:
                pass
            v = live["vb"]
            if board == "native" and v is not None and not v.alive:
                console.print(f"  the native board is gone ({v.describe_exit()}); starting it again", markup=False)
                from .virtual import start_native_board as start
                v = live["vb"] = stack.enter_context(start(binary, blob, timeout=timeout))
                live["port"] = v.port
            end = time.monotonic() + timeout
            while not os.path.exists(live["port"]):
                if time.monotonic() > end:
                    raise BoardError(f"serial port {live['port']} did not come back within {timeout:g} s")
                time.sleep(0.1)
            s = live["ser"] = open_port(live["port"], baud)
            stack.callback(s.close)
            console.print(f"  reconnected on {live['port']}")
            return Link(s)
        try:
            _step(console, f"handshake on {port}")
            hello = sess.handshake(timeout=timeout)
            console.print(f"  board [bold]{hello.board}[/] fw {hello.fw_version}, clock: [bold]{R.clock_name(hello.clock)}[/], "
                          f"model {bytes(hello.model_hash).hex()[:16]}, layout {hello.layout_id}, context {hello.max_seq_len}",
                          soft_wrap=True)
            sess.check_model(hello, manifest["model_hash"])
            if on_device and not hello.can_encode:
                raise UserError(f"board {hello.board} cannot encode text prompts (its HELLO says so: older "
                                f"firmware, or an image without a device tokenizer); use --encode-on host")
            if not on_device:
                check_prompt_length(len(ids), int(hello.max_seq_len), f"board {hello.board}'s")
            from .passes import check as check_passes
            why = check_passes(hello, batch, speculate, draft_k, temperature)
            if why:
                raise UserError(why)
            cfg = manifest["config"]
            want = (int(cfg["vocab_size"]), int(cfg.get("out_vocab") or cfg["vocab_size"]))
            if (int(hello.vocab_size), int(hello.out_vocab)) != want:
                raise UserError(f"board {hello.board} reports vocab {hello.vocab_size} (output {hello.out_vocab}), "
                                f"the model has {want[0]} (output {want[1]})")
            after_handshake = None
            if kv is not None:     # the model's own placement with this KV format, kept across resets
                lid, st, tiers = kv_layout(model_dir / manifest["blob"], kv)

                def after_handshake(h):
                    if h.layout_id != lid:
                        sess.set_layout(lid, st, tiers, timeout=timeout)
                after_handshake(hello)
                console.print(f"  KV cache {kv}: layout {lid}")
            _step(console, f"generating up to {max_tokens} tokens from "
                           + ("a text prompt the board encodes" if on_device else f"a {len(ids)}-token prompt")
                           + (", sliding the window when the context fills" if slide else "")
                           + (", every step's whole head (ALL_LOGITS)" if all_logits else "")
                           + (f", speculating ({speculate})" if speculate else ""))
            if emulated:
                vb.read_counts()      # the emulator's per-step read counts: only this generation's
            with R.LiveView(console, hello, piece_of=piece_of, prompt_text=prompt_text,
                            ple=bool(manifest["config"].get("ple_dim")), draft=bool(speculate)) as view:
                result = sess.generate_with_recovery(ids, max_tokens, temperature=temperature, top_p=top_p,
                                                     seed=seed, on_token=view.on_token, reconnect=reconnect,
                                                     max_recoveries=retries, handshake_timeout=timeout,
                                                     slide=slide, all_logits=all_logits,
                                                     after_handshake=after_handshake, batch=batch or 0,
                                                     speculate=speculate or "none", draft_k=draft_k or 0)
            if emulated:
                result.harness = vb.read_counts()
        except BoardError as e:    # DeviceError, LinkTimeout, LinkLost, BoardReset, ModelMismatch, ...
            partial = getattr(e, "partial", None)
            if partial is not None and partial.tokens:
                _write_outputs(console, partial, json_path, csv_path, png_path)
            v = live["vb"]
            if v is not None and not v.alive:
                raise BoardError(f"{e}; {v.describe_exit()}") from None
            raise

    R.print_summary(console, result)
    for ev in result.recoveries:
        console.print(f"[yellow]recovered[/] after {ev['after']} ({ev['reason']}): {ev['action']}",
                      soft_wrap=True, highlight=False)
    if result.resent_steps:
        console.print(f"{len(result.resent_steps)} lost step(s) re-sent by the board "
                      f"({result.resend_requests} RESEND request(s))", highlight=False)
    _write_outputs(console, result, json_path, csv_path, png_path)
    if result.missing_steps:
        shown = ", ".join(map(str, result.missing_steps[:20]))
        print(f"flashlm: warning: {len(result.missing_steps)} step(s) lost on the link: {shown}", file=sys.stderr)
    return 130 if result.interrupted else 0


def emulated_board(board: str | None) -> str | None:
    """The emulator a board profile runs in (its ``emulator`` key, e.g. "rp2040js"), else None."""
    if not board or board == "native":
        return None
    from converter.boards import load_board
    from converter.ir import ModelError
    try:
        return load_board(board).get("emulator")
    except ModelError:
        return None


def emulated_boards() -> list[str]:
    from converter.boards import board_names
    return [b for b in board_names() if emulated_board(b)]


def cmd_run(args, console) -> int:
    if args.prompt is None and args.prompt_ids is None:
        raise UserError("give a prompt: --prompt TEXT or --prompt-ids 1,2,3")
    return run(console, args.model, prompt=args.prompt, prompt_ids=args.prompt_ids, board=args.board,
               port=args.port, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
               seed=args.seed, json_path=args.json, csv_path=args.csv, png_path=args.png, baud=args.baud,
               timeout=args.timeout, retries=max(0, args.retries), encode_on=args.encode_on, slide=args.slide,
               all_logits=args.all_logits, kv=args.kv, batch=args.batch, speculate=args.speculate,
               draft_k=args.draft_k)


# ---------------------------------------------------------------------------------------------
# serve: start a virtual board and leave it running, for `flashlm run --port`

def cmd_serve(args, console) -> int:
    import time
    emulated = emulated_board(args.board)
    if args.board != "native" and not emulated:
        raise UserError(f"--board {args.board} is not a virtual board (native, {', '.join(emulated_boards())})")
    model_dir, manifest = load_manifest(args.model)
    image = ensure_native_binary(console, model_dir, manifest, board=args.board)
    blob = model_dir / manifest["blob"]
    from .virtual import start_emulated_board, start_native_board
    if emulated:
        vb = start_emulated_board(image, blob, board=args.board, timeout=args.timeout, counts_path=args.counts)
    else:
        vb = start_native_board(image, blob, timeout=args.timeout)
    with vb:
        console.print(f"[bold]{args.board}[/] serving on [bold]{vb.port}[/] (pid {vb.proc.pid}); "
                      f"'flashlm run --port {vb.port} --model {model_dir} ...' talks to it; Ctrl-C stops it",
                      soft_wrap=True)
        if emulated:
            console.print(f"  per-step read counts from the emulator harness: {vb.counts_path}", soft_wrap=True)
        try:
            while vb.alive:
                time.sleep(0.5)
        except KeyboardInterrupt:
            return 0
        raise UserError(vb.describe_exit() or "the board stopped")


def cmd_faultproxy(args, console) -> int:
    from .faultproxy import serve
    return serve(args)


# ---------------------------------------------------------------------------------------------
# demo

def cmd_demo(args, console) -> int:
    if args.board != "native" and not emulated_board(args.board):
        raise UserError(f"the demo runs on a virtual board (native, {', '.join(emulated_boards())}); "
                        f"for {args.board}, use build + run --port")
    model = DEFAULT_MODEL
    if not model.is_file():
        raise UserError(f"the default model {model} is not there (make it with "
                        f"'flashlm train --out {model.parent}')")
    tok = model.parent / "tokenizer.json"
    out = Path(args.output)
    console.rule("[bold]flashlm demo[/]: 1/3 convert")
    console.print(f"converting {model} (q8, group 32) into {out}/")
    convert(console, model, out, tokenizer=tok if tok.is_file() else None, fmt="q8", group_size=32)
    console.rule("[bold]flashlm demo[/]: 2/3 build")
    _, manifest = load_manifest(out)
    ensure_native_binary(console, out, manifest, board=args.board)
    console.rule("[bold]flashlm demo[/]: 3/3 run")
    console.print(f"prompt {args.prompt!r}, up to {args.max_tokens} tokens, greedy, on {args.board}")
    rc = run(console, out, prompt=args.prompt, board=args.board, max_tokens=args.max_tokens,
             json_path=out / "run.json", csv_path=out / "run.csv", png_path=out / "run.png",
             timeout=args.timeout)
    if rc == 0:
        console.print(f"[green]demo done[/]: {out}/run.json, run.csv, run.png")
    return rc


# ---------------------------------------------------------------------------------------------
# eval

def cmd_eval(args, console) -> int:
    from converter.evaluate import evaluate
    from rich.table import Table

    from .report import atomic_write_bytes
    rep = evaluate(args.model, targets=args.targets or None, group_size=args.group_size, text=args.text,
                   progress=lambda what: _step(console, f"scoring {what}"))
    split = rep["param_split"]
    console.print(f"{rep['checkpoint']}: {rep['n_params']:,} parameters"
                  + (f" (PLE table {split['table']:,}, core {split['core']:,})" if split["table"] else ""),
                  soft_wrap=True)
    t = Table(title=f"held-out {rep['eval_text']}: the first {rep['targets_window']:,} of {rep['targets_available']:,} "
                    f"targets ({rep['chars']:,} characters)"
                    + (f", {rep['skipped_unpredictable']:,} targets the head cannot predict skipped"
                       if rep["skipped_unpredictable"] else ""), title_justify="left")
    for col, just in (("model", "left"), ("recipe", "left"), ("loss (nats)", "right"), ("perplexity", "right"),
                      ("bits/char", "right"), ("top-1 = fp32", "right")):
        t.add_column(col, justify=just)
    for r in rep["rows"]:
        agree = "-" if r["top1_agreement"] is None else f"{r['top1_agreement'] * 100:.2f}%"
        t.add_row(r["model"], r["recipe"], f"{r['loss']:.4f}", f"{r['ppl']:.2f}", f"{r['bits_per_char']:.4f}",
                  agree)
    console.print(t)
    console.print("fp32: the PyTorch model; int8/int4: the NumPy reference (what the device computes)")
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps(rep, indent=1) + "\n").encode())
    return 0


# ---------------------------------------------------------------------------------------------
# train (delegated)

def cmd_train(args, console, extra) -> int:
    from converter import train
    p = _Parser(prog="flashlm train", description="Train a small model (converter.train).")
    train.add_arguments(p)
    return train.main_train(p.parse_args(extra))


# ---------------------------------------------------------------------------------------------
# parser and entry point

def add_generation_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """What one generation on a board takes: prompt, sampling, and the serial link's settings."""
    pr = p.add_mutually_exclusive_group()
    pr.add_argument("--prompt", metavar="TEXT")
    pr.add_argument("--prompt-ids", metavar="1,2,3")
    p.add_argument("--max-tokens", type=_positive_int, default=max_tokens, metavar="N")
    p.add_argument("--temperature", type=_nonneg_float, default=0.0, metavar="T")
    p.add_argument("--top-p", type=_top_p, default=0.0, metavar="P")
    p.add_argument("--seed", type=_nonneg_int, default=0, metavar="S")
    p.add_argument("--baud", type=_positive_int, default=115200, metavar="B")
    p.add_argument("--timeout", type=_seconds, default=10.0, metavar="S",
                   help="seconds to wait for the board and for each frame (default 10)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="flashlm", description="Small transformer LMs on microcontrollers, with per-token timing.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("convert", help="checkpoint -> quantized flash image + manifest")
    c.add_argument("checkpoint", metavar="CHECKPOINT")
    c.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or llama2.c tokenizer.bin")
    c.add_argument("-o", "--output", metavar="OUTDIR", default="out/model")
    c.add_argument("--format", choices=("q8", "q4"), default="q8")
    c.add_argument("--group-size", type=_positive_int, default=32, metavar="N")
    c.add_argument("--quant", action="append", default=[], metavar="PATTERN=FMT[:G]",
                   help="per-tensor override, e.g. 'layers.*.ffn=q4:32', 'head=q4' (repeatable)")
    c.add_argument("--scales", choices=("f32", "f16"), default="f32",
                   help="group scales as f32, or rounded to fp16 (half the scale bytes)")
    c.add_argument("--kv", choices=("f32", "int8"), default="f32",
                   help="KV cache format recorded in the blob (int8: a scale and int8 codes per row)")
    c.add_argument("--batch", type=_positive_int, default=DEFAULT_BATCH, metavar="T",
                   help=f"the most tokens one forward pass runs, recorded in the blob: prefill in chunks of T, "
                        f"speculative drafts up to T-1; scratch RAM grows with T (default {DEFAULT_BATCH})")
    c.add_argument("--draft", metavar="DIR",
                   help="a small model of the same tokenizer (checkpoint or flashlm train folder) to carry in the "
                        "image for speculative decoding (flashlm run --speculate draft)")
    c.add_argument("--no-report", action="store_true", help="skip the quality report")
    c.set_defaults(func=cmd_convert)

    b = sub.add_parser("build", help="render and build the firmware for a board")
    b.add_argument("--board", default="native")
    b.add_argument("--model", metavar="OUTDIR", help="model directory the firmware is sized for")
    b.add_argument("-o", "--output", metavar="BUILDDIR")
    b.set_defaults(func=cmd_build)

    r = sub.add_parser("run", help="generate on a board and show per-token timing")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--board", help="start a virtual board (native, or rp2040-emu: the emulated RP2040)")
    where.add_argument("--port", metavar="PATH", help="serial port of a flashed board")
    r.add_argument("--model", metavar="OUTDIR", required=True)
    add_generation_args(r, max_tokens=32)
    r.add_argument("--json", metavar="FILE")
    r.add_argument("--csv", metavar="FILE")
    r.add_argument("--png", metavar="FILE")
    r.add_argument("--encode-on", choices=("host", "device"), default="host",
                   help="who turns --prompt into token ids: the host (default) or the board (its image's "
                        "device tokenizer; the same ids)")
    r.add_argument("--retries", type=int, default=3, metavar="N",
                   help="times to reconnect or regenerate after a lost link, a board reset or lost steps (default 3)")
    r.add_argument("--slide", action="store_true",
                   help="when the context fills, keep position 0, drop the older half and go on (no context_full)")
    r.add_argument("--all-logits", action="store_true",
                   help="verification mode: every step computes the whole output layer (no prefill skip, no pruning)")
    r.add_argument("--kv", choices=("f32", "int8"),
                   help="switch the board's KV cache format first (a LAYOUT; default: the blob's)")
    from .passes import add_arguments as add_pass_arguments
    add_pass_arguments(r)
    r.set_defaults(func=cmd_run)

    f = sub.add_parser("flash", help="build and upload a PlatformIO project from 'build', then write the blob")
    f.add_argument("project", metavar="PROJECT", help="the directory 'flashlm build --board B' rendered")
    f.add_argument("--port", metavar="P", help="serial port (default: found by the board's USB VID/PID)")
    f.add_argument("--dry-run", action="store_true", help="print every command, run none")
    f.set_defaults(func=cmd_flash)

    from .plan import add_commands as add_plan_commands   # plan, compare
    add_plan_commands(sub, _positive_int, _nonneg_int, add_generation_args)

    sv = sub.add_parser("serve", help="start a virtual board (native, rp2040-emu) and print its port")
    sv.add_argument("--board", default="rp2040-emu")
    sv.add_argument("--model", metavar="OUTDIR", required=True)
    sv.add_argument("--counts", metavar="FILE", help="rp2040-emu: write the harness's per-step read counts here")
    sv.add_argument("--timeout", type=_seconds, default=10.0, metavar="S")
    sv.set_defaults(func=cmd_serve)

    fx = sub.add_parser("faultproxy", help="serve a pty between the host and a board that damages the bytes "
                                           "(drop, dup, flip, insert, boot noise, line close): for testing")
    from .faultproxy import add_arguments as add_fault_arguments
    add_fault_arguments(fx)
    fx.set_defaults(func=cmd_faultproxy)

    d = sub.add_parser("demo", help="convert the shipped model, build, run, write out/demo/run.*")
    d.add_argument("--board", default="native")
    d.add_argument("--prompt", default=DEFAULT_PROMPT)
    d.add_argument("--max-tokens", type=_positive_int, default=48, metavar="N")
    d.add_argument("-o", "--output", default="out/demo", metavar="OUTDIR")
    d.add_argument("--timeout", type=_seconds, default=10.0, metavar="S")
    d.set_defaults(func=cmd_demo)

    e = sub.add_parser("eval", help="eval loss, perplexity and top-1 agreement of fp32, int8 and int4 on held-out text")
    e.add_argument("model", metavar="MODEL", help="a 'flashlm train' folder (model.pt, eval.txt) or a checkpoint")
    e.add_argument("--targets", type=_nonneg_int, default=4096, metavar="N",
                   help="score the first N predictions (default %(default)s; 0: all; the reference runs "
                        "~10-30 ms a token)")
    e.add_argument("--text", metavar="FILE", help="held-out text (default: eval.txt beside the checkpoint)")
    e.add_argument("--group-size", type=_positive_int, default=32, metavar="N",
                   help="quantization group size (default %(default)s, as convert)")
    e.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    e.set_defaults(func=cmd_eval)

    t = sub.add_parser("train", help="train a small model (options: flashlm train --help)", add_help=False)
    t.set_defaults(func=None, train=True)
    return p


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and not type(e).__module__.startswith("serial"):
        if e.filename is not None:
            why = e.strerror or str(e)
            if isinstance(e, FileNotFoundError):
                why = "no such file or directory"
            return f"{e.filename}: {why}"
        text = e.strerror or str(e)
    else:
        text = str(e)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _is_user_error(e: Exception) -> bool:
    """A mistake in the call, the files or the board (one line, exit 2), not a bug (traceback).

    Only called while an exception is being handled, so ``--help`` and a working run import none
    of these modules.  converter.train imports torch; its errors can only come from
    ``flashlm train``, which has imported it already, so it is looked at last and a failing
    ``run`` never loads torch."""
    from converter.corpus import CorpusError
    from converter.ir import ModelError
    from firmware.build import BuildError

    from .protocol import ProtocolError
    from .flash import FlashError
    from .virtual import BoardError
    if isinstance(e, (UserError, OSError, ModelError, BoardError, ProtocolError, BuildError, CorpusError,
                      FlashError)):
        return True
    from converter.train import TrainError
    return isinstance(e, TrainError)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if getattr(args, "train", False):
            pass
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        elif args.command is None:
            parser.error("choose a command: convert, build, flash, run, serve, plan, compare, demo, eval, train")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    debug = bool(os.environ.get("FLASHLM_DEBUG"))
    console = _console()
    try:
        try:
            if getattr(args, "train", False):
                return cmd_train(args, console, extra)
            return int(args.func(args, console) or 0)
        except SystemExit as e:     # the train parser's own argparse errors / --help
            return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("flashlm: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug or not _is_user_error(e):
            raise
        print(f"flashlm: error: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
