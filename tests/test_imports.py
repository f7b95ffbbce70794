"""The house's import graph, read from the source (every import, module level or inside a function): no module of
app/, engine/ or pages/ imports itself back through others, and engine/ never imports app/ or pages/ (nor a UI
library: the engine knows only tensors and token ids)."""
from __future__ import annotations

import ast
from pathlib import Path

from servers import ROOT

PACKAGES = ("app", "engine", "pages")
UI = {"streamlit", "plotly", "altair"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The project's modules (and UI libraries) that `path` imports: `from a.b import c` names a.b.c when c is a
    module, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in found if m in known or m.split(".")[0] in UI}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, name, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in edges), None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


def test_the_engine_imports_neither_the_app_nor_a_ui_library():
    upward = {(name, target) for name, targets in graph().items() if name.split(".")[0] == "engine"
              for target in targets if target.split(".")[0] in {"app", "pages", *UI}}
    assert upward == set()


def test_the_graph_sees_a_cycle_and_an_upward_import():
    """The checks themselves: a loop of three modules, an import inside a function, a relative import."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    edges = graph()
    assert "app.hosting.model" in edges["app.asgi"]                       # a module-level import
    assert "engine.server.state" in edges["app.hosting.hosted"]           # an import inside a function
    assert "streamlit" in edges["app.hosting.model"]


def test_the_server_is_below_the_cluster_and_the_launcher():
    """engine/launch.py starts the model server in this process (engine/server) or on Ray Serve (engine/cluster):
    the server imports neither, the cluster builds on the server, and engine/settings.py needs no other module."""
    edges = graph()
    up = {(name, target) for name, targets in edges.items() if name.startswith("engine.server")
          for target in targets if target.startswith(("engine.cluster", "engine.launch"))}
    assert up == set()
    assert edges["engine.settings"] == set()
    assert "engine.cluster.launch" in edges["engine.launch"] and "engine.server.app" in edges["engine.launch"]


# The one-forward issue rewrites these files now; their imports get their reasons there.
REWRITTEN_ELSEWHERE = ("engine/core/", "engine/serving/batch.py", "engine/serving/lean.py", "engine/serving/graphed.py")


def import_blocks(body: list[ast.stmt]) -> list[list[ast.stmt]]:
    """Runs of consecutive import statements in one body of statements."""
    runs: list[list[ast.stmt]] = [[]]
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            runs[-1].append(node)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def unexplained_imports(path: Path) -> list[int]:
    """Lines of imports inside a function with no comment saying why: on their own lines, or the line above."""
    lines = path.read_text().splitlines()
    found = set()
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None)
                for run in import_blocks(body if isinstance(body, list) else []):
                    if not any("#" in line for line in lines[run[0].lineno - 2:run[-1].end_lineno]):
                        found.add(run[0].lineno)
    return sorted(found)


def test_every_import_inside_a_function_says_why():
    missing = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(modules().values())
               if not str(path.relative_to(ROOT)).startswith(REWRITTEN_ELSEWHERE) for line in unexplained_imports(path)]
    assert missing == []


def test_the_comment_check_sees_a_bare_import(tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text("def f():\n    import json\n\n    return json\n\n\ndef g():\n    import os  # why\n    import re\n")
    assert unexplained_imports(bare) == [2]


APP_FLOORS = ("app.ui", "app.hosting", "app.room", "app.runs")   # app/'s own packages, from the ground up


def app_floor(module: str) -> int | None:
    return next((i for i, pkg in enumerate(APP_FLOORS) if module == pkg or module.startswith(pkg + ".")), None)


def test_the_apps_packages_stand_in_floors():
    """ui/ imports nothing else of app/; hosting/ only ui/; room/ those two; runs/ those three; none of them imports
    a topic package, main.py or the launcher (docs/architecture.md)."""
    edges = graph()
    up = [(name, target) for name, targets in edges.items() if app_floor(name) is not None
          for target in targets if target.startswith("app.") and (app_floor(target) or -1) > app_floor(name)]
    out = [(name, target) for name, targets in edges.items() if app_floor(name) is not None
           for target in targets if target.startswith("app.") and app_floor(target) is None]
    assert up == [] and out == []
    assert len([p for p in (ROOT / "app").glob("*.py")]) <= 12        # at most 12 modules left flat
