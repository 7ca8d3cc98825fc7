"""Ctrl-C during a command that collects something from a board (``run``, ``serve``, ``compare
--run``): what was collected is written and the board is stopped, however often Ctrl-C is pressed.

Inside ``interrupts()`` the first Ctrl-C raises KeyboardInterrupt as usual (a generation sends STOP
and keeps what arrives until the board confirms, at most a few seconds); every later press, and any
press after ``hold()``, is counted and nothing else, so the summary, the files and the board's
clean-up (its process stopped, its temporary files removed) are never cut short wherever the press
lands. The first such press prints one line saying so. Outside the main thread (a scripting
caller's worker) Python delivers no signals, and nothing changes."""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager


class Interrupts:
    """The Ctrl-C presses seen inside ``interrupts()``; ``held``: those that raised nothing."""

    def __init__(self):
        self.presses = 0
        self.held = 0
        self._holding = False

    def hold(self) -> None:
        """From now on a press raises nothing."""
        self._holding = True

    def _on_sigint(self, signum, frame) -> None:
        self.presses += 1
        if not self._holding and self.presses == 1:
            raise KeyboardInterrupt
        self.held += 1
        if self.held == 1:
            print("flashlm: stopping: the board is stopped and what arrived is reported and written first "
                  "(Ctrl-C is ignored until then)", file=sys.stderr)


@contextmanager
def interrupts():
    """Ctrl-C raises KeyboardInterrupt once in the block, and not after its ``hold()``; the previous
    handler comes back at the end."""
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.signal(signal.SIGINT, state._on_sigint)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
