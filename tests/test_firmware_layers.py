"""The firmware's C files call each other in layers: a file includes the headers of the files below
it only, so no two of the device app's files (firmware/app/) depend on each other in a circle, and
the engine (firmware/engine/) includes nothing of the app."""
import re
from pathlib import Path

from firmware.build_meta import APP_DIR, ENGINE_DIR

INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def includes(folder: Path) -> dict[str, set[str]]:
    """File stem -> the stems of the files of the same folder its .c and .h include."""
    out: dict[str, set[str]] = {}
    for p in list(folder.glob("*.c")) + list(folder.glob("*.h")):
        deps = {Path(i).stem for i in INCLUDE.findall(p.read_text()) if (folder / i).is_file()}
        out.setdefault(p.stem, set()).update(deps - {p.stem})
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(n, path):
        state[n] = "open"
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                found.append(path[path.index(m):] + [m])
            elif m not in state:
                visit(m, path + [m])
        state[n] = "done"
    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return found


def test_app_files_include_each_other_without_a_circle():
    graph = includes(APP_DIR)
    assert {"app", "app_receive", "app_generate", "app_request"} <= set(graph)
    assert circles(graph) == []
    assert "app_frames" not in graph["app_generate"]       # generation reports through its app_output


def test_engine_includes_nothing_of_the_app():
    app = {p.name for p in APP_DIR.iterdir()}
    for p in list(ENGINE_DIR.glob("*.c")) + list(ENGINE_DIR.glob("*.h")):
        assert not set(INCLUDE.findall(p.read_text())) & app, p.name
