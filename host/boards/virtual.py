"""The boards flashlm starts itself: native (the firmware built for this host) and the emulated
ones (a board profile whose ``emulator`` key names one: rp2040js, or QEMU for the ESP32 family's
instruction sets). Which boards they are, whether this machine can start one, and starting one."""
from __future__ import annotations

from pathlib import Path

from converter.boards import board_names, load_board
from converter.ir import ModelError

from ..errors import UserError
from .emulated import rp2040js_missing, start_emulated_board
from .native import VirtualBoard, start_native_board
from .qemu import qemu_missing, start_qemu_board


def emulated_board(board: str | None) -> str | None:
    """The emulator a board profile runs in (its ``emulator`` key, e.g. "rp2040js"), else None."""
    if not board or board == "native":
        return None
    try:
        return load_board(board).get("emulator")
    except ModelError:
        return None


def emulated_boards() -> list[str]:
    return [b for b in board_names() if emulated_board(b)]


def emulator_missing(board: str) -> str | None:
    """Why ``board``'s emulator cannot start here (one line naming what to install), or None."""
    prof = load_board(board)
    return qemu_missing(prof) if prof.get("emulator") == "qemu" else rp2040js_missing()


def describe_start(board: str, xip_model: bool = True) -> str:
    """What starting ``board`` starts, for the console."""
    emulator = emulated_board(board)
    if emulator == "qemu":
        return (f"starting the emulated board {board} (QEMU: the instruction set, no caches or memory timing; "
                f"clock: emulated instructions)")
    if emulator:
        return f"starting the emulated board {board} ({emulator}, XIP model {'on' if xip_model else 'off'})"
    return "starting the native virtual board"


def check_virtual_board(board: str) -> str | None:
    """Refuse, before any work, a board flashlm cannot start here: an unknown name, a real board
    (flash it and use --port) or an emulator that is not installed. Returns its emulator or None
    (native)."""
    if board == "native":
        return None
    load_board(board)                  # unknown: a one-line error listing the known boards
    emulated = emulated_board(board)
    if not emulated:
        raise UserError(f"--board {board} is a real board: flashlm starts only the virtual ones (native, "
                        f"{', '.join(emulated_boards())}); flash it ('flashlm build --board {board}', "
                        f"'flashlm flash') and pass --port")
    why = emulator_missing(board)
    if why:
        raise UserError(f"--board {board}: {why}")
    return emulated


def start_virtual_board(board: str, image: Path, blob: Path, timeout: float, xip_model: bool = True,
                        counts_path=None) -> VirtualBoard:
    """Start ``board`` (native or an emulated one) running ``image`` with ``blob`` as its flash;
    ``xip_model`` and ``counts_path`` are the emulated RP2040's (host/boards/emulated.py)."""
    emulator = emulated_board(board)
    if emulator == "qemu":
        return start_qemu_board(image, blob, board=board, timeout=timeout)
    if emulator:
        return start_emulated_board(image, blob, board=board, timeout=timeout, counts_path=counts_path,
                                    xip_model=xip_model)
    return start_native_board(image, blob, timeout=timeout)
