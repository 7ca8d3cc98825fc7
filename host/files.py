"""Writing the files flashlm makes (model folders, reports, figures): atomically, so a reader never
sees half a file and a failed write leaves the old one in place."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder (fsync, then
    os.replace); the folder is created when missing."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:      # name the file the user asked for, not our temporary one
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_json(path, doc, **dumps) -> Path:
    """``doc`` as indented JSON (one space, a final newline), written atomically."""
    return atomic_write_bytes(path, (json.dumps(doc, indent=1, **dumps) + "\n").encode("utf-8"))
