"""``flashlm pull``'s options: a model by name into the Hugging Face cache."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("pull", help="download a catalogue model or hf:REPO[@REV] (sha256 checked); no NAME: the catalogue")
    p.add_argument("name", metavar="NAME", nargs="?",
                   help="a catalogue name (e.g. stories260K) or hf:OWNER/NAME[@REVISION]; omitted: list the catalogue")
    p.set_defaults(func=cmd_pull)


def cmd_pull(args, console) -> int:
    from ..catalogue import CATALOGUE
    if args.name is None:
        for e in CATALOGUE.values():
            console.print(f"[bold]{e.name}[/]: {e.about}")
            for f in e.files:
                console.print(f"  {f.label}@{f.revision[:12]}  sha256 {f.sha256 or 'trusted on first download'}")
            console.print(f"  pins: {e.pins}")
        return 0
    from ..commands.pull import pull     # huggingface_hub: not for --help
    got = pull(console, args.name)
    console.print(f"checkpoint {got.checkpoint}" + (f"\ntokenizer  {got.tokenizer}" if got.tokenizer else ""))
    console.print(f"next: flashlm convert {args.name} -o out/{args.name.rpartition('/')[2].partition('@')[0]}")
    return 0
