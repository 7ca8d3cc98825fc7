"""What a user error is, and how any error is told to the user: one line on stderr (exit 2), or
a traceback when it is a bug. Every error flashlm tells in one line derives from
``converter.errors.FlashlmError``; a file that cannot be read or written (an ``OSError``) is told
the same way."""
from __future__ import annotations

from converter.errors import FlashlmError


class UserError(FlashlmError):
    """A mistake in how flashlm was called; the message is one line for the user."""


class BoardError(FlashlmError, RuntimeError):
    """A board, port or link problem; the message is one line for the user."""


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
    """A mistake in the call, the files or the board (one line, exit 2), not a bug (traceback)."""
    return isinstance(e, (FlashlmError, OSError))
