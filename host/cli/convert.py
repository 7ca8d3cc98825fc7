"""``flashlm convert``'s options: a checkpoint into a model directory."""
from __future__ import annotations

from ..defaults import DEFAULT_BATCH, KV_DEFAULT, KV_FORMATS
from .options import add_recipe, output_dir, positive_int, recipe_of


def add_parser(sub) -> None:
    c = sub.add_parser("convert", help="checkpoint -> quantized flash image + manifest")
    c.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="llama2.c or flashlm checkpoint, a Hugging Face folder (config.json, safetensors), or a model "
                        "name: a catalogue name (flashlm pull lists them) or hf:OWNER/NAME[@REV]")
    c.add_argument("-o", "--output", metavar="OUTDIR", type=output_dir, default="out/model")
    add_recipe(c)
    c.add_argument("--kv", choices=KV_FORMATS, default=KV_DEFAULT,
                   help=f"KV cache format recorded in the blob (default {KV_DEFAULT}: a scale and 12-bit codes per K "
                        "row, a scale and int8 codes per V row, integer attention; int8: int8 K rows too, less SRAM; "
                        "f32: float values and float attention)")
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
    c.add_argument("--calibrate", choices=("auto", "none", "gptq", "qat"), default="auto",
                   help="gptq: each matrix's codes rounded GPTQ-style against its inputs' second moments on 1024 "
                        "positions of text the fp32 model samples itself; qat: the weights and each group's scale "
                        "multiplier first trained (minutes) to match fp32's next-token distributions through the "
                        "quantizer, on text fp32 samples itself "
                        "(both: the same scales and blob format; flashlm eval --fidelity shows what they gain); "
                        "none: each weight to its nearest code; auto (default): gptq for q8, qat for q4 "
                        "(none with float group scales)")
    c.add_argument("--no-report", action="store_true", help="skip the quality report")
    c.set_defaults(func=cmd_convert)


def cmd_convert(args, console) -> int:
    from ..commands.convert import convert    # the converter (numpy, tokenizers): not for --help
    convert(console, args.checkpoint, args.output, recipe_of(args), tokenizer=args.tokenizer,
            report=not args.no_report, kv=args.kv, context=args.ctx, batch=args.batch, draft=args.draft,
            head_index=args.head_index, calibrate=args.calibrate)
    return 0
