"""Fixtures shared by several test files, and the markers that say what a test needs.

Markers (pyproject.toml registers them; ``make test-fast`` leaves out ``cross``, ``emulated`` and ``slow``):
``native`` builds or runs the C engine on this machine, ``cross`` needs a cross compiler, ``emulated``
runs an emulated board, ``slow`` takes more than a few seconds alone. An unmarked test needs Python only.
The guard below holds the markers honest: a test that starts a tool its markers do not declare fails
and names the marker it lacks, so a fast run can never quietly depend on an emulator or a cross
compiler."""
import os
import subprocess
from pathlib import Path

import pytest

from firmware.build_meta import ENGINE_DIR, ENGINE_SOURCES

ROOT = Path(__file__).resolve().parent.parent

# the markers that allow starting each kind of program (a wider need allows the narrower tools)
_NATIVE_TOOLS = ("cc", "gcc", "clang", "make")
_CROSS_PREFIXES = ("arm-none-eabi-", "riscv64-unknown-elf-", "xtensa-", "clang-22", "llvm-mc")
_EMULATORS = ("node", "qemu-system-")


def _needed_marker(prog: str) -> str | None:
    name = os.path.basename(prog)
    if name.startswith(_EMULATORS):
        return "emulated"
    if name.startswith(_CROSS_PREFIXES):
        return "cross"
    if name in _NATIVE_TOOLS:
        return "native"
    return None


_ALLOWED = {"native": {"native", "cross", "emulated"}, "cross": {"cross", "emulated"}, "emulated": {"emulated"}}
_running: list = []       # the test item whose setup or call is running (none between tests)
_popen_init = subprocess.Popen.__init__


def _guarded_init(self, args, *a, **k):
    if _running:
        prog = args if isinstance(args, (str, bytes, os.PathLike)) else (args[0] if args else "")
        prog = os.fsdecode(prog).split()[0] if isinstance(args, str) else os.fsdecode(prog)
        need = _needed_marker(prog)
        if need is not None:
            have = {m.name for m in _running[-1].iter_markers()}
            if not have & _ALLOWED[need]:
                raise AssertionError(f"{_running[-1].nodeid} starts {os.path.basename(prog)}: mark it "
                                     f"@pytest.mark.{need} (tests/conftest.py)")
    _popen_init(self, args, *a, **k)


subprocess.Popen.__init__ = _guarded_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _running.append(item)
    yield
    _running.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _running.append(item)
    yield
    _running.pop()


@pytest.fixture(scope="session")
def blob_checker(tmp_path_factory):
    """tests/c/blob_check.c with the firmware's blob reader and engine, under ASan + UBSan: prints
    "ok KV LOGITS SCRATCH" (the engine's RAM region bytes) or the refusal reason for a blob file;
    with the argument "head", the engine's output layer on activations from stdin."""
    exe = tmp_path_factory.mktemp("c") / "blob_check"
    subprocess.run(["cc", "-std=c99", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", f"-I{ENGINE_DIR}", str(ROOT / "tests/c/blob_check.c"),
                    *map(str, ENGINE_SOURCES), "-o", str(exe)], check=True)
    return exe
