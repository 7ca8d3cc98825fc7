"""Whether a board can run a request's forward-pass options (docs/formats.md section 2.4): the
tokens a prefill pass runs (batch) and speculative decoding, against what its HELLO says it can do."""
from __future__ import annotations

from ..link.messages import Generate, Hello


def refusal(hello: Hello, request: Generate) -> str | None:
    """Why the board cannot run the request's forward-pass options (a one-line reason), or None."""
    batch, speculate, draft_k = request.batch, request.speculate, request.draft_k
    if batch and batch > hello.batch:
        return (f"--batch {batch}: board {hello.board} runs at most {hello.batch} token(s) per forward pass "
                f"(its placement's batch; flashlm convert --batch or flashlm plan --batch --apply raises it)")
    if draft_k and speculate == "none":
        return "--draft-k needs --speculate"
    if speculate != "none":
        if speculate == "draft" and not hello.can_draft:
            return (f"--speculate draft: board {hello.board} has no draft model ready (convert the model with "
                    f"--draft DIR, and check the boot LOG: its state may not fit the board's RAM)")
        if request.temperature > 0:
            return ("--speculate verifies greedy tokens only: use --temperature 0 (exact speculative sampling "
                    "is not implemented)")
        k = draft_k or hello.batch - 1
        if k < 1 or k + 1 > hello.batch:
            return (f"--speculate: a pass of the last token and {k} draft(s) needs a batch of at least 2 and at "
                    f"most board {hello.board}'s {hello.batch} (flashlm convert --batch raises it)")
    return None
