"""Fixtures shared by several test files."""
import subprocess
from pathlib import Path

import pytest

from firmware.build_meta import ENGINE_DIR, ENGINE_SOURCES

ROOT = Path(__file__).resolve().parent.parent


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
