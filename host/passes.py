"""`flashlm run`'s forward-pass options (docs/formats.md section 2.4): the tokens a prefill pass runs
(--batch), and speculative decoding (--speculate, --draft-k): their arguments and their checks
against what the board says it can do (HELLO)."""
from __future__ import annotations

import argparse


def _tokens(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {s!r}") from None
    if not 1 <= v <= 255:
        raise argparse.ArgumentTypeError(f"must be 1..255 tokens, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=_tokens, metavar="T",
                   help="tokens per prefill pass, at most the board's batch (HELLO; flashlm convert/plan --batch); "
                        "default: the board's")
    p.add_argument("--speculate", choices=("lookup", "draft"),
                   help="speculative decoding, greedy-exact: drafts from prompt lookup (n-gram matches in the "
                        "context) or from the image's draft model (flashlm convert --draft), verified several at a "
                        "time by one forward pass")
    p.add_argument("--draft-k", type=_tokens, metavar="K",
                   help="drafts per verifying pass (default: the board's batch minus one)")


def check(hello, batch: int | None, speculate: str | None = None, draft_k: int | None = None,
          temperature: float = 0.0) -> str | None:
    """Why the board cannot run these options (a one-line reason), or None."""
    if batch and batch > hello.batch:
        return (f"--batch {batch}: board {hello.board} runs at most {hello.batch} token(s) per forward pass "
                f"(its placement's batch; flashlm convert --batch or flashlm plan --batch --apply raises it)")
    if draft_k and not speculate:
        return "--draft-k needs --speculate"
    if speculate:
        if speculate == "draft" and not hello.can_draft:
            return (f"--speculate draft: board {hello.board} has no draft model ready (convert the model with "
                    f"--draft DIR, and check the boot LOG: its state may not fit the board's RAM)")
        if temperature > 0:
            return ("--speculate verifies greedy tokens only: use --temperature 0 (exact speculative sampling "
                    "is not implemented)")
        k = draft_k or hello.batch - 1
        if k < 1 or k + 1 > hello.batch:
            return (f"--speculate: a pass of the last token and {k} draft(s) needs a batch of at least 2 and at "
                    f"most board {hello.board}'s {hello.batch} (flashlm convert --batch raises it)")
    return None
