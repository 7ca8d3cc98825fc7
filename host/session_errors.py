"""What can go wrong on the board side of a session: a ``BoardError`` with a one-line message.
``DeviceError`` (the device answered ERROR), ``LinkTimeout`` (the device went silent), ``LinkLost``
(the port went away), ``BoardReset`` (the board restarted mid-generation), ``ModelMismatch`` and
``Diverged`` also carry the partial ``RunResult`` gathered before the failure (``.partial``; None
where nothing was generated yet)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import protocol as P
from .virtual import BoardError

if TYPE_CHECKING:
    from .run_result import RunResult

__all__ = ["BoardError", "BoardReset", "DeviceError", "Diverged", "LinkLost", "LinkTimeout", "ModelMismatch"]


class DeviceError(BoardError):
    """The device answered ERROR."""

    def __init__(self, msg: str, error=None, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.error = error
        self.partial = partial


class LinkTimeout(BoardError):
    """No frame arrived within the bounded wait."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class LinkLost(BoardError):
    """The port went away (unplugged, the virtual board's process died)."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class BoardReset(BoardError):
    """The board restarted during a generation (its frame numbering began again at 0)."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class ModelMismatch(BoardError):
    """The board holds a different model than the one the host was asked to use."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial


class Diverged(BoardError):
    """A step generated again came out differently from the first time."""

    def __init__(self, msg: str, partial: "RunResult | None" = None):
        super().__init__(msg)
        self.partial = partial



def _error_text(err: P.Error) -> str:
    return f"{err.text} ({err.name})" if err.text else err.name
