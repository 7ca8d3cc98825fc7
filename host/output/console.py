"""The terminal the commands print to (rich), and the one way a command announces a step."""
from __future__ import annotations

import os
import sys

PIPED_WIDTH = 200   # wide enough for every table flashlm prints (the run table is ~150 columns)


def make_console():
    """rich's console; piped or redirected output (no terminal to ask) gets PIPED_WIDTH columns
    instead of rich's 80, so that tables are printed whole, not cut with '…' (COLUMNS wins)."""
    from rich.console import Console
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPED_WIDTH
    return Console(highlight=False, width=width)


def step(console, text: str) -> None:
    console.print(f"[bold cyan]→[/] {text}", soft_wrap=True)
