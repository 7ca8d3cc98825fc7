"""``flashlm train``: converter.train's own options, parsed after the command is known."""
from __future__ import annotations

from .options import Parser


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="train a small model (options: flashlm train --help)", add_help=False)
    t.set_defaults(func=None, train=True)


def cmd_train(console, extra: list[str]) -> int:
    from converter import train    # torch: only a training run loads it
    p = Parser(prog="flashlm train", description="Train a small model (converter.train).")
    train.add_arguments(p)
    return train.main_train(p.parse_args(extra))
