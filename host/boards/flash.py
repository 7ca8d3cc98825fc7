"""``flashlm flash PROJECT``: build and upload a rendered PlatformIO project (``flashlm build
--board B``), then write the weights blob where the firmware looks for it.

- ESP32 (method ``esptool``): ``pio run -t upload`` writes bootloader, partition table and app;
  then PlatformIO's esptool writes ``model.flmb`` at the blob partition's offset.
- RP2040 / RP2350 (method ``picotool``): ``pio run -t upload`` writes the firmware; a 1200-baud
  touch on its USB CDC port reboots the board into BOOTSEL, and PlatformIO's picotool loads
  ``model.uf2`` (the blob at its XIP address) and starts the firmware. ``flashlm-combined.uf2``
  (firmware + blob in one file) is written too, for a drag-and-drop onto the BOOTSEL drive.

The serial port comes from ``--port`` or from the USB VID/PID in the project's ``flashlm.json``
(the board profile's ``[usb]``). ``--dry-run`` prints every step and runs none.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import serial
from serial.tools import list_ports

from converter.errors import FlashlmError
from firmware import uf2

PROJECT_FILE = "flashlm.json"
COMBINED_UF2 = "flashlm-combined.uf2"
ESPTOOL_BAUD = 460800


class FlashError(FlashlmError):
    """A one-line reason the project cannot be flashed (the CLI prints it and exits 2)."""


@dataclass
class Step:
    kind: str                     # "run" (a command), "touch" (1200-baud reset), "combine" (write the UF2)
    argv: list[str] = field(default_factory=list)
    text: str = ""

    def show(self) -> str:
        return shlex.join(self.argv) if self.kind == "run" else f"# {self.text}"


def load_project(path) -> tuple[Path, dict]:
    d = Path(path)
    if d.is_file() and d.name in (PROJECT_FILE, "platformio.ini"):
        d = d.parent
    if not d.is_dir():
        raise FlashError(f"project {d} does not exist (create it with 'flashlm build --board BOARD --model DIR -o {d}')")
    f = d / PROJECT_FILE
    if not f.is_file() or not (d / "platformio.ini").is_file():
        raise FlashError(f"{d} is not a flashlm PlatformIO project (no {PROJECT_FILE} / platformio.ini); "
                         f"render one with 'flashlm build --board BOARD --model DIR -o {d}'")
    try:
        info = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise FlashError(f"{f} is not valid JSON: {e}") from None
    missing = [k for k in ("board", "env", "method", "blob", "blob_offset", "usb") if k not in info]
    if missing:
        raise FlashError(f"{f} lacks {', '.join(missing)}; re-run 'flashlm build'")
    if not (d / info["blob"]).is_file():
        raise FlashError(f"the blob {d / info['blob']} is missing; re-run 'flashlm build'")
    return d, info


def find_pio() -> str | None:
    """PlatformIO's CLI: on PATH, next to this Python (pip install platformio into the venv), or
    where PlatformIO's own installer puts it."""
    for name in ("pio", "platformio"):
        p = shutil.which(name)
        if p:
            return p
    here = Path(sys.executable).parent
    home = Path.home() / ".platformio" / "penv"
    for d in (here, home / "bin", home / "Scripts"):
        for name in ("pio", "pio.exe", "platformio"):
            if (d / name).is_file():
                return str(d / name)
    return None


def _ids(info: dict) -> list[tuple[int, int]]:
    return [(int(u["vid"]), int(u["pid"])) for u in info.get("usb", [])]


def find_port(info: dict, ports=None) -> str | None:
    """The serial port whose USB VID/PID is one of the board's; None when there is none. The ids
    include common USB-to-UART bridges (CP210x, CH340, CH343) that other devices use too, so two
    matching ports are refused rather than guessed between."""
    ids = set(_ids(info))
    found = [p for p in (list_ports.comports() if ports is None else ports) if (p.vid, p.pid) in ids]
    if len(found) > 1:
        raise FlashError("several serial ports have one of the board's USB ids ("
                         + ", ".join(f"{p.device} {p.vid:04x}:{p.pid:04x}" for p in found) + "); pass --port")
    return found[0].device if found else None


def describe_ids(info: dict) -> str:
    return " or ".join(f"{v:04x}:{p:04x}" for v, p in _ids(info)) or "(none in the profile)"


def plan(project: Path, info: dict, port: str | None, pio: str = "pio") -> list[Step]:
    """Every step ``flashlm flash`` takes for this project, in order."""
    env = info["env"]
    up = [pio, "run", "-d", str(project), "-e", env, "-t", "upload"] + (["--upload-port", port] if port else [])
    steps = [Step("run", up)]
    blob = str(project / info["blob"])
    shown_port = port or "<PORT>"
    if info["method"] == "esptool":
        chip = info.get("esptool_chip") or "auto"
        steps.append(Step("run", [pio, "pkg", "exec", "-p", "tool-esptoolpy", "--", "esptool.py", "--chip", chip,
                                  "--port", shown_port, "--baud", str(ESPTOOL_BAUD), "write_flash",
                                  hex(int(info["blob_offset"])), blob]))
    elif info["method"] in ("picotool", "uf2"):
        uf2_path = str(project / info.get("uf2", "model.uf2"))
        steps.append(Step("combine", text=f"write {project / COMBINED_UF2} (firmware + blob, for a drag-and-drop "
                                          f"onto the BOOTSEL drive)"))
        where = port or f"the board's serial port (USB id {describe_ids(info)})"
        steps.append(Step("touch", [port or ""], text=f"open {where} at 1200 baud and close it: the board "
                                                      f"reboots into BOOTSEL"))
        steps.append(Step("run", [pio, "pkg", "exec", "--", "picotool", "load", "-v", "-x", uf2_path]))
    else:
        raise FlashError(f"board {info['board']}: flash method {info['method']!r} is not supported "
                         f"(esptool, picotool, uf2)")
    return steps


def _wait_port(info: dict, port: str | None, timeout: float = 10.0) -> str | None:
    """The board's port after a reset (it may re-enumerate, possibly under a new name)."""
    def present(p):   # a COM port is no path on Windows: ask the port list
        return os.path.exists(p) or (os.name == "nt" and p in _devices())
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if port and present(port):
            return port
        found = find_port(info)
        if found:
            return found
        time.sleep(0.25)
    return port if port and present(port) else None


def _devices() -> set[str]:
    return {p.device for p in list_ports.comports()}


def touch_1200(port: str) -> None:
    try:
        s = serial.Serial(port, 1200)
        s.dtr = False
        s.close()
    except (OSError, serial.SerialException):
        pass   # the board resets as the port closes; an error on the way out is expected


def write_combined(project: Path, info: dict) -> Path | None:
    fw = project / ".pio" / "build" / info["env"] / "firmware.uf2"
    if not fw.is_file():
        return None
    data = (project / info["blob"]).read_bytes()
    out = project / COMBINED_UF2
    out.write_bytes(uf2.combine(fw.read_bytes(), data, uf2.XIP_BASE + int(info["blob_offset"]),
                                int(info.get("uf2_family", uf2.family_for(info.get("chip", ""))))))
    return out


def check_port(port: str) -> None:
    """A --port that names no serial port here is refused with the ones there are."""
    ports = sorted(p.device for p in list_ports.comports())
    if port in ports or os.path.exists(port):
        return
    raise FlashError(f"serial port {port} does not exist (ports here: {', '.join(ports) or 'none'}); "
                     f"plug the board in, or leave --port out to find it by its USB id")


def flash(project, port: str | None = None, dry_run: bool = False, echo=print) -> int:
    project, info = load_project(project)
    rp = info["method"] in ("picotool", "uf2")
    pio = find_pio()
    if pio is None and not dry_run:
        raise FlashError("PlatformIO is not installed (no 'pio' on PATH); install it with 'pip install platformio' "
                         "and run 'flashlm flash' again")
    note = None
    if port is not None and not dry_run:
        check_port(port)         # before the build: a wrong --port should not cost a compile
    if port is None:
        port = find_port(info)
        if port is None and rp:
            # a board without our firmware shows no serial port; in BOOTSEL mode PlatformIO's picotool
            # finds it by itself, and the firmware's own port appears after the upload
            note = (f"no serial port with USB id {describe_ids(info)}: the board must be in BOOTSEL mode "
                    f"(hold BOOTSEL while plugging it in)")
        elif port is None and not dry_run:
            raise FlashError(f"no serial port with the {info['board']}'s USB id {describe_ids(info)} is connected; "
                             f"plug the board in or pass --port")
        elif port is None:
            note = f"no board with USB id {describe_ids(info)} is connected: <PORT> stands for its serial port"
    steps = plan(project, info, port, "pio" if dry_run or pio is None else pio)
    if note:
        echo(f"# {note}")
    if dry_run:
        for s in steps:
            echo(s.show())
        return 0
    for s in steps:
        echo(f"$ {s.show()}" if s.kind == "run" else s.show())
        if s.kind == "run":
            if "--port" in s.argv:       # the upload reset the board: wait until its port is back
                i = s.argv.index("--port") + 1
                live = _wait_port(info, port)
                if live is None:
                    raise FlashError("the board's serial port did not come back after the upload; "
                                     "re-plug it and run 'flashlm flash' again")
                s.argv[i] = live
            r = subprocess.run(s.argv)
            if r.returncode != 0:
                raise FlashError(f"'{shlex.join(s.argv[:4])} ...' failed with exit code {r.returncode} "
                                 f"(its output is above)")
        elif s.kind == "touch":
            live = _wait_port(info, port)
            if live is None:
                raise FlashError(f"the board's serial port did not appear after the upload; put it in BOOTSEL "
                                 f"mode and copy {project / COMBINED_UF2} onto its drive")
            touch_1200(live)
            time.sleep(3.0)              # the boot ROM's USB device comes up
        elif s.kind == "combine":
            out = write_combined(project, info)
            if out is not None:
                echo(f"  wrote {out}")
    return 0
