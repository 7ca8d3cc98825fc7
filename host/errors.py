"""What a user error is, and how any error is told to the user: one line on stderr (exit 2), or
a traceback when it is a bug."""
from __future__ import annotations


class UserError(Exception):
    """A mistake in how flashlm was called; the message is one line for the user."""


def one_line(e: BaseException) -> str:
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


def is_user_error(e: Exception) -> bool:
    """A mistake in the call, the files or the board (one line, exit 2), not a bug (traceback).

    Only called while an exception is being handled, so ``--help`` and a working run import none
    of these modules.  converter.train imports torch; its errors can only come from
    ``flashlm train``, which has imported it already, so it is looked at last and a failing
    ``run`` never loads torch."""
    from converter.corpus import CorpusError
    from converter.ir import ModelError
    from firmware.build_meta import BuildError

    from .protocol import ProtocolError
    from .flash import FlashError
    from .virtual import BoardError
    if isinstance(e, (UserError, OSError, ModelError, BoardError, ProtocolError, BuildError, CorpusError,
                      FlashError)):
        return True
    from converter.train import TrainError
    return isinstance(e, TrainError)
