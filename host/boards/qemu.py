"""The QEMU boards (profiles with ``emulator = "qemu"``: the ESP32-C3's, ESP32-P4's and ESP32-S3's
instruction sets on QEMU's generic machines): the firmware's ELF in QEMU, its serial link on a pty.

QEMU's serial is its stdin/stdout (``-chardev stdio`` on the RISC-V virt machine's UART, semihosting
on the Xtensa sim machine), both the master side of a raw pty this process creates and keeps the
slave of open, so the link never hangs up between host connections and nothing the firmware writes
before the host opens the port is lost. The command line is the profile's ``[qemu]`` table plus the
image, the blob at the profile's ``[flash].blob_address`` (QEMU's generic loader) and no display or
monitor. QEMU's stderr is the firmware's fault report; an exit status of 100 + cause is a trap the
HAL reported (start-up code of firmware/hal/qemu_rv32, qemu_xtensa), named here."""
from __future__ import annotations

import collections
import ctypes
import os
import shutil
import signal
import subprocess
import termios
import threading
import time
import tty
from pathlib import Path

from converter.boards import load_board

from ..errors import BoardError
from .native import VirtualBoard, drain, exit_how

QEMU_APT = "apt-get install qemu-system-misc"
# exit status 100 + the cause the HAL's trap handler reports, per instruction set
TRAPS = {
    "qemu-system-riscv32": ("trap", {0: "instruction address misaligned", 1: "instruction access fault",
                                     2: "illegal instruction", 3: "breakpoint", 4: "load address misaligned",
                                     5: "load access fault", 6: "store address misaligned", 7: "store access fault",
                                     11: "environment call"}),
    "qemu-system-xtensa": ("exception", {0: "illegal instruction", 2: "instruction fetch error",
                                         3: "load/store error", 6: "integer divide by zero",
                                         9: "unaligned load or store", 12: "instruction fetch (PIF) error",
                                         13: "load/store (PIF) error", 20: "instruction fetch prohibited",
                                         28: "load prohibited", 29: "store prohibited",
                                         32: "coprocessor 0 (FPU) disabled"}),
}


def qemu_missing(prof: dict) -> str | None:
    """Why the QEMU board cannot start here (one line naming what to install), or None."""
    system = prof["qemu"]["system"]
    if shutil.which(system) is None:
        return f"the {prof['name']} board needs {system} ({QEMU_APT}; or 'make emu-deps')"
    return None


def qemu_command(prof: dict, elf: Path, blob: Path) -> list[str]:
    """The QEMU command line running ``elf`` with the weights ``blob`` where the image expects it."""
    q = prof["qemu"]
    return [q["system"], *q["args"], "-display", "none", "-monitor", "none", "-kernel", str(elf),
            "-device", f"loader,file={blob},addr={int(prof['flash']['blob_address']):#x},force-raw=on"]


def exit_reason(prof: dict, rc: int) -> str:
    kind, causes = TRAPS.get(prof["qemu"]["system"], ("trap", {}))
    if 100 <= rc < 164:
        return f"{kind}: {causes.get(rc - 100, f'cause {rc - 100}')}"
    return ""


class QemuBoard(VirtualBoard):
    """A running QEMU and the pty its serial link is bridged to."""

    def __init__(self, prof: dict, proc, port, elf: Path, blob: Path, stderr_tail, slave_fd: int):
        super().__init__(proc, port, elf, blob, stderr_tail, collections.deque(maxlen=1))
        self.prof = prof
        self.name = prof["name"]
        self._slave = slave_fd

    def describe_exit(self) -> str | None:
        rc = self.proc.poll()
        if rc is None:
            return None
        why = exit_reason(self.prof, rc) or (self.stderr_tail(1)[-1] if self.stderr_tail(1) else "")
        return f"{self.name} (QEMU) {exit_how(rc)}" + (f": {why}" if why else "")

    def __repr__(self) -> str:
        return f"QemuBoard({self.name}, port={self.port!r}, pid={self.proc.pid}, alive={self.alive})"


def raw_link(fd: int) -> None:
    """Raw mode for the pty (binary frames: no echo, no translation either way), with every output
    flag cleared: QEMU's stdio chardev turns OPOST back on when it starts (it keeps a console's
    output processing), and with the pty's default ONLCR still set every 0x0a the host writes
    would reach QEMU as 0x0d 0x0a."""
    tty.setraw(fd)
    attrs = termios.tcgetattr(fd)
    attrs[1] = 0               # c_oflag
    termios.tcsetattr(fd, termios.TCSANOW, attrs)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started QEMU dies (Linux
    PR_SET_PDEATHSIG), as the native board does for itself: a virtual board never outlives its host."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def start_qemu_board(image, blob_path, board: str, timeout: float = 10, settle: float = 0.2) -> QemuBoard:
    """Start QEMU on ``image`` (firmware.elf) with ``blob_path`` as its flash; problems are one-line
    BoardErrors. ``settle``: how long to watch for QEMU refusing its command line before returning
    (the firmware then boots and runs its golden check before it answers the host's handshake,
    which has its own timeout)."""
    prof = load_board(board)
    image, blob_path = Path(image), Path(blob_path)
    why = qemu_missing(prof)
    if why:
        raise BoardError(why)
    if not image.is_file():
        raise BoardError(f"firmware image {image} does not exist (run 'flashlm build --board {board}')")
    if not _is_elf(image):
        raise BoardError(f"firmware image {image} is not an ELF file (rebuild it: 'flashlm build --board {board}')")
    if not blob_path.is_file():
        raise BoardError(f"model image {blob_path} does not exist")
    flash = int(prof["tiers"]["flash"]["capacity"]) - int(prof["flash"]["blob_offset"])
    if blob_path.stat().st_size > flash:
        raise BoardError(f"model image {blob_path} is {blob_path.stat().st_size:,} bytes; {board}'s flash "
                         f"holds {flash:,} for it")
    cmd = qemu_command(prof, image, blob_path)
    master, slave = os.openpty()
    raw_link(slave)
    try:
        proc = subprocess.Popen(cmd, stdin=master, stdout=master, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True, preexec_fn=_die_with_parent)
    except OSError as e:
        os.close(master)
        os.close(slave)
        raise BoardError(f"cannot start {cmd[0]}: {e.strerror or e}") from None
    os.close(master)           # QEMU holds it; we hold the slave so the pty never hangs up
    tail: collections.deque = collections.deque(maxlen=50)
    threading.Thread(target=drain, args=(proc.stderr, tail), daemon=True, name="qemu-stderr").start()
    vb = QemuBoard(prof, proc, os.ttyname(slave), image, blob_path, tail, slave)
    deadline = time.monotonic() + min(settle, timeout)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            time.sleep(0.05)
            msg = vb.describe_exit()
            vb.stop()
            raise BoardError(msg)
        time.sleep(0.02)
    return vb
