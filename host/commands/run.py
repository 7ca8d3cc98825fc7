"""``flashlm run``: generate on a board -- a virtual board flashlm starts (native, or an emulated
one) or a flashed board on a serial port -- with each step's timing shown live, then the summary
and the files ``Outputs`` names. ``run`` takes the request (``Generate``, built once by the
command line) and typed options: it doubles as the scripting API."""
from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from converter.boards import load_board, stream_stride
from converter.formats import TIER_CODE, layout_id_of
from converter.tokenizer import decode

from ..boards.builds import ensure_firmware
from ..boards.emulated import unloaded_padding
from ..boards.native import start_native_board
from ..boards.virtual import check_virtual_board, describe_start, start_virtual_board
from ..errors import BoardError, UserError
from ..interrupts import interrupts
from ..link.messages import Generate, clock_name
from ..link.port import Link, open_port
from ..model_dir import ModelDir
from ..output.console import step
from ..output.export import Outputs
from ..output.live import LiveView
from ..output.summary import bit_exact_line, print_summary
from ..session.checks import refusal
from ..session.recovery import Policy
from ..session.session import Session
from .prompt import check_prompt_length


@dataclass(frozen=True)
class Target:
    """Where the board is: a virtual board flashlm starts (``board``: native or an emulated one) or
    a flashed board's serial ``port``, at ``baud``; ``xip_model``: the emulated RP2040 times flash
    reads through its XIP cache model (off: as SRAM reads)."""
    board: str | None = None
    port: str | None = None
    baud: int = 115200
    xip_model: bool = True


def kv_layout(blob: Path, kv: str) -> tuple[int, int, bytes]:
    """(layout_id, state_tiers, tiers) of the blob's own placement with the KV cache format kv: the
    LAYOUT that switches a board holding this blob to it."""
    # the blob module loads the golden check's reference forward pass: only a run with --kv needs it
    from converter.blob import read_header
    h = read_header(blob)
    st = replace(h.state_tiers, kv=kv).to_u32()
    tiers = bytes(TIER_CODE[e.tier] for e in h.entries)
    return layout_id_of(tiers, st), st, tiers


def _check_board(hello, model: ModelDir, request: Generate) -> None:
    """Refuse a board that cannot run this request on this model (before anything is generated)."""
    if request.is_text and not hello.can_encode:
        raise UserError(f"board {hello.board} cannot encode text prompts (its HELLO says so: older "
                        f"firmware, or an image without a device tokenizer); use --encode-on host")
    if not request.is_text:
        check_prompt_length(len(request.prompt), int(hello.max_seq_len), f"board {hello.board}'s")
    why = refusal(hello, request)
    if why:
        raise UserError(why)
    want = (model.vocab_size, model.out_vocab)
    if (int(hello.vocab_size), int(hello.out_vocab)) != want:
        raise UserError(f"board {hello.board} reports vocab {hello.vocab_size} (output {hello.out_vocab}), "
                        f"the model has {want[0]} (output {want[1]})")


def _describe(request: Generate) -> str:
    return (f"generating up to {request.max_new_tokens} tokens from "
            + ("a text prompt the board encodes" if request.is_text else f"a {len(request.prompt)}-token prompt")
            + (", sliding the window when the context fills" if request.slide else "")
            + (", every step's whole head (ALL_LOGITS)" if request.all_logits else "")
            + (f", speculating ({request.speculate})" if request.speculate != "none" else ""))


def run(console, model: ModelDir, request: Generate, target: Target, outputs: Outputs = Outputs(),
        policy: Policy = Policy(), kv: str | None = None, selftest: bool = False) -> int:
    """Generate ``request`` on ``target`` and report it; ``policy``: retries and timeouts (its
    reconnect and after_handshake are the run's own); ``kv``: switch the board's KV cache format
    first (a LAYOUT, sent again after a board restarts); ``selftest``: run every step of the
    image's golden check first. Ctrl-C stops the generation, and what arrived is reported and written
    however often it is pressed (host/interrupts.py). Returns the exit code (130: interrupted)."""
    emulated = check_virtual_board(target.board) if target.board is not None else None
    tok = model.tokenizer(required=False)
    prompt_text, piece_of = "", None
    if tok is not None:
        pieces = tok.pieces
        piece_of = lambda i: pieces[i] if 0 <= i < len(pieces) else None  # noqa: E731
        try:
            prompt_text = request.prompt if request.is_text else bytes(decode(tok, request.prompt)).decode(
                "utf-8", "replace")
        except Exception:   # the echoed prompt is a display nicety; it must never stop a run
            prompt_text = ""
    with interrupts() as ctrl_c:
        with ExitStack() as stack:
            try:
                result = _generate(console, stack, model, request, target, outputs, policy, kv, selftest,
                                   emulated, piece_of, prompt_text)
            finally:    # from here on Ctrl-C is ignored: the board is stopped, what arrived written
                ctrl_c.hold()
        print_summary(console, result)
        if result.done is not None and result.done.reason == "eos" and result.tokens:
            last = result.tokens[-1].out_id
            piece = piece_of(last) if piece_of is not None else None
            console.print(f"ended by stop id {last}" + (f" {piece!r}" if piece is not None else "")
                          + f" (the model's stop ids: {model.stops})", markup=False, soft_wrap=True)
        for ev in result.recoveries:
            console.print(f"[yellow]recovered[/] after {ev['after']} ({ev['reason']}): {ev['action']}",
                          soft_wrap=True, highlight=False)
        if result.resent_steps:
            console.print(f"{len(result.resent_steps)} lost step(s) re-sent by the board "
                          f"({result.resend_requests} RESEND request(s))", highlight=False)
        outputs.write(console, result)
    if result.missing_steps:
        shown = ", ".join(map(str, result.missing_steps[:20]))
        print(f"flashlm: warning: {len(result.missing_steps)} step(s) lost on the link: {shown}", file=sys.stderr)
    return 130 if result.interrupted else 0


def _generate(console, stack: ExitStack, model: ModelDir, request: Generate, target: Target, outputs: Outputs,
              policy: Policy, kv: str | None, selftest: bool, emulated: str | None, piece_of, prompt_text: str):
    """The board started (a virtual one, in ``stack``) or its port opened, the handshake and the
    generation shown live: run's RunResult. A board error writes the steps that arrived
    before it is raised."""
    board, timeout = target.board, policy.handshake_timeout
    vb = None
    port = target.port
    if board is not None:
        image = ensure_firmware(console, model, board)
        step(console, describe_start(board, target.xip_model))
        vb = stack.enter_context(start_virtual_board(board, image, model.blob, timeout, target.xip_model))
        port = vb.port
        console.print(f"  pid {vb.proc.pid}, serial link on {port}" if emulated else f"  pid {vb.proc.pid} on {port}")
    ser = open_port(port, target.baud)
    stack.callback(ser.close)
    sess = Session(Link(ser), name=port, frame_timeout=policy.frame_timeout or timeout)
    live = {"ser": ser, "vb": vb, "port": port}

    def reconnect():
        """A new link after the old one failed: our own native board is started again if it died;
        a serial port that vanished (a USB board resetting) is waited for."""
        try:
            live["ser"].close()
        except Exception:
            pass
        v = live["vb"]
        if board == "native" and v is not None and not v.alive:
            console.print(f"  the native board is gone ({v.describe_exit()}); starting it again", markup=False)
            v = live["vb"] = stack.enter_context(start_native_board(image, model.blob, timeout=timeout))
            live["port"] = v.port
        end = time.monotonic() + timeout
        while not os.path.exists(live["port"]):
            if time.monotonic() > end:
                raise BoardError(f"serial port {live['port']} did not come back within {timeout:g} s")
            time.sleep(0.1)
        s = live["ser"] = open_port(live["port"], target.baud)
        stack.callback(s.close)
        console.print(f"  reconnected on {live['port']}")
        return Link(s)
    try:
        step(console, f"handshake on {port}")
        hello = sess.handshake(timeout=timeout)
        console.print(f"  board [bold]{hello.board}[/] fw {hello.fw_version}, clock: [bold]{clock_name(hello.clock)}[/], "
                      f"model {bytes(hello.model_hash).hex()[:16]}, layout {hello.layout_id}, context {hello.max_seq_len}",
                      soft_wrap=True)
        sess.check_model(hello, model.model_hash)
        _check_board(hello, model, request)
        after_handshake = None
        if kv is not None:     # the model's own placement with this KV format, kept across resets
            lid, st, tiers = kv_layout(model.blob, kv)

            def switch_kv(h):
                if h.layout_id != lid:
                    sess.set_layout(lid, st, tiers, timeout=timeout)
            after_handshake = switch_kv
            switch_kv(hello)
            console.print(f"  KV cache {kv}: layout {lid}")
        if selftest:
            step(console, "golden check: every step (SELFTEST)")
            sess.selftest(timeout=max(timeout, 60.0))
        console.print(bit_exact_line(sess.hello), soft_wrap=True)
        step(console, _describe(request))
        if emulated:
            vb.read_counts()      # the emulator's per-step read counts: only this generation's
        with LiveView(console, hello, piece_of=piece_of, prompt_text=prompt_text, ple=model.has_ple,
                      draft=request.speculate != "none") as view:
            result = sess.generate_with_recovery(
                request, replace(policy, reconnect=reconnect, after_handshake=after_handshake), view.on_token)
        if emulated:
            # the blob module loads the golden check's reference forward pass: only an emulated run needs it
            from converter.blob import read_header
            result.harness = vb.read_counts()
            result.padding = unloaded_padding(read_header(model.blob), result.tokens,
                                              request.temperature == 0 and not request.whole_heads,
                                              request.speculate == "draft",
                                              stream_stride(load_board(target.board)))
        return result
    except BoardError as e:    # DeviceError, LinkTimeout, LinkLost, BoardReset, ModelMismatch, ...
        partial = getattr(e, "partial", None)
        if partial is not None and partial.tokens:
            outputs.write(console, partial)
        v = live["vb"]
        if v is not None and not v.alive:
            raise BoardError(f"{e}; {v.describe_exit()}") from None
        raise
