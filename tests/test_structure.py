"""The project's layout rules, checked from the source: the Python packages import each other without
a circle (function-local imports included, so none can hide one), and no source file grows past ~500
lines unless this file says why."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("converter", "host", "firmware", "bench")
MAX_LINES = 500
# files allowed past MAX_LINES, each with its reason
LONG_FILES = {
    "tests/test_protocol.py": "one test per message and field of the wire format: splitting it by message would "
                              "scatter the shared frame builders",
    "tests/test_planner.py": "the planner's cases over every board profile share one set of model fixtures",
    "tests/test_session.py": "the session's cases share the fake board's fixtures",
    "tests/test_import.py": "one case per checkpoint format and field, sharing the writers of test checkpoints",
    "tests/test_boards_build.py": "every board profile's rendered project and build, sharing the rendering fixtures",
    "tests/test_tokenize.py": "the host and device tokenizers' cases share the model and board fixtures",
    "firmware/engine/engine.c": "the forward pass is one translation unit so its static parts inline as bench "
                                "measures them (its header comment)",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            if "node_modules" in f.parts:
                continue
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def _targets(mods: dict[str, Path], mod: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The project modules an import statement loads (the nearest enclosing module for a name)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            anchor = mod.split(".") if mods[mod].name == "__init__.py" else mod.split(".")[:-1]
            anchor = anchor[:len(anchor) - (node.level - 1)]
            prefix = ".".join(anchor + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]
    out = set()
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name and name != mod:
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[m] |= _targets(mods, m, node)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_circles_finds_a_circle_and_only_that():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(g) == [["a", "b", "c"]]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_source_file_past_the_limit_without_a_reason():
    long = {}
    for pattern in ("converter/**/*.py", "host/**/*.py", "firmware/**/*.py", "bench/**/*.py", "tests/**/*.py",
                    "firmware/**/*.c", "firmware/**/*.h", "host/emu/*.mjs"):
        for f in ROOT.glob(pattern):
            rel = f.relative_to(ROOT).as_posix()
            if "node_modules" in rel:
                continue
            n = len(f.read_text().splitlines())
            if n > MAX_LINES and rel not in LONG_FILES:
                long[rel] = n
    assert not long, f"files over {MAX_LINES} lines with no reason in LONG_FILES: {long}"
