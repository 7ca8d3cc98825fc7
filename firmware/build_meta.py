"""What every firmware builder shares (build.py, baremetal.py, platformio.py, exact_float.py) and
every tool that compiles the firmware's C itself (tests, the fuzz targets, bench): where the
sources are, the version the firmware reports, which C files make the engine and which the device
app, the error a build raises and what a build returns.

The firmware's C, by folder: ``engine/`` the forward pass and its kernels (every board, and host
tools that run the engine alone), ``app/`` the device app and the serial protocol on top of it,
``hal/<name>/`` one board family's HAL, ``templates/`` the generated project files."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from converter.errors import FlashlmError

FW_DIR = Path(__file__).resolve().parent
ENGINE_DIR = FW_DIR / "engine"
APP_DIR = FW_DIR / "app"
HAL_DIR = FW_DIR / "hal"
TEMPLATES_DIR = FW_DIR / "templates"
FW_VERSION = "0.1.0"

ENGINE_SOURCES = tuple(sorted(ENGINE_DIR.glob("*.c")))
APP_SOURCES = tuple(sorted(APP_DIR.glob("*.c")))


class BuildError(FlashlmError):
    """The firmware could not be rendered or compiled; the message is for the user."""


@dataclass(frozen=True)
class BuildResult:
    board: str
    project_dir: Path
    binary: Path | None
    size_text: str
