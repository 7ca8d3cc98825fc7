"""Files the user names: read them, or fail with one line that names the file."""
from __future__ import annotations

import hashlib
import os

from .ir import ModelError


def sha256_file(path) -> str:
    """The hex sha256 of a file, read in 1 MB chunks (a checkpoint need not fit in memory twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def regular_file_size(path, expect: str = "a model file", cls: type = ModelError) -> int:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise cls(f"{path}: no such file") from None
    except OSError as e:
        raise cls(f"{path}: cannot read: {e.strerror or e}") from None
    if os.path.isdir(path):
        raise cls(f"{path}: is a directory, expected {expect}")
    if not os.path.isfile(path):
        raise cls(f"{path}: not a regular file")
    return st.st_size


def read_file(path, expect: str = "a file", cls: type = ModelError) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise cls(f"{path}: no such file") from None
    except IsADirectoryError:
        raise cls(f"{path}: is a directory, expected {expect}") from None
    except OSError as e:
        raise cls(f"{path}: cannot read: {e.strerror or e}") from None
