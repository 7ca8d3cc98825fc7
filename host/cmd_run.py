"""``flashlm run`` (generate on a board, live per-token table, JSON/CSV/PNG) and ``flashlm serve``
(start a virtual board and leave it running); which boards are virtual."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cmd_build import ensure_native_binary
from .console import step
from .errors import UserError
from .model_dir import load_manifest
from .prompt import check_prompt_length, encode_prompt, text_prompt


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
    from dataclasses import replace

    from converter.blob import read_header
    from converter.formats import TIER_CODE, layout_id_of
    h = read_header(blob)
    st = replace(h.state_tiers, kv=kv).to_u32()
    tiers = bytes(TIER_CODE[e.tier] for e in h.entries)
    return layout_id_of(tiers, st), st, tiers


def run(console, model, prompt=None, prompt_ids=None, board=None, port=None, max_tokens=32,
        temperature=0.0, top_p=0.0, seed=0, json_path=None, csv_path=None, png_path=None,
        baud=115200, timeout=10.0, retries=3, encode_on="host", slide=False, all_logits=False, kv=None,
        batch=None, speculate=None, draft_k=None, xip_model=True, selftest=False) -> int:
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
    emulated = check_virtual_board(board) if board is not None else None

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
            step(console, "starting the native virtual board")
            from .virtual import start_native_board
            vb = stack.enter_context(start_native_board(binary, blob, timeout=timeout))
            port = vb.port
            console.print(f"  pid {vb.proc.pid} on {port}")
        elif emulated:
            image = ensure_native_binary(console, model_dir, manifest, board=board)
            blob = model_dir / manifest["blob"]
            step(console, f"starting the emulated board {board} ({emulated}, "
                          f"XIP model {'on' if xip_model else 'off'})")
            from .virtual import start_emulated_board
            vb = stack.enter_context(start_emulated_board(image, blob, board=board, timeout=timeout,
                                                          xip_model=xip_model))
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
            step(console, f"handshake on {port}")
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
            if selftest:
                step(console, "golden check: every step (SELFTEST)")
                sess.selftest(timeout=max(timeout, 60.0))
            console.print(R.bit_exact_line(sess.hello), soft_wrap=True)
            step(console, f"generating up to {max_tokens} tokens from "
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
    if result.done is not None and result.done.reason == "eos" and result.tokens:
        last = result.tokens[-1].out_id
        piece = piece_of(last) if piece_of is not None else None
        console.print(f"ended by stop id {last}" + (f" {piece!r}" if piece is not None else "")
                      + f" (the model's stop ids: {manifest.get('stop_ids', '?')}, {manifest.get('stop_source', '?')})",
                      markup=False, soft_wrap=True)
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


def check_virtual_board(board: str) -> str | None:
    """Refuse, before any work, a board flashlm cannot start here: an unknown name, a real board
    (flash it and use --port) or an emulator that is not installed. Returns its emulator or None
    (native)."""
    if board == "native":
        return None
    from converter.boards import load_board
    load_board(board)                  # unknown: a one-line error listing the known boards
    emulated = emulated_board(board)
    if not emulated:
        raise UserError(f"--board {board} is a real board: flashlm starts only the virtual ones (native, "
                        f"{', '.join(emulated_boards())}); flash it ('flashlm build --board {board}', "
                        f"'flashlm flash') and pass --port")
    from .virtual import emulator_missing
    why = emulator_missing()
    if why:
        raise UserError(f"--board {board}: {why}")
    return emulated


def cmd_run(args, console) -> int:
    if args.prompt is None and args.prompt_ids is None:
        raise UserError("give a prompt: --prompt TEXT or --prompt-ids 1,2,3")
    return run(console, args.model, prompt=args.prompt, prompt_ids=args.prompt_ids, board=args.board,
               port=args.port, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
               seed=args.seed, json_path=args.json, csv_path=args.csv, png_path=args.png, baud=args.baud,
               timeout=args.timeout, retries=max(0, args.retries), encode_on=args.encode_on, slide=args.slide,
               all_logits=args.all_logits, kv=args.kv, batch=args.batch, speculate=args.speculate,
               draft_k=args.draft_k, xip_model=args.xip_model == "on", selftest=args.selftest)


# ---------------------------------------------------------------------------------------------
# serve: start a virtual board and leave it running, for `flashlm run --port`

def cmd_serve(args, console) -> int:
    import time
    emulated = check_virtual_board(args.board)
    model_dir, manifest = load_manifest(args.model)
    image = ensure_native_binary(console, model_dir, manifest, board=args.board)
    blob = model_dir / manifest["blob"]
    from .virtual import start_emulated_board, start_native_board
    if emulated:
        vb = start_emulated_board(image, blob, board=args.board, timeout=args.timeout, counts_path=args.counts,
                                  xip_model=args.xip_model == "on")
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
