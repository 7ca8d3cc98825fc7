"""The terminal the commands print to (rich), and the one way a command announces a step."""
from __future__ import annotations


def make_console():
    from rich.console import Console
    return Console(highlight=False)


def step(console, text: str) -> None:
    console.print(f"[bold cyan]→[/] {text}", soft_wrap=True)
