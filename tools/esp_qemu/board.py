"""Start an image built by build.py in QEMU, its serial link on a pty, as host.virtual starts the
native and emulated RP2040 boards: the returned board's ``port`` is a /dev/pts/N the host opens
like a real board's serial port.

QEMU's serial chardev is its stdin/stdout (``-chardev stdio``), both the master side of a raw pty
this process creates and keeps the slave of open (so the link never hangs up between host
connections, and nothing the firmware writes before the host opens the port is dropped).

rv32:   qemu-system-riscv32 -M virt -cpu rv32,a=false,f=false,d=false -bios none -icount shift=0; the
        NS16550A UART is serial0.
xtensa: see XTENSA_QEMU below."""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from host.virtual import BoardError, VirtualBoard, _drain

from .build import ISAS, RV32, Isa

RV_QEMU = "qemu-system-riscv32"
XT_QEMU = "qemu-system-xtensa"
QEMU_APT = "apt-get install qemu-system-misc"
RV_BLOB = 0x80200000         # qemu_rv32.ld BLOB
RV_TRAPS = {0: "instruction address misaligned", 1: "instruction access fault", 2: "illegal instruction",
            3: "breakpoint", 4: "load address misaligned", 5: "load access fault",
            6: "store address misaligned", 7: "store access fault", 11: "environment call"}


def qemu_command(isa: Isa, elf: Path, blob: Path) -> list[str]:
    """The QEMU command line for ``elf`` with the weights ``blob`` where the image expects it."""
    if isa is RV32:
        # -cpu rv32 without A, F and D: the hart is an rv32imc (+ Zicsr, Zifencei) like the C3's, so an
        # instruction the chip lacks traps here instead of running
        return [RV_QEMU, "-M", "virt", "-cpu", "rv32,a=false,f=false,d=false", "-bios", "none", "-icount", "shift=0",
                "-display", "none",
                "-monitor", "none", "-chardev", "stdio,id=link,signal=off", "-serial", "chardev:link",
                "-kernel", str(elf), "-device", f"loader,file={blob},addr={RV_BLOB:#x},force-raw=on"]
    from .xtensa import qemu_command as xt
    return xt(elf, blob)


def exit_reason(isa: Isa, rc: int) -> str:
    if isa is RV32 and 100 <= rc < 132:
        return f"trap: {RV_TRAPS.get(rc - 100, f'mcause {rc - 100}')}"
    if isa is not RV32:
        from .xtensa import exit_reason as xt
        return xt(rc)
    return ""


class QemuBoard(VirtualBoard):
    def __init__(self, isa: Isa, proc, port, elf: Path, blob: Path, stderr_tail, slave_fd: int):
        super().__init__(proc, port, elf, blob, stderr_tail, collections.deque(maxlen=1))
        self.isa = isa
        self.name = isa.board
        self._slave = slave_fd

    def describe_exit(self) -> str | None:
        rc = self.proc.poll()
        if rc is None:
            return None
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        why = exit_reason(self.isa, rc) or (self.stderr_tail(1)[-1] if self.stderr_tail(1) else "")
        return f"{self.name} (QEMU) {how}" + (f": {why}" if why else "")

    def stop(self, timeout: float = 3.0) -> int | None:
        rc = super().stop(timeout)
        if self._slave is not None:
            try:
                os.close(self._slave)
            except OSError:
                pass
            self._slave = None
        return rc

    def __repr__(self) -> str:
        return f"QemuBoard({self.name}, port={self.port!r}, pid={self.proc.pid}, alive={self.alive})"


def raw_link(fd: int) -> None:
    """Raw mode for the pty (binary frames: no echo, no translation either way), with every output
    flag cleared: QEMU's stdio chardev turns OPOST back on when it starts (it keeps a console's
    output processing), and with the pty's default ONLCR still set that turns every 0x0a the host
    writes into 0x0d 0x0a before QEMU reads it."""
    import termios
    import tty
    tty.setraw(fd)
    attrs = termios.tcgetattr(fd)
    attrs[1] = 0               # c_oflag
    termios.tcsetattr(fd, termios.TCSANOW, attrs)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started QEMU dies (Linux), as the
    native board does for itself (prctl PR_SET_PDEATHSIG): a virtual board never outlives its host."""
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def start(isa: str | Isa, elf, blob, settle: float = 0.2) -> QemuBoard:
    """Start QEMU on ``elf`` with ``blob``; problems are one-line BoardErrors. ``settle``: how long
    to watch for QEMU refusing its command line before returning."""
    isa = ISAS[isa] if isinstance(isa, str) else isa
    elf, blob = Path(elf), Path(blob)
    cmd = qemu_command(isa, elf, blob)
    if shutil.which(cmd[0]) is None:
        raise BoardError(f"the {isa.board} board needs {cmd[0]} ({QEMU_APT})")
    if not elf.is_file():
        raise BoardError(f"firmware image {elf} does not exist (tools/esp_qemu/build.py builds it)")
    if not blob.is_file():
        raise BoardError(f"model image {blob} does not exist")
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
    threading.Thread(target=_drain, args=(proc.stderr, tail), daemon=True, name="qemu-stderr").start()
    board = QemuBoard(isa, proc, os.ttyname(slave), elf, blob, tail, slave)
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            time.sleep(0.05)
            msg = board.describe_exit()
            board.stop()
            raise BoardError(msg)
        time.sleep(0.02)
    return board
