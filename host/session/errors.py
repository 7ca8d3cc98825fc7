"""What can go wrong on the board side of a session: a ``BoardError`` (host/errors.py) with a
one-line message. ``DeviceError`` (the device answered ERROR), ``LinkTimeout`` (the device went
silent), ``LinkLost`` (the port went away), ``BoardReset`` (the board restarted mid-generation),
``ModelMismatch`` and ``Diverged`` are ``SessionError``s: they also carry the partial ``RunResult``
gathered before the failure (``.partial``; None where nothing was generated yet)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import BoardError
from ..link.messages import Error

if TYPE_CHECKING:
    from .result import RunResult


class SessionError(BoardError):
    """A failure during a conversation with a board, with what had arrived before it."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class DeviceError(SessionError):
    """The device answered ERROR."""

    def __init__(self, msg: str, error: Error | None = None, partial: "RunResult | None" = None):
        super().__init__(msg, partial)
        self.error = error


class LinkTimeout(SessionError):
    """No frame arrived within the bounded wait."""


class LinkLost(SessionError):
    """The port went away (unplugged, the virtual board's process died)."""


class BoardReset(SessionError):
    """The board restarted during a generation (its frame numbering began again at 0)."""


class ModelMismatch(SessionError):
    """The board holds a different model than the one the host was asked to use."""


class Diverged(SessionError):
    """A step generated again came out differently from the first time."""


def error_text(err: Error) -> str:
    """A device's ERROR as the user reads it: its text and the code's name."""
    return f"{err.text} ({err.name})" if err.text else err.name
