"""The ``flashlm`` argument parser: every command, its options and the function that runs it."""
from __future__ import annotations

import argparse

from .args import (Parser, add_generation_args, add_xip_arg, nonneg_int, output_dir, output_file, positive_int,
                   seconds)
from .cmd_build import cmd_build, cmd_flash
from .cmd_convert import DEFAULT_BATCH, cmd_convert
from .cmd_demo import cmd_demo
from .cmd_run import cmd_faultproxy, cmd_run, cmd_serve
from .cmd_train import cmd_eval
from .passes import add_arguments as add_pass_arguments
from .prompt import DEFAULT_PROMPT


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="flashlm", description="Small transformer LMs on microcontrollers, with per-token timing.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    c = sub.add_parser("convert", help="checkpoint -> quantized flash image + manifest")
    c.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="llama2.c or flashlm checkpoint, or a Hugging Face folder (config.json, safetensors)")
    c.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or llama2.c tokenizer.bin")
    c.add_argument("-o", "--output", metavar="OUTDIR", type=output_dir, default="out/model")
    c.add_argument("--format", choices=("q8", "q4"), default="q8")
    c.add_argument("--group-size", type=positive_int, default=32, metavar="N")
    c.add_argument("--quant", action="append", default=[], metavar="PATTERN=FMT[:G]",
                   help="per-tensor override, e.g. 'layers.*.ffn=q4:32', 'head=q4' (repeatable)")
    c.add_argument("--scales", choices=("row", "f32", "f16"), default=None,
                   help="row (default): a power-of-two scale per row and an integer multiplier per group "
                        "(a matvec row in integers, one float multiply); f32 or fp16: a float scale per group "
                        "(the only form of llama2.c v2 Q8_0, which is imported as it is unless --scales is given)")
    c.add_argument("--kv", choices=("f32", "int8"), default="int8",
                   help="KV cache format recorded in the blob (default int8: a scale and int8 codes per row, "
                        "integer attention; f32: float values and float attention)")
    c.add_argument("--ctx", "--context", type=positive_int, metavar="N", dest="ctx",
                   help="context length of the converted model (default: the checkpoint's, e.g. a Hugging Face "
                        "max_position_embeddings); at most the checkpoint's")
    c.add_argument("--batch", type=positive_int, default=DEFAULT_BATCH, metavar="T",
                   help=f"the most tokens one forward pass runs, recorded in the blob: prefill in chunks of T, "
                        f"speculative drafts up to T-1; scratch RAM grows with T (default {DEFAULT_BATCH})")
    c.add_argument("--draft", metavar="DIR",
                   help="a small model of the same tokenizer (checkpoint or flashlm train folder) to carry in the "
                        "image for speculative decoding (flashlm run --speculate draft)")
    c.add_argument("--head-index", choices=("auto", "on", "off"), default="auto",
                   help="the greedy head's tile index: auto keeps it when calibration shows it pays, on always, off never")
    c.add_argument("--no-report", action="store_true", help="skip the quality report")
    c.set_defaults(func=cmd_convert)

    b = sub.add_parser("build", help="render and build the firmware for a board")
    b.add_argument("--board", default="native")
    b.add_argument("--model", metavar="OUTDIR", help="model directory the firmware is sized for")
    b.add_argument("-o", "--output", metavar="BUILDDIR", type=output_dir,
                   help="where to build (default: OUTDIR/build/BOARD)")
    b.set_defaults(func=cmd_build)

    r = sub.add_parser("run", help="generate on a board and show per-token timing")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--board", help="start a virtual board (native, or rp2040-emu: the emulated RP2040)")
    where.add_argument("--port", metavar="PATH", help="serial port of a flashed board")
    r.add_argument("--model", metavar="OUTDIR", required=True)
    add_generation_args(r, max_tokens=32)
    r.add_argument("--json", metavar="FILE", type=output_file)
    r.add_argument("--csv", metavar="FILE", type=output_file)
    r.add_argument("--png", metavar="FILE", type=output_file)
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
    add_pass_arguments(r)
    r.add_argument("--selftest", action="store_true",
                   help="run every step of the image's golden check first (SELFTEST; the boot check runs a few)")
    r.set_defaults(func=cmd_run)

    f = sub.add_parser("flash", help="build and upload a PlatformIO project from 'build', then write the blob")
    f.add_argument("project", metavar="PROJECT", help="the directory 'flashlm build --board B' rendered")
    f.add_argument("--port", metavar="P", help="serial port (default: found by the board's USB VID/PID)")
    f.add_argument("--dry-run", action="store_true", help="print every command, run none")
    f.set_defaults(func=cmd_flash)

    from .plan import add_commands as add_plan_commands   # plan, compare
    add_plan_commands(sub)

    sv = sub.add_parser("serve", help="start a virtual board (native, rp2040-emu) and print its port")
    sv.add_argument("--board", default="native", help="native (default) or rp2040-emu (needs 'make emu-deps')")
    sv.add_argument("--model", metavar="OUTDIR", required=True)
    sv.add_argument("--counts", metavar="FILE", type=output_file, help="rp2040-emu: write the harness's per-step read counts here")
    sv.add_argument("--timeout", type=seconds, default=10.0, metavar="S")
    add_xip_arg(sv)
    sv.set_defaults(func=cmd_serve)

    fx = sub.add_parser("faultproxy", help="serve a pty between the host and a board that damages the bytes "
                                           "(drop, dup, flip, insert, boot noise, line close): for testing")
    from .faultproxy import add_arguments as add_fault_arguments
    add_fault_arguments(fx)
    fx.set_defaults(func=cmd_faultproxy)

    d = sub.add_parser("demo", help="convert the shipped model, build, run, write out/demo/run.*")
    d.add_argument("--board", default="native")
    d.add_argument("--prompt", default=DEFAULT_PROMPT)
    d.add_argument("--max-tokens", type=positive_int, default=48, metavar="N")
    d.add_argument("-o", "--output", default="out/demo", metavar="OUTDIR", type=output_dir)
    d.add_argument("--timeout", type=seconds, default=10.0, metavar="S")
    add_xip_arg(d)
    d.set_defaults(func=cmd_demo)

    e = sub.add_parser("eval", help="eval loss, perplexity and top-1 agreement of fp32, int8 and int4 on held-out text")
    e.add_argument("model", metavar="MODEL", help="a 'flashlm train' folder (model.pt, eval.txt) or a checkpoint")
    e.add_argument("--targets", type=nonneg_int, default=4096, metavar="N",
                   help="score the first N predictions (default %(default)s; 0: all; the reference runs "
                        "~10-30 ms a token)")
    e.add_argument("--text", metavar="FILE", help="held-out text (default: eval.txt beside the checkpoint)")
    e.add_argument("--group-size", type=positive_int, default=32, metavar="N",
                   help="quantization group size (default %(default)s, as convert)")
    e.add_argument("--json", metavar="FILE", type=output_file, help="also write the results as JSON")
    e.set_defaults(func=cmd_eval)

    t = sub.add_parser("train", help="train a small model (options: flashlm train --help)", add_help=False)
    t.set_defaults(func=None, train=True)
    return p
